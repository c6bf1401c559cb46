"""trainperf trace: interval arithmetic on hand-built timelines (checked against a point-set model),
the nccl-tests bandwidth factors, mesh-group naming, the GPU (NCCL kernel) path on a hand-built
trace with the argument schema torch 2.11 writes, and the whole capture + analysis on a recorded
2-process gloo FSDP2 CPU profile with a planted straggler."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import textwrap

import pytest

from trainperf.cli import trace as trace_cli
from trainperf.trace.events import load_trace
from trainperf.trace.parse import parse_rank
from trainperf.trace.steps import breakdown
from trainperf.trace.summary import analyze_dir


# ----------------------------------------------------------------------------------------------
# a recorded 2-process gloo FSDP2 profile (torchrun), captured with StepProfiler

SKIP, WARMUP, ACTIVE, AFTER, WORLD, SLEEP_S = 2, 1, 3, 2, 2, 0.04
LAYERS = [(16, 33), (33, 8)]  # Linear(in, out): 33 output rows do not split evenly over 2 ranks -> padding

SCRIPT = textwrap.dedent(f"""
    import sys, time
    import torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from trainperf.trace.capture import StepProfiler

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(i, o) for i, o in {LAYERS}])
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    prof = StepProfiler(sys.argv[1], rank, warmup_steps={WARMUP}, active_steps={ACTIVE}, wait_steps={SKIP},
                        device_type="cpu", mesh_sizes={{"pp": 1, "dp_replicate": 1, "dp_shard": world, "cp": 1, "tp": 1}})
    for step in range({SKIP + WARMUP + ACTIVE + AFTER}):
        if rank == 1:
            time.sleep({SLEEP_S})  # a planted straggler: rank 0 waits for it in the first all-gather
        model(torch.randn(64, {LAYERS[0][0]})).square().mean().backward()
        opt.step()
        opt.zero_grad()
        prof.step()
    prof.close()
    dist.barrier()
    dist.destroy_process_group()
