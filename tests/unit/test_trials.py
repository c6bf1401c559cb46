"""Tune trials are stored as trials: the v7 migration keeps every row and recognises older trials."""

from __future__ import annotations

import json
import sqlite3

from trainperf.runner.tune import trial_command
from trainperf.store.db import MIGRATIONS, SCHEMA_VERSION, Store


def _v5_store(path) -> None:
    conn = sqlite3.connect(path)
    for v in range(1, 6):
        for stmt in MIGRATIONS[v].split(";"):
            if stmt.strip():
                conn.execute(stmt)
    conn.execute("PRAGMA user_version = 5")
    # a run, and a trial as `trainperf tune` ran it before trials had a column of their own (no evals at all)
    for run_id, every in (("a-run", 384), ("old-trial", 1_000_000_000)):
        spec = {"eval": {"every_samples": every, "target": 0.9}, "train": {"max_steps": 4}}
        conn.execute("INSERT INTO runs (run_id, created_at, workload, status, spec_json, layout, world_size) "
                     "VALUES (?, 0, 'w', 'failed', ?, 'dp_shard=1', 1)", (run_id, json.dumps(spec, sort_keys=True)))
    conn.commit()
    conn.close()


def test_v5_store_migrates_keeping_every_row_and_marking_old_trials(tmp_path):
    _v5_store(tmp_path / "t.db")
    store = Store(tmp_path / "t.db")
    assert store.schema_version == SCHEMA_VERSION >= 7  # through v6 (ownership) and v7 (purpose)
    assert {r["run_id"]: r["purpose"] for r in store.list_runs()} == {"a-run": "run", "old-trial": "trial"}
    assert [r["run_id"] for r in store.list_runs(trials=False)] == ["a-run"]


def test_new_trials_are_stored_as_trials_and_tune_asks_for_it(tmp_path):
    store = Store(tmp_path / "t.db")
    store.create_run("t1", "w", {}, "dp_shard=1", 1, "open", False, 0.9, str(tmp_path), purpose="trial")
    store.create_run("r1", "w", {}, "dp_shard=1", 1, "open", False, 0.9, str(tmp_path))
    assert [r["run_id"] for r in store.list_runs(workload="w", trials=False)] == ["r1"]
    assert "--trial" in trial_command("w", 2, "--set parallel.tp=2", 4, "t.db", "runs", [])


def test_trials_are_named_by_their_layout_and_counted_as_run():
    from types import SimpleNamespace

    from trainperf.core.spec import ParallelSpec, RunSpec
    from trainperf.runner.tune import Trial, TuneResult, trial_name

    spec = RunSpec(workload="w", parallel=ParallelSpec(dp_shard=2, tp=4, cp=2, sp=True))
    assert trial_name(SimpleNamespace(id="ab12cd:P2", spec=spec)).split() == ["ab12cd:P2", "DP2·TP4·CP2·SP", "MBS1"]
    cand = SimpleNamespace(id="P1")
    res = TuneResult(trials=[Trial(cand, 4, step_time_s=1.0), Trial(cand, 4, error="not tried: slower")])
    assert len(res.ran) == 1
