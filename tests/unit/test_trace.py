"""trainperf trace: interval arithmetic on hand-built timelines (checked against a point-set model),
the nccl-tests bandwidth factors, mesh-group naming, the GPU (NCCL kernel) path on a hand-built
trace with the argument schema torch 2.11 writes, and the whole capture + analysis on a recorded
2-process gloo FSDP2 CPU profile with a planted straggler."""

from __future__ import annotations

import argparse
import json
import random

import pytest

from trainperf.cli import trace as trace_cli
from trainperf.trace.collectives import algo_bytes, busbw_factor, dtype_bytes, op_kind
from trainperf.trace.groups import label_group, mesh_groups, resolve_mesh_sizes
from trainperf.trace.intervals import clip, intersect, merge, subtract, total, union
from trainperf.trace.overhead import overhead, overhead_hint, unprofiled_estimate
from trainperf.trace.parse import parse_rank
from trainperf.trace.steps import breakdown
from trainperf.trace.summary import analyze


# ----------------------------------------------------------------------------------------------
# interval arithmetic


def points(intervals) -> set[int]:
    return {x for s, e in intervals for x in range(s, e)}


def test_merge_overlapping_touching_nested_unsorted_and_empty():
    got = merge([(50, 60), (0, 10), (5, 20), (20, 25), (30, 40), (32, 35), (70, 70), (80, 79)])
    assert got == [(0, 25), (30, 40), (50, 60)]  # touching (20) joins, nested (32-35) vanishes, empty dropped
    assert total(got) == 25 + 10 + 10
    assert merge([]) == []


def test_interval_ops_match_a_point_set_model_on_random_timelines():
    rng = random.Random(7)
    for _ in range(300):
        def rand_list():
            out = []
            for _ in range(rng.randint(0, 7)):
                s = rng.randint(0, 60)
                out.append((s, s + rng.randint(0, 15)))
            return out

        a, b = merge(rand_list()), merge(rand_list())
        pa, pb = points(a), points(b)
        assert points(intersect(a, b)) == pa & pb
        assert points(subtract(a, b)) == pa - pb
        assert points(union(a, b)) == pa | pb
        lo, hi = rng.randint(0, 40), rng.randint(20, 80)
        assert points(clip(a, lo, hi)) == {x for x in pa if lo <= x < hi}
        for res in (intersect(a, b), subtract(a, b), clip(a, lo, hi)):  # results are merged lists
            assert res == merge(res)
        assert total(intersect(a, b)) == len(pa & pb)


def test_breakdown_on_a_hand_built_step():
    # step [0, 100): compute [10, 40) and [60, 90); comm [30, 70); a memcpy [92, 95)
    comp, comm, mem = merge([(10, 40), (60, 90)]), merge([(30, 70)]), [(92, 95)]
    b = breakdown(1, 0, 100, comp, comm, mem)
    assert (b.compute, b.comm, b.overlap, b.exposed, b.mem) == (60, 40, 20, 20, 3)
    assert b.idle == 100 - 80 - 3  # busy = [10, 90) + [92, 95)
    assert b.mem_exposed == 3  # the copy runs while nothing else does
    assert b.span == b.compute + b.comm - b.overlap + b.mem_exposed + b.idle
    # a copy under compute (an offloaded layer's copy hidden by the next layer) is not exposed
    b = breakdown(4, 0, 100, comp, comm, [(15, 25), (85, 95)])
    assert (b.mem, b.mem_exposed) == (20, 5)
    assert b.span == b.compute + b.comm - b.overlap + b.mem_exposed + b.idle
    # the window clips: only [50, 100) of the same timeline
    b = breakdown(2, 50, 100, comp, comm, mem)
    assert (b.compute, b.comm, b.overlap, b.idle) == (30, 20, 10, 50 - 40 - 3)
    # nothing overlaps: all communication is exposed
    b = breakdown(3, 0, 100, merge([(0, 10)]), merge([(10, 30)]))
    assert (b.overlap, b.exposed, b.idle) == (0, 20, 70)


