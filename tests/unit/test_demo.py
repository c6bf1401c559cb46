"""`trainperf demo` (what `make demo` runs) hands the run and report commands complete arguments."""

from __future__ import annotations

import argparse

from trainperf.cli import demo
from trainperf.cli import report as report_command
from trainperf.cli import run as run_command


def _dests(command) -> set[str]:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return {a.dest for a in parser._actions if a.dest != "help"}


def test_demo_runs_mini_lora_and_the_report_with_every_option_their_parsers_define(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(run_command, "run", lambda args, workload=None: seen.setdefault("run", args) and 0)
    monkeypatch.setattr(report_command, "run", lambda args: seen.setdefault("report", args) and 0)
    args = argparse.Namespace(nproc_per_node=2, db=str(tmp_path / "t.db"), out=str(tmp_path / "runs"), json=False)
    assert demo.run(args) == 0
    run_args, report_args = seen["run"], seen["report"]
    assert _dests(run_command) <= set(vars(run_args)) and _dests(report_command) <= set(vars(report_args))
    assert run_args.workload == "mini-lora" and run_args.nproc_per_node == 2 and run_args.db == args.db
    assert run_args.trial is False and report_args.db == args.db and report_args.limit == 10
