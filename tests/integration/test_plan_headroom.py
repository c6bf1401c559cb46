"""`plan --memory-headroom` (and `tune`'s): a layout is ranked only if its predicted memory leaves the
given fraction of the GPU free; the default covers the largest memory under-prediction measured."""

from __future__ import annotations

import json
import subprocess

from tests.fixtures.cli import trainperf_cmd


def test_invalid_headroom_via_the_cli(tmp_path):
    out = subprocess.run(trainperf_cmd("plan", "synthetic-lora", "--gpus", "2", "--memory-headroom", "0.7", "--json",
                                       "--db", str(tmp_path / "t.db")),
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert json.loads(out.stdout)["error"].startswith("--memory-headroom 0.7: must be a fraction")
    assert out.stderr.count("\n") == 1 and "[0, 0.5)" in out.stderr
    word = subprocess.run(trainperf_cmd("plan", "synthetic-lora", "--gpus", "2", "--memory-headroom", "lots"),
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert word.returncode == 2 and "--memory-headroom" in word.stderr and "invalid float" in word.stderr
