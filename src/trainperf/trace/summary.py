"""Across ranks: the trace summary of a run (``TraceSummary``; its ``to_dict()`` is
trace_summary.json): per-step and per-rank breakdowns, the collective table and communication per
parallel dim, rank skew and the straggler, top kernels/ops, idle gaps, and the profiler's overhead.
Times in the summary are seconds. Ranks on several hosts have unaligned clocks, so only durations
are compared across ranks."""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from trainperf.trace.collectives import (
    CollectiveRow,
    collective_table,
    collective_waits,
    comm_by_group,
    match_collectives,
)
from trainperf.trace.events import load_trace
from trainperf.trace.gaps import idle_gap_summary
from trainperf.trace.groups import mesh_groups, resolve_mesh_sizes
from trainperf.trace.overhead import overhead, overhead_hint, unprofiled_estimate
from trainperf.trace.parse import RankTrace, parse_rank
from trainperf.trace.steps import NS, RankBreakdown, StepBreakdown, rank_breakdowns

TOP_OPS = 25  # rows of the top kernels/ops table
_TOTAL_KEYS = ("step_s", "compute_s", "comm_s", "exposed_comm_s", "mem_s", "exposed_mem_s", "idle_s",
               "collective_wait_s")
MULTI_HOST_NOTE = ("ranks ran on several hosts: their clocks are not aligned, so only durations "
                   "(not start times) are compared across ranks")


@dataclass
class TraceSummary:
    """The JSON keys of trace_summary.json, in order; the directory's fields only when read from one."""
    mode: str | None
    ranks: list[int]
    steps_per_rank: dict[str, list[int]]
    totals: dict
    per_rank: list[RankBreakdown]
    steps: list[StepBreakdown]
    collectives: list[CollectiveRow]
    comm_by_group: dict[str, dict]
    skew: dict
    top: list[dict]
    idle_gaps: dict | None
    overhead: dict
    unprofiled_estimate: dict | None
    overhead_hint: str | None
    trace_dir: str | None = None  # from here on: set by summarize_dir only
    world_size: int | None = None
    mesh_sizes: dict[str, int] | None = None
    hosts: list[str] = field(default_factory=list)
    note: str | None = None

    def to_dict(self) -> dict:
        out = {"mode": self.mode, "ranks": self.ranks, "steps_per_rank": self.steps_per_rank, "totals": self.totals,
               "per_rank": [r.to_dict() for r in self.per_rank], "steps": [r.to_dict() for r in self.steps],
               "collectives": [c.to_dict() for c in self.collectives], "comm_by_group": self.comm_by_group,
               "skew": self.skew, "top": self.top, "idle_gaps": self.idle_gaps, "overhead": self.overhead,
               "unprofiled_estimate": self.unprofiled_estimate, "overhead_hint": self.overhead_hint}
        if self.trace_dir is not None:
            out.update({"trace_dir": self.trace_dir, "world_size": self.world_size, "mesh_sizes": self.mesh_sizes,
                        "hosts": self.hosts})
        if self.note is not None:
            out["note"] = self.note
        return out


def skew(per_rank: list[RankBreakdown], matched: dict, wait_ns: dict[int, int], arrived_last: dict[int, int]) -> dict:
    """Slowest and fastest rank, and the straggler: the rank the others wait for waits least itself
    (TraceLens); by how much per step."""
    if not per_rank:
        return {}
    slow = max(per_rank, key=lambda r: r.step_s)
    fast = min(per_rank, key=lambda r: r.step_s)
    med = statistics.median(r.step_s for r in per_rank)
    out = {"step_s_by_rank": {str(r.rank): r.step_s for r in per_rank},
           "slowest_rank": slow.rank, "fastest_rank": fast.rank,
           "slowest_minus_fastest_s": slow.step_s - fast.step_s,
           "slowest_over_median_pct": 100.0 * (slow.step_s / med - 1) if med else None,
           "busy_s_by_rank": {str(r.rank): r.step_s - r.idle_s for r in per_rank},
           "collective_wait_s_by_rank": {str(r.rank): r.collective_wait_s for r in per_rank},
           "arrived_last_by_rank": {str(r.rank): arrived_last.get(r.rank, 0) for r in per_rank},
           "straggler": None}
    if len(per_rank) > 1 and any(wait_ns.values()):
        least = min(per_rank, key=lambda r: r.collective_wait_s)
        others = [r.collective_wait_s for r in per_rank if r is not least]
        out["straggler"] = {"rank": least.rank, "basis": "least wait inside collectives",
                            "others_wait_more_by_s_per_step": statistics.mean(others) - least.collective_wait_s,
                            "arrived_last": arrived_last.get(least.rank, 0),
                            "matched_collectives": sum(1 for cs in matched.values() if len(cs) > 1)}
    return out


