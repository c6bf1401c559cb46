"""``trainperf report``: a table of the runs in the results store (and optionally one HTML page)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trainperf.cli.errors import EXIT_OK, bad_input
from trainperf.cli.options import add_common
from trainperf.core.untrusted import printable

HELP = "table of stored runs"
DESCRIPTION = ("Show the runs in the results store: every run, one table per workload (and with --html one "
               "page with scaling tables, plots and MLPerf scores). --limit N lists only the newest N; every "
               "figure, score and plot is still of all the runs.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", help="only runs of this workload")
    p.add_argument("--limit", type=int, default=None,
                   help="list only the newest N runs (default: every run); scores, scaling rows, plots and the "
                   "projection are of all the runs, and the listing says how many it left out")
    p.add_argument("--html", metavar="FILE", help="also write the full report as one self-contained HTML page")
    p.add_argument("--trials", action="store_true", help="include `trainperf tune` trials (left out by default)")
    p.add_argument("--wide", action="store_true",
                   help="every column, whatever the terminal's width (by default columns are dropped to fit)")
    add_common(p)


EVERY_RUN = 1_000_000_000  # the store's list_runs takes a LIMIT: this is none


def run(args) -> int:
    # rich loads only for a report, not for --help
    from trainperf.report.table import print_table, rows_for_json

    # the store (and sqlite3) loads only when a command runs, not for --help
    from trainperf.store.db import Store, StoreError, require_existing_store

    if args.limit is not None and args.limit < 1:
        return bad_input(f"--limit {args.limit}: give the number of newest runs to list (>= 1), or leave it out "
                         "for every run", args.json)
    try:
        require_existing_store(args.db, "your runs")  # a misspelt --db would otherwise show "0 runs"
    except StoreError as exc:
        return bad_input(str(exc), args.json)
    html = getattr(args, "html", None)
    if html and not Path(html).parent.is_dir():
        return bad_input(f"--html {html!r}: folder {str(Path(html).parent)!r} does not exist", args.json)
    try:
        store = Store(args.db, read_only_ok=True)  # a report of a store one may not write (reaping is skipped)
        store.check_cell_types(("runs", "steps") if html else ("runs",))  # a mistyped cell would break the formatting
    except StoreError as exc:
        return bad_input(str(exc), args.json)
    store.reap_dead_runs()
    if args.workload and not store.list_runs(workload=args.workload, limit=1):
        known = sorted({r["workload"] for r in store.list_runs(limit=EVERY_RUN)})
        store.close()
        return bad_input(f"--workload {args.workload!r}: no runs of it in {args.db!r}; workloads with runs: "
                         f"{', '.join(known) or 'none'}", args.json)
    # every figure is of every run; --limit cuts only the listing
    runs = store.list_runs(workload=args.workload, limit=EVERY_RUN, trials=args.trials)
    listed = runs[:args.limit] if args.limit else runs
    trials_left_out = 0 if args.trials else sum(
        r["purpose"] == "trial" for r in store.list_runs(workload=args.workload, limit=EVERY_RUN))
    if html:
        # the HTML page's renderer (and its charts) loads only for --html
        from trainperf.report.html import render

        evals = {r["run_id"]: store.evals(r["run_id"]) for r in runs}
        try:
            Path(html).write_text(render(runs, evals, preflight=store.latest_preflight(),
                                         trials_left_out=trials_left_out, listed=len(listed)))
        except OSError as exc:
            store.close()
            return bad_input(f"--html {html!r}: cannot write it ({exc.strerror})", args.json)
    store.close()
    if args.json:
        print(json.dumps(rows_for_json(listed), indent=2))
        if len(listed) < len(runs):  # the cut named beside the JSON, which stays a list of runs
            print(f"report: the newest {len(listed)} of {len(runs)} runs listed (--limit)", file=sys.stderr)
    else:
        print_table(listed, wide=args.wide, trials_left_out=trials_left_out, all_runs=runs)
    if html:  # where the page is, on stderr beside --json's stdout
        print(f"report page: {printable(Path(html).resolve(), 1000)}", file=sys.stderr if args.json else sys.stdout)
    return EXIT_OK
