"""The parallel layout's arithmetic, in one place (torchtitan's ``ParallelDims`` in spirit).

One DeviceMesh holds the world, outermost to innermost: pp, dp_replicate, dp_shard, cp, tp -- so TP
stays inside a node, then CP, then FSDP; replication and pipeline stages cross node boundaries first.
:class:`Layout` owns every degree, group and stage computation the engine, the planner, the trace
analysis and the reports need; nothing else multiplies degrees or numbers ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainperf.core.errors import SpecError

if TYPE_CHECKING:  # annotations only: core.spec imports nothing from here
    from trainperf.core.spec import ParallelSpec, RunSpec

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
# flattened views of the mesh: data loading (dp), FSDP's shard group (data and context ranks hold the
# same parameters), and loss scaling (every rank whose gradients are averaged)
FLATTENED = {"dp_shard_cp": ("dp_shard", "cp"), "dp": ("dp_replicate", "dp_shard"),
             "dp_cp": ("dp_replicate", "dp_shard", "cp")}

# offloaded layers below the one in backward whose copies back are already issued (parallel/offload.py);
# the highest offloaded layer's copy is issued this many layers above it. Here for the planner too.
OFFLOAD_PREFETCH_DEPTH = 2


@dataclass(frozen=True)
class Layout:
    """Degrees of one layout (dp_shard resolved) and what follows from them."""

    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1
    pp: int = 1
    sp: bool = False
    pp_schedule: str = "1F1B"
    pp_stages_per_rank: int = 0  # 0: the schedule's default
    ep: int = 1  # expert parallel: borrowed from dp_shard, so no mesh dim of its own

    @classmethod
    def of(cls, p: ParallelSpec) -> Layout:
        return cls(dp_replicate=p.dp_replicate, dp_shard=p.dp_shard, cp=p.cp, tp=p.tp, pp=p.pp, sp=p.sp,
                   pp_schedule=p.pp_schedule, pp_stages_per_rank=p.pp_stages_per_rank, ep=p.ep)

    @classmethod
    def from_sizes(cls, sizes: dict, world: int) -> Layout:
        """From a {dim: size} mapping (a stored spec's parallel section; dp_shard=-1 filled in from the world)."""
        d = {k: int(sizes.get(k, 1)) for k in MESH_DIMS}
        if d["dp_shard"] < 0:
            rest = d["pp"] * d["dp_replicate"] * d["cp"] * d["tp"]
            d["dp_shard"] = max(world // max(rest, 1), 1)
        return cls(**d)

    # -- degrees
    @property
    def sizes(self) -> dict[str, int]:
        return {d: getattr(self, d) for d in MESH_DIMS}

    @property
    def world_size(self) -> int:
        return math.prod(self.sizes.values())

    @property
    def dp(self) -> int:
        """Data-parallel degree: the ranks that read different samples."""
        return self.dp_replicate * self.dp_shard

    @property
    def loss_scale(self) -> int:
        """FSDP/HSDP average gradients over dp_replicate x dp_shard x cp ranks; each rank's loss is its
        share of the global sum, so it is scaled by that count to make the average a sum."""
        return self.dp_replicate * self.dp_shard * self.cp

    @property
    def expert_shard(self) -> int:
        """FSDP's shard degree for expert weights under EP: dp_shard splits into (dp_shard / ep, ep),
        the ep ranks hold different experts and the dp_shard / ep ranks of one expert shard it."""
        return self.dp_shard // self.ep

    def grad_accum_steps(self, global_batch_size: int, micro_batch_size: int) -> int:
        return global_batch_size // (self.dp * micro_batch_size)

    # -- pipeline stages
    @property
    def stages_per_rank(self) -> int:
        """Pipeline stages each rank holds: pp_stages_per_rank, else 2 for Interleaved1F1B, else 1
        (1 without pipeline parallelism)."""
        if self.pp == 1:
            return 1
        return self.pp_stages_per_rank or (2 if self.pp_schedule == "Interleaved1F1B" else 1)

    @property
    def num_stages(self) -> int:
        return self.pp * self.stages_per_rank

    def layers_per_stage(self, num_layers: int) -> int:
        return num_layers // self.num_stages

    def stages_of_rank(self, pp_rank: int) -> list[int]:
        """The stages pp rank ``pp_rank`` holds: pp_rank, pp_rank + pp, ... (looping placement, as the
        interleaved schedule expects)."""
        return list(range(pp_rank, self.num_stages, self.pp))

    # -- ranks and groups
    def tp_group_seed(self, seed: int, rank: int) -> int:
        """The seed of a rank's random streams (LoRA dropout): one per tensor-parallel group, since the
        ranks of a group must draw the same global dropout mask. tp is the innermost mesh dimension, so
        a group is tp consecutive ranks and rank // tp numbers the groups; tp = 1: seed + rank."""
        return seed + rank // self.tp

    def coords(self, rank: int) -> tuple[int, ...]:
        """``rank``'s coordinate along each of MESH_DIMS (row-major, as init_device_mesh lays it out)."""
        out = []
        for size in reversed([self.sizes[d] for d in MESH_DIMS]):
            out.append(rank % size)
            rank //= size
        return tuple(reversed(out))

    def groups(self, rank: int) -> dict[str, tuple[int, ...]]:
        """The ranks of ``rank``'s group along every mesh dim and flattened dim, plus 'world'."""
        mine = self.coords(rank)

        def group(dims: tuple[str, ...]) -> tuple[int, ...]:
            free = {MESH_DIMS.index(d) for d in dims}
            return tuple(g for g in range(self.world_size)
                         if all(c == mine[i] for i, c in enumerate(self.coords(g)) if i not in free))

        out = {d: group((d,)) for d in MESH_DIMS}
        out.update({name: group(dims) for name, dims in FLATTENED.items()})
        out["world"] = tuple(range(self.world_size))
        return out

    def placement(self, gpus_per_node: int) -> dict[str, str]:
        """For each mesh dim of size > 1: whether its groups stay inside a node or cross node boundaries."""
        out, stride = {}, 1
        for dim in reversed(MESH_DIMS):  # innermost first: its ranks are adjacent
            size = self.sizes[dim]
            if size > 1:
                out[dim] = "intra-node" if stride * size <= gpus_per_node else "crosses nodes"
            stride *= size
        return out

    def describe(self) -> str:
        """The layout as the store and reports name it: dp_replicate=1,dp_shard=2,tp=1,cp=1,pp=1[,sp][,pp_schedule=...]."""
        s = f"dp_replicate={self.dp_replicate},dp_shard={self.dp_shard},tp={self.tp},cp={self.cp},pp={self.pp}"
        if self.tp > 1 and self.sp:
            s += ",sp"
        if self.pp > 1:
            s += f",pp_schedule={self.pp_schedule}"
        if self.ep > 1:
            s += f",ep={self.ep}"
        return s


# ---------------------------------------------------------------------------------------------
# The same questions asked of a spec (call sites that hold a ParallelSpec or a RunSpec)

def data_parallel_size(p: ParallelSpec) -> int:
    return Layout.of(p).dp


def grad_accum_steps(spec: RunSpec) -> int:
    return Layout.of(spec.parallel).grad_accum_steps(spec.train.global_batch_size, spec.train.micro_batch_size)


def stages_per_rank(p: ParallelSpec) -> int:
    return Layout.of(p).stages_per_rank


def layers_per_stage(spec: RunSpec) -> int:
    return Layout.of(spec.parallel).layers_per_stage(spec.model.num_layers)


def degrees_name(p: dict) -> str:
    """Every degree of a layout that is not 1, for people: DP2·TP4·CP2·SP, PP2(GPipe); HSDP as
    DP<replicate>x<shard>. ``p`` is a parallel section as a mapping (a stored spec's, or asdict)."""
    rep, shard = p.get("dp_replicate") or 1, max(p.get("dp_shard") or 1, 1)
    parts = [f"DP{rep}x{shard}" if rep > 1 and shard > 1 else f"DP{rep * shard}"]
    parts += [f"{k.upper()}{p[k]}" for k in ("tp", "cp", "ep") if (p.get(k) or 1) > 1]
    if (p.get("pp") or 1) > 1:
        parts.append(f"PP{p['pp']}" + (f"({p['pp_schedule']})" if p.get("pp_schedule") else ""))
    if p.get("sp") and (p.get("tp") or 1) > 1:
        parts.append("SP")
    return "·".join(parts)


def layout_string(p: ParallelSpec) -> str:
    return Layout.of(p).describe()


def resolve_layout(spec: RunSpec, world_size: int) -> None:
    """Fill dp_shard=-1 from the world size and check the layout multiplies out."""
    p = spec.parallel
    for name in ("dp_replicate", "tp", "cp", "pp"):
        if getattr(p, name) < 1:
            raise SpecError(f"parallel.{name}={getattr(p, name)}: must be >= 1")
    others = p.tp * p.cp * p.pp * p.dp_replicate
    if p.dp_shard == -1:
        if world_size % others:
            raise SpecError(
                f"world size {world_size} is not divisible by parallel.tp x cp x pp x dp_replicate = {p.tp} x {p.cp} x "
                f"{p.pp} x {p.dp_replicate} = {others}; choose them so that their product divides {world_size}"
            )
        p.dp_shard = world_size // others
    if p.dp_shard < 1:
        raise SpecError(f"parallel.dp_shard={p.dp_shard}: must be >= 1 or -1 (fill the world size)")
    product = others * p.dp_shard
    if product != world_size:
        raise SpecError(
            f"layout dp_replicate={p.dp_replicate} x dp_shard={p.dp_shard} x tp={p.tp} x cp={p.cp} x pp={p.pp} "
            f"= {product} processes, but the world size is {world_size}; make the product equal {world_size}"
        )
    if p.ep < 1 or p.dp_shard % p.ep:
        valid = [d for d in range(1, p.dp_shard + 1) if p.dp_shard % d == 0]
        raise SpecError(f"parallel.ep={p.ep}: expert parallel borrows its ranks from dp_shard={p.dp_shard}, so it must "
                        f"divide it; valid: {', '.join(map(str, valid))}")


def layer_memory_modes(n: int, recompute: str, recompute_layers: int = -1, others: str = "none",
                       offload: int = 0) -> list[str]:
    """What each of a stage's ``n`` decoder layers does with its activations: offload | full |
    selective | none. The first ``offload`` + k layers (k = recompute_layers; -1: all the others) are
    the ones that keep least on the GPU: ``offload`` of them (train.offload_layers) keep their
    activations in pinned host memory, spread evenly among the k that get train.recompute -- a layer's
    copy back then runs under the backward and the recomputation of the layers between it and the
    offloaded layer above it, not under one layer's backward alone; the layers after them get
    train.recompute_others (Megatron's recompute-num-layers). Offloading the first layers first: their
    copies out overlap the forward of every layer after them."""
    offload = min(offload, n)
    if recompute == "none":
        k, others = 0, "none"
    else:
        k = n - offload if recompute_layers < 0 else min(recompute_layers, n - offload)
    block = offload + k
    offloaded = {i * block // offload for i in range(offload)} if offload else set()
    return ["offload" if i in offloaded else recompute if i < block else others for i in range(n)]
