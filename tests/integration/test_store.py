"""The results store: round trip, one transaction per write, concurrent writers, dead-run reaping,
and refusing files it cannot use. Every test checks something that a broken store would get wrong."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import subprocess
import sys
import traceback

from pathlib import Path

import pytest

from trainperf.store.db import SCHEMA_VERSION, Store, StoreError

from tests.fixtures.store import _create, _evals, _steps


def _concurrent_worker(path: str, worker: int, n: int) -> None:
    """Module level so that the 'spawn' context can pickle it."""
    s = Store(path)
    for i in range(n):
        run_id = f"w{worker}-{i}"
        _create(s, run_id)
        s.finish_run(run_id, eval_rows=_evals(3), step_rows=_steps(), status="success", time_to_train_s=float(i))
    s.close()


def _concurrent_entry(path: str, worker: int, n: int, errors) -> None:
    try:
        _concurrent_worker(path, worker, n)
    except BaseException:
        errors.put(f"worker {worker}: {traceback.format_exc()}")
        raise


def test_concurrent_writers(db):
    ctx = mp.get_context("spawn")
    errors = ctx.Queue()
    # every process opens the (not yet created) file at once: creation and migration race too
    procs = [ctx.Process(target=_concurrent_entry, args=(str(db), w, 25, errors)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    msgs = []
    while not errors.empty():
        msgs.append(errors.get())
    assert not msgs, "\n".join(msgs)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]

    s = Store(db)
    assert s.schema_version == SCHEMA_VERSION
    runs = s.list_runs(limit=1000)
    assert len(runs) == 100
    assert {r["run_id"] for r in runs} == {f"w{w}-{i}" for w in range(4) for i in range(25)}
    assert all(r["status"] == "success" for r in runs)
    for r in runs:
        assert len(s.evals(r["run_id"])) == 3
        assert len(s.steps(r["run_id"])) == 2
    assert s.conn.execute("SELECT COUNT(*) FROM evals").fetchone()[0] == 300
    s.close()


def _open_at_once(path: str, barrier, errors) -> None:
    barrier.wait()
    try:
        Store(path).close()
    except StoreError as exc:
        errors.put(str(exc))


def test_processes_opening_a_new_store_together_all_get_it(tmp_path):
    # the ranks of one torchrun open a store that does not exist yet in the same millisecond; SQLite
    # refuses the switch to WAL at once ("database is locked", no busy wait) while another holds the file.
    # Before the wait in Store._switch_to_wal, about one round in six failed here.
    ctx = mp.get_context("fork")  # fork: the four start within microseconds of the barrier
    errors = ctx.Queue()
    for round_ in range(40):
        path = str(tmp_path / f"r{round_}.db")
        barrier = ctx.Barrier(4)
        procs = [ctx.Process(target=_open_at_once, args=(path, barrier, errors)) for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=60)
        assert [p.exitcode for p in procs] == [0] * 4
        assert errors.empty(), f"round {round_}: {errors.get()}"
        s = Store(path)
        assert s.schema_version == SCHEMA_VERSION
        assert s.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        s.close()


def test_reap_dead_runs(db):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    dead_pid = proc.pid
    try:
        os.kill(dead_pid, 0)
        pytest.skip("the exited child's pid was reused already")
    except ProcessLookupError:
        pass
    s = Store(db)
    _create(s, "dead", pid=dead_pid)
    _create(s, "alive", pid=os.getpid())
    _create(s, "done", pid=dead_pid)
    s.finish_run("done", status="success", time_to_train_s=1.0)
    assert s.reap_dead_runs() == ["dead"]
    row = s.get_run("dead")
    assert row["status"] == "failed"
    assert row["status_reason"] and "died" in row["status_reason"]
    assert row["finished_at"] is not None
    assert s.get_run("alive")["status"] == "running"
    assert s.get_run("alive")["status_reason"] is None
    assert s.get_run("done")["status"] == "success"  # a finished run of a dead process is left alone
    assert s.reap_dead_runs() == []  # idempotent
    s.close()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    try:
        os.kill(proc.pid, 0)
        pytest.skip("the exited child's pid was reused already")
    except ProcessLookupError:
        return proc.pid


def test_a_run_of_another_pid_namespace_is_not_reaped(db):
    """Containers on one host share its hostname; their pids are not ours to ask. A row whose process
    lives in another PID namespace is left running; one of ours whose pid is gone is reaped."""
    import trainperf.store.db as store_db

    s = Store(db)
    dead = _dead_pid()
    _create(s, "theirs", pid=dead)
    _create(s, "ours", pid=dead)
    s.conn.execute("UPDATE runs SET pid_ns = 'pid:[1]' WHERE run_id = 'theirs'")
    assert s.get_run("ours")["pid_ns"] == store_db.pid_namespace() is not None
    assert s.reap_dead_runs() == ["ours"]
    assert s.get_run("theirs")["status"] == "running"
    s.close()


def test_a_sweep_item_is_claimed_by_one_process_only(db):
    s = Store(db)
    items = [{"item_id": name, "workload": "w", "nproc": 1, "overrides": {"train.seed": i}}
             for i, name in enumerate(("a", "b", "c", "d"))]
    s.add_sweep_items("sw", items)
    claimed = s.claim_sweep_item("sw", "a")
    assert claimed["status"] == "running" and claimed["overrides"] == {"train.seed": 0}
    row = next(r for r in s.sweep_items("sw") if r["item_id"] == "a")
    assert (row["status"], row["owner_pid"]) == ("running", os.getpid())
    assert s.claim_sweep_item("sw", "a") is None  # held by a live process (this one)
    s.set_sweep_item("sw", "b", "success", "run-b")
    assert s.claim_sweep_item("sw", "b") is None  # finished: never again
    s.conn.execute("UPDATE sweep_items SET status = 'running', owner_host = ?, owner_pid = ? WHERE item_id = 'c'",
                   (socket.gethostname(), _dead_pid()))
    assert s.claim_sweep_item("sw", "c")["item_id"] == "c"  # its sweep died: taken over
    s.conn.execute("UPDATE sweep_items SET status = 'running', owner_host = 'elsewhere', owner_pid = 1 WHERE item_id = 'd'")
    assert s.claim_sweep_item("sw", "d") is None  # another host's process cannot be asked
    assert s.sweep_item_holder("sw", "d") == "host elsewhere, pid 1" and s.sweep_item_holder("sw", "b") is None
    assert s.claim_sweep_item("sw", "d", take_over=True)["item_id"] == "d"  # the user says it is gone
    assert s.sweep_item_holder("sw", "d") == f"host {socket.gethostname()}, pid {os.getpid()}"
    assert s.claim_sweep_item("sw", "b", take_over=True) is None  # finished stays finished
    assert s.claim_sweep_item("sw", "nope") is None
    s.close()


def test_a_reader_may_open_a_store_it_cannot_write(tmp_path, monkeypatch):
    """report and sweep status read a read-only store as it is: no WAL switch, no migration, no reaping."""
    path = tmp_path / "ro.db"
    s = Store(path)
    _create(s, "gone", pid=_dead_pid())
    s.close()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == path else real_access(p, mode))
    with pytest.raises(StoreError, match="is read-only here"):
        Store(path)
    reader = Store(path, read_only_ok=True)
    assert reader.writable is False and reader.reap_dead_runs() == []
    assert [r["run_id"] for r in reader.list_runs()] == ["gone"] and reader.get_run("gone")["status"] == "running"
    reader.close()
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == tmp_path else real_access(p, mode))
    with pytest.raises(StoreError, match="is read-only here"):  # nothing to read: a new store cannot be made there
        Store(tmp_path / "new.db", read_only_ok=True)
