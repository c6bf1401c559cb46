"""Offline analysis of the per-rank Chrome traces ``trace.capture`` writes; pure Python, no GPU.

Per step (the ``ProfilerStep#k`` spans of the main thread) and per rank, on interval unions
(the definitions of Meta's Holistic Trace Analysis, HTA):

    compute   |U(COMP)|                 GPU: kernels that are not NCCL; CPU traces (gloo): the leaf
                                        CPU ops of the training threads (the CPU's "kernels")
    comm      |U(COMM)|                 GPU: NCCL kernels; CPU: the gloo:* work on gloo's threads
    overlap   |U(COMP) ∩ U(COMM)|       overlap % = overlap / comm
    exposed   |U(COMM) \\ U(COMP)|       = comm - overlap
    mem       |U(MEM)|                  GPU memcpy/memset (0 on CPU)
    exposed mem |U(MEM) \\ (U(COMP) ∪ U(COMM))|  copies nothing else runs beside (activation offload's
                                        cost when it is not hidden)
    idle      step - |U(COMP ∪ COMM ∪ MEM)|; GPU traces also list the gaps (``idle_gaps``) with
              their cause read off the host's timeline (a sync, a late launch, a dependency)

Times are integer nanoseconds inside (the traces' microsecond floats are rounded once, at load), so
the identity step = compute + comm - overlap + exposed mem + idle holds exactly.

Collectives: every NCCL kernel carries its metadata in its args (Collective name, In/Out msg nelems,
dtype, Group size, Process Group Name/Description/Ranks -- checked on torch 2.11 + NCCL 2.28); gloo
traces carry none of it, so each ``gloo:*`` event is paired with the ``c10d::*`` op that issued it
(kind, element count, issue order), and its group is inferred from the sizes. The process group is
named by its parallel dimension: the groups of every mesh dim (and of the flattened dims trainperf
builds) are computed from the layout and compared with the collective's ranks. Bandwidths follow
nccl-tests (algbw = S / t, busbw = algbw x factor(n)); t is the *transfer* time, the shortest
duration of the same collective over the ranks (TraceLens), since a rank that arrives early spends
the difference waiting; that wait is reported per rank, and the rank the others wait for is the
straggler.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import statistics
from bisect import bisect_left, bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from trainperf.core.layout import FLATTENED, MESH_DIMS, Layout

Interval = tuple[int, int]


# ---------------------------------------------------------------------------------------------
# interval arithmetic (half-open [start, end), integer ns; "merged" = sorted, disjoint, non-empty)


def merge(intervals) -> list[Interval]:
    """Union of any intervals as a merged list; empty ones dropped, touching ones joined."""
    out: list[list[int]] = []
    for s, e in sorted((s, e) for s, e in intervals if e > s):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def total(merged: list[Interval]) -> int:
    return sum(e - s for s, e in merged)


def union(a: list[Interval], b: list[Interval]) -> list[Interval]:
    return merge(list(a) + list(b))


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Intersection of two merged lists (two-pointer sweep)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """a minus b, both merged."""
    out, j = [], 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            if cur >= e:
                break
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def clip(merged: list[Interval], lo: int, hi: int) -> list[Interval]:
    """The part of a merged list inside [lo, hi)."""
    if hi <= lo or not merged:
        return []
    starts = [s for s, _ in merged]
    i = max(bisect_right(starts, lo) - 1, 0)
    j = bisect_left(starts, hi)
    return [(max(s, lo), min(e, hi)) for s, e in merged[i:j] if min(e, hi) > max(s, lo)]


@dataclass
class Breakdown:
    """One step of one rank, in ns."""
    step: int
    span: int
    compute: int
    comm: int
    overlap: int
    mem: int
    idle: int
    mem_exposed: int = 0

    @property
    def exposed(self) -> int:
        return self.comm - self.overlap


def breakdown(step: int, lo: int, hi: int, comp: list[Interval], comm: list[Interval],
              mem: list[Interval] = ()) -> Breakdown:
    """Compute / comm / overlap / mem / idle of the window [lo, hi) from merged interval lists."""
    c, m, x = clip(comp, lo, hi), clip(comm, lo, hi), clip(list(mem), lo, hi)
    kernels = union(c, m)
    busy = union(kernels, x)
    return Breakdown(step=step, span=hi - lo, compute=total(c), comm=total(m), overlap=total(intersect(c, m)),
                     mem=total(x), idle=(hi - lo) - total(busy), mem_exposed=total(busy) - total(kernels))


# ---------------------------------------------------------------------------------------------
# collectives: names, sizes, bandwidth

_DTYPE_BYTES = {"float": 4, "float32": 4, "bfloat16": 2, "half": 2, "float16": 2, "double": 8, "float64": 8,
                "int": 4, "int32": 4, "long": 8, "int64": 8, "long int": 8, "short": 2, "int16": 2, "char": 1,
                "int8": 1, "byte": 1, "uint8": 1, "unsigned char": 1, "bool": 1, "signed char": 1,
                "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
                "complexfloat": 8, "complexdouble": 16}


def dtype_bytes(dtype: str | None) -> int | None:
    if not dtype:
        return None
    return _DTYPE_BYTES.get(dtype.lower().replace("c10::", "").replace("at::", "").strip())


def op_kind(name: str) -> str:
    """Normalised collective name from a 'Collective name', c10d op or gloo/nccl annotation."""
    n = name.lower().replace("c10d::", "").replace("gloo:", "").replace("nccl:", "").replace("_", "")
    for key, kind in (("reducescatter", "reduce_scatter"), ("allgather", "all_gather"), ("allreduce", "all_reduce"),
                      ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("barrier", "barrier"),
                      ("recvanysource", "recv"), ("send", "send"), ("recv", "recv"), ("gather", "gather"),
                      ("scatter", "scatter"), ("reduce", "reduce")):
        if key in n:
            return kind
    return name


def busbw_factor(kind: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor (doc/PERFORMANCE.md)."""
    if n <= 1:
        return 0.0 if kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all") else 1.0
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (n - 1) / n
    return 1.0


