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