def test_bandwidth_conventions_follow_nccl_tests():
    assert busbw_factor("all_reduce", 8) == pytest.approx(1.75)
    assert busbw_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert busbw_factor("reduce_scatter", 2) == pytest.approx(0.5)
    assert busbw_factor("broadcast", 8) == 1.0
    assert algo_bytes("all_gather", 100, 800) == 800  # S = total output
    assert algo_bytes("reduce_scatter", 800, 100) == 800  # S = total input
    assert algo_bytes("all_reduce", 400, 400) == 400
    assert [op_kind(n) for n in ("_allgather_base", "allgather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced",
                                   "c10d::_reduce_scatter_base_", "allreduce", "gloo:all_reduce", "nccl:broadcast")] == [
        "all_gather", "all_gather", "reduce_scatter", "reduce_scatter", "all_reduce", "all_reduce", "broadcast"]
    assert dtype_bytes("BFloat16") == 2 and dtype_bytes("c10::BFloat16") == 2 and dtype_bytes("float") == 4


def test_mesh_groups_name_the_parallel_dimension():
    sizes = {"pp": 1, "dp_replicate": 2, "dp_shard": 2, "cp": 1, "tp": 2}
    g = mesh_groups(sizes, 5)  # coords (pp 0, rep 1, shard 0, cp 0, tp 1)
    assert g["tp"] == (4, 5) and g["dp_shard"] == (5, 7) and g["dp_replicate"] == (1, 5)
    assert g["dp"] == (1, 3, 5, 7) and g["dp_shard_cp"] == (5, 7) and g["world"] == tuple(range(8))
    assert label_group((5, 7), g) == "dp_shard"  # a single dim wins over the equal flattened one
    assert label_group((7, 5, 3, 1), g) == "dp"
    assert label_group((4, 5), g) == "tp"
    assert label_group((0, 5), g) is None
    assert resolve_mesh_sizes({"dp_shard": -1, "tp": 2}, 8)["dp_shard"] == 4


# ----------------------------------------------------------------------------------------------
# the GPU path on a hand-built NCCL trace (argument schema as torch 2.11 / NCCL 2.28 write it)


def _gpu_rank_trace(rank: int, nccl_start_us: float) -> dict:
    nccl_args = {"Collective name": "_allgather_base", "In msg nelems": 1000, "Out msg nelems": 2000, "Group size": 2,
                 "dtype": "BFloat16", "Process Group Name": "0", "Process Group Description": "default_pg",
                 "Process Group Ranks": "[0, 1]", "stream": 22, "correlation": 9}
    return {"distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2,
                                "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1]}]},
            "traceEvents": [
                {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#5", "pid": 1, "tid": 1, "ts": 1000.0,
                 "dur": 1000.0},
                {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#5", "pid": 0, "tid": 7, "ts": 1100.0,
                 "dur": 650.0},
                {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16", "pid": 0, "tid": 7, "ts": 1100.0, "dur": 300.0,
                 "args": {}},
                {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                 "pid": 0, "tid": 22, "ts": nccl_start_us, "dur": 1600.0 - nccl_start_us, "args": nccl_args},
                {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "pid": 0, "tid": 7,
                 "ts": 1700.0, "dur": 50.0, "args": {}},
                {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1010.0, "dur": 5.0},
                # a pipeline send on rank 0 only, at a different time on each rank: never matched as a collective
                {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
                 "pid": 0, "tid": 30, "ts": 1800.0 + 50 * rank, "dur": 10.0 + 10 * rank,
                 "args": dict(nccl_args, **{"Collective name": "send", "In msg nelems": 64, "Out msg nelems": 64})},
            ]}


