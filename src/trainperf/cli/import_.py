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
from trainperf.core.untrusted import printable

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
    # names from the folders are escaped where they are read; once more here, at the terminal
    problems = [printable(line, 2000) for line in problems]
    for line in problems:
        print(f"trainperf: import: {line}", file=sys.stderr)
    if not runs:
        return bad_input(f"nothing to import from {' '.join(args.paths)} ({len(problems)} problems above)", args.json)
    # a run's id is the hash of its log's bytes: the same log twice (a copied folder) is one row
    first: dict[str, object] = {}
    for r in runs:
        first.setdefault(r.row["run_id"], r)
    store = Store(args.db)
    try:
        stored = {rid for r in runs for rid in (r.row["run_id"], r.legacy_run_id) if rid and store.get_run(rid)}
        fresh = [r for rid, r in first.items() if rid not in stored and r.legacy_run_id not in stored]
        written = set(store.import_runs([r.row for r in fresh]))
    finally:
        store.close()
    new_runs = {id(r) for r in runs if r.row["run_id"] in written and first[r.row["run_id"]] is r}
    again: dict[str, int] = {}
    for r in runs:
        if id(r) not in new_runs:
            again[r.where] = again.get(r.where, 0) + 1
    folders = [f"{where} ({n})" for where, n in again.items()]
    already = (f"{sum(again.values())} of these logs were already imported (the same log bytes as stored runs): "
               + ", ".join(folders[:3]) + (f" and {len(folders) - 3} more folders" if len(folders) > 3 else "")) \
        if again else None
    groups: dict[tuple, list] = {}
    for r in runs:
        hw = json.loads(r.row["hardware_json"])
        groups.setdefault((r.engine, r.row["workload"], hw["system"], hw["gpus"], r.row["layout"]), []).append(r)
    summary = [{"engine": printable(k[0], 40), "benchmark": k[1], "system": printable(k[2], 200), "gpus": k[3],
                "layout": k[4], "runs": len(v), "new": sum(id(r) in new_runs for r in v),
                "tokens_per_s_per_gpu": sorted(r.row["tokens_per_s_per_gpu"] for r in v)[len(v) // 2],
                "minutes": sorted((r.row["time_to_train_s"] or 0) / 60 for r in v)[len(v) // 2]}
               for k, v in groups.items()]
    if args.json:
        print(json.dumps({"imported": len(new_runs), "already_stored": len(runs) - len(new_runs), "groups": summary,
                          "already_imported": again, "problems": problems}, indent=2))
    else:
        for g in summary:
            print(f"{g['engine']:8s} {g['benchmark']:16s} {g['gpus']:5d} x {g['system'][:34]:34s} {g['layout']:26s} "
                  f"{g['runs']:2d} runs ({g['new']} new)  {g['tokens_per_s_per_gpu']:8,.0f} tok/s/GPU  "
                  f"median run {g['minutes']:.2f} min")
        if already:
            print(already)
        if summary:  # a median run is not the MLPerf score (olympic mean, RCP-scaled, under the round's rules)
            print("MLPerf scores of these sets: trainperf score --workload BENCHMARK [--system S --gpus N]")
        print(f"imported {len(new_runs)} runs into {printable(args.db)} ({len(runs) - len(new_runs)} already there, "
              f"{len(problems)} not imported)")
    return EXIT_OK
