"""A hung collective ends the run as 'hung' (with the last completed step and a flight-recorder
location), never damages the store; live Prometheus metrics are served while a run trains."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import time
import urllib.request

import pytest

from tests.fixtures.cli import trainperf_cmd

SHORT = ["--set", "hardware.device=cpu", "--set", "train.seed=3", "--set", "eval.every_samples=100000",
         "--set", "train.log_every=1"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_rank_stalling_past_the_timeout_ends_the_run_as_hung(tmp_path):
    db = tmp_path / "t.db"
    ok = subprocess.run(trainperf_cmd("run", "mini-pretrain", "--json", "--db", str(db), "--out", str(tmp_path / "runs"),
                                      *SHORT, "--set", "train.max_steps=2"), cwd=tmp_path, capture_output=True, text=True,
                        timeout=300)
    assert ok.returncode == 1, ok.stderr[-2000:]  # a finished (failed-by-design) run already in the store
    env = dict(os.environ, TRAINPERF_TEST_STALL="1:3:60")  # rank 1 sleeps 60 s before step 3
    t0 = time.time()
    hung = subprocess.run(trainperf_cmd("run", "mini-pretrain", "--nproc-per-node", "2", "--json", "--db", str(db),
                                        "--out", str(tmp_path / "runs"), *SHORT, "--set", "train.max_steps=6",
                                        "--set", "train.collective_timeout_s=5"),
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert hung.returncode != 0
    assert time.time() - t0 < 55, "the timeout, not the stalled rank, must end the run"
    with sqlite3.connect(db) as c:
        assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = c.execute("SELECT status, status_reason, run_id FROM runs ORDER BY created_at").fetchall()
    assert rows[0][0] == "failed"  # the earlier run is untouched
    status, reason, run_id = rows[1]
    assert status == "hung", reason
    assert "timed out" in reason and "last completed step 2" in reason
    assert (tmp_path / "runs" / run_id / "flight_recorder").is_dir()
    assert json.loads((tmp_path / "runs" / run_id / "progress.json").read_text())["step"] == 2


def test_metrics_port_serves_while_a_run_trains(tmp_path):
    port = _free_port()
    proc = subprocess.Popen(trainperf_cmd("run", "mini-pretrain", "--json", "--db", str(tmp_path / "t.db"),
                                          "--out", str(tmp_path / "runs"), "--metrics-port", str(port), *SHORT,
                                          "--set", "train.max_steps=400"),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = None
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
                steps = [float(line.split()[-1]) for line in text.splitlines() if line.startswith("trainperf_step{")]
                if steps and steps[0] > 0:
                    seen = steps[0]
                    break
            except OSError:
                pass
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.terminate()  # seen what we came for; the run records itself as failed (interrupted)
        proc.wait(timeout=300)
    assert seen is not None and seen >= 1


def test_bad_metrics_port_is_refused(tmp_path):
    out = subprocess.run(trainperf_cmd("run", "mini-pretrain", "--json", "--db", str(tmp_path / "t.db"),
                                       "--metrics-port", "70000"), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "metrics_port" in json.loads(out.stdout)["error"]