def test_gpu_trace_breakdown_collective_table_and_straggler():
    sizes = {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 1}
    # rank 0 enters the all-gather at 1300 us and waits; rank 1 arrives at 1500 us: the straggler
    traces = [parse_rank(_gpu_rank_trace(r, start), r, mesh_groups(sizes, r)) for r, start in ((0, 1300.0), (1, 1500.0))]
    assert all(t.mode == "gpu" for t in traces)
    s = analyze(traces)
    r0, r1 = s["per_rank"]
    assert r0["compute_s"] == pytest.approx(300e-6) and r0["comm_s"] == pytest.approx(310e-6)  # all-gather + send
    assert r0["overlap_pct"] == pytest.approx(100 * 100 / 310)  # [1300, 1400) under the GEMM
    assert r0["exposed_comm_s"] == pytest.approx(210e-6) and r0["mem_s"] == pytest.approx(50e-6)
    assert r0["idle_s"] == pytest.approx(440e-6)  # 1000 - |[1100, 1600) + [1700, 1750) + [1800, 1810)|
    assert r1["overlap_pct"] == 0 and r1["idle_s"] == pytest.approx(1000e-6 - 400e-6 - 50e-6 - 20e-6)
    (c,) = [c for c in s["collectives"] if c["op"] == "all_gather"]
    assert (c["op"], c["group"], c["group_size"], c["in_bytes"], c["bytes"]) == ("all_gather", "dp_shard", 2, 2000, 4000)
    (p2p,) = [c for c in s["collectives"] if c["op"] == "send"]
    assert p2p["bytes"] == 128 and p2p["mean_s"] == pytest.approx(15e-6) and p2p["transfer_s"] == p2p["mean_s"]
    assert s["comm_by_group"]["dp_shard"]["bytes_per_step"] == 4000 + 128
    assert c["transfer_s"] == pytest.approx(100e-6)  # the late rank's duration: the true transfer time
    assert c["algbw_gbps"] == pytest.approx(4000 / 100e-6 / 1e9)
    assert c["busbw_gbps"] == pytest.approx(c["algbw_gbps"] / 2)
    assert r0["collective_wait_s"] == pytest.approx(200e-6) and r1["collective_wait_s"] == 0
    st = s["skew"]["straggler"]
    assert st["rank"] == 1 and st["others_wait_more_by_s_per_step"] == pytest.approx(200e-6) and st["arrived_last"] == 1
    top = {t["name"]: t for t in s["top"]}
    assert top["sm90_xmma_gemm_bf16"]["kind"] == "compute" and top["sm90_xmma_gemm_bf16"]["pct_of_compute"] == 100.0


def _gapped_step_trace() -> dict:
    """One step [0, 1000) us on the host thread (1, 1): kernels [10, 100), [300, 400), [600, 700), [700, 950).
    The second is launched at 250 us, inside the optimizer's foreach call, after the GPU went idle at 100;
    the host sits in cudaStreamSynchronize under aten::item over [410, 590), then launches the third at
    595; the fourth was launched early but starts behind a wait (no idle: it follows the third); the step
    ends 50 us after the last kernel; a 10 us head gap is below the threshold."""
    def x(cat, name, ts, dur, tid=1, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1 if cat not in ("kernel",) else 0, "tid": tid,
                "ts": float(ts), "dur": float(dur), "args": args}

    return {"traceEvents": [
        x("user_annotation", "ProfilerStep#3", 0, 1000),
        x("kernel", "gemm_a", 10, 90, tid=7, correlation=1),
        x("kernel", "adam_foreach", 300, 100, tid=7, correlation=2),
        x("kernel", "loss_kernel", 600, 100, tid=7, correlation=3),
        x("kernel", "gemm_b", 700, 250, tid=7, correlation=4),
        x("cuda_runtime", "cudaLaunchKernel", 5, 2, correlation=1),
        x("user_annotation", "Optimizer.step#AdamW.step", 200, 95),
        x("cpu_op", "aten::_foreach_mul_", 240, 20),
        x("cuda_runtime", "cudaLaunchKernel", 250, 3, correlation=2),
        x("cpu_op", "aten::item", 405, 190),
        x("cpu_op", "aten::_local_scalar_dense", 406, 188),
        x("cuda_runtime", "cudaStreamSynchronize", 410, 180),
        x("cuda_runtime", "cudaLaunchKernel", 595, 3, correlation=3),
        x("cuda_runtime", "cuLaunchKernelEx", 598, 1, correlation=4),
    ]}


