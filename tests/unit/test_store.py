"""The results store: round trip, one transaction per write, concurrent writers, dead-run reaping,
and refusing files it cannot use. Every test checks something that a broken store would get wrong."""

from __future__ import annotations

import json
import os
import sqlite3

from pathlib import Path

import pytest

from trainperf.store.db import RUN_RESULT_FIELDS, SCHEMA_VERSION, Store, StoreError

from tests.fixtures.store import SPEC, _create, _evals, _steps


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


def _item_run(s: Store, run_id: str, owner_pid: int) -> None:
    s.create_run(run_id, "mini-pretrain", SPEC, "dp_shard=1", 1, "open", False, 3.3, "/tmp/x",
                 sweep_item={"sweep_id": "sw", "item_id": "i1", "owner_pid": owner_pid})


def test_a_sweep_items_run_is_linked_and_ends_it_in_the_runs_own_writes(db):
    """The run a sweep starts links its item when its row is made and ends it when it succeeds, in the
    same transactions: a sweep killed in between cannot leave the item to be run a second time."""
    s = Store(db)
    s.add_sweep_items("sw", [{"item_id": "i1", "workload": "mini-pretrain", "nproc": 1, "overrides": {}}])
    assert s.claim_sweep_item("sw", "i1") is not None
    _item_run(s, "other", owner_pid=os.getpid() + 1)  # not the sweep that holds the item: not linked
    assert s.sweep_items("sw")[0]["run_id"] is None
    _item_run(s, "r1", owner_pid=os.getpid())
    assert s.sweep_items("sw")[0]["run_id"] == "r1"
    s.finish_run("r1", status="success", time_to_train_s=1.0)
    item = s.sweep_items("sw")[0]
    assert item["status"] == "success" and item["finished_at"] is not None
    s.set_sweep_item("sw", "i1", "pending", "r1", "the sweep was stopped")  # a late stop does not undo it
    assert s.sweep_items("sw")[0]["status"] == "success"
    with s.transaction() as c:  # an item left running by a store that lost the sweep's last write
        c.execute("UPDATE sweep_items SET status = 'running', owner_pid = NULL")
    assert s.claim_sweep_item("sw", "i1") is None and s.sweep_items("sw")[0]["status"] == "success"


def test_a_failed_or_interrupted_run_leaves_its_item_to_the_sweep(db):
    s = Store(db)
    s.add_sweep_items("sw", [{"item_id": "i1", "workload": "mini-pretrain", "nproc": 1, "overrides": {}}])
    s.claim_sweep_item("sw", "i1")
    _item_run(s, "r1", owner_pid=os.getpid())
    s.finish_run("r1", status="failed", status_reason="RunInterrupted: received signal SIGTERM")
    s.set_sweep_item("sw", "i1", "pending", "r1", "the sweep was stopped")
    assert s.sweep_items("sw")[0]["status"] == "pending"
    assert s.claim_sweep_item("sw", "i1")["status"] == "running"  # the resume runs it again


def test_a_healthy_store_on_a_full_disk_is_said_to_be_on_a_full_disk(tmp_path, monkeypatch):
    """Not "not a usable SQLite database ... restore it from a copy": the file is fine, the disk is full;
    and the -wal/-shm files the refused open made are removed."""
    import shutil

    import trainperf.store.db as db

    path = tmp_path / "t.db"
    Store(path).close()
    before = path.read_bytes()

    def fails_as_a_full_disk(self):
        Path(f"{self.path}-shm").write_bytes(b"\0" * 3)  # what SQLite had made when the write failed
        Path(f"{self.path}-wal").touch()
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(db.Store, "_switch_to_wal", fails_as_a_full_disk)
    monkeypatch.setattr(db.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(1 << 30, 1 << 30, 0))
    with pytest.raises(StoreError, match=r"the disk is full \(0 bytes free on the file system of") as err:
        Store(path)
    assert "restore" not in str(err.value) and "\n" not in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.db"] and path.read_bytes() == before


def test_a_run_refused_by_its_store_leaves_no_run_folder(tmp_path, monkeypatch):
    from trainperf.runner import local, row
    from trainperf.workloads import get_workload

    def full(*args, **kwargs):
        raise StoreError("results store 't.db': the disk is full (0 bytes free)")

    monkeypatch.setattr(row, "Store", full)
    spec = get_workload("mini-pretrain").defaults()
    with pytest.raises(StoreError, match="disk is full"):
        local.launch(spec, str(tmp_path / "out" / "runs"), str(tmp_path / "t.db"), 1, False)
    assert list(tmp_path.iterdir()) == []  # neither runs/<id>/ nor the folders made for it


def test_a_run_whose_store_cannot_be_written_still_has_a_summary(tmp_path, monkeypatch):
    from trainperf.runner import local
    from trainperf.runner.row import RunRow
    from trainperf.workloads import get_workload

    class FullStore:
        path = tmp_path / "t.db"

        def mark_failed_if_running(self, run_id, reason):
            raise sqlite3.OperationalError("database or disk is full")

        def get_run(self, run_id):
            raise StoreError("the disk is full")

    row = RunRow(tmp_path / "t.db", "r1")
    row._store = FullStore()  # the row's connection, on a disk that has filled up since it was opened
    ended = row.mark_failed("the disk is full: OSError: [Errno 28] No space left on device")
    assert ended.startswith("the disk is full") and "not recorded in the store: the disk is full" in ended
    summary = local.abnormal_end_summary(get_workload("mini-pretrain").defaults(), row, tmp_path, ended).as_dict()
    assert summary["status"] == "failed" and summary["status_reason"] == ended
