"""A run belongs to its processes: a launcher (or its torchrun) killed outright takes its ranks with it,
and the store row then says one thing -- failed -- that nothing rewrites afterwards."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time

import pytest

from tests.fixtures.cli import trainperf_cmd

LONG = ["--set", "hardware.device=cpu", "--set", "train.seed=3", "--set", "eval.every_samples=100000",
        "--set", "train.log_every=1", "--set", "train.max_steps=100000"]


def _ranks_of(run_root) -> list[int]:
    """Pids of the living worker processes whose command line names a run folder under ``run_root``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read().decode(errors="replace")
            with open(f"/proc/{entry}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if ("trainperf.runner.worker" in cmd and str(run_root) in cmd and "torch.distributed.run" not in cmd
                and state != "Z"):
            pids.append(int(entry))
    return pids


def _wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _step_reached(db) -> bool:
    """A rank is training: the run folder has a progress file."""
    with sqlite3.connect(db) as c:
        row = c.execute("SELECT out_dir FROM runs").fetchone()
    return row is not None and os.path.exists(os.path.join(row[0], "progress.json"))


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["launcher", "torchrun"])
def test_a_killed_launcher_takes_its_ranks_and_the_row_stays_failed(tmp_path, victim):
    db, runs = tmp_path / "t.db", tmp_path / "runs"
    launcher = subprocess.Popen(trainperf_cmd("run", "mini-pretrain", "--nproc-per-node", "2", "--json", "--db", str(db),
                                              "--out", str(runs), *LONG), cwd=tmp_path, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_for(lambda: db.exists() and _step_reached(db), 120, "the ranks to train")
        ranks = _ranks_of(runs)
        assert len(ranks) == 2
        with sqlite3.connect(db) as c:
            pid, pgid, started = c.execute("SELECT pid, pgid, pid_started FROM runs").fetchone()
        assert pid == launcher.pid and started is not None and pgid not in (None, os.getpgrp())
        target = launcher.pid if victim == "launcher" else pgid  # torchrun leads the run's process group
        os.kill(target, signal.SIGKILL)
        _wait_for(lambda: not _ranks_of(runs), 60, "the ranks to end")
    finally:
        os.killpg(launcher.pid, signal.SIGKILL) if launcher.poll() is None else None
        launcher.wait()
    for pid in ranks:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    report = subprocess.run(trainperf_cmd("report", "--db", str(db), "--json"), cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    with sqlite3.connect(db) as c:
        status, reason = c.execute("SELECT status, status_reason FROM runs").fetchone()
        assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert status == "failed", reason