def test_idle_gaps_name_the_host_sync_and_the_late_launch():
    t = parse_rank(_gapped_step_trace(), 0)
    s = analyze([t])
    gaps = s["idle_gaps"]
    causes = {(g["cause"], g["where"]): g for g in gaps["by_cause"]}
    sync = causes[("host sync", "aten::_local_scalar_dense > cudaStreamSynchronize")]
    late = causes[("late launch", "Optimizer.step#AdamW.step > aten::_foreach_mul_")]
    end = causes[("end of step", "(no op open)")]
    assert sync["total_s_per_step"] == pytest.approx(200e-6)  # [400, 600)
    assert late["total_s_per_step"] == pytest.approx(200e-6)  # [100, 300)
    assert end["total_s_per_step"] == pytest.approx(50e-6)  # [950, 1000)
    assert len(gaps["by_cause"]) == 3  # the 10 us head gap is below MIN_GAP_NS
    assert gaps["gaps_s_per_step"] == pytest.approx(450e-6)
    assert s["per_rank"][0]["idle_s"] == pytest.approx(460e-6)  # the gaps plus the head gap
    largest = gaps["largest"][0]
    assert largest["before"] in ("gemm_a", "adam_foreach") and largest["dur_s"] == pytest.approx(200e-6)
    (g,) = [g for g in gaps["largest"] if g["cause"] == "late launch"]
    assert (g["before"], g["after"], g["offset_s"]) == ("gemm_a", "adam_foreach", pytest.approx(100e-6))


def test_idle_gaps_at_the_steps_edges_are_the_traces_own_and_summed_apart():
    """The trace drains the GPU after every step: a head gap before the first kernel and a tail gap with
    the host in a bare cudaDeviceSynchronize are the step's edges; a sync under an op stays a host sync."""
    trace = _gapped_step_trace()
    for e in trace["traceEvents"]:
        if e["name"] == "gemm_a":  # the first kernel starts 80 us into the step: a head gap over the threshold
            e["ts"], e["dur"] = 80.0, 20.0
    trace["traceEvents"].append({"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": 1,
                                 "tid": 1, "ts": 940.0, "dur": 58.0, "args": {}})
    gaps = analyze([parse_rank(trace, 0)])["idle_gaps"]
    causes = {(g["cause"], g["where"]): g for g in gaps["by_cause"]}
    assert causes[("start of step", "(no op open)")]["total_s_per_step"] == pytest.approx(80e-6)
    assert causes[("end of step", "cudaDeviceSynchronize")]["total_s_per_step"] == pytest.approx(50e-6)
    assert causes[("host sync", "aten::_local_scalar_dense > cudaStreamSynchronize")]["total_s_per_step"] == \
        pytest.approx(200e-6)
    assert gaps["edges_s_per_step"] == pytest.approx(130e-6)
    assert gaps["inside_s_per_step"] == pytest.approx(400e-6)  # the late launch and the host sync
    assert gaps["gaps_s_per_step"] == pytest.approx(530e-6)


def _ev(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0 if cat == "kernel" else 1, "tid": tid,
            "ts": float(ts), "dur": float(dur), "args": args}


def _causes(trace) -> dict:
    """Each (cause, where)'s idle time over the whole trace, in us."""
    n_steps = sum(1 for e in trace["traceEvents"] if e["name"].startswith("ProfilerStep#"))
    gaps = analyze([parse_rank(trace, 0)])["idle_gaps"]
    return {(g["cause"], g["where"]): round(g["total_s_per_step"] * 1e6 * n_steps) for g in gaps["by_cause"]}


def test_a_steps_head_is_the_traces_only_up_to_how_far_ahead_the_host_was():
    """Step 4's host needs 300 us before its first launch; the trace's own sync at the end of step 3
    lasted 100 us, so a loop that does not wait would have entered step 4 only 100 us ahead of the
    GPU: 100 us of the head are the trace's, 200 us a late launch. The first profiled step (3) has no
    earlier step in the trace: its whole head is the trace's."""
    trace = {"traceEvents": [
        _ev("user_annotation", "ProfilerStep#3", 0, 1000), _ev("user_annotation", "ProfilerStep#4", 1000, 1000),
        _ev("kernel", "k3", 150, 700, tid=7, correlation=1), _ev("cuda_runtime", "cudaLaunchKernel", 100, 2, correlation=1),
        _ev("cuda_runtime", "cudaDeviceSynchronize", 895, 100),  # the trace's wait: [895, 995), the GPU busy to 850
        _ev("cpu_op", "aten::zeros", 1250, 60),
        _ev("kernel", "k4", 1300, 600, tid=7, correlation=2), _ev("cuda_runtime", "cudaLaunchKernel", 1290, 2, correlation=2),
        _ev("cuda_runtime", "cudaDeviceSynchronize", 1950, 45),
    ]}
    gaps = analyze([parse_rank(trace, 0)])["idle_gaps"]
    got = sorted((g["step"], g["cause"], round(g["dur_s"] * 1e6)) for g in gaps["largest"])
    assert got == [(3, "end of step", 105), (3, "late launch", 45), (3, "start of step", 150),  # [850, 895): host
                   (4, "end of step", 50), (4, "late launch", 50), (4, "late launch", 200), (4, "start of step", 100)]
    assert gaps["edges_s_per_step"] == pytest.approx((105 + 150 + 50 + 100) * 1e-6 / 2)
    # had step 3 not waited at its end (no trace sync in it), step 4's whole head would be real idle
    no_wait = {"traceEvents": [e for e in trace["traceEvents"] if not (e["name"] == "cudaDeviceSynchronize"
                                                                       and e["ts"] < 1000)]}
    heads = [g for g in analyze([parse_rank(no_wait, 0)])["idle_gaps"]["largest"] if g["step"] == 4
             and g["offset_s"] == 0]
    assert [(g["cause"], round(g["dur_s"] * 1e6)) for g in heads] == [("late launch", 300)]


