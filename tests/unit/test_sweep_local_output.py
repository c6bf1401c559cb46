"""A local sweep says what it does: a line as each item starts and ends, each item's log kept (its path
printed), readable labels, exit 1 when any item failed, and `sweep retry FILE` runs only the failed items.
The runs are stood in for (``run_passing_signals``): what is tested is the sweep's side of them."""

from __future__ import annotations

import json
import re

import pytest

from trainperf.cli.main import main
from trainperf.runner import sweep
from trainperf.store.db import Store

SWEEP = """name: night
runs:
  - workload: mini-pretrain
    seeds: [1, 2, 3]
    set:
      hardware.device: cpu
"""


@pytest.fixture
def fake_runs(monkeypatch):
    """Stands in for `trainperf run`: seed 2 fails (until ``fixed``), the others succeed; every call counted
    by seed. Each writes a progress line to stderr and its JSON summary to stdout, as a run does."""
    calls: list[int] = []
    state = {"fixed": False}

    def run(cmd, stdout=None, stderr=None, on_start=None, **_):
        seed = int(next(a for a in cmd if a.startswith("train.seed=")).split("=")[1])
        calls.append(seed)
        ok = seed != 2 or state["fixed"]
        stderr.write(f"step 1/2 seed {seed} loss 5.0\n" + ("" if ok else "trainperf: it broke\n"))
        stderr.flush()
        summary = {"run_id": f"run-{seed}-{len(calls)}", "status": "success" if ok else "failed",
                   "status_reason": None if ok else "target not reached in 2 steps"}
        stdout.write(json.dumps(summary, indent=2))
        stdout.flush()
        return 0 if ok else 1

    monkeypatch.setattr(sweep, "run_passing_signals", run)
    return calls, state


def _sweep(tmp_path, *args: str) -> list[str]:
    return ["sweep", *args, "--db", str(tmp_path / "t.db"), "--out", str(tmp_path / "runs")]


def test_each_item_says_start_and_end_keeps_its_log_and_a_failure_exits_1(tmp_path, capsys, fake_runs, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(SWEEP)
    assert main(_sweep(tmp_path, "s.yaml")) == 1  # one item of three failed
    out = capsys.readouterr().out
    starts = re.findall(r"^\[(\d)/3\] start   mini-pretrain x1 hardware\.device=cpu train\.seed=(\d) \(log: (\S+)\)$",
                        out, re.M)
    assert [s[1] for s in starts] == ["1", "2", "3"], out
    assert re.search(r"^\[2/3\] failed  mini-pretrain x1 hardware\.device=cpu train\.seed=2 run-2-2 \(\d+ s\): "
                     r"target not reached in 2 steps \(log: ", out, re.M), out
    assert len(re.findall(r"^\[\d/3\] success ", out, re.M)) == 2
    assert "['" not in out  # no Python list reprs
    log = tmp_path / "runs" / "sweep-night" / f"{sweep.expand(sweep.read_sweep_file('s.yaml'), 'f')[1][1]['item_id']}.log"
    assert starts[1][2] == str(log)
    text = log.read_text()
    assert "trainperf: it broke" in text and '"run_id": "run-2-2"' in text and "=== exit 1 after" in text
    assert "sweep retry s.yaml" in out and "sweep night: 2 success, 1 failed, 0 pending, 0 running of 3" in out


def test_retry_runs_only_the_failed_items_and_exits_0_once_they_succeed(tmp_path, capsys, fake_runs, monkeypatch):
    calls, state = fake_runs
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(SWEEP)
    assert main(_sweep(tmp_path, "s.yaml")) == 1
    assert main(_sweep(tmp_path, "s.yaml")) == 1  # run again without retry: nothing runs, still failed
    assert calls == [1, 2, 3]
    assert "1 failed item not run again" in capsys.readouterr().out
    state["fixed"] = True
    assert main(_sweep(tmp_path, "retry", "s.yaml")) == 0
    assert calls == [1, 2, 3, 2]  # the failed item once more; a succeeded item never twice
    out = capsys.readouterr().out
    assert "sweep night: 1 failed item put back to run" in out
    assert "sweep night: 3 success, 0 failed" in out
    log = next((tmp_path / "runs" / "sweep-night").glob("*.log"), None)
    assert log is not None
    assert main(_sweep(tmp_path, "s.yaml", "--retry-failed")) == 0 and calls == [1, 2, 3, 2]  # nothing left to retry
    items = Store(tmp_path / "t.db").sweep_items("night")
    assert sorted(i["status"] for i in items) == ["success"] * 3
    two = [p for p in (tmp_path / "runs" / "sweep-night").glob("*.log") if "seed 2" in p.read_text()]
    assert len(two) == 1 and two[0].read_text().count("=== exit") == 2  # both attempts kept in its log


def test_retry_never_reruns_an_item_whose_run_succeeded(tmp_path):
    """A failed item whose recorded run is a success in the store (the sweep died between the two
    writes) becomes a success, not a retry."""
    store = Store(tmp_path / "t.db")
    store.add_sweep_items("s", [{"item_id": i, "workload": "w", "nproc": 1, "overrides": {}} for i in ("a", "b")])
    store.create_run("r1", "w", {}, "DP1", 1, "open", False, 1.0, str(tmp_path))
    store.finish_run("r1", status="success", status_reason=None)
    store.set_sweep_item("s", "a", "failed", "r1", "x")
    store.set_sweep_item("s", "b", "failed", None, "y")
    assert store.retry_failed_sweep_items("s", ["a", "b"]) == ["b"]
    assert {i["item_id"]: i["status"] for i in store.sweep_items("s")} == {"a": "success", "b": "pending"}
    assert store.retry_failed_sweep_items("s", ["a"]) == []


@pytest.mark.parametrize("argv, message", [
    (["s.yaml", "--nproc-per-node", "2"], "--nproc-per-node and --name go with --workload"),
    (["s.yaml", "extra.yaml"], "unexpected 'extra.yaml' after 's.yaml'"),
    (["status", "--retry-failed"], "sweep status shows progress"),
    (["retry"], "give a sweep file"),
])
def test_misused_sweep_arguments_are_one_line_of_bad_input(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(SWEEP)
    Store(tmp_path / "t.db").close()
    assert main(_sweep(tmp_path, *argv)) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
