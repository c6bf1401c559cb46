"""`trainperf tune`: real short trials of planned layouts; the measured fastest wins."""

from __future__ import annotations

import json
import subprocess

from tests.fixtures.cli import trainperf_cmd


def test_tune_keeps_the_measured_fastest(tmp_path):
    out = subprocess.run(
        trainperf_cmd("tune", "mini-pretrain", "--gpus", "1", "--top", "4", "--steps", "3", "--budget-minutes", "5",
                      "--abandon-factor", "0",  # CPU: H200 predictions say nothing here, try every layout
                      "--keep-within", "0",  # plain successive halving: the faster half goes on
                      "--set", "hardware.device=cpu", "--json", "--db", str(tmp_path / "t.db"), "--out", str(tmp_path / "runs")),
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout)
    first = [t for t in res["trials"] if t["steps"] == 3]
    assert len(first) == 4 and all(t["step_time_s"] for t in first)
    second = [t for t in res["trials"] if t["steps"] == 6]
    faster_half = sorted(first, key=lambda t: t["step_time_s"])[:2]
    assert [t["id"] for t in second] == [t["id"] for t in faster_half]  # the faster half, twice the steps
    assert len(res["trials"]) == 6  # then one is left: it wins without another round
    assert res["winner"] == min(second, key=lambda t: t["step_time_s"])["id"]
    assert res["command"].startswith("trainperf run mini-pretrain --nproc-per-node 1 --set parallel.tp=1")
