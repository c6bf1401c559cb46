"""`trainperf run` as the ranks of a job an external torchrun started (as srun would): a stalled rank
ends the run at the collective timeout, as 'hung', with a Flight Recorder dump in the run folder; a
finished run's per-GPU throughput is its total over the job's ranks."""

from __future__ import annotations

import json
import os
import pickle
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SHORT = ["--set", "hardware.device=cpu", "--set", "train.seed=3", "--set", "eval.every_samples=100000",
         "--set", "train.log_every=1"]
TIMEOUT_S = 5


def external_torchrun(tmp: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "trainperf", "run", "mini-pretrain", "--json", "--db", str(tmp / "t.db"), "--out", str(tmp / "runs"),
           *SHORT, *args]
    return subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=300, env=env)


def test_a_stalled_rank_under_an_external_torchrun_ends_the_run_as_hung_with_a_dump(tmp_path):
    env = dict(os.environ, TRAINPERF_TEST_STALL="1:3:60")  # rank 1 sleeps 60 s before step 3
    t0 = time.time()
    out = external_torchrun(tmp_path, "--set", "train.max_steps=6", "--set",
                            f"train.collective_timeout_s={TIMEOUT_S}", env=env)
    wall = time.time() - t0
    assert out.returncode != 0
    assert wall < 55, f"the timeout, not the stalled rank, must end the run ({wall:.0f} s)\n{out.stderr[-3000:]}"
    with sqlite3.connect(tmp_path / "t.db") as c:
        assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = c.execute("SELECT status, status_reason, run_id, out_dir FROM runs").fetchall()
    assert len(rows) == 1, rows  # one run id agreed by both ranks
    status, reason, run_id, out_dir = rows[0]
    assert status == "hung", reason
    assert f"timed out after {TIMEOUT_S} s" in reason and "last completed step 2" in reason
    run_dir = tmp_path / "runs" / run_id
    assert Path(out_dir) == run_dir
    dump = run_dir / "flight_recorder" / "rank_0"  # the rank whose collective timed out
    assert dump.is_file(), sorted(p.name for p in run_dir.rglob("*"))
    entries = pickle.loads(dump.read_bytes())["entries"]  # the form fr_trace reads
    assert any(e["profiling_name"].startswith("gloo:") for e in entries)


def test_per_gpu_throughput_of_an_external_two_rank_run_is_the_total_over_its_ranks(tmp_path):
    out = external_torchrun(tmp_path, "--set", "train.max_steps=3")
    assert out.returncode == 1, out.stderr[-3000:]  # no eval within 3 steps: failed by design, but measured
    s = json.loads(out.stdout)
    assert s["world_size"] == 2
    assert s["tokens_per_s"] > 0
    assert s["tokens_per_s_per_gpu"] == pytest.approx(s["tokens_per_s"] / 2)
    summary = json.loads((Path(s["out_dir"]) / "summary.json").read_text())
    assert summary["model_tflops_per_gpu"] == pytest.approx(
        summary["model_flops_per_token"] * summary["tokens_per_s"] / 2 / 1e12)
    with sqlite3.connect(tmp_path / "t.db") as c:
        stored = c.execute("SELECT tokens_per_s, tokens_per_s_per_gpu FROM runs").fetchone()
    assert stored == pytest.approx((s["tokens_per_s"], s["tokens_per_s"] / 2))
