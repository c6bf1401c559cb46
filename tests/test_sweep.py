"""Sweeps: grid expansion, idempotent resumable local queue, failures recorded and skipped past."""

from __future__ import annotations

import json
import sqlite3
import subprocess

import pytest

from conftest import trainperf_cmd
from trainperf.launch.sweep import expand
from trainperf.specs import SpecError
from trainperf.store.db import Store


def test_expand_spans_the_grid_with_stable_ids():
    data = {"name": "s", "runs": [{"workload": "mini-lora", "nproc_per_node": [1, 2], "seeds": [1, 2, 3],
                                   "set": {"train.global_batch_size": [16, 32], "train.lr": 0.01}}]}
    name, items = expand(data, "f")
    assert name == "s" and len(items) == 2 * 3 * 2
    assert len({i["item_id"] for i in items}) == len(items)
    assert {i["overrides"]["train.seed"] for i in items} == {1, 2, 3}
    assert all(i["overrides"]["train.lr"] == 0.01 for i in items)
    assert [i["item_id"] for i in expand(data, "f")[1]] == [i["item_id"] for i in items]  # stable across reads


@pytest.mark.parametrize("data, words", [
    ({"runs": [{"workload": "x"}]}, "needs a name"),
    ({"name": "s", "runs": []}, "non-empty list"),
    ({"name": "s", "runs": [{"nproc_per_node": 2}]}, "needs a workload"),
    ({"name": "s", "runs": [{"workload": "x", "gpus": 2}]}, "unknown keys"),
    ({"name": "s", "runs": [{"workload": "x", "set": ["a"]}]}, "must map"),
])
def test_malformed_sweeps_are_refused(data, words):
    with pytest.raises(SpecError, match=words):
        expand(data, "f")


SWEEP = """name: nightly
runs:
  - workload: mini-pretrain
    seeds: [1, 2]
    set:
      train.max_steps: 2
      hardware.device: cpu
  - workload: mini-pretrain
    set:
      parallel.tp: 3
"""


def test_local_sweep_is_resumable_and_survives_failures(tmp_path):
    (tmp_path / "s.yaml").write_text(SWEEP)
    args = ["--db", str(tmp_path / "t.db"), "--out", str(tmp_path / "runs"), "--json"]
    first = subprocess.run(trainperf_cmd("sweep", "s.yaml", *args), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    assert json.loads(first.stdout) == {"nightly": {"pending": 0, "running": 0, "success": 0, "failed": 3}}
    store = Store(tmp_path / "t.db")
    items = {tuple(sorted(i["overrides"].items())): i for i in store.sweep_items("nightly")}
    bad = items[(("parallel.tp", 3),)]
    assert bad["run_id"] is None and "not divisible" in bad["reason"]  # refused before launch, queue went on
    runs_before = len(store.list_runs())
    assert runs_before == 2
    # run again: nothing finished is run twice
    again = subprocess.run(trainperf_cmd("sweep", "s.yaml", *args), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and len(Store(tmp_path / "t.db").list_runs()) == runs_before
    # an item interrupted mid-run (left 'running') is picked up by the next invocation
    some = next(i for i in items.values() if i["run_id"])
    with sqlite3.connect(tmp_path / "t.db") as c:
        c.execute("UPDATE sweep_items SET status = 'running' WHERE item_id = ?", (some["item_id"],))
    resumed = subprocess.run(trainperf_cmd("sweep", "s.yaml", *args), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0
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
