"""Idle gaps of GPU traces: every stretch of a profiled step where no kernel, copy or collective runs
on the GPU, at least ``MIN_GAP_NS`` long, with its cause read off the host's timeline.

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
  launch-bound step keeps its real head idle. The first profiled step's head is ``start of step``
  whole: no earlier step is in the trace, and the profiler switches itself on there
  (docs/OBSERVABILITY.md). Host work between the last kernel and that sync is ``late launch``,
  where = the ops open halfway through it. A step without a kernel is ``no kernel in the step``,
  no edge. Edges are summed apart from the gaps inside the step.

``where``: the innermost host ops at the sync or at the launch.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict

from trainperf.trace.events import is_step_span, span_of, thread_of
from trainperf.trace.intervals import Interval, holes

MIN_GAP_NS = 50_000  # gaps shorter than 50 us are launch jitter, not a cause worth a row
EDGE_CAUSES = ("start of step", "end of step")  # the trace's own waits at each step's edges
_RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
_STACK_CATS = ("cpu_op", "user_annotation")

Activity = tuple[int, int, str, object]  # (start, end, name, correlation) of one GPU activity
Cause = tuple[str, list[str]]  # (cause, host stack)


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
    inner = [n for n in stack if not is_step_span(n)][-2:]
    return " > ".join(inner) if inner else "(no op open)"


class HostTimeline:
    """What the host did: each launch's time and thread (by correlation id), the blocking runtime
    calls, and every thread's op stack."""

    def __init__(self, events: list[dict]):
        self.launches: dict = {}
        self.syncs: list[tuple[Interval, tuple, str]] = []
        per_thread: dict = defaultdict(list)
        for e in events:
            cat, iv, key, name = e.get("cat"), span_of(e), thread_of(e), e.get("name", "")
            if cat in _RUNTIME_CATS:
                corr = (e.get("args") or {}).get("correlation")
                if corr is not None:
                    self.launches[corr] = (iv[0], key)
                if _is_host_sync(name):
                    self.syncs.append((iv, key, name))
            elif cat in _STACK_CATS:
                per_thread[key].append((iv[0], iv[1], name))
        self.stacks = {k: _Stacks(v) for k, v in per_thread.items()}

    def ops_at(self, key, ts: int) -> list[str]:
        return self.stacks[key].at(ts) if key in self.stacks else []

    def is_bare(self, iv: Interval, key) -> bool:
        """A synchronize called with no op open but the step's own span: the trace's own wait."""
        ops = self.ops_at(key, iv[0])
        return bool(ops) and all(is_step_span(n) for n in ops)

    def launch_stack(self, activity: Activity | None) -> list[str]:
        """The host ops open where ``activity`` was launched; [] where the launch is not in the trace."""
        launch = self.launches.get(activity[3]) if activity is not None else None
        return self.ops_at(launch[1], launch[0]) if launch else []

    def bare_syncs_in(self, g0: int, g1: int) -> list[tuple[Interval, tuple, str]]:
        return [(iv, key, name) for iv, key, name in self.syncs if iv[0] < g1 and iv[1] > g0 and self.is_bare(iv, key)]

    def sync_leads(self, steps) -> dict[int, int]:
        """{k: length of the trace's own sync in step k (the last bare one starting inside it)}: how far
        ahead of the GPU the host would have entered the next step had it not waited."""
        lead = {}
        for k, lo, hi in steps:
            own = [iv for iv, key, _ in self.syncs if lo <= iv[0] < hi and self.is_bare(iv, key)]
            if own:
                lead[k] = max(own)[1] - max(own)[0]
        return lead

    def classify(self, g0: int, g1: int, after: Activity | None, skip_bare: bool = False) -> Cause:
        """The cause of the gap [g0, g1) before GPU activity ``after``. A sync is the cause when the host
        waited in it for the GPU to run dry (it began before the gap: the queue was empty when it
        returned) or sat in it for half the gap or more; an event sync that returns at once inside
        host work (its step long finished) is not."""
        blocking = [(iv, key, name) for iv, key, name in self.syncs if iv[0] < g1 and iv[1] > g0
                    and (iv[0] <= g0 or 2 * (min(iv[1], g1) - max(iv[0], g0)) >= g1 - g0)
                    and not (skip_bare and self.is_bare(iv, key))]
        if blocking:
            iv, key, name = max(blocking, key=lambda b: min(b[0][1], g1) - max(b[0][0], g0))
            return "host sync", self.ops_at(key, iv[0]) + [name]
        if after is None:
            return "end of step", []
        launch = self.launches.get(after[3])
        if launch is None:
            return "dependency", []
        return ("late launch" if launch[0] > g0 else "dependency"), self.ops_at(launch[1], launch[0])


