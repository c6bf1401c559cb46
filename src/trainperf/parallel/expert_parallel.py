"""Expert parallelism on the DeviceMesh, as torchtitan's ``distributed/expert_parallel.py`` does it.

``parallel.ep`` ranks are borrowed from dp_shard: the world mesh's dp_shard dim is unflattened into
(dp_shard_mod_ep, ep). Along ``ep`` each rank holds ``num_experts / ep`` experts (their weights are
DTensors Shard(0) over it); the tokens of every rank still come from its own data-parallel batch.
In each MoE layer the rows a rank routed, sorted by expert, go to the ranks owning those experts
by one ``all_to_all_single`` (the counts first, then the rows), are re-sorted by local expert for the
grouped GEMMs, and return by the inverse all-to-all; backward runs the same exchanges reversed.
FSDP2 shards the expert weights over dp_shard_mod_ep (with dp_replicate under HSDP) -- the ranks
that hold the same experts -- and divides their gradients by the same count as every other
parameter's, so the step equals one process's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from trainperf.core.layout import Layout
from trainperf.core.spec import ParallelSpec
from trainperf.model.moe import GroupedExperts

EXPERT_PARAMS = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")


def expert_mesh(mesh: DeviceMesh, p: ParallelSpec) -> DeviceMesh:
    """The world mesh with dp_shard unflattened into (dp_shard_mod_ep, ep); one root with ``mesh``,
    so FSDP2 can compose its shard dim with the experts' ep dim."""
    lay = Layout.of(p)
    key = (id(mesh), lay.ep)
    if key not in _EXPERT_MESHES:  # one set of process groups per world mesh, not one per call
        _EXPERT_MESHES[key] = mesh._unflatten("dp_shard", (lay.expert_shard, lay.ep), ("dp_shard_mod_ep", "ep"))
    return _EXPERT_MESHES[key]


_EXPERT_MESHES: dict = {}


class _AllToAll(torch.autograd.Function):
    """Rows to the ranks given by the splits; backward sends the gradients back the same way reversed."""

    @staticmethod
    def forward(ctx, x, out_splits: list[int], in_splits: list[int], group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def _segment_order(sizes: torch.Tensor) -> torch.Tensor:
    """Row order that turns rows laid out by (source rank, local expert) into (local expert, source
    rank); ``sizes``: [ranks, local experts] row counts."""
    starts = (torch.cumsum(sizes.reshape(-1), 0) - sizes.reshape(-1)).reshape(sizes.shape)
    sizes_t, starts_t = sizes.t().reshape(-1), starts.t().reshape(-1)
    segment = torch.repeat_interleave(torch.arange(sizes_t.numel(), device=sizes.device), sizes_t)
    seg_start = torch.cumsum(sizes_t, 0) - sizes_t
    within = torch.arange(int(sizes_t.sum()), device=sizes.device) - seg_start[segment]
    return starts_t[segment] + within


class AllToAllDispatcher:
    """GroupedExperts.dispatcher under EP: rows sorted by global expert in, the same rows' outputs out."""

    def __init__(self, group, ep: int):
        self.group, self.ep = group, ep

    def __call__(self, x: torch.Tensor, counts: torch.Tensor, experts_fn):
        counts = counts.to(torch.int64)
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts, group=self.group)  # [source rank x local expert]
        sizes = received.view(self.ep, -1)
        # the split sizes must be known on the host: one sync per layer, as in torchtitan
        in_splits = counts.view(self.ep, -1).sum(1).tolist()
        out_splits = sizes.sum(1).tolist()
        rows = _AllToAll.apply(x, out_splits, in_splits, self.group)
        order = _segment_order(sizes)
        local_counts = sizes.sum(0)
        y = experts_fn(rows[order], local_counts, local_counts.tolist())
        y = y[torch.argsort(order)]
        return _AllToAll.apply(y, in_splits, out_splits, self.group)


def apply_ep(model: nn.Module, mesh: DeviceMesh, p: ParallelSpec) -> None:
    """Split every GroupedExperts' weights over the ep ranks (Shard(0): whole experts per rank) and
    route its rows through the all-to-all dispatcher."""
    from torch.distributed.tensor import Shard, distribute_tensor

    ep_mesh = expert_mesh(mesh, p)["ep"]
    for module in model.modules():
        if not isinstance(module, GroupedExperts):
            continue
        for name in EXPERT_PARAMS:
            param = getattr(module, name)
            dt = distribute_tensor(param, ep_mesh, [Shard(0)], src_data_rank=None)
            module.register_parameter(name, nn.Parameter(dt, requires_grad=param.requires_grad))
        module.dispatcher = AllToAllDispatcher(ep_mesh.get_group(), ep_mesh.size())


def shard_experts(model: nn.Module, mesh: DeviceMesh, p: ParallelSpec, param_dtype: torch.dtype | None,
                  reshard: bool) -> None:
    """FSDP2 on each GroupedExperts over the ranks holding the same experts, before the layers' own
    fully_shard (which then leaves these weights to it); gradients divided by the layout's loss
    scale like every other parameter's: FSDP2 averages over its smaller group, the experts scale
    their gradients by that group over the loss scale (set_gradient_divide_factor would need a
    PREMUL_SUM reduction, which gloo lacks)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    sparse = expert_mesh(mesh, p)
    shard_mesh = sparse[("dp_replicate", "dp_shard_mod_ep")] if p.dp_replicate > 1 else sparse["dp_shard_mod_ep"]
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
    scale = shard_mesh.size() / Layout.of(p).loss_scale
    for module in model.modules():
        if isinstance(module, GroupedExperts):
            fully_shard(module, mesh=shard_mesh, mp_policy=mp, reshard_after_forward=reshard)
            module.grad_scale = scale
