"""``trainperf import DIR...``: MLPerf submission folders into the store as runs of their engine.

Each result_*.txt becomes one finished run (benchmark, GPUs, nodes, GPU model, layout, GBS, MBS,
precision, step time and tokens/s from the log's tracked_stats, time to train, status) with its
engine named (``nemo`` for NVIDIA's NeMo submissions). What stops a folder or a log from being
imported is printed, one line each; the runs that are complete are written in one transaction.
"""

from __future__ import annotations

import argparse
import json
import sys

from trainperf.cli.errors import EXIT_OK, SpecError, bad_input
from trainperf.cli.options import add_common

HELP = "read MLPerf submission folders into the store as runs of their engine"
DESCRIPTION = ("Import published MLPerf Training results (<org>/results/<system>/<benchmark>/result_*.txt with "
               "<org>/systems/<system>.json and the implementation's config scripts) as finished runs of "
               "another engine, to compare with ours and to fit that engine's profile (plan --calibrate --engine).")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="DIR", help="round, org or results folders of MLPerf submissions")
    p.add_argument("--ruleset", default="6.0.0",
                   help="compliance ruleset for logs outside a vX.Y round folder (default 6.0.0; a round folder "
                        "named v4.1 is checked with 4.1.0)")
    add_common(p)


def run(args) -> int:
    # the submission reader loads mlperf_logging: only when an import runs, not for --help
    from trainperf.mlperf.published import read_submissions

    # the store (and sqlite3) loads only when a command runs, not for --help
    from trainperf.store.db import Store

    try:
        runs, problems = read_submissions(args.paths, args.ruleset)
    except (SpecError, OSError) as exc:
        return bad_input(str(exc), args.json)
    for line in problems:
        print(f"trainperf: import: {line}", file=sys.stderr)
    if not runs:
        return bad_input(f"nothing to import from {' '.join(args.paths)} ({len(problems)} problems above)", args.json)
    store = Store(args.db)
    try:
        written = set(store.import_runs([r.row for r in runs]))
    finally:
        store.close()
    groups: dict[tuple, list] = {}
    for r in runs:
        hw = json.loads(r.row["hardware_json"])
        groups.setdefault((r.engine, r.row["workload"], hw["system"], hw["gpus"], r.row["layout"]), []).append(r)
    summary = [{"engine": k[0], "benchmark": k[1], "system": k[2], "gpus": k[3], "layout": k[4], "runs": len(v),
                "new": sum(r.row["run_id"] in written for r in v),
                "tokens_per_s_per_gpu": sorted(r.row["tokens_per_s_per_gpu"] for r in v)[len(v) // 2],
                "minutes": sorted((r.row["time_to_train_s"] or 0) / 60 for r in v)[len(v) // 2]}
               for k, v in groups.items()]
    if args.json:
        print(json.dumps({"imported": len(written), "already_stored": len(runs) - len(written), "groups": summary,
                          "problems": problems}, indent=2))
    else:
        for g in summary:
            print(f"{g['engine']:8s} {g['benchmark']:16s} {g['gpus']:5d} x {g['system'][:34]:34s} {g['layout']:26s} "
                  f"{g['runs']:2d} runs ({g['new']} new)  {g['tokens_per_s_per_gpu']:8,.0f} tok/s/GPU  "
                  f"median {g['minutes']:.2f} min")
        print(f"imported {len(written)} runs into {args.db} ({len(runs) - len(written)} already there, "
              f"{len(problems)} not imported)")
    return EXIT_OK
