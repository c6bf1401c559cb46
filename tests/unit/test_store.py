"""The results store: round trip, one transaction per write, concurrent writers, dead-run reaping,
and refusing files it cannot use. Every test checks something that a broken store would get wrong."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import sqlite3
import subprocess
import sys
import traceback

from pathlib import Path

import pytest

from trainperf.store.db import RUN_RESULT_FIELDS, SCHEMA_VERSION, Store, StoreError

SPEC = {"workload": "tiny", "train": {"lr": 0.001, "global_batch_size": 8}, "model": {"hidden_size": 64}}


def _create(store: Store, run_id: str, pid: int | None = None, workload: str = "tiny") -> None:
    store.create_run(run_id, workload, SPEC, "dp_shard=2", 2, "open", False, 3.25, f"/tmp/out/{run_id}",
                     hardware={"device": "cpu"}, software={"torch": "x"}, git_sha="abc123", pid=pid)


def _evals(n: int = 3) -> list[dict]:
    return [{"samples_count": 16 * (i + 1), "step": 2 * (i + 1), "eval_loss": 4.0 - 0.5 * i, "elapsed_s": 1.5 * (i + 1)}
            for i in range(n)]


def _steps() -> list[dict]:
    return [
        {"step": 1, "samples": 8, "loss": 5.0, "lr": 1e-4, "grad_norm": 2.5, "step_time_s": 0.1, "tokens_per_s": 1000.0},
        {"step": 2, "samples": 16},  # optional fields left out are stored as NULL
    ]


@pytest.fixture
def db(tmp_path):
    return tmp_path / "sub" / "results.db"  # parent does not exist yet: the store creates it


def test_round_trip(db):
    s = Store(db)
    assert s.schema_version == SCHEMA_VERSION
    assert s.conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
    _create(s, "r1")
    row = s.get_run("r1")
    assert row["status"] == "running"
    assert row["finished_at"] is None and row["time_to_train_s"] is None
    assert row["pid"] == os.getpid()

    s.finish_run("r1", eval_rows=_evals(), step_rows=_steps(), status="success", time_to_train_s=12.5,
                 samples_to_target=48, final_eval_loss=3.0, steps=6, step_time_s=0.25, tokens_per_s=1234.5,
                 tokens_per_s_per_gpu=617.25, model_tflops_per_gpu=0.5, mfu=None, peak_mem_gib=1.5,
                 mllog_path="/tmp/out/r1/mllog.txt", summary_path="/tmp/out/r1/summary.json")
    s.close()

    s = Store(db)  # a fresh connection sees exactly what was committed
    row = s.get_run("r1")
    assert row["run_id"] == "r1" and row["workload"] == "tiny"
    assert row["status"] == "success" and row["status_reason"] is None
    assert row["time_to_train_s"] == 12.5
    assert row["samples_to_target"] == 48
    assert row["final_eval_loss"] == 3.0
    assert row["steps"] == 6
    assert row["step_time_s"] == 0.25
    assert row["tokens_per_s"] == 1234.5
    assert row["tokens_per_s_per_gpu"] == 617.25
    assert row["model_tflops_per_gpu"] == 0.5
    assert row["mfu"] is None
    assert row["peak_mem_gib"] == 1.5
    assert row["mllog_path"] == "/tmp/out/r1/mllog.txt"
    assert row["summary_path"] == "/tmp/out/r1/summary.json"
    assert row["finished_at"] is not None and row["finished_at"] >= row["created_at"]
    assert json.loads(row["spec_json"]) == SPEC
    assert json.loads(row["hardware_json"]) == {"device": "cpu"}
    assert json.loads(row["software_json"]) == {"torch": "x"}
    assert row["layout"] == "dp_shard=2" and row["world_size"] == 2
    assert row["division"] == "open" and row["comparable"] == 0
    assert row["target"] == 3.25 and row["out_dir"] == "/tmp/out/r1" and row["git_sha"] == "abc123"

    expect_evals = [dict(run_id="r1", **e) for e in _evals()]
    assert s.evals("r1") == expect_evals
    got_steps = s.steps("r1")
    assert got_steps == [
        dict(run_id="r1", **_steps()[0]),
        {"run_id": "r1", "step": 2, "samples": 16, "loss": None, "lr": None, "grad_norm": None,
         "step_time_s": None, "tokens_per_s": None},
    ]
    runs = s.list_runs()
    assert [r["run_id"] for r in runs] == ["r1"]
    assert runs[0] == row
    assert s.list_runs(workload="other") == []
    assert s.evals("nope") == [] and s.steps("nope") == [] and s.get_run("nope") is None
    s.close()


def test_list_runs_filters_and_orders(db):
    s = Store(db)
    for i, wl in enumerate(["a", "b", "a", "a"]):
        _create(s, f"r{i}", workload=wl)
    assert [r["run_id"] for r in s.list_runs(workload="a")] == ["r3", "r2", "r0"]  # newest first
    assert [r["run_id"] for r in s.list_runs(limit=2)] == ["r3", "r2"]
    assert len(s.list_runs()) == 4
    s.close()


def test_failed_finish_writes_nothing(db):
    s = Store(db)
    _create(s, "r1")
    bad_evals = _evals(2) + [{"samples_count": 99, "step": 9, "eval_loss": 1.0}]  # no elapsed_s: KeyError mid-write
    with pytest.raises(KeyError):
        s.finish_run("r1", eval_rows=bad_evals, step_rows=_steps(), status="success", time_to_train_s=1.0)
    # the UPDATE and the first two eval rows ran inside the transaction; all of it must be rolled back
    other = Store(db)  # another connection: nothing half-written is visible
    for store in (s, other):
        row = store.get_run("r1")
        assert row["status"] == "running"
        assert row["time_to_train_s"] is None and row["finished_at"] is None
        assert store.evals("r1") == []
        assert store.steps("r1") == []
    assert not s.conn.in_transaction
    # the store is still usable afterwards
    s.finish_run("r1", eval_rows=_evals(2), status="success", time_to_train_s=2.0)
    assert other.get_run("r1")["status"] == "success"
    assert len(other.evals("r1")) == 2
    s.close()
    other.close()


def test_finish_unknown_run_and_unknown_fields(db):
    s = Store(db)
    with pytest.raises(StoreError, match="not in the store"):
        s.finish_run("ghost", eval_rows=_evals(1), status="success")
    assert s.evals("ghost") == []  # the eval row for the unknown run was rolled back too
    _create(s, "r1")
    with pytest.raises(StoreError, match="unknown run result fields"):
        s.finish_run("r1", status="success", bogus=1)
    assert "bogus" not in RUN_RESULT_FIELDS
    assert s.get_run("r1")["status"] == "running"
    with pytest.raises(StoreError):
        s.update_run_info("r1", status="success")
    assert s.get_run("r1")["status"] == "running"
    s.close()


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


@pytest.mark.parametrize("case", ["under-a-file", "a-folder", "read-only-file", "read-only-folder"])
def test_unusable_store_paths_are_one_line_errors(tmp_path, monkeypatch, case):
    (tmp_path / "afile").write_text("x")
    path = {"under-a-file": tmp_path / "afile" / "sub" / "t.db", "a-folder": tmp_path,
            "read-only-file": tmp_path / "ro.db", "read-only-folder": tmp_path / "new.db"}[case]
    if case == "read-only-file":
        Store(path).close()
    if case.startswith("read-only"):  # os.access, as a user without root's override sees it
        locked = path if case == "read-only-file" else tmp_path
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == locked else real_access(p, mode))
    words = {"under-a-file": "cannot create its folder", "a-folder": "is a folder",
             "read-only-file": "is read-only here", "read-only-folder": "is read-only here"}[case]
    with pytest.raises(StoreError, match=words) as err:
        Store(path)
    assert "\n" not in str(err.value) and "--db" in str(err.value)


def test_mark_failed_if_running(db):
    s = Store(db)
    _create(s, "ok")
    s.finish_run("ok", status="success", time_to_train_s=3.0)
    finished_at = s.get_run("ok")["finished_at"]
    assert s.mark_failed_if_running("ok", "too late") is False
    row = s.get_run("ok")
    assert row["status"] == "success" and row["status_reason"] is None
    assert row["time_to_train_s"] == 3.0 and row["finished_at"] == finished_at

    _create(s, "live")
    assert s.mark_failed_if_running("live", "killed") is True
    row = s.get_run("live")
    assert row["status"] == "failed" and row["status_reason"] == "killed"
    assert s.mark_failed_if_running("live", "again") is False
    assert s.get_run("live")["status_reason"] == "killed"
    s.close()


def test_not_a_database(tmp_path):
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is definitely not an sqlite file\x00\x01\x02" * 200)
    with pytest.raises(StoreError, match="not a usable SQLite database"):
        Store(path)


def test_newer_schema_refused(tmp_path):
    path = tmp_path / "future.db"
    c = sqlite3.connect(str(path))
    c.execute("CREATE TABLE runs (run_id TEXT)")
    c.execute("PRAGMA user_version = 99")
    c.commit()
    c.close()
    with pytest.raises(StoreError, match="newer"):
        Store(path)
    # nothing was changed by the refused open
    c = sqlite3.connect(str(path))
    assert c.execute("PRAGMA user_version").fetchone()[0] == 99
    c.close()


def test_reopen_does_not_remigrate(db):
    s = Store(db)
    _create(s, "r1")
    s.close()
    s = Store(db)  # migrating again would fail on CREATE TABLE or lose data
    assert s.schema_version == SCHEMA_VERSION
    assert s.get_run("r1")["status"] == "running"
    s.close()


def test_v1_store_migrates_to_current_schema_keeping_runs(tmp_path, monkeypatch):
    """An older store gains the new tables/columns on open; nothing already stored is lost."""
    import trainperf.store.db as db

    path = tmp_path / "old.db"
    monkeypatch.setattr(db, "SCHEMA_VERSION", 1)
    old = db.Store(path)
    # the row as a v1 trainperf wrote it (today's create_run names columns v1 lacks)
    with old.transaction() as c:
        c.execute("""INSERT INTO runs (run_id, created_at, workload, status, division, comparable, spec_json, layout,
                     world_size, hardware_json, software_json, git_sha, host, pid, target, out_dir)
                     VALUES ('r1', 1.0, 'mini-lora', 'running', 'open', 0, '{"a": 1}', 'dp_shard=1', 1, '{}', '{}',
                     NULL, 'h', 1, 0.9, ?)""", (str(tmp_path),))
    old.finish_run("r1", status="success", time_to_train_s=3.5)
    assert old.schema_version == 1
    old.close()
    monkeypatch.setattr(db, "SCHEMA_VERSION", SCHEMA_VERSION)
    new = db.Store(path)
    assert new.schema_version == SCHEMA_VERSION >= 2
    run = new.get_run("r1")
    assert run["status"] == "success" and run["time_to_train_s"] == 3.5 and run["predicted_step_time_s"] is None
    new.save_plan([{"plan_id": "x:P1", "workload": "mini-lora", "gpus": 2, "gpus_per_node": 2, "gpu": "H200",
                    "overrides": {"parallel.tp": 2}, "predicted": {"step_time_s": 1.0}}])
    assert new.get_plan("x:P1")["overrides"] == {"parallel.tp": 2}
