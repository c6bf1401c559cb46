"""`trainperf import` and `plan --calibrate --engine` as a user runs them (published folders read where
the checkout has them, ../shared/published)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.cli import trainperf_cmd

PUBLISHED = Path(__file__).resolve().parents[2] / ".." / "shared" / "published" / "v4.1" / "NVIDIA"


@pytest.mark.skipif(not PUBLISHED.is_dir(), reason="no published MLPerf folders here")
def test_import_then_a_fit_that_names_what_it_needs(tmp_path):
    org = tmp_path / "v4.1" / "NVIDIA"
    res = org / "results" / "h200_ngc24.09_nemo" / "llama2_70b_lora"
    res.mkdir(parents=True)
    shutil.copy(PUBLISHED / "results/h200_ngc24.09_nemo/llama2_70b_lora/result_0.txt", res)
    shutil.copytree(PUBLISHED / "systems", org / "systems")
    shutil.copytree(PUBLISHED / "benchmarks", org / "benchmarks")
    db = ["--db", str(tmp_path / "t.db")]
    out = subprocess.run(trainperf_cmd("import", str(tmp_path / "v4.1"), str(tmp_path / "nothing"), "--json", *db),
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert got["imported"] == 1 and got["groups"][0]["engine"] == "nemo" and got["groups"][0]["layout"] == "CP2 DP4 MBS 1"
    assert "nothing: not an MLPerf submission folder" in out.stderr
    fit = subprocess.run(trainperf_cmd("plan", "--calibrate", "--engine", "nemo", *db), cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert fit.returncode == 2 and "a fit needs at least 3" in fit.stderr and "llama2_70b_lora@8 CP2 DP4" in fit.stderr


@pytest.mark.skipif(not PUBLISHED.is_dir(), reason="no published MLPerf folders here")
def test_plan_names_where_the_stored_layouts_at_its_scale_rank(tmp_path):
    """After `import`, a plan for the engine at a scale the store holds runs of shows each stored layout
    with its measured tokens/s, its rank in this plan and the plan's prediction for it."""
    db = ["--db", str(tmp_path / "t.db")]
    out = subprocess.run(trainperf_cmd("import", str(PUBLISHED.parents[1]), *db), cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = {}
    for engine in ("nemo", "trainperf"):
        plan = subprocess.run(trainperf_cmd("plan", "llama2_70b_lora", "--gpus", "64", "--gpu", "h100", "--engine", engine,
                                            "--gbs", "8", "--top", "3", "--json", *db),
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert plan.returncode == 0, plan.stderr[-2000:]
        got[engine] = json.loads(plan.stdout)["stored_at_scale"]
    nvidia = next(e for e in got["nemo"] if e["layout"] == "TP4 SP CP2 DP8 MBS 1")
    assert nvidia["runs"] >= 5 and nvidia["global_batch_size"] == 8 and 1 <= nvidia["rank"] <= nvidia["ranked"]
    assert abs(nvidia["predicted_tokens_per_s_per_gpu"] / nvidia["tokens_per_s_per_gpu"] - 1) < 0.15
    assert got["trainperf"] == []  # the store holds no run of this engine at 64 GPUs