def top_ops(traces: list[RankTrace], limit: int = TOP_OPS) -> list[dict]:
    """The kernels/ops with the most time, per rank; compute ones as a share of all compute."""
    agg: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for t in traces:
        for k, (cnt, tot) in t.top.items():
            agg[k][0] += cnt
            agg[k][1] += tot
    nr = max(len(traces), 1)
    grand = sum(tot for (_, kind), (_, tot) in agg.items() if kind == "compute") or 1
    return [{"name": name, "kind": kind, "count_per_rank": cnt / nr, "total_s_per_rank": tot / nr * NS,
             "mean_s": tot / cnt * NS if cnt else 0.0,
             "pct_of_compute": 100.0 * tot / grand if kind == "compute" else None}
            for (name, kind), (cnt, tot) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:limit]]


def _totals(per_rank: list[RankBreakdown], steps: list[StepBreakdown]) -> dict:
    """The mean over ranks of each per-rank figure; overlap % over all steps of all ranks."""
    def mean(key):
        vals = [getattr(r, key) for r in per_rank if getattr(r, key) is not None]
        return statistics.mean(vals) if vals else None

    comm_all = sum(r.comm_s * r.steps for r in per_rank)
    overlap_all = sum(x.overlap_s for x in steps)
    totals = {k: mean(k) for k in _TOTAL_KEYS}
    totals["overlap_pct"] = 100.0 * overlap_all / comm_all if comm_all else None
    return totals


def summarize(traces: list[RankTrace], steps_info: dict[int, dict] | None = None) -> TraceSummary:
    """The summary of all ranks' parsed traces."""
    traces = sorted(traces, key=lambda t: t.rank)
    steps, per_rank = [], []
    for t in traces:
        bds = rank_breakdowns(t)
        steps += [StepBreakdown.of(t.rank, b) for b in bds]
        per_rank.append(RankBreakdown.of(t.rank, bds))
    matched = match_collectives(traces)
    wait_ns, arrived_last = collective_waits(matched)
    for r in per_rank:
        if r.rank in wait_ns:
            r.collective_wait_s = wait_ns[r.rank] / max(r.steps, 1) * NS
    rows = collective_table(matched)
    over = overhead(steps_info or {})
    estimate = unprofiled_estimate([r.to_dict() for r in per_rank], over)
    return TraceSummary(
        mode=traces[0].mode if traces else None, ranks=[t.rank for t in traces],
        steps_per_rank={str(t.rank): [k for k, _, _ in t.steps] for t in traces},
        totals=_totals(per_rank, steps), per_rank=per_rank, steps=steps, collectives=rows,
        comm_by_group=comm_by_group(rows, [r.steps for r in per_rank]),
        skew=skew(per_rank, matched, wait_ns, arrived_last), top=top_ops(traces), idle_gaps=idle_gap_summary(traces),
        overhead=over, unprofiled_estimate=estimate, overhead_hint=overhead_hint(over, estimate))


def analyze(traces: list[RankTrace], steps_info: dict[int, dict] | None = None) -> dict:
    """The summary of all ranks' parsed traces, JSON-ready."""
    return summarize(traces, steps_info).to_dict()


def _rank_of(path: Path) -> int | None:
    m = re.match(r"rank(\d+)\.json(\.gz)?$", path.name)
    return int(m.group(1)) if m else None


def _steps_files(trace_dir: Path) -> dict[int, dict]:
    steps_info = {}
    for p in trace_dir.glob("rank*.steps.json"):
        info = json.loads(p.read_text())
        steps_info[int(info["rank"])] = info
    return steps_info


def summarize_dir(trace_dir: str | Path, mesh_sizes: dict[str, int] | None = None) -> TraceSummary:
    """Analyse RUN_DIR/trace (rank{R}.json[.gz] + rank{R}.steps.json); the layout comes from
    ``mesh_sizes``, else the steps files, else RUN_DIR/spec.json."""
    trace_dir = Path(trace_dir)
    files = sorted((p for p in trace_dir.iterdir() if _rank_of(p) is not None), key=_rank_of)
    if not files:
        raise FileNotFoundError(f"no rank*.json[.gz] traces in {trace_dir}")
    steps_info = _steps_files(trace_dir)
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
    out = summarize(traces, steps_info)
    hosts = {i.get("host") for i in steps_info.values()} | {t.host for t in traces if t.host}
    out.trace_dir, out.world_size, out.mesh_sizes = str(trace_dir), world, mesh_sizes
    out.hosts = sorted(h for h in hosts if h)
    if len(out.hosts) > 1:
        out.note = MULTI_HOST_NOTE
    return out


def analyze_dir(trace_dir: str | Path, mesh_sizes: dict[str, int] | None = None) -> dict:
    """``summarize_dir`` JSON-ready: the content of trace_summary.json."""
    return summarize_dir(trace_dir, mesh_sizes).to_dict()