def algo_bytes(kind: str, in_bytes: int, out_bytes: int) -> int:
    """S of nccl-tests: all-gather the total output, reduce-scatter the total input, else the buffer."""
    if kind in ("all_gather", "gather"):
        return out_bytes
    if kind in ("reduce_scatter", "scatter"):
        return in_bytes
    return max(in_bytes, out_bytes) if kind in ("broadcast", "reduce") else in_bytes


# ---------------------------------------------------------------------------------------------
# mesh groups: name a set of ranks by its parallel dimension


def resolve_mesh_sizes(parallel: dict, world: int) -> dict[str, int]:
    """{dim: size} from a spec's parallel section (dp_shard=-1 filled in from the world size)."""
    return Layout.from_sizes(parallel, world).sizes


def mesh_groups(sizes: dict[str, int], rank: int) -> dict[str, tuple[int, ...]]:
    """The ranks of ``rank``'s group along every mesh dim and flattened dim, plus 'world'."""
    return Layout.from_sizes(sizes, math.prod(int(v) for v in sizes.values())).groups(rank)


def label_group(ranks: tuple[int, ...] | None, groups: dict[str, tuple[int, ...]]) -> str | None:
    """The mesh dim whose group is exactly ``ranks``: a single dim first, then a flattened one."""
    if not ranks or not groups:
        return None
    want = tuple(sorted(ranks))
    for name in MESH_DIMS + tuple(FLATTENED) + ("world",):
        g = groups.get(name)
        if g is not None and len(g) > 1 and tuple(sorted(g)) == want:
            return name
    return None


def dims_of_size(n: int, groups: dict[str, tuple[int, ...]]) -> list[str]:
    """Distinct groups of size n (one name each, single dims first) -- candidates when only the size is known."""
    seen, out = set(), []
    for name in MESH_DIMS + tuple(FLATTENED) + ("world",):
        g = groups.get(name)
        if g is not None and len(g) == n and n > 1 and g not in seen:
            seen.add(g)
            out.append(name)
    return out


# ---------------------------------------------------------------------------------------------
# one rank's trace


@dataclass
class Collective:
    rank: int
    kind: str
    name: str
    start: int
    end: int
    in_bytes: int | None
    out_bytes: int | None
    dtype: str | None
    group_size: int | None
    pg_name: str | None
    ranks: tuple[int, ...] | None
    group: str  # the parallel dimension (or a description of the group)
    step: int | None = None

    @property
    def dur(self) -> int:
        return self.end - self.start

    @property
    def bytes(self) -> int | None:
        if self.in_bytes is None or self.out_bytes is None:
            return None
        return algo_bytes(self.kind, self.in_bytes, self.out_bytes)


@dataclass
class RankTrace:
    rank: int
    mode: str  # "gpu" | "cpu"
    steps: list[tuple[int, int, int]]  # (k, start ns, end ns)
    comp: list[Interval]
    comm: list[Interval]
    mem: list[Interval]
    collectives: list[Collective]
    top: dict[tuple[str, str], list[int]]  # (name, kind) -> [count, total ns]
    host: str | None = None
    distributed: dict = field(default_factory=dict)
    gaps: list[dict] = field(default_factory=list)  # GPU traces: idle gaps >= MIN_GAP_NS, attributed