def test_only_the_traces_own_bare_sync_makes_a_tail_an_edge():
    """The tail after a step's last kernel: host work before the trace's sync is a late launch (where =
    the op open then); a sync under an op that runs to the step's end stays a host sync; a bare sync
    on a thread without the step's span is no trace's wait; a step without a kernel is no edge."""
    base = [_ev("user_annotation", "ProfilerStep#3", 0, 1000), _ev("kernel", "k", 0, 100, tid=7, correlation=1),
            _ev("cuda_runtime", "cudaLaunchKernel", 0, 1, correlation=1)]
    busy_host = base + [_ev("cpu_op", "write_progress", 120, 800), _ev("cuda_runtime", "cudaDeviceSynchronize", 990, 5)]
    assert _causes({"traceEvents": busy_host}) == {("late launch", "write_progress"): 890,
                                                   ("end of step", "cudaDeviceSynchronize"): 10}
    # an event sync inside that work returns at once (its step long done): no cause of the host's 800 us
    quick_sync = busy_host + [_ev("cuda_runtime", "cudaEventSynchronize", 500, 2)]
    assert _causes({"traceEvents": quick_sync}) == _causes({"traceEvents": busy_host})
    item = base + [_ev("cpu_op", "aten::item", 150, 849), _ev("cpu_op", "aten::_local_scalar_dense", 151, 847),
                   _ev("cuda_runtime", "cudaStreamSynchronize", 160, 835)]
    assert _causes({"traceEvents": item}) == {("host sync", "aten::_local_scalar_dense > cudaStreamSynchronize"): 900}
    other_thread = base + [_ev("cuda_runtime", "cudaDeviceSynchronize", 200, 795, tid=9)]
    assert _causes({"traceEvents": other_thread}) == {("host sync", "cudaDeviceSynchronize"): 900}
    # a step without a kernel, ending in the trace's own sync as every step does
    no_kernel = base + [_ev("user_annotation", "ProfilerStep#4", 1000, 1000), _ev("cpu_op", "aten::add", 1100, 10),
                        _ev("cuda_runtime", "cudaDeviceSynchronize", 1950, 40)]
    assert _causes({"traceEvents": no_kernel}) == {("end of step", "(no op open)"): 900,
                                                   ("no kernel in the step", "(no op open)"): 1000}


def test_the_summary_prints_the_idle_gaps(capsys):
    s = analyze([parse_rank(_gapped_step_trace(), 0)])
    s.update(trace_dir="t", summary_file="t/trace_summary.json")
    trace_cli.print_summary(s)
    out = capsys.readouterr().out
    assert "where the GPU sat idle" in out and "host sync" in out and "late launch" in out
    assert "Optimizer.step#AdamW.step > aten::_foreach_mul_" in out


def test_idle_gap_where_a_kernel_waits_on_another_stream_is_a_dependency():
    trace = _gapped_step_trace()
    for e in trace["traceEvents"]:  # the optimizer's kernel launched at 50 us: early, yet it starts at 300
        if e["args"].get("correlation") == 2 and e["cat"] == "cuda_runtime":
            e["ts"] = 50.0
    s = analyze([parse_rank(trace, 0)])
    (g,) = [g for g in s["idle_gaps"]["largest"] if g["offset_s"] == pytest.approx(100e-6)]
    assert g["cause"] == "dependency"


