"""A run belongs to its processes: a launcher (or its torchrun) killed outright takes its ranks with it,
and the store row then says one thing -- failed -- that nothing rewrites afterwards."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
import types

import pytest

from tests.fixtures.cli import trainperf_cmd
from trainperf.core.processes import process_group_alive

LONG = ["--set", "hardware.device=cpu", "--set", "train.seed=3", "--set", "eval.every_samples=100000",
        "--set", "train.log_every=1", "--set", "train.max_steps=100000"]


def _ranks_of(run_root) -> list[int]:
    """Pids of the living ranks of the run folders under ``run_root``: processes whose command line
    names the worker and the folder (ranks torchrun starts as interpreters of their own), or the
    children of that run's torchrun (ranks forked from it, which share its command line)."""
    procs = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read().decode(errors="replace")
            with open(f"/proc/{entry}/stat") as fh:
                state, ppid = fh.read().rsplit(")", 1)[1].split()[:2]
        except OSError:
            continue
        if state != "Z" and str(run_root) in cmd:
            procs[int(entry)] = (int(ppid), cmd)
    torchruns = {pid for pid, (_, cmd) in procs.items() if "trainperf.parallel.torchrun" in cmd}
    return [pid for pid, (ppid, cmd) in procs.items()
            if ppid in torchruns or ("trainperf.runner.worker" in cmd and "--nproc-per-node" not in cmd)]


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
    try:
        with sqlite3.connect(db) as c:
            row = c.execute("SELECT out_dir FROM runs").fetchone()
    except sqlite3.OperationalError:  # the store is being created
        return False
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
        _wait_for(lambda: all(_gone(pid) for pid in ranks) and not _ranks_of(runs), 60, "the ranks to end")
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


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_an_owned_child_dies_with_its_parent_killed_outright(tmp_path):
    """start_owned: a parent SIGKILLed (no handler runs) still takes its child, via the death signal."""
    parent = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from trainperf.parallel.launcher import start_owned; "
        "p = start_owned(['sleep', '60']); print(p.pid, flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True, start_new_session=True)
    child = int(parent.stdout.readline())
    assert os.getpgid(child) == child  # a process group of its own
    parent.kill()
    parent.wait()
    _wait_for(lambda: _gone(child), 10, "the child to end")


def test_a_timed_out_trial_has_its_process_group_ended(monkeypatch):
    from trainperf.runner import tune  # the trial runner

    monkeypatch.setattr(tune, "trial_command", lambda *a: ["sh", "-c", "sleep 60 & echo $! >&2; wait"])
    cand = types.SimpleNamespace(id="P1", set_line="")
    t0 = time.monotonic()
    trial = tune.run_trial("mini-lora", 1, cand, 2, "t.db", "runs", [], timeout_s=1)
    assert time.monotonic() - t0 < 15
    assert "budget ran out (1 s were left" in trial.error and "process group" in trial.error and "ended" in trial.error
    pgid = int(trial.error.split("process group ")[1].split(")")[0])
    _wait_for(lambda: not process_group_alive(pgid), 5, "the trial's group to end")


_TRIAL_THAT_HIDES_ITS_TIMEOUT = """
import signal, sys, time
from trainperf.store.db import Store
store = Store(sys.argv[1])
store.create_run("trial-1", "mini-lora", {}, "dp_shard=1", 1, "open", False, 3.3, "/tmp/x", purpose="trial")
def stopped(signum, frame):  # as a rank stopped inside a collective records it: an empty RuntimeError
    store.mark_failed_if_running("trial-1", "RuntimeError: ")
    sys.exit(1)
signal.signal(signal.SIGTERM, stopped)
print("started", flush=True)
time.sleep(60)
"""


def test_a_timed_out_trials_row_says_it_timed_out(monkeypatch, tmp_path):
    from trainperf.runner import tune  # the trial runner
    from trainperf.store.db import Store

    db = tmp_path / "t.db"
    Store(db).close()
    monkeypatch.setattr(tune, "trial_command", lambda *a: [sys.executable, "-c", _TRIAL_THAT_HIDES_ITS_TIMEOUT, str(db)])
    cand = types.SimpleNamespace(id="P1", set_line="")
    trial = tune.run_trial("mini-lora", 1, cand, 2, str(db), str(tmp_path / "runs"), [], timeout_s=3)
    assert trial.run_id == "trial-1"
    row = Store(db).get_run("trial-1")
    assert row["status"] == "failed" and row["status_reason"].startswith("timed out after 3 s"), row["status_reason"]
    assert "RuntimeError" in row["status_reason"]  # what the run itself recorded is kept after it


