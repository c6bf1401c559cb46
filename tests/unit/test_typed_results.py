"""The trace summary and the preflight result are dataclasses whose to_dict() is today's JSON:
the keys of trace_summary.json and preflight.json, in order, from the same numbers."""

from __future__ import annotations

import dataclasses

from trainperf.preflight.checks import CheckResult, PreflightResult, evaluate, judge
from trainperf.trace.collectives import CollectiveRow
from trainperf.trace.parse import parse_rank
from trainperf.trace.steps import RankBreakdown, StepBreakdown
from trainperf.trace.summary import TraceSummary, analyze, summarize

SUMMARY_KEYS = ["mode", "ranks", "steps_per_rank", "totals", "per_rank", "steps", "collectives", "comm_by_group",
                "skew", "top", "idle_gaps", "overhead", "unprofiled_estimate", "overhead_hint"]
STEP_KEYS = ["rank", "step", "step_s", "compute_s", "comm_s", "overlap_s", "overlap_pct", "exposed_comm_s", "mem_s",
             "exposed_mem_s", "idle_s"]
RANK_KEYS = ["rank", "steps", "step_s", "compute_s", "comm_s", "overlap_pct", "exposed_comm_s", "mem_s",
             "exposed_mem_s", "idle_s", "collective_wait_s"]
COLLECTIVE_KEYS = ["op", "group", "group_size", "dtype", "bytes", "in_bytes", "out_bytes", "ranks", "count_per_rank",
                   "total_s_per_rank", "mean_s", "transfer_s", "wait_s", "algbw_gbps", "busbw_gbps"]
CHECK_KEYS = ["check", "subject", "size", "value", "unit", "datasheet", "pct", "verdict", "note"]


def _ev(cat, name, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1, "args": args}


def _gpu_trace(rank: int, nccl_start_us: float) -> dict:
    """Two ranks of one all-reduce over [0, 1]: a GEMM, then the collective, inside one profiled step."""
    nccl = {"Collective name": "allreduce", "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20, "dtype": "BFloat16",
            "Group size": 2, "Process Group Ranks": "[0, 1]"}
    return {"distributedInfo": {"rank": rank}, "traceEvents": [
        _ev("cpu_op", "ProfilerStep#3", 0.0, 400.0),
        _ev("kernel", "sm90_gemm", 10.0, 80.0, correlation=1),
        _ev("kernel", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", nccl_start_us, 300.0 - nccl_start_us,
            correlation=2, **nccl)]}


def _traces():
    return [parse_rank(_gpu_trace(r, 100.0 + 50 * r), r) for r in range(2)]


def test_trace_summary_is_typed_and_writes_todays_json():
    s = summarize(_traces())
    assert isinstance(s, TraceSummary)
    assert all(isinstance(r, StepBreakdown) for r in s.steps) and all(isinstance(r, RankBreakdown) for r in s.per_rank)
    assert s.collectives and all(isinstance(c, CollectiveRow) for c in s.collectives)
    out = s.to_dict()
    assert list(out) == SUMMARY_KEYS  # no trace directory: its keys are left out, as before
    assert list(out["steps"][0]) == STEP_KEYS and list(out["per_rank"][0]) == RANK_KEYS
    assert list(out["collectives"][0]) == COLLECTIVE_KEYS
    assert out == analyze(_traces())
    assert [f.name for f in dataclasses.fields(StepBreakdown)] == STEP_KEYS


def test_trace_summary_of_a_directory_adds_its_keys():
    s = summarize(_traces())
    s.trace_dir, s.world_size, s.mesh_sizes, s.hosts = "RUN/trace", 2, None, ["a"]
    assert list(s.to_dict()) == SUMMARY_KEYS + ["trace_dir", "world_size", "mesh_sizes", "hosts"]
    s.hosts, s.note = ["a", "b"], "clocks"
    assert list(s.to_dict())[-1] == "note"


def _raw() -> dict:
    ranks = [{"rank": r, "local_rank": r, "device_index": r, "node": "h", "host": "h"} for r in range(2)]
    return {"device": "cuda", "world_size": 2, "nodes": ["h", "h"], "ranks": ranks,
            "gemm": [{"rank": r, "dtype": "bf16", "n": 8192, "time_s": 1.0, "tflops": t}
                     for r, t in enumerate((700, 600))],
            "hbm": [{"rank": r, "bytes": 2**30, "time_s": 1.0, "tbps": 4.2} for r in range(2)],
            "collectives": [{"collective": "all_reduce", "group": "world", "kind": "intra", "n": 2, "size": 2**30,
                             "busbw_gbps": 300.0, "time_s": 0.01}]}


def test_preflight_result_is_typed_and_writes_todays_json():
    res = judge(_raw(), None, "test")
    assert isinstance(res, PreflightResult) and all(isinstance(c, CheckResult) for c in res.checks)
    out = res.to_dict()
    assert list(out) == list(_raw()) + ["note", "gpu_preset", "preset_source", "thresholds", "checks", "slow_gpus",
                                         "slow_pairs", "baseline", "summary", "exit_code", "measured_overrides"]
    assert list(out["checks"][0]) == CHECK_KEYS
    assert out == evaluate(_raw(), None, "test")
    assert res.slow_gpus and res.slow_gpus[0]["rank"] == 1 and res.exit_code == 1  # 14% below the best GPU
