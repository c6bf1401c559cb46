"""``trainperf score``: the MLPerf score of a set of runs (olympic mean, RCP check, package export)."""

from __future__ import annotations

import argparse
import json

from trainperf.cli.errors import EXIT_FAILED, EXIT_OK, SpecError, bad_input
from trainperf.cli.options import add_common

HELP = "MLPerf score of a set of runs: olympic mean, RCP check, package export"
DESCRIPTION = ("Score runs from their MLPerf logs as MLPerf does: olympic mean of the run times "
               "(minutes), RCP check and scaling for closed-division runs; exit 1 if the score "
               "is not a valid MLPerf score. One score is of one set: one engine, system, GPU count, "
               "layout, GBS and MBS; each set is scored under its round's ruleset.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="*", metavar="RUN",
                   help="run ids from the store, result directories, or mllog files (result_*.txt, mllog.txt)")
    p.add_argument("--workload", help="score the most recent finished runs of this workload in the store: the "
                   "newest run's set (engine, system, GPU count, layout, GBS, MBS), never a pool of sets")
    p.add_argument("--engine", help="with --workload: the runs of this engine (trainperf, or an imported one such as "
                   "nemo; default: the newest run's); two engines' runs are never one set")
    p.add_argument("--system", help="with --workload: the set whose submitted system or GPU name contains this "
                   "(any case), e.g. Eos_n8 or H200; with --export: the package's system name (default: the logs' "
                   "submission_platform)")
    p.add_argument("--gpus", type=int, help="with --workload: the set of this many GPUs")
    p.add_argument("--layout", help="with --workload: the set of this layout, as `report` names it (DP8.TP4.SP)")
    p.add_argument("--last", type=int, default=None,
                   help="with --workload: how many of its newest runs (default: the runs its benchmark requires)")
    p.add_argument("--ruleset", default=None,
                   help="MLPerf training ruleset for RCPs and checks (default: an imported run's round, v4.1 -> "
                   "4.1.0, or the round folder a log lies in; else 6.0.0)")
    p.add_argument("--export", metavar="DIR", help="also write a submission package under DIR/<org>/ and check it")
    p.add_argument("--org", help="submitter for --export (default: the logs' submission_org)")
    add_common(p)


def run(args) -> int:
    # the MLPerf rules and RCP tables load only when a score is asked for, not for --help
    from trainperf.mlperf.score import (
        export_package,
        gather,
        print_score,
        score_gathered,
    )

    try:
        gathered = gather(args.inputs, db=args.db, workload=args.workload, last=args.last, ruleset=args.ruleset,
                          engine=args.engine, system=args.system, gpus=args.gpus, layout=args.layout)
        result = score_gathered(gathered)
        if args.export:
            # a --system given with --workload picked the set; the package is named by the logs' platform
            name = None if args.workload else args.system
            result.export = export_package(result, args.export, org=args.org, system=name)
    except SpecError as exc:
        return bad_input(str(exc), args.json)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print_score(result)
    return EXIT_OK if result.valid else EXIT_FAILED
