"""The former single module of trace analysis, kept as a name for callers that still import from it
(``trainperf.cli.trace``). The code lives in the modules by concern: ``intervals``, ``events``,
``groups``, ``parse``, ``gaps``, ``steps``, ``collectives``, ``overhead`` and ``summary``."""

from trainperf.trace.collectives import (
    P2P, Collective, algo_bytes, busbw_factor, dtype_bytes, match_collectives, op_kind,
)
from trainperf.trace.events import load_trace
from trainperf.trace.gaps import EDGE_CAUSES, MIN_GAP_NS, idle_gap_summary, idle_gaps
from trainperf.trace.groups import dims_of_size, label_group, mesh_groups, resolve_mesh_sizes
from trainperf.trace.intervals import Interval, clip, intersect, merge, subtract, total, union
from trainperf.trace.overhead import (
    HOST_PACED_SHARE, OVERHEAD_GOAL_PCT, overhead, overhead_hint, unprofiled_estimate,
)
from trainperf.trace.parse import RankTrace, parse_rank
from trainperf.trace.steps import Breakdown, breakdown
from trainperf.trace.summary import analyze, analyze_dir

__all__ = [
    "EDGE_CAUSES", "HOST_PACED_SHARE", "MIN_GAP_NS", "OVERHEAD_GOAL_PCT", "P2P", "Breakdown", "Collective",
    "Interval", "RankTrace", "algo_bytes", "analyze", "analyze_dir", "breakdown", "busbw_factor", "clip",
    "dims_of_size", "dtype_bytes", "idle_gap_summary", "idle_gaps", "intersect", "label_group", "load_trace",
    "match_collectives", "merge", "mesh_groups", "op_kind", "overhead", "overhead_hint", "parse_rank",
    "resolve_mesh_sizes", "subtract", "total", "union", "unprofiled_estimate",
]