class DeviceTimeline:
    """The GPU's activities in start order, and in end order for "what ran before"."""

    def __init__(self, device: list[Activity]):
        self.device = sorted(device)
        self.starts = [d[0] for d in self.device]
        self.ends = sorted((d[1], d[2]) for d in self.device)
        self.end_times = [x[0] for x in self.ends]

    def first_from(self, ts: int) -> Activity | None:
        """The first activity starting at or after ``ts``: the one that ends a gap there."""
        i = bisect_left(self.starts, ts)
        return self.device[i] if i < len(self.device) else None

    def last_ended_by(self, ts: int) -> str | None:
        j = bisect_right(self.end_times, ts) - 1
        return self.ends[j][1] if j >= 0 else None


Piece = tuple[int, int, str, list[str]]  # (start, end, cause, host stack) of one attributed gap


def _whole_step(host: HostTimeline, g0: int, g1: int, after) -> list[Piece]:
    """No kernel in the whole step: no edge of the trace's."""
    cause, stack = host.classify(g0, g1, after, skip_bare=True)
    return [(g0, g1, cause if cause == "host sync" else "no kernel in the step", stack)]


def _head(host: HostTimeline, g0: int, g1: int, after, prev_lead: int | None) -> list[Piece]:
    """The step's head: hidden behind the previous step's lead, when that step was in the trace."""
    edge = min(g1 - g0, prev_lead) if prev_lead is not None else g1 - g0
    return [(g0, g0 + edge, "start of step", host.launch_stack(after)),
            (g0 + edge, g1, *host.classify(g0 + edge, g1, after))]


def _tail(host: HostTimeline, g0: int, g1: int, after, bare_syncs) -> list[Piece]:
    """The step's tail: the trace's own sync from its start; before it, what the host worked on."""
    (s0, _), key, name = max(bare_syncs)
    pieces = []
    if s0 > g0:
        cause, stack = host.classify(g0, s0, after)
        if cause != "host sync":  # the GPU ran dry while the host worked on what was open then
            cause, stack = "late launch", host.ops_at(key, (g0 + s0) // 2)
        pieces.append((g0, s0, cause, stack))
    pieces.append((max(g0, s0), g1, "end of step", host.ops_at(key, s0) + [name]))
    return pieces


def _attribute(host: HostTimeline, lo: int, hi: int, g0: int, g1: int, after, prev_lead: int | None) -> list[Piece]:
    if g0 == lo and g1 == hi:
        return _whole_step(host, g0, g1, after)
    if g0 == lo:
        return _head(host, g0, g1, after, prev_lead)
    bare_syncs = host.bare_syncs_in(g0, g1) if g1 == hi else []
    if bare_syncs:
        return _tail(host, g0, g1, after, bare_syncs)
    return [(g0, g1, *host.classify(g0, g1, after))]


def idle_gaps(steps, busy: list[Interval], device: list[Activity], events: list[dict]) -> list[dict]:
    """Every idle gap of at least MIN_GAP_NS in the profiled ``steps`` ((k, start, end) ns) outside
    the merged ``busy`` intervals, split at the step's edges and attributed (the module's docstring)."""
    host, gpu = HostTimeline(events), DeviceTimeline(device)
    lead, traced = host.sync_leads(steps), {k for k, _, _ in steps}
    out = []
    for k, lo, hi in steps:
        prev_lead = lead.get(k - 1, 0) if k - 1 in traced else None
        for g0, g1 in holes(busy, lo, hi):
            if g1 - g0 < MIN_GAP_NS:
                continue
            after = gpu.first_from(g1)
            for p0, p1, cause, stack in _attribute(host, lo, hi, g0, g1, after, prev_lead):
                if p1 - p0 > 0:
                    out.append({"step": k, "start_ns": p0, "offset_s": (p0 - lo) * 1e-9, "dur_s": (p1 - p0) * 1e-9,
                                "cause": cause, "where": _where(stack), "stack": stack[-4:],
                                "before": gpu.last_ended_by(p0), "after": after[2] if after else None})
    return out


def idle_gap_summary(traces, largest: int = 10) -> dict | None:
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
