"""preflight measures the planner's kernel table; on a GPU it becomes a measured figure plan uses."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from trainperf.plan.hardware import PRESETS
from trainperf.plan.kernels import load_table
from trainperf.cli import preflight as pcli
from trainperf.preflight.kernels import measure_kernel_table


def test_cpu_sweep_writes_a_table_the_planner_can_read(tmp_path):
    table = measure_kernel_table("cpu", iters=1)
    assert table["device"] == "cpu" and len(table["gemm_tflops"]) >= 9  # 3 orientations x 3+ shapes
    path = tmp_path / "k.json"
    path.write_text(json.dumps(table))
    t = load_table(str(path))
    assert t.gemm_seconds(128, 128, 128) > 0 and t.attention_seconds(1, 4, 4, 32, 128) > 0


@pytest.mark.parametrize("choice, device, quick, want", [
    ("auto", "cuda", False, True), ("auto", "cuda", True, False), ("auto", "cpu", False, False),
    ("yes", "cpu", True, True), ("no", "cuda", False, False)])
def test_when_the_table_is_measured(choice, device, quick, want):
    assert pcli.wants_kernel_table(choice, device, quick) is want


def test_a_gpu_table_becomes_a_measured_override_and_plan_uses_it(tmp_path, monkeypatch):
    fake = {"device": "NVIDIA H200", "gemm_tflops": {"8192x4096x4096": 100.0},
            "attention_tflops_fwd_bwd": {"32x32x128x8192": [50.0, 40.0]}, "seconds": 0.1}
    import trainperf.preflight.kernels as pk

    monkeypatch.setattr(pk, "measure_kernel_table", lambda device, iters: fake)
    result = {"measured_overrides": {"hbm_tbps": 4.2}}
    pcli.measure_kernel_table_into(result, "cuda", tmp_path)
    path = result["measured_overrides"]["kernel_table"]
    assert Path(path).is_file() and result["kernel_table"]["gemm_shapes"] == 1
    # what `plan` does with a stored preflight's overrides (cli.py): a 7x slower table, a slower step
    from tests.fixtures.specs import spec_for
    from trainperf.plan.costs import estimate

    slow = dataclasses.replace(PRESETS["h200"], **result["measured_overrides"])
    spec = spec_for("parallel.dp_shard=1")
    assert estimate(spec, slow, 8).step_time_s > 3 * estimate(spec, PRESETS["h200"], 8).step_time_s
    cpu = {"measured_overrides": {}}
    pcli.measure_kernel_table_into(cpu, "cpu", tmp_path)  # CPU figures are never handed to plan
    assert "kernel_table" not in cpu["measured_overrides"] and "kernel_table" in cpu


def test_flash4_column_is_sdpas_rate_times_the_queued_ratio():
    from trainperf.preflight.kernels import flash4_in_sdpa_frame

    sdpa = {"32x32x128x2048": [330.0, 272.0], "32x32x128x8192": [595.0, 530.0]}
    sdpa_queued = {"32x32x128x2048": [400.0, 340.0], "32x32x128x8192": [615.0, 536.0]}
    fa4_queued = {"32x32x128x2048": [500.0, 400.0], "32x32x128x8192": [689.0, 621.0]}
    col = flash4_in_sdpa_frame(sdpa, sdpa_queued, fa4_queued)
    assert col["32x32x128x2048"] == pytest.approx([330.0 * 500 / 400, 272.0 * 400 / 340], rel=1e-3)
    assert col["32x32x128x8192"] == pytest.approx([595.0 * 689 / 615, 530.0 * 621 / 536], rel=1e-3)
    # a shape FA4 skipped (head dim not a multiple of 8) stays out of its column
    assert set(flash4_in_sdpa_frame({**sdpa, "32x32x100x2048": [100.0, 100.0]}, sdpa_queued, fa4_queued)) == set(sdpa)