def test_overhead_from_steps_files():
    steps = [{"index": i, "phase": p, "wall_s": w} for i, (p, w) in
             enumerate([("wait", 9.0), ("wait", 1.0), ("warmup", 1.3), ("active", 1.2), ("active", 1.2), ("after", 1.0)])]
    o = overhead({0: {"steps": steps, "export_s": 0.5}})
    e = o["per_rank"]["0"]
    assert (e["baseline_steps"], e["profiled_steps"]) == (2, 2)  # step 0 (9 s: the run's warm-up) is left out
    assert e["overhead_pct"] == pytest.approx(20.0) and o["overhead_pct"] == pytest.approx(20.0)


def test_unprofiled_estimate_takes_the_profiler_time_out_of_idle_then_waits():
    over = {"per_rank": {"0": {"baseline_step_s": 1.0, "profiled_step_s": 1.3},
                         "1": {"baseline_step_s": 1.0, "profiled_step_s": 1.3}}}
    per_rank = [  # rank 0 launch-bound (idle absorbs it all); rank 1 waits on rank 0 inside collectives
        {"rank": 0, "compute_s": 0.5, "exposed_comm_s": 0.1, "idle_s": 0.7, "collective_wait_s": 0.05},
        {"rank": 1, "compute_s": 0.5, "exposed_comm_s": 0.6, "idle_s": 0.1, "collective_wait_s": 0.5}]
    u = unprofiled_estimate(per_rank, over)
    r0, r1 = u["per_rank"]
    assert r0["idle_s"] == pytest.approx(0.4) and r0["collective_wait_s"] == pytest.approx(0.05)
    assert r0["exposed_comm_s"] == pytest.approx(0.1) and r0["step_s"] == 1.0
    assert r1["idle_s"] == 0.0 and r1["collective_wait_s"] == pytest.approx(0.3)
    assert r1["exposed_comm_s"] == pytest.approx(0.4) and r1["unexplained_s"] == 0.0
    assert u["totals"]["profiler_extra_s"] == pytest.approx(0.3) and u["totals"]["compute_s"] == 0.5
    assert unprofiled_estimate(per_rank, {"per_rank": {}}) is None  # no baseline: no estimate


def test_overhead_hint_names_a_host_paced_step_and_stays_quiet_within_the_goal():
    est = {"totals": {"step_s": 1.563, "idle_s": 0.036, "collective_wait_s": 0.286}}  # compiled TP2+SP, mb 1
    hint = overhead_hint({"overhead_pct": 43.5}, est)
    assert hint.startswith("host-paced step") and "waits 322 of 1563 ms" in hint and "+43.5%" in hint
    busy = {"totals": {"step_s": 2.0, "idle_s": 0.02, "collective_wait_s": 0.0}}
    assert overhead_hint({"overhead_pct": 5.0}, busy).startswith("profiler overhead +5.0% on a step whose GPU is busy")
    assert overhead_hint({"overhead_pct": 0.4}, est) is None  # within the 3% goal
    assert overhead_hint({"overhead_pct": 43.5}, None) is None  # no baseline, nothing to say


def _cli(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="trainperf trace")
    trace_cli.add_arguments(p)
    return p.parse_args(argv)


def test_cli_bad_input(tmp_path, capsys):
    assert trace_cli.run(_cli(["--json"])) == 2
    assert "WORKLOAD" in json.loads(capsys.readouterr().out)["error"]
    assert trace_cli.run(_cli(["--analyze", str(tmp_path / "nope")])) == 2
    assert trace_cli.run(_cli(["--analyze", str(tmp_path)])) == 2  # a directory without traces
    assert trace_cli.run(_cli(["mini-pretrain", "--steps", "0"])) == 2


def test_trace_overrides_fix_the_window():
    o = trace_cli.trace_overrides(_cli(["w", "--set", "train.max_steps=99", "--steps", "4", "--skip", "2"]))
    assert o[0] == "mlperf.division=open" and o.index("train.max_steps=99") < o.index("train.max_steps=10")
    assert "train.profile_steps=4" in o and "train.profile_wait=2" in o
