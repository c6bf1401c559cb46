"""``trainperf score``: the MLPerf score of a set of runs (olympic mean, RCP check, package export)."""

from __future__ import annotations

import argparse
import json

from trainperf.cli.errors import EXIT_FAILED, EXIT_OK, SpecError, bad_input
from trainperf.cli.options import add_common

HELP = "MLPerf score of a set of runs: olympic mean, RCP check, package export"
DESCRIPTION = ("Score runs from their MLPerf logs as MLPerf does: olympic mean of the run times "
               "(minutes), RCP check and scaling for closed-division runs; exit 1 if the score "
               "is not a valid MLPerf score.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="*", metavar="RUN",
                   help="run ids from the store, result directories, or mllog files (result_*.txt, mllog.txt)")
    p.add_argument("--workload", help="score the most recent finished runs of this workload in the store")
    p.add_argument("--engine", help="with --workload: the runs of this engine (trainperf, or an imported one such as "
                   "nemo; default: the newest run's); two engines' runs are never one set")
    p.add_argument("--last", type=int, default=None,
                   help="with --workload: how many of its newest runs (default: the runs its benchmark requires)")
    p.add_argument("--ruleset", default="6.0.0", help="MLPerf training ruleset for RCPs and checks (default 6.0.0)")
    p.add_argument("--export", metavar="DIR", help="also write a submission package under DIR/<org>/ and check it")
    p.add_argument("--org", help="submitter for --export (default: the logs' submission_org)")
    p.add_argument("--system", help="system name for --export (default: the logs' submission_platform)")
    add_common(p)


def run(args) -> int:
    # the MLPerf rules and RCP tables load only when a score is asked for, not for --help
    from trainperf.mlperf.score import (
        export_package,
        gather_runs,
        print_score,
        score_runs,
    )

    try:
        runs = gather_runs(args.inputs, db=args.db, workload=args.workload, last=args.last, ruleset=args.ruleset,
                            engine=args.engine)
        result = score_runs(runs, ruleset=args.ruleset)
        if args.export:
            result.export = export_package(result, args.export, org=args.org, system=args.system)
    except SpecError as exc:
        return bad_input(str(exc), args.json)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print_score(result)
    return EXIT_OK if result.valid else EXIT_FAILED
