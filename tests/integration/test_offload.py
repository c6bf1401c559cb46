"""Activation offload (train.offload_layers, parallel/offload.py) on CPU: which layers, what moves and
what stays, views restored exactly, training unchanged (eager and compiled), the planner's trade.
The GPU side (pinned memory, side streams) is in tests/gpu/test_gpu.py; the layouts (FSDP2, PP) in
tests/integration/test_layouts.py."""

from __future__ import annotations


def test_plan_command_shows_the_offload_pick_and_its_host_memory(tmp_path):
    import json
    import subprocess

    from tests.fixtures.cli import trainperf_cmd

    out = subprocess.run(trainperf_cmd("plan", "llama2_70b_lora", "--gpus", "2", "--gpu", "h200", "--datasheet", "--json",
                                       "--objective", "throughput", "--top", "3", "--db", str(tmp_path / "t.db"),
                                       "--set", "train.compile=true", "--set", "hardware.host_mem_gib=256",
                                       "--set", "hardware.fp8=tensorwise", "--set", "hardware.frozen_dtype=fp8"),
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    best = json.loads(out.stdout)["ranked"][0]
    assert "train.offload_layers=" in best["set"]
    assert 0 < best["host_offload_gib"] <= 0.5 * 256 / 2
    assert 0 <= best["time"]["offload_exposed"] < 0.02 * best["step_time_s"]  # the pick hides its copies
