"""``trainperf sweep FILE`` / ``trainperf sweep status``: run every item of a sweep file (resumable)."""

from __future__ import annotations

import argparse
import json
import sys

from trainperf.cli.errors import EXIT_FAILED, EXIT_OK, SpecError, bad_input
from trainperf.cli.options import add_common, add_out
from trainperf.cli.paths import check_out_folder
from trainperf.parallel.launcher import Interrupted
from trainperf.runner.slurm import add_slurm_args, status_lines

HELP = "run every item of a sweep file (resumable), or `sweep status`"
DESCRIPTION = ("`trainperf sweep FILE` runs the runs a sweep file spans, one after another, "
               "skipping those already finished; `trainperf sweep status` shows progress.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", help="a sweep file (YAML/TOML), or the word status")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="applied to every run of the sweep")
    add_out(p)
    p.add_argument("--take-over", action="store_true",
                   help="also run items another sweep process claimed (when that process is gone but cannot be asked: "
                        "another host, or its pid reused)")
    add_slurm_args(p)  # --wait (default None: the sweep file's slurm.wait applies)
    add_common(p)


def run(args) -> int:
    # the sweep runner loads only when a sweep runs, not for --help
    from trainperf.runner import sweep

    # the store (and sqlite3) loads only when a command runs, not for --help
    from trainperf.store.db import Store, StoreError, require_existing_store

    try:
        if args.target == "status":
            require_existing_store(args.db, "your sweep")
            store = Store(args.db, read_only_ok=True)
            counts = sweep.status_counts(store)
            if not args.json:
                for line in status_lines(store):
                    print(line)
        else:
            name, items = sweep.load_sweep(args.target, args.overrides)  # a bad file creates no store
            check_out_folder(args.out)
            store = Store(args.db)
            echo = (lambda line: print(line, file=sys.stderr)) if args.json else print
            counts = sweep.run_sweep(store, name, items, args.db, args.out, args.overrides, echo=echo, wait=args.wait,
                                     take_over=args.take_over)
    except (SpecError, StoreError) as exc:
        return bad_input(str(exc), args.json)
    except Interrupted as exc:
        print(f"trainperf: sweep stopped ({exc}); the same command resumes it", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps(counts, indent=2))
    else:
        for name, c in counts.items():
            total = sum(c.values())
            print(f"sweep {name}: {c['success']} success, {c['failed']} failed, {c['pending']} pending, "
                  f"{c['running']} running of {total}")
    return EXIT_OK