@pytest.mark.slow
def test_sigterm_to_tune_ends_the_running_trial_and_says_so(tmp_path):
    tune = subprocess.Popen(trainperf_cmd("tune", "mini-pretrain", "--gpus", "1", "--db", str(tmp_path / "t.db"),
                                          "--out", str(tmp_path / "runs"), "--steps", "100000", "--set",
                                          "hardware.device=cpu"),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _wait_for(lambda: (tmp_path / "t.db").exists() and _step_reached(tmp_path / "t.db"), 120, "a trial to train")
        with sqlite3.connect(tmp_path / "t.db") as c:
            trial_pgid = c.execute("SELECT pgid FROM runs").fetchone()[0]
        tune.send_signal(signal.SIGTERM)
        out, err = tune.communicate(timeout=60)
    finally:
        if tune.poll() is None:
            os.killpg(tune.pid, signal.SIGKILL)
    assert tune.returncode == 1, err[-2000:]
    assert "tune stopped" in err and f"process group {trial_pgid}" in err and "Traceback" not in err
    assert not process_group_alive(trial_pgid)
    with sqlite3.connect(tmp_path / "t.db") as c:
        assert c.execute("SELECT status FROM runs").fetchone()[0] == "failed"


@pytest.mark.slow
def test_a_sweep_killed_outright_is_resumed_only_once_its_run_has_ended(tmp_path):
    """kill -9 of a sweep: its run dies with it (parent-death signal), and until it has, a resumed sweep
    does not claim the item -- never two runs of one item at once."""
    from trainperf.store.db import Store  # the store the sweep writes

    (tmp_path / "s.yaml").write_text("name: own\nruns:\n  - workload: mini-pretrain\n    set:\n"
                                     "      hardware.device: cpu\n      train.max_steps: 100000\n")
    db = tmp_path / "t.db"
    sweep = subprocess.Popen(trainperf_cmd("sweep", str(tmp_path / "s.yaml"), "--db", str(db), "--out",
                                           str(tmp_path / "runs")), cwd=tmp_path, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)

    def run_group():
        if not db.exists():
            return None
        try:
            with sqlite3.connect(db) as c:
                row = c.execute("SELECT run_pgid FROM sweep_items").fetchone()
        except sqlite3.OperationalError:  # the store is being created
            return None
        return row and row[0]

    try:
        pgid = _wait_for(run_group, 120, "the sweep to start its run")
    finally:
        os.kill(sweep.pid, signal.SIGKILL)
        sweep.wait()
    store = Store(db)
    item_id = store.sweep_items("own")[0]["item_id"]
    deadline = time.monotonic() + 60
    while (claimed := store.claim_sweep_item("own", item_id)) is None:  # refused while the run is ending
        holder = store.sweep_item_holder("own", item_id)  # None if the run ended since the claim was refused
        assert holder is None or holder.startswith("its previous run"), holder
        assert time.monotonic() < deadline, "the orphaned run did not end"
        time.sleep(0.05)
    assert claimed["status"] == "running" and not process_group_alive(pgid)


def test_a_rank_killed_outright_is_told_in_one_line_naming_it_and_the_signal(tmp_path):
    """torch-elastic logs its own monitor loop's traceback and names whichever failed rank it looked at
    first; trainperf's torchrun names the rank the signal ended, in one line, and tells the launcher."""
    from tests.fixtures.cli import REPO
    from trainperf.parallel.launcher import RANKS_END_ENV, killed_ranks

    # a slow monitor: by its first look both ranks have ended, the killed one first
    cmd = [sys.executable, "-m", "trainperf.parallel.torchrun", "--standalone", "--nproc-per-node=2",
           "--monitor-interval=2", "-m", "tests.fixtures.rank_killed"]
    ends = tmp_path / "ranks_end.json"
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, RANKS_END_ENV: str(ends)})
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "trainperf: torchrun: ranks failed (rank 1 killed by SIGKILL)"
    assert killed_ranks(ends) == ["rank 1 killed by SIGKILL"]


def test_the_run_of_a_killed_rank_says_so_before_what_its_peers_recorded(tmp_path):
    import json

    from trainperf.runner.local import record_abnormal_end
    from trainperf.store.db import Store

    store = Store(tmp_path / "t.db")
    store.create_run("r1", "mini-lora", {}, "dp_shard=2", 2, "open", False, 3.3, str(tmp_path))
    store.mark_failed_if_running("r1", "RuntimeError: Connection reset by peer")  # rank 0, when rank 1 vanished
    (tmp_path / "ranks_end.json").write_text(json.dumps({"exitcodes": {"1": -9}}))
    (tmp_path / "progress.json").write_text(json.dumps({"step": 4}))
    record_abnormal_end(store, "r1", tmp_path, "torchrun exited with code 1")
    assert store.get_run("r1")["status_reason"] == ("rank 1 killed by SIGKILL (kill -9, or the out-of-memory killer) "
                                                    "after step 4; then RuntimeError: Connection reset by peer")
