"""Sweeps: grid expansion, idempotent resumable local queue, failures recorded and skipped past."""

from __future__ import annotations

import json
import sqlite3
import subprocess

import pytest

from tests.fixtures.cli import trainperf_cmd
from trainperf.store.db import Store


TWO_SEEDS = """  - workload: mini-pretrain
    seeds: [1, 2]
    set:
      train.max_steps: 2
      hardware.device: cpu
"""

SWEEP = "name: nightly\nruns:\n" + TWO_SEEDS + """  - workload: mini-pretrain
    set:
      parallel.tp: 3
"""


def test_local_sweep_is_resumable_and_survives_failures(tmp_path):
    (tmp_path / "s.yaml").write_text(SWEEP)
    args = ["--db", str(tmp_path / "t.db"), "--out", str(tmp_path / "runs"), "--json"]
    first = subprocess.run(trainperf_cmd("sweep", "s.yaml", *args), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert first.returncode == 1, first.stderr[-2000:]  # every item failed: the sweep says so
    assert json.loads(first.stdout) == {"nightly": {"pending": 0, "running": 0, "success": 0, "failed": 3}}
    logs = sorted((tmp_path / "runs" / "sweep-nightly").glob("*.log"))
    assert len(logs) == 2 and all(f"(log: {log})" in first.stderr for log in logs), first.stderr[-2000:]
    assert all("=== exit 1 after" in log.read_text() and '"status": "failed"' in log.read_text() for log in logs)
    store = Store(tmp_path / "t.db")
    items = {tuple(sorted(i["overrides"].items())): i for i in store.sweep_items("nightly")}
    bad = items[(("parallel.tp", 3),)]
    assert bad["run_id"] is None and "not divisible" in bad["reason"]  # refused before launch, queue went on
    runs_before = len(store.list_runs())
    assert runs_before == 2
    # run again: nothing finished is run twice
    again = subprocess.run(trainperf_cmd("sweep", "s.yaml", *args), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert again.returncode == 1 and len(Store(tmp_path / "t.db").list_runs()) == runs_before
    # an item interrupted mid-run (left 'running') is picked up by the next invocation
    some = next(i for i in items.values() if i["run_id"])
    with sqlite3.connect(tmp_path / "t.db") as c:
        c.execute("UPDATE sweep_items SET status = 'running' WHERE item_id = ?", (some["item_id"],))
    resumed = subprocess.run(trainperf_cmd("sweep", "s.yaml", *args), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 1
    assert len(Store(tmp_path / "t.db").list_runs()) == runs_before + 1
    status = subprocess.run(trainperf_cmd("sweep", "status", "--db", str(tmp_path / "t.db"), "--json"), cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert json.loads(status.stdout)["nightly"]["failed"] == 3


def test_bad_sweep_file_is_bad_input(tmp_path):
    (tmp_path / "s.yaml").write_text("name: x\nruns: 3\n")
    out = subprocess.run(trainperf_cmd("sweep", "s.yaml", "--db", str(tmp_path / "t.db")), cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "non-empty list" in out.stderr
    assert Store(tmp_path / "t.db").sweep_items() == []


TWICE = "name: shared\nruns:\n" + TWO_SEEDS


def test_two_sweeps_of_one_name_run_each_item_once_and_only_their_own(tmp_path):
    """Two processes on one file claim items in the store, so neither runs what the other runs; a
    second file under the same name runs its own items, not the first file's."""
    (tmp_path / "a.yaml").write_text(TWICE)
    (tmp_path / "b.yaml").write_text(TWICE.replace("seeds: [1, 2]", "seeds: [3]"))
    db = tmp_path / "t.db"
    Store(db).close()  # created before, so neither sweep's open races its creation
    args = ["--db", str(db), "--out", str(tmp_path / "runs"), "--json"]
    procs = [subprocess.Popen(trainperf_cmd("sweep", "a.yaml", *args), cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    # two steps reach no target: the items fail, and each sweep's exit code says so
    assert [p.returncode for p in procs] == [1, 1], [o[1][-1500:] for o in outs]
    store = Store(db)
    runs = store.list_runs()
    items = store.sweep_items("shared")
    assert len(runs) == 2 and sorted(i["run_id"] for i in items) == sorted(r["run_id"] for r in runs)
    b = subprocess.run(trainperf_cmd("sweep", "b.yaml", *args), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert b.returncode == 1, b.stderr[-1500:]
    runs_after = Store(db).list_runs()
    assert len(runs_after) == 3
    seeds = {json.loads(r["spec_json"])["train"]["seed"] for r in runs_after}
    assert seeds == {1, 2, 3}


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_sigterm_to_a_sweep_stops_its_run_and_leaves_the_item_to_resume(tmp_path, sig):
    """SIGTERM or SIGINT (Ctrl-C): the run is told the same signal and records it as the one that stopped it."""
    import signal
    import time

    (tmp_path / "s.yaml").write_text("""name: stopme
runs:
  - workload: mini-pretrain
    set:
      eval.target: 0.0001
      train.max_steps: 100000
      hardware.device: cpu
""")
    db = tmp_path / "t.db"
    proc = subprocess.Popen(trainperf_cmd("sweep", "s.yaml", "--db", str(db), "--out", str(tmp_path / "runs")),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (db.exists() and Store(db).list_runs()):
        time.sleep(0.5)
    time.sleep(2)  # the run is training
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and f"sweep stopped (received {sig})" in err, err[-1500:]
    store = Store(db)
    (item,) = store.sweep_items("stopme")
    (run,) = store.list_runs()
    assert run["status"] == "failed"  # the signal reached the run, which recorded its end
    assert run["status_reason"] == f"RunInterrupted: received signal {sig}"
    assert item["status"] == "pending" and item["run_id"] == run["run_id"] and "resumed" in item["reason"]


# A sweep that dies (SIGKILL: no handler runs) right after its item's run has stored its success,
# before the sweep itself records the item: the run's row already linked the item and ended it.
_DIE_AFTER_RUN = """
import os, signal, sys
from trainperf.runner import sweep
real = sweep.run_passing_signals
def run_then_die(*args, **kwargs):
    real(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)
sweep.run_passing_signals = run_then_die
from trainperf.cli.main import main
sys.exit(main(sys.argv[1:]))
"""

# The same, except that the item's launcher is stopped (SIGSTOP) once its run has stored its success:
# the launcher outlives the sweep, its SIGTERM pending.
_STOP_RUN_THEN_DIE = """
import os, signal, sqlite3, sys, time
from trainperf.parallel import launcher
from trainperf.runner import sweep
def stop_then_die(cmd, env=None, stdout=None, stderr=None, on_start=None, **passing):
    proc = launcher.start_owned(cmd, env, stdout, stderr)
    on_start(proc.pid)
    db = cmd[cmd.index("--db") + 1]
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        try:
            with sqlite3.connect(db) as c:
                if c.execute("SELECT 1 FROM runs WHERE status = 'success'").fetchone():
                    break
        except sqlite3.OperationalError:
            pass
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGSTOP)
    with open(os.environ["STOPPED_PID_FILE"], "w") as fh:
        fh.write(str(proc.pid))
    os.kill(os.getpid(), signal.SIGKILL)
sweep.run_passing_signals = stop_then_die
from trainperf.cli.main import main
sys.exit(main(sys.argv[1:]))
"""

ONE_SEED = """name: once
runs:
  - workload: mini-pretrain
    seeds: [7]
    set:
      hardware.device: cpu
      eval.target: 100
      eval.every_samples: 1
      train.max_steps: 4
      data.train_samples: 64
      data.eval_samples: 8
"""


def _successes(db) -> list[dict]:
    store = Store(db)
    try:
        return [r for r in store.list_runs() if r["status"] == "success"]
    finally:
        store.close()


@pytest.mark.slow
def test_a_sweep_killed_after_its_run_stored_success_does_not_run_it_again(tmp_path):
    import sys

    from tests.fixtures.cli import run_cli

    (tmp_path / "s.yaml").write_text(ONE_SEED)
    db, args = tmp_path / "t.db", ["--db", str(tmp_path / "t.db"), "--out", str(tmp_path / "runs")]
    killed = subprocess.run([sys.executable, "-c", _DIE_AFTER_RUN, "sweep", "s.yaml", *args], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    (run,) = _successes(db)
    (item,) = Store(db).sweep_items("once")
    assert item["status"] == "success" and item["run_id"] == run["run_id"]  # linked by the run's own writes
    with sqlite3.connect(db) as c:  # even an item left running (the sweep's last write lost) holds its run
        c.execute("UPDATE sweep_items SET status = 'running', finished_at = NULL")
    resumed = run_cli("sweep", "s.yaml", *args, "--json", cwd=tmp_path)
    assert resumed.returncode == 0 and json.loads(resumed.stdout)["once"]["success"] == 1, resumed.stderr[-2000:]
    assert [r["run_id"] for r in _successes(db)] == [run["run_id"]]  # one run of seed 7, not two


@pytest.mark.slow
def test_a_stopped_launcher_outliving_its_killed_sweep_is_never_run_twice(tmp_path):
    import os
    import signal
    import sys

    from tests.fixtures.cli import run_cli

    (tmp_path / "s.yaml").write_text(ONE_SEED)
    db, args = tmp_path / "t.db", ["--db", str(tmp_path / "t.db"), "--out", str(tmp_path / "runs")]
    pid_file = tmp_path / "stopped.pid"
    killed = subprocess.run([sys.executable, "-c", _STOP_RUN_THEN_DIE, "sweep", "s.yaml", *args], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "STOPPED_PID_FILE": str(pid_file)})
    assert killed.returncode == -9, killed.stderr[-2000:]
    first = run_cli("sweep", "s.yaml", *args, "--json", cwd=tmp_path)  # the launcher may still be there
    assert first.returncode == 0 and json.loads(first.stdout)["once"]["success"] == 1, first.stderr[-2000:]
    try:  # a stopped group orphaned by the sweep's death is sent SIGHUP and SIGCONT by the kernel: it may be gone
        os.kill(int(pid_file.read_text()), signal.SIGCONT)
    except ProcessLookupError:
        pass
    second = run_cli("sweep", "s.yaml", *args, "--json", cwd=tmp_path)
    assert second.returncode == 0 and json.loads(second.stdout)["once"]["success"] == 1, second.stderr[-2000:]
    (run,) = _successes(db)
    assert Store(db).sweep_items("once")[0]["run_id"] == run["run_id"]
