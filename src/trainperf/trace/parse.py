"""One rank's Chrome trace reduced to a ``RankTrace``: its profiled steps, the merged compute /
communication / memory intervals, its collectives, op totals and (GPU) idle gaps.

GPU traces: compute = kernels that are not NCCL, comm = NCCL kernels, mem = memcpy/memset. Every NCCL
kernel carries its metadata in its args (Collective name, In/Out msg nelems, dtype, Group size,
Process Group Name/Description/Ranks -- checked on torch 2.11 + NCCL 2.28).
CPU traces (gloo): compute = the leaf CPU ops of the training threads (the CPU's "kernels"), comm =
the gloo:* work on gloo's threads. gloo events carry none of the metadata, so each is paired with the
``c10d::*`` op that issued it (kind, element count, issue order), and its group is inferred from the sizes.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field

from trainperf.trace.collectives import Collective, dtype_bytes, op_kind
from trainperf.trace.events import profiled_steps, span_of, step_of, thread_of
from trainperf.trace.gaps import idle_gaps
from trainperf.trace.groups import FSDP_DIMS, Groups, infer_group, label_group
from trainperf.trace.intervals import Interval, clip, merge, union

_COMM_CPU_PREFIXES = ("c10d::", "_c10d_functional::", "c10d_functional::", "record_param_comms", "gloo:", "nccl:")
_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")

Top = dict[tuple[str, str], list[int]]  # (name, kind) -> [count, total ns]


@dataclass
class RankTrace:
    rank: int
    mode: str  # "gpu" | "cpu"
    steps: list[tuple[int, int, int]]  # (k, start ns, end ns)
    comp: list[Interval]
    comm: list[Interval]
    mem: list[Interval]
    collectives: list[Collective]
    top: Top
    host: str | None = None
    distributed: dict = field(default_factory=dict)
    gaps: list[dict] = field(default_factory=list)  # GPU traces: idle gaps >= MIN_GAP_NS, attributed


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


def _is_comm_or_wait(name: str) -> bool:
    return name.startswith(_COMM_CPU_PREFIXES) or "wait" in name.lower()


def _count(top: Top, key: tuple[str, str], iv: Interval) -> None:
    t = top[key]
    t[0] += 1
    t[1] += iv[1] - iv[0]


def parse_rank(trace: dict, rank: int | None = None, groups: Groups | None = None,
               fsdp_dims: tuple[str, ...] = FSDP_DIMS) -> RankTrace:
    """Reduce one rank's Chrome trace to intervals, collectives and op totals."""
    info = trace.get("distributedInfo") or {}
    rank = int(info.get("rank", 0)) if rank is None else rank
    pg_ranks = {str(p.get("pg_name")): tuple(p.get("ranks") or []) for p in info.get("pg_config") or []}
    groups = groups or {}
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    steps = profiled_steps(events)
    gpu = any(e.get("cat") == "kernel" for e in events)
    top: Top = defaultdict(lambda: [0, 0])
    gaps: list[dict] = []
    if gpu:
        comp, comm, mem, colls, device = _gpu_intervals(events, rank, pg_ranks, groups, top)
        gaps = idle_gaps(steps, union(union(comp, comm), mem), device, events)
    else:
        thread_names = {thread_of(e): (e.get("args") or {}).get("name", "") for e in trace.get("traceEvents", [])
                        if e.get("ph") == "M" and e.get("name") == "thread_name"}
        comp, comm, colls = _cpu_intervals(events, thread_names, rank, groups, fsdp_dims, top)
        mem = []
    for c in colls:
        c.step = step_of(c.start, steps)
    return RankTrace(rank=rank, mode="gpu" if gpu else "cpu", steps=steps, comp=comp, comm=comm, mem=mem,
                     collectives=colls, top=dict(top), host=trace.get("host_name"), distributed=info, gaps=gaps)


def _gpu_intervals(events, rank, pg_ranks, groups, top):
    """GPU traces: (compute, comm, mem merged; the NCCL collectives; every GPU activity for idle gaps)."""
    comp, comm, mem, colls = [], [], [], []
    device: list[tuple[int, int, str, object]] = []  # (start, end, name, correlation) of every GPU activity
    for e in events:
        cat = e.get("cat")
        if cat not in _GPU_CATS:
            continue
        iv = span_of(e)
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
        _count(top, (name, kind), iv)
    return merge(comp), merge(comm), merge(mem), colls, device


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


def _split_cpu_events(events, gloo_threads):
    """(gloo events, c10d ops, FSDP spans, {thread: [(interval, name)] of the training threads' CPU ops})."""
    by_thread: dict = defaultdict(list)
    gloo_events, c10d_ops, fsdp_spans = [], [], []
    for e in events:
        key = thread_of(e)
        name = e.get("name", "")
        iv = span_of(e)
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
    return gloo_events, c10d_ops, fsdp_spans, by_thread


def _leaf_ops(evs: list[tuple[Interval, str]], top: Top) -> list[Interval]:
    """The leaf ops of one thread (the CPU's kernels), counted in ``top``; a wrapper's own time is
    interpreter overhead or a wait, not compute."""
    comp = []
    evs.sort(key=lambda x: (x[0][0], -(x[0][1] - x[0][0])))
    stack: list[list] = []  # [interval, name, children ns, has child]

    def pop():
        iv, nm, _, has_child = stack.pop()
        if has_child or _is_comm_or_wait(nm):
            return
        comp.append(iv)
        _count(top, (nm, "compute"), iv)

    for iv, nm in evs:
        while stack and iv[0] >= stack[-1][0][1]:
            pop()
        if stack:
            stack[-1][2] += iv[1] - iv[0]
            stack[-1][3] = True
        stack.append([iv, nm, 0, False])
    while stack:
        pop()
    return comp


def _cpu_intervals(events, thread_names, rank, groups, fsdp_dims, top):
    """gloo traces: comm = gloo:* work on gloo's threads; compute = leaf CPU ops of the other threads."""
    gloo_threads = {k for k, v in thread_names.items() if "gloo" in v.lower()}
    gloo_threads |= {thread_of(e) for e in events if e.get("name", "").startswith("gloo:")}
    gloo_events, c10d_ops, fsdp_spans, by_thread = _split_cpu_events(events, gloo_threads)
    comp = [iv for evs in by_thread.values() for iv in _leaf_ops(evs, top)]
    comm = merge(iv for iv, _ in gloo_events)
    colls = _pair_gloo(rank, gloo_events, c10d_ops, fsdp_spans, groups, fsdp_dims)
    for (iv, e) in gloo_events:
        _count(top, (e.get("name", ""), "comm"), iv)
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
        group, ranks = infer_group(gsize, in_fsdp, groups, fsdp_dims)
        if gsize is None and ranks:
            gsize = len(ranks)
        out.append(Collective(rank=rank, kind=kind, name=e.get("name", ""), start=iv[0], end=iv[1],
                              in_bytes=n_in * size if size and n_in else None,
                              out_bytes=n_out * size if size and n_out else None, dtype=dtype,
                              group_size=gsize, pg_name=None, ranks=ranks, group=group))
    return out