""")


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("gloo_fsdp")
    script = run_dir / "fsdp_profile.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}",
                           str(script), str(run_dir)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def shard_elements(in_f: int, out_f: int, world: int) -> int:
    """FSDP2 shards every parameter on dim 0, padded to a multiple of the world size."""
    return math.ceil(out_f / world) * in_f + math.ceil(out_f / world)  # weight [out, in] + bias [out]


def test_capture_writes_traces_and_step_phases(gloo_run):
    trace = gloo_run / "trace"
    for r in range(WORLD):
        assert (trace / f"rank{r}.json.gz").stat().st_size > 0
        info = json.loads((trace / f"rank{r}.steps.json").read_text())
        phases = [s["phase"] for s in info["steps"]]
        assert phases == ["wait"] * SKIP + ["warmup"] * WARMUP + ["active"] * ACTIVE + ["after"] * AFTER
        assert info["trace_file"] == f"rank{r}.json.gz" and info["export_s"] > 0
    t = parse_rank(load_trace(trace / "rank0.json.gz"), 0)
    assert [k for k, _, _ in t.steps] == list(range(SKIP + WARMUP, SKIP + WARMUP + ACTIVE))  # ProfilerStep#k
    assert t.mode == "cpu"
    # exact identity per step, in integer ns: span = compute + comm - overlap + idle (no memcpy on CPU)
    for k, lo, hi in t.steps:
        b = breakdown(k, lo, hi, t.comp, t.comm, t.mem)
        assert b.span == b.compute + b.comm - b.overlap + b.idle
        assert b.compute > 0 and b.comm > 0 and b.idle >= 0 and 0 <= b.overlap <= min(b.compute, b.comm)


def test_gloo_fsdp_collective_table_has_padded_shard_bytes(gloo_run):
    s = analyze_dir(gloo_run / "trace")
    assert s["mode"] == "cpu" and s["ranks"] == [0, 1] and s["mesh_sizes"]["dp_shard"] == WORLD
    shards = sorted(shard_elements(i, o, WORLD) * 4 for i, o in LAYERS)  # fp32 bytes per rank
    assert shards == [136 * 4, 289 * 4]  # Linear(33, 8): 4 rows x 33 + 4; Linear(16, 33): 17 rows x 16 + 17
    ag = [c for c in s["collectives"] if c["op"] == "all_gather"]
    rs = [c for c in s["collectives"] if c["op"] == "reduce_scatter"]
    assert sorted(c["in_bytes"] for c in ag) == shards
    assert sorted(c["bytes"] for c in ag) == [WORLD * b for b in shards]  # S = the gathered output
    assert sorted(c["out_bytes"] for c in rs) == shards
    assert sorted(c["bytes"] for c in rs) == [WORLD * b for b in shards]  # S = the reduced input
    for c in ag + rs:
        assert c["group"] == "dp_shard" and c["group_size"] == WORLD and c["ranks"] == WORLD
        assert c["transfer_s"] <= c["mean_s"] and c["algbw_gbps"] > 0
        assert c["busbw_gbps"] == pytest.approx(c["algbw_gbps"] * (WORLD - 1) / WORLD)
    # per unit and step: all-gather in forward and again in backward (resharded after forward), one reduce-scatter
    assert all(c["count_per_rank"] == 2 * ACTIVE for c in ag)
    assert all(c["count_per_rank"] == ACTIVE for c in rs)
    assert {c["op"] for c in s["collectives"]} == {"all_gather", "reduce_scatter"}


def test_gloo_fsdp_straggler_skew_and_overhead(gloo_run):
    s = analyze_dir(gloo_run / "trace")
    r0, r1 = s["per_rank"]
    # rank 1 sleeps SLEEP_S per step outside any op: idle for it, waiting inside gloo for rank 0
    assert r0["collective_wait_s"] > 0.5 * SLEEP_S > r1["collective_wait_s"]
    assert r0["comm_s"] > r1["comm_s"] and r1["idle_s"] > r0["idle_s"]
    st = s["skew"]["straggler"]
    assert st["rank"] == 1 and st["others_wait_more_by_s_per_step"] > 0.5 * SLEEP_S
    assert st["matched_collectives"] == 3 * 2 * ACTIVE  # 2 AG + 1 RS per unit per step, all paired across ranks
    assert set(s["skew"]["step_s_by_rank"]) == {"0", "1"}
    assert len(s["steps"]) == WORLD * ACTIVE
    assert s["overhead"]["per_rank"]["0"]["baseline_steps"] == (SKIP - 1) + AFTER
    assert s["overhead"]["overhead_pct"] is not None
    assert any(t["kind"] == "compute" and t["name"].startswith("aten::") for t in s["top"])
    assert any(t["kind"] == "comm" and t["name"] == "gloo:all_gather" for t in s["top"])


def _cli(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="trainperf trace")
    trace_cli.add_arguments(p)
    return p.parse_args(argv)


def test_cli_analyze_writes_summary_and_json(gloo_run, capsys):
    rc = trace_cli.run(_cli(["--analyze", str(gloo_run), "--json"]))
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    saved = json.loads((gloo_run / "trace_summary.json").read_text())
    assert out["collectives"] == saved["collectives"] and len(out["collectives"]) == 4
    assert out["summary_file"] == str(gloo_run / "trace_summary.json")
    rc = trace_cli.run(_cli(["--analyze", str(gloo_run / "trace")]))  # the rich tables
    text = capsys.readouterr().out
    assert rc == 0 and "all_gather" in text and "straggler: rank 1" in text and "profiler overhead" in text


@pytest.mark.skipif(not trace_cli.loop_has_hook(), reason="the training loop has no profiler hook yet")
def test_trainperf_trace_end_to_end_on_two_cpu_ranks(tmp_path):
    from tests.fixtures.cli import trainperf_cmd

    proc = subprocess.run(trainperf_cmd("trace", "mini-pretrain", "--nproc-per-node", "2", "--steps", "2", "--warmup", "0",
                                        "--after", "1", "--json", "--set", "hardware.device=cpu",
                                        "--out", str(tmp_path / "runs")),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads(proc.stdout)
    assert s["ranks"] == [0, 1] and all(len(v) == 2 for v in s["steps_per_rank"].values())
    ops = {(c["op"], c["group"]) for c in s["collectives"]}
    assert ("all_gather", "dp_shard") in ops and ("reduce_scatter", "dp_shard") in ops
    assert s["overhead"]["overhead_pct"] is not None
    assert (tmp_path / "runs" / s["run"]["run_id"] / "trace_summary.json").is_file()