def load_trace(path: str | Path) -> dict:
    path = Path(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as fh:
        return json.load(fh)


def _ns(x) -> int:
    return int(round(float(x) * 1000.0))


def _numel(dims) -> int | None:
    """Elements of one tensor's dims, or the sum over a TensorList's ([[d, ...], ...])."""
    if not isinstance(dims, list):
        return None
    if all(isinstance(d, int) for d in dims):
        return math.prod(dims)
    if all(isinstance(d, list) and all(isinstance(x, int) for x in d) for d in dims):
        return sum(math.prod(d) for d in dims)
    return None


def _ranks_arg(v) -> tuple[int, ...] | None:
    if isinstance(v, list):
        return tuple(int(x) for x in v)
    if isinstance(v, str):
        try:
            parsed = json.loads(v)
        except ValueError:
            return None
        return tuple(int(x) for x in parsed) if isinstance(parsed, list) else None
    return None


_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_COMM_CPU_PREFIXES = ("c10d::", "_c10d_functional::", "c10d_functional::", "record_param_comms", "gloo:", "nccl:")


def _is_comm_or_wait(name: str) -> bool:
    return name.startswith(_COMM_CPU_PREFIXES) or "wait" in name.lower()


def parse_rank(trace: dict, rank: int | None = None, groups: dict[str, tuple[int, ...]] | None = None,
               fsdp_dims: tuple[str, ...] = ("dp_shard_cp", "dp_shard", "dp", "dp_cp")) -> RankTrace:
    """Reduce one rank's Chrome trace to intervals, collectives and op totals."""
    info = trace.get("distributedInfo") or {}
    rank = int(info.get("rank", 0)) if rank is None else rank
    pg_ranks = {str(p.get("pg_name")): tuple(p.get("ranks") or []) for p in info.get("pg_config") or []}
    groups = groups or {}
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    thread_names = {(e.get("pid"), e.get("tid")): (e.get("args") or {}).get("name", "")
                    for e in trace.get("traceEvents", []) if e.get("ph") == "M" and e.get("name") == "thread_name"}
    steps = []
    for e in events:
        m = _STEP.match(e.get("name", ""))
        if m and e.get("cat") != "gpu_user_annotation":
            s = _ns(e["ts"])
            steps.append((int(m.group(1)), s, s + _ns(e.get("dur", 0))))
    steps.sort()
    gpu = any(e.get("cat") == "kernel" for e in events)
    top: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    colls: list[Collective] = []
    gaps: list[dict] = []
    if gpu:
        comp, comm, mem = [], [], []
        device: list[tuple[int, int, str, object]] = []  # (start, end, name, correlation) of every GPU activity
        for e in events:
            cat = e.get("cat")
            if cat not in ("kernel", "gpu_memcpy", "gpu_memset"):
                continue
            s = _ns(e["ts"])
            iv = (s, s + _ns(e.get("dur", 0)))
            name = e.get("name", "")
            args = e.get("args") or {}
            device.append((iv[0], iv[1], name, args.get("correlation")))
            if cat != "kernel":
                mem.append(iv)
                kind = "memory"
            elif "nccl" in name.lower() or "Collective name" in args:
                comm.append(iv)
                kind = "comm"
                colls.append(_nccl_collective(rank, name, args, iv, pg_ranks, groups))
            else:
                comp.append(iv)
                kind = "compute"
            t = top[(name, kind)]
            t[0] += 1
            t[1] += iv[1] - iv[0]
        comp, comm, mem = merge(comp), merge(comm), merge(mem)
        gaps = idle_gaps(steps, union(union(comp, comm), mem), device, events)
    else:
        comp, comm, colls = _cpu_intervals(events, thread_names, rank, groups, fsdp_dims, top)
        mem = []
    for c in colls:
        c.step = _step_of(c.start, steps)
    return RankTrace(rank=rank, mode="gpu" if gpu else "cpu", steps=steps, comp=comp, comm=comm, mem=mem,
                     collectives=colls, top=dict(top), host=trace.get("host_name"), distributed=info, gaps=gaps)


# ---------------------------------------------------------------------------------------------
# idle gaps: where the GPU sat idle inside a step, and what the host was doing

MIN_GAP_NS = 50_000  # gaps shorter than 50 us are launch jitter, not a cause worth a row
EDGE_CAUSES = ("start of step", "end of step")  # the trace's own waits at each step's edges (idle_gaps)
_RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
_STACK_CATS = ("cpu_op", "user_annotation")


def _is_host_sync(name: str) -> bool:
    """A runtime call that blocks the host until GPU work finishes."""
    return "Synchronize" in name or name in ("cudaMemcpy", "cuMemcpyDtoH_v2", "cuMemcpyDtoH")


class _Stacks:
    """The CPU op / annotation stack of one thread at any time: events sorted by start, each with its
    parent (the profiler's ops nest properly on a thread)."""

    def __init__(self, evs: list[tuple[int, int, str]]):
        evs.sort(key=lambda x: (x[0], -(x[1] - x[0])))
        self.starts, self.ends, self.names, self.parent = [], [], [], []
        open_: list[int] = []
        for s, e, name in evs:
            while open_ and s >= self.ends[open_[-1]]:
                open_.pop()
            self.parent.append(open_[-1] if open_ else -1)
            self.starts.append(s)
            self.ends.append(e)
            self.names.append(name)
            open_.append(len(self.starts) - 1)

    def at(self, ts: int) -> list[str]:
        """Names of the ops open at ``ts``, outermost first."""
        i = bisect_right(self.starts, ts) - 1
        while i >= 0 and self.ends[i] <= ts:  # the last op to start before ts has ended: its ancestors
            i = self.parent[i]
        names = []
        while i >= 0:
            names.append(self.names[i])
            i = self.parent[i]
        return names[::-1]


def _where(stack: list[str]) -> str:
    """The innermost two ops of a host stack, the step's own span left out."""
    inner = [n for n in stack if not _STEP.match(n)][-2:]
    return " > ".join(inner) if inner else "(no op open)"


def idle_gaps(steps, busy: list[Interval], device: list[tuple], events: list[dict]) -> list[dict]:
    """Every stretch of a profiled step where no kernel, copy or collective runs on the GPU, at least
    MIN_GAP_NS long, with its cause read off the host's timeline:

    - ``host sync``: a host thread waited in a blocking runtime call (a stream / device / event
      synchronize, a blocking copy) until the GPU ran dry, or sat in one for half the gap or more --
      the op that issued it is the culprit;
    - ``late launch``: the kernel that ends the gap was launched after the gap began -- the host was
      the bottleneck there (Python, the optimizer's per-tensor calls, a compiled graph's guards);
    - ``dependency``: it was launched before the gap began but started later (a cross-stream wait,
      an event);
    - ``start of step`` / ``end of step``: the step's edges, the trace's own waits. The trace waits
      for the GPU after every step (so each step's GPU time is its own, ``capture.TraceCapture.step``):
      the tail from that bare synchronize's start (no op open on its thread but the step's span) is
      ``end of step``, and so is a tail with no later kernel in the trace. A loop that does not wait
      would have gone into the next step that much ahead of the GPU -- the sync's whole length -- so
      the next step's head gap (the host's walk to its first launch) is ``start of step`` up to that
      length and ``late launch`` beyond it (all of it when the previous step did not wait): a
      launch-bound step keeps its real head idle. The first profiled step's head is ``start of
      step`` whole: no earlier step is in the trace, and the profiler switches itself on there (50 ms
      seen on a 7B LoRA step, against 2 ms in the next).
      Host work between the last kernel and that sync is ``late launch``, where = the ops open
      halfway through it. A step without a kernel is ``no kernel in the step``, no edge. Edges are
      summed apart from the gaps inside the step.
    ``where``: the innermost host ops at the sync or at the launch."""
    runtime = {}
    syncs = []
    per_thread: dict = defaultdict(list)
    for e in events:
        cat = e.get("cat")
        s = _ns(e["ts"])
        iv = (s, s + _ns(e.get("dur", 0)))
        key = (e.get("pid"), e.get("tid"))
        if cat in _RUNTIME_CATS:
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                runtime[corr] = (iv[0], key)
            if _is_host_sync(e.get("name", "")):
                syncs.append((iv, key, e.get("name", "")))
        elif cat in _STACK_CATS:
            per_thread[key].append((iv[0], iv[1], e.get("name", "")))
    stacks = {k: _Stacks(v) for k, v in per_thread.items()}
    device = sorted(device)
    starts = [d[0] for d in device]
    ends = sorted((d[1], d[2]) for d in device)
    end_times = [x[0] for x in ends]

    def ops_at(key, ts) -> list[str]:
        return stacks[key].at(ts) if key in stacks else []

    def bare(iv, key) -> bool:  # a synchronize called with no op open but the step's own span: the trace's
        ops = ops_at(key, iv[0])
        return bool(ops) and all(_STEP.match(n) for n in ops)

    def classify(g0, g1, after, skip_bare=False):
        # a sync is the gap's cause when the host waited in it for the GPU to run dry (it began before
        # the gap: the queue was empty when it returned) or sat in it for half the gap or more; an
        # event sync that returns at once inside host work (its step long finished) is not
        blocking = [(iv, key, name) for iv, key, name in syncs if iv[0] < g1 and iv[1] > g0
                    and (iv[0] <= g0 or 2 * (min(iv[1], g1) - max(iv[0], g0)) >= g1 - g0)
                    and not (skip_bare and bare(iv, key))]
        if blocking:
            iv, key, name = max(blocking, key=lambda b: min(b[0][1], g1) - max(b[0][0], g0))
            return "host sync", ops_at(key, iv[0]) + [name]
        if after is None:
            return "end of step", []
        launch = runtime.get(after[3])
        if launch is None:
            return "dependency", []
        return ("late launch" if launch[0] > g0 else "dependency"), ops_at(launch[1], launch[0])

    # the trace's own sync in each step (the last bare one starting inside it): how far ahead of the GPU
    # the host would have entered the next step had it not waited
    lead, traced = {}, {k for k, _, _ in steps}
    for k, lo, hi in steps:
        own = [iv for iv, key, _ in syncs if lo <= iv[0] < hi and bare(iv, key)]
        if own:
            lead[k] = max(own)[1] - max(own)[0]
    out = []

    def add(k, lo, g0, g1, cause, stack, after):
        if g1 - g0 <= 0:
            return
        j = bisect_right(end_times, g0) - 1
        out.append({"step": k, "start_ns": g0, "offset_s": (g0 - lo) * 1e-9, "dur_s": (g1 - g0) * 1e-9,
                    "cause": cause, "where": _where(stack), "stack": stack[-4:],
                    "before": ends[j][1] if j >= 0 else None, "after": after[2] if after else None})

    for k, lo, hi in steps:
        inside = clip(busy, lo, hi)
        cursor, holes = lo, []
        for s, e in inside:
            if s > cursor:
                holes.append((cursor, s))
            cursor = max(cursor, e)
        if cursor < hi:
            holes.append((cursor, hi))
        for g0, g1 in holes:
            if g1 - g0 < MIN_GAP_NS:
                continue
            i = bisect_left(starts, g1)
            after = device[i] if i < len(device) else None
            if g0 == lo and g1 == hi:  # no kernel in the whole step: no edge of the trace's
                cause, stack = classify(g0, g1, after, skip_bare=True)
                add(k, lo, g0, g1, cause if cause == "host sync" else "no kernel in the step", stack, after)
                continue
            if g0 == lo:  # the head: hidden behind the previous step's lead, if it was in the trace
                edge = min(g1 - g0, lead.get(k - 1, 0)) if k - 1 in traced else g1 - g0
                launch = runtime.get(after[3]) if after is not None else None
                add(k, lo, g0, g0 + edge, "start of step", ops_at(launch[1], launch[0]) if launch else [], after)
                add(k, lo, g0 + edge, g1, *classify(g0 + edge, g1, after), after)
                continue
            tail = [(iv, key, name) for iv, key, name in syncs if iv[0] < g1 and iv[1] > g0 and bare(iv, key)]
            if g1 == hi and g0 > lo and tail:  # the tail: the trace's own sync from its start
                (s0, _), key, name = max(tail)
                if s0 > g0:
                    cause, stack = classify(g0, s0, after)
                    if cause != "host sync":  # the GPU ran dry while the host worked on what was open then
                        cause, stack = "late launch", ops_at(key, (g0 + s0) // 2)
                    add(k, lo, g0, s0, cause, stack, after)
                add(k, lo, max(g0, s0), g1, "end of step", ops_at(key, s0) + [name], after)
                continue
            add(k, lo, g0, g1, *classify(g0, g1, after), after)
    return out


def _step_of(ts: int, steps: list[tuple[int, int, int]]) -> int | None:
    for k, s, e in steps:
        if s <= ts < e:
            return k
    return None


def _nccl_collective(rank, name, args, iv, pg_ranks, groups) -> Collective:
    kind = op_kind(args.get("Collective name") or name)
    size = dtype_bytes(args.get("dtype"))
    n_in, n_out = args.get("In msg nelems"), args.get("Out msg nelems")
    ranks = _ranks_arg(args.get("Process Group Ranks")) or pg_ranks.get(str(args.get("Process Group Name")))
    gsize = args.get("Group size") or (len(ranks) if ranks else None)
    group = label_group(ranks, groups) or args.get("Process Group Description") or (
        f"ranks {list(ranks)}" if ranks else "?")
    return Collective(rank=rank, kind=kind, name=name.split("(")[0], start=iv[0], end=iv[1],
                      in_bytes=n_in * size if size and isinstance(n_in, int) else None,
                      out_bytes=n_out * size if size and isinstance(n_out, int) else None,
                      dtype=args.get("dtype"), group_size=gsize, pg_name=args.get("Process Group Name"),
                      ranks=tuple(ranks) if ranks else None, group=group)


def _cpu_intervals(events, thread_names, rank, groups, fsdp_dims, top):
    """gloo traces: comm = gloo:* work on gloo's threads; compute = leaf CPU ops of the other threads."""
    gloo_threads = {k for k, v in thread_names.items() if "gloo" in v.lower()}
    gloo_threads |= {(e.get("pid"), e.get("tid")) for e in events if e.get("name", "").startswith("gloo:")}
    by_thread: dict = defaultdict(list)
    gloo_events, c10d_ops, fsdp_spans = [], [], []
    for e in events:
        key = (e.get("pid"), e.get("tid"))
        name = e.get("name", "")
        s = _ns(e["ts"])
        iv = (s, s + _ns(e.get("dur", 0)))
        if name.startswith("gloo:"):
            gloo_events.append((iv, e))
            continue
        if key in gloo_threads:
            continue
        if name.startswith("FSDP::") and e.get("cat") == "user_annotation":
            fsdp_spans.append(iv)
        if e.get("cat") != "cpu_op":
            continue
        if name.startswith(("c10d::", "_c10d_functional::", "c10d_functional::")):
            c10d_ops.append((iv, e))
        by_thread[key].append((iv, name))
    comp = []
    for evs in by_thread.values():
        evs.sort(key=lambda x: (x[0][0], -(x[0][1] - x[0][0])))
        stack: list[list] = []  # [interval, name, children ns, has child]; leaves are the CPU's kernels

        def pop():
            (s, e), nm, _, has_child = stack.pop()
            if has_child or _is_comm_or_wait(nm):
                return  # a wrapper's own time is interpreter overhead or a wait, not compute
            comp.append((s, e))
            t = top[(nm, "compute")]
            t[0] += 1
            t[1] += e - s

        for iv, nm in evs:
            while stack and iv[0] >= stack[-1][0][1]:
                pop()
            if stack:
                stack[-1][2] += iv[1] - iv[0]
                stack[-1][3] = True
            stack.append([iv, nm, 0, False])
        while stack:
            pop()
    comm = merge(iv for iv, _ in gloo_events)
    colls = _pair_gloo(rank, gloo_events, c10d_ops, fsdp_spans, groups, fsdp_dims)
    for (iv, e) in gloo_events:
        t = top[(e.get("name", ""), "comm")]
        t[0] += 1
        t[1] += iv[1] - iv[0]
    return merge(comp), comm, colls


def _c10d_expect(e) -> tuple[str, int | None, int | None, int | None]:
    """(kind, elements gloo works on, in elements, out elements) of a c10d op, where the dims say."""
    a = e.get("args") or {}
    kind = op_kind(e.get("name", ""))
    dims = a.get("Input Dims") or []
    first = _numel(dims[0]) if len(dims) > 0 else None
    second = _numel(dims[1]) if len(dims) > 1 else None
    name = e.get("name", "")
    if kind == "all_gather" and ("base" in name or "allgather_into_tensor" in name):
        return kind, second, second, first  # (output, input, ...)
    if kind == "reduce_scatter" and ("base" in name or "reduce_scatter_tensor" in name):
        return kind, second, second, first  # gloo reduces the whole input
    if kind in ("all_reduce", "broadcast"):
        return kind, first, first, first
    return kind, None, None, None


_GLOO_FOR = {"all_gather": "all_gather", "reduce_scatter": "all_reduce", "all_reduce": "all_reduce",
             "broadcast": "broadcast", "all_to_all": "all_to_all", "barrier": "barrier", "send": "send",
             "recv": "recv", "reduce": "reduce", "gather": "gather", "scatter": "scatter"}


def _pair_gloo(rank, gloo_events, c10d_ops, fsdp_spans, groups, fsdp_dims) -> list[Collective]:
    """Pair each gloo:* event with the c10d op that queued it (same kind and size, issued before it,
    first come first served) to learn the logical op and its sizes; infer the group from sizes."""
    pending = sorted(((iv, e) + _c10d_expect(e) for iv, e in c10d_ops), key=lambda x: x[0][0])
    used = [False] * len(pending)
    fsdp_spans = merge(fsdp_spans)
    out = []
    for iv, e in sorted(gloo_events, key=lambda x: x[0][0]):
        a = e.get("args") or {}
        gkind = op_kind(e.get("name", ""))
        dims = a.get("Input Dims") or []
        numel = _numel(dims[0]) if dims else None
        dtype = (a.get("Input type") or [None])[0]
        size = dtype_bytes(dtype)
        match = None
        for i, (civ, ce, kind, g_el, n_in, n_out) in enumerate(pending):
            if used[i] or civ[0] > iv[0]:
                continue
            if _GLOO_FOR.get(kind) == gkind and (g_el is None or g_el == numel):
                match = i
                break
        kind, n_in, n_out, issued = gkind, numel, numel, None
        if match is not None:
            used[match] = True
            civ, ce, kind, _, m_in, m_out = pending[match]
            n_in, n_out, issued = m_in or numel, m_out or numel, civ
        gsize = None
        if n_in and n_out and kind == "all_gather":
            gsize = n_out // n_in
        elif n_in and n_out and kind == "reduce_scatter":
            gsize = n_in // n_out
        in_fsdp = issued is not None and bool(clip(fsdp_spans, issued[0], max(issued[1], issued[0] + 1)))
        group, ranks = _infer_group(gsize, in_fsdp, groups, fsdp_dims)
        if gsize is None and ranks:
            gsize = len(ranks)
        out.append(Collective(rank=rank, kind=kind, name=e.get("name", ""), start=iv[0], end=iv[1],
                              in_bytes=n_in * size if size and n_in else None,
                              out_bytes=n_out * size if size and n_out else None, dtype=dtype,
                              group_size=gsize, pg_name=None, ranks=ranks, group=group))
    return out


def _infer_group(gsize, in_fsdp, groups, fsdp_dims) -> tuple[str, tuple[int, ...] | None]:
    if not groups:
        return (f"size {gsize}" if gsize else "?"), None
    cands = dims_of_size(gsize, groups) if gsize else [n for n in MESH_DIMS + tuple(FLATTENED)
                                                         if len(groups.get(n, ())) > 1]
    if in_fsdp:
        # FSDP's collectives run on the (flattened) shard dim; the same set may carry another name
        fsdp = [d for d in fsdp_dims if len(groups.get(d, ())) > 1 and (gsize is None or len(groups[d]) == gsize)]
        if fsdp:
            return label_group(groups[fsdp[0]], groups) or fsdp[0], groups[fsdp[0]]
    distinct = {groups[c] for c in cands}
    if len(distinct) == 1:
        return cands[0], groups[cands[0]]
    if cands:
        return "|".join(cands) + " (ambiguous)", None
    return (f"size {gsize}" if gsize else "?"), None


# ---------------------------------------------------------------------------------------------
# across ranks


def _fmt_ranks(r):
    return list(r) if r else None


P2P = ("send", "recv")


def match_collectives(traces: list[RankTrace]) -> dict[tuple, list[Collective]]:
    """The same collective on every rank of its group: keyed by (group ranks or label, kind, i-th
    occurrence on that group). All ranks of a group issue its collectives in the same order.
    Point-to-point transfers stay unmatched (one rank each): they do not synchronise a group.
    Collectives outside the profiled steps are left out."""
    matched: dict[tuple, list[Collective]] = defaultdict(list)
    for t in traces:
        seq: dict[tuple, int] = defaultdict(int)
        for c in sorted(t.collectives, key=lambda c: c.start):
            if c.step is None:
                continue
            gkey = (("p2p", c.rank), c.kind) if c.kind in P2P else (c.ranks or (c.group,), c.kind)
            matched[gkey + (seq[gkey],)].append(c)
            seq[gkey] += 1
    return matched


def analyze(traces: list[RankTrace], steps_info: dict[int, dict] | None = None) -> dict:
    """The summary (JSON-ready; seconds) of all ranks' parsed traces."""
    traces = sorted(traces, key=lambda t: t.rank)
    ns = 1e-9
    rows, per_rank = [], []
    for t in traces:
        bds = [breakdown(k, s, e, t.comp, t.comm, t.mem) for k, s, e in t.steps]
        for b in bds:
            rows.append({"rank": t.rank, "step": b.step, "step_s": b.span * ns, "compute_s": b.compute * ns,
                         "comm_s": b.comm * ns, "overlap_s": b.overlap * ns,
                         "overlap_pct": 100.0 * b.overlap / b.comm if b.comm else None,
                         "exposed_comm_s": b.exposed * ns, "mem_s": b.mem * ns,
                         "exposed_mem_s": b.mem_exposed * ns, "idle_s": b.idle * ns})
        n = max(len(bds), 1)
        comm = sum(b.comm for b in bds)
        per_rank.append({"rank": t.rank, "steps": len(bds), "step_s": sum(b.span for b in bds) / n * ns,
                         "compute_s": sum(b.compute for b in bds) / n * ns, "comm_s": comm / n * ns,
                         "overlap_pct": 100.0 * sum(b.overlap for b in bds) / comm if comm else None,
                         "exposed_comm_s": sum(b.exposed for b in bds) / n * ns,
                         "mem_s": sum(b.mem for b in bds) / n * ns,
                         "exposed_mem_s": sum(b.mem_exposed for b in bds) / n * ns,
                         "idle_s": sum(b.idle for b in bds) / n * ns,
                         "collective_wait_s": 0.0})
    by_rank = {r["rank"]: r for r in per_rank}

    # collectives matched over ranks: transfer time (min over ranks) and each rank's wait
    matched = match_collectives(traces)
    table: dict[tuple, dict] = {}
    wait_ns: dict[int, int] = defaultdict(int)
    arrived_last: dict[int, int] = defaultdict(int)
    for key, cs in matched.items():
        fastest = min(c.dur for c in cs)
        complete = len(cs) == (cs[0].group_size or len(cs)) and len(cs) > 1
        if complete:
            for c in cs:
                wait_ns[c.rank] += c.dur - fastest
            arrived_last[max(cs, key=lambda c: c.start).rank] += 1
        for c in cs:
            row_key = (c.kind, c.group, c.group_size, c.dtype, c.bytes, c.in_bytes, c.out_bytes)
            r = table.setdefault(row_key, {"calls": 0, "dur": 0, "transfer": 0, "ranks": set()})
            r["calls"] += 1
            r["dur"] += c.dur
            r["transfer"] += fastest
            r["ranks"].add(c.rank)
    collectives = []
    for (kind, group, gsize, dtype, nbytes, in_b, out_b), r in table.items():
        nr = len(r["ranks"])
        mean_s = r["dur"] / r["calls"] * ns
        transfer_s = r["transfer"] / r["calls"] * ns
        algbw = nbytes / transfer_s / 1e9 if nbytes and transfer_s > 0 else None
        collectives.append({
            "op": kind, "group": group, "group_size": gsize, "dtype": dtype, "bytes": nbytes,
            "in_bytes": in_b, "out_bytes": out_b, "ranks": nr, "count_per_rank": r["calls"] / nr,
            "total_s_per_rank": r["dur"] / nr * ns, "mean_s": mean_s, "transfer_s": transfer_s,
            "wait_s": mean_s - transfer_s, "algbw_gbps": algbw,
            "busbw_gbps": algbw * busbw_factor(kind, gsize or 1) if algbw is not None and gsize else None})
    collectives.sort(key=lambda r: -r["total_s_per_rank"])
    n_steps = max(statistics.mean(r["steps"] for r in per_rank), 1) if per_rank else 1
    by_group: dict[str, dict] = {}
    for c in collectives:
        g = by_group.setdefault(str(c["group"]), {"comm_s_per_step": 0.0, "transfer_s_per_step": 0.0,
                                                  "bytes_per_step": 0, "calls_per_step": 0.0})
        g["comm_s_per_step"] += c["total_s_per_rank"] / n_steps
        g["transfer_s_per_step"] += c["transfer_s"] * c["count_per_rank"] / n_steps
        g["bytes_per_step"] += (c["bytes"] or 0) * c["count_per_rank"] / n_steps
        g["calls_per_step"] += c["count_per_rank"] / n_steps
    for rk, w in wait_ns.items():
        if rk in by_rank:
            by_rank[rk]["collective_wait_s"] = w / max(by_rank[rk]["steps"], 1) * ns

    # skew and stragglers
    skew: dict = {}
    if per_rank:
        slow = max(per_rank, key=lambda r: r["step_s"])
        fast = min(per_rank, key=lambda r: r["step_s"])
        med = statistics.median(r["step_s"] for r in per_rank)
        skew = {"step_s_by_rank": {str(r["rank"]): r["step_s"] for r in per_rank},
                "slowest_rank": slow["rank"], "fastest_rank": fast["rank"],
                "slowest_minus_fastest_s": slow["step_s"] - fast["step_s"],
                "slowest_over_median_pct": 100.0 * (slow["step_s"] / med - 1) if med else None,
                "busy_s_by_rank": {str(r["rank"]): r["step_s"] - r["idle_s"] for r in per_rank},
                "collective_wait_s_by_rank": {str(r["rank"]): r["collective_wait_s"] for r in per_rank},
                "arrived_last_by_rank": {str(r["rank"]): arrived_last.get(r["rank"], 0) for r in per_rank},
                "straggler": None}
        if len(per_rank) > 1 and any(wait_ns.values()):
            # the rank the others wait for waits least itself (TraceLens); by how much per step
            least = min(per_rank, key=lambda r: r["collective_wait_s"])
            others = [r["collective_wait_s"] for r in per_rank if r is not least]
            skew["straggler"] = {"rank": least["rank"], "basis": "least wait inside collectives",
                                 "others_wait_more_by_s_per_step": statistics.mean(others) - least["collective_wait_s"],
                                 "arrived_last": arrived_last.get(least["rank"], 0),
                                 "matched_collectives": sum(1 for cs in matched.values() if len(cs) > 1)}

    # top kernels / ops
    agg: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for t in traces:
        for k, (cnt, tot) in t.top.items():
            agg[k][0] += cnt
            agg[k][1] += tot
    nr = max(len(traces), 1)
    grand = sum(tot for (_, kind), (_, tot) in agg.items() if kind == "compute") or 1
    top = [{"name": name, "kind": kind, "count_per_rank": cnt / nr, "total_s_per_rank": tot / nr * ns,
            "mean_s": tot / cnt * ns if cnt else 0.0,
            "pct_of_compute": 100.0 * tot / grand if kind == "compute" else None}
           for (name, kind), (cnt, tot) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:25]]

    def mean(key):
        vals = [r[key] for r in per_rank if r[key] is not None]
        return statistics.mean(vals) if vals else None

    gaps = idle_gap_summary(traces)

    comm_all = sum(r["comm_s"] * r["steps"] for r in per_rank)
    overlap_all = sum(x["overlap_s"] for x in rows)
    totals = {k: mean(k) for k in ("step_s", "compute_s", "comm_s", "exposed_comm_s", "mem_s", "exposed_mem_s", "idle_s",
                                   "collective_wait_s")}
    totals["overlap_pct"] = 100.0 * overlap_all / comm_all if comm_all else None
    over = overhead(steps_info or {})
    estimate = unprofiled_estimate(per_rank, over)
    return {"mode": traces[0].mode if traces else None, "ranks": [t.rank for t in traces],
            "steps_per_rank": {str(t.rank): [k for k, _, _ in t.steps] for t in traces},
            "totals": totals, "per_rank": per_rank, "steps": rows, "collectives": collectives,
            "comm_by_group": by_group, "skew": skew,
            "top": top, "idle_gaps": gaps, "overhead": over, "unprofiled_estimate": estimate,
            "overhead_hint": overhead_hint(over, estimate)}


def idle_gap_summary(traces: list[RankTrace], largest: int = 10) -> dict | None:
    """The ranks' idle gaps (GPU traces) per step: summed by cause and host op, and the largest ones."""
    if not traces or traces[0].mode != "gpu":
        return None
    n_steps = sum(len(t.steps) for t in traces) or 1
    by: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    every = []
    for t in traces:
        for g in t.gaps:
            row = by[(g["cause"], g["where"])]
            row[0] += 1
            row[1] += g["dur_s"]
            every.append(dict(g, rank=t.rank))
    edge = sum(g["dur_s"] for g in every if g["cause"] in EDGE_CAUSES)
    return {"min_gap_s": MIN_GAP_NS * 1e-9,
            "gaps_s_per_step": sum(g["dur_s"] for g in every) / n_steps,
            "inside_s_per_step": (sum(g["dur_s"] for g in every) - edge) / n_steps,
            "edges_s_per_step": edge / n_steps,
            "by_cause": [{"cause": c, "where": w, "count_per_step": n / n_steps, "total_s_per_step": d / n_steps}
                         for (c, w), (n, d) in sorted(by.items(), key=lambda kv: -kv[1][1])],
            "largest": sorted(every, key=lambda g: -g["dur_s"])[:largest]}


def unprofiled_estimate(per_rank: list[dict], over: dict) -> dict | None:
    """The breakdown of the *unprofiled* step, estimated. The profiler adds host time per op (about
    3 us a kernel on an H200, docs/OBSERVABILITY.md): on a launch-bound step the GPU waits for it,
    so it shows up as idle time, or, on the other ranks of a collective, as time waiting inside the
    collective. Kernel durations themselves are GPU-side and unchanged. So the extra step time
    (profiled minus unprofiled wall time, per rank) is taken out of idle first, then out of the
    collective waits (and with them out of exposed communication). None without an overhead
    baseline."""
    ranks = (over or {}).get("per_rank") or {}
    rows = []
    for r in per_rank:
        o = ranks.get(str(r["rank"])) or {}
        base, prof = o.get("baseline_step_s"), o.get("profiled_step_s")
        if base is None or prof is None:
            continue
        extra = max(0.0, prof - base)
        idle = max(0.0, r["idle_s"] - extra)
        rest = extra - (r["idle_s"] - idle)
        wait = r.get("collective_wait_s") or 0.0
        wait_left = max(0.0, wait - rest)
        rows.append({"rank": r["rank"], "step_s": base, "profiler_extra_s": extra, "compute_s": r["compute_s"],
                     "exposed_comm_s": max(0.0, r["exposed_comm_s"] - (wait - wait_left)), "idle_s": idle,
                     "collective_wait_s": wait_left,
                     "unexplained_s": max(0.0, rest - wait)})  # extra time neither idle nor waits absorb
    if not rows:
        return None
    keys = ("step_s", "profiler_extra_s", "compute_s", "exposed_comm_s", "idle_s", "collective_wait_s", "unexplained_s")
    return {"totals": {k: statistics.mean(x[k] for x in rows) for k in keys}, "per_rank": rows,
            "method": "profiled breakdown minus the profiler's extra step time (profiled - unprofiled wall "
                      "time), taken from idle first, then from time waiting inside collectives"}


OVERHEAD_GOAL_PCT = 3.0  # issue 6: tracing may cost at most this much step time
HOST_PACED_SHARE = 0.05  # the unprofiled GPU waits on the host this share of the step or more


def overhead_hint(over: dict, estimate: dict | None) -> str | None:
    """One line for a trace whose profiler overhead exceeds the goal: whether the step is paced by
    the host (then the profiler's per-op host cost lands on the step in full, and the figure to read
    is the unprofiled estimate), and what makes such a step GPU-bound. None within the goal."""
    pct = (over or {}).get("overhead_pct")
    if pct is None or pct <= OVERHEAD_GOAL_PCT or not estimate:
        return None
    u = estimate["totals"]
    waiting = u["idle_s"] + u["collective_wait_s"]
    if u["step_s"] <= 0 or waiting / u["step_s"] < HOST_PACED_SHARE:
        return (f"profiler overhead {pct:+.1f}% on a step whose GPU is busy (estimated): "
                "the breakdown is distorted by it; compare with the unprofiled estimate")
    return (f"host-paced step: unprofiled, the GPU waits {1e3 * waiting:.0f} of {1e3 * u['step_s']:.0f} ms "
            "(idle, and inside collectives for a slower rank; estimated), and the profiler's per-op host "
            f"cost lengthens such a step ({pct:+.1f}%); read the unprofiled estimate. A GPU-bound "
            "configuration traces within 3% (train.compile=true, a larger train.micro_batch_size: "
            "7B TP2+SP went from +43% to +0.4%, docs/OBSERVABILITY.md)")


def overhead(steps_info: dict[int, dict]) -> dict:
    """Profiler overhead from the steps files: median wall time of the profiled (active) steps over
    that of the unprofiled ones (wait steps after the first, and the steps after the window)."""
    per_rank = {}
    for rank, info in sorted(steps_info.items()):
        steps = info.get("steps") or []
        base = [s["wall_s"] for s in steps if (s["phase"] == "wait" and s["index"] > 0) or s["phase"] == "after"]
        prof = [s["wall_s"] for s in steps if s["phase"] == "active"]
        entry = {"baseline_step_s": statistics.median(base) if base else None,
                 "profiled_step_s": statistics.median(prof) if prof else None,
                 "baseline_steps": len(base), "profiled_steps": len(prof), "export_s": info.get("export_s")}
        entry["overhead_pct"] = (100.0 * (entry["profiled_step_s"] / entry["baseline_step_s"] - 1)
                                 if base and prof and entry["baseline_step_s"] > 0 else None)
        per_rank[str(rank)] = entry
    vals = [e["overhead_pct"] for e in per_rank.values() if e["overhead_pct"] is not None]
    return {"overhead_pct": statistics.median(vals) if vals else None,
            "method": "median step wall time, profiled (active) steps vs unprofiled steps of the same run "
                      "(first step excluded); trace export time excluded and given separately",
            "per_rank": per_rank}


# ---------------------------------------------------------------------------------------------
# a run's trace directory


def _rank_of(path: Path) -> int | None:
    m = re.match(r"rank(\d+)\.json(\.gz)?$", path.name)
    return int(m.group(1)) if m else None


def analyze_dir(trace_dir: str | Path, mesh_sizes: dict[str, int] | None = None) -> dict:
    """Analyse RUN_DIR/trace (rank{R}.json[.gz] + rank{R}.steps.json); the layout comes from
    ``mesh_sizes``, else the steps files, else RUN_DIR/spec.json."""
    trace_dir = Path(trace_dir)
    files = sorted((p for p in trace_dir.iterdir() if _rank_of(p) is not None), key=_rank_of)
    if not files:
        raise FileNotFoundError(f"no rank*.json[.gz] traces in {trace_dir}")
    steps_info = {}
    for p in trace_dir.glob("rank*.steps.json"):
        info = json.loads(p.read_text())
        steps_info[int(info["rank"])] = info
    world = max([len(files)] + [int(i.get("world_size") or 0) for i in steps_info.values()])
    if not mesh_sizes:
        mesh_sizes = next((i["mesh_sizes"] for i in steps_info.values() if i.get("mesh_sizes")), None)
    spec_file = trace_dir.parent / "spec.json"
    if not mesh_sizes and spec_file.is_file():
        mesh_sizes = resolve_mesh_sizes(json.loads(spec_file.read_text()).get("parallel", {}), world)
    traces = []
    for p in files:
        rank = _rank_of(p)
        groups = mesh_groups(mesh_sizes, rank) if mesh_sizes and math.prod(mesh_sizes.values()) > rank else {}
        traces.append(parse_rank(load_trace(p), rank, groups))
    out = analyze(traces, steps_info)
    hosts = {i.get("host") for i in steps_info.values()} | {t.host for t in traces if t.host}
    out.update({"trace_dir": str(trace_dir), "world_size": world, "mesh_sizes": mesh_sizes,
                "hosts": sorted(h for h in hosts if h)})
    if len(out["hosts"]) > 1:
        out["note"] = ("ranks ran on several hosts: their clocks are not aligned, so only durations "
                       "(not start times) are compared across ranks")
    return out
