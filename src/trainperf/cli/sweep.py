"""``trainperf sweep FILE`` / ``trainperf sweep status``: run every item of a sweep file (resumable)."""

from __future__ import annotations

import argparse
import json
import sys

from trainperf.cli.errors import EXIT_FAILED, EXIT_OK, SpecError, bad_input
from trainperf.cli.options import add_common, add_out
from trainperf.cli.paths import check_out_folder
from trainperf.core.untrusted import printable
from trainperf.parallel.launcher import Interrupted
from trainperf.runner.slurm import add_slurm_args, status_lines

HELP = "run every item of a sweep file (resumable), `sweep retry FILE`, or `sweep status`"
DESCRIPTION = ("`trainperf sweep FILE` runs the runs a sweep file spans, one after another, "
               "skipping those already finished (a line as each starts and ends; each item's log is kept); "
               "`trainperf sweep retry FILE` also runs again the items that failed; `trainperf sweep status` "
               "shows progress. Exit 1 when any item of the sweep has failed.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", nargs="?",
                   help="a sweep file (YAML/TOML), the word status, or the word retry and a file; left out with --workload")
    p.add_argument("file", nargs="?", help="after retry: the sweep file whose failed items run again")
    p.add_argument("--workload", help="one run without a sweep file (with --nproc-per-node, --set, --slurm)")
    p.add_argument("--nproc-per-node", type=int, default=None, help="with --workload: processes (GPUs) per node")
    p.add_argument("--slurm", dest="slurm_options", action="append", default=[], metavar="KEY=VALUE",
                   help="submit through Slurm with this sweep-file slurm key (partition=h200, nodes=2, "
                        "time=02:00:00, gpus_per_node=8, ...), over the file's own; repeatable. With --workload "
                        "gpus_per_node defaults to --nproc-per-node (0 when hardware.device=cpu)")
    p.add_argument("--name", help="with --workload: the sweep's name (default WORKLOAD-xN)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="applied to every run of the sweep")
    add_out(p)
    p.add_argument("--retry-failed", action="store_true",
                   help="put the sweep's failed items back to run (as `sweep retry FILE`); a succeeded item never runs again")
    p.add_argument("--take-over", action="store_true",
                   help="also run items another sweep process claimed (when that process is gone but cannot be asked: "
                        "another host, or its pid reused)")
    p.add_argument("--dry-run", action="store_true",
                   help="print every item the file spans and, for Slurm, the exact sbatch script of each; run nothing")
    add_slurm_args(p)  # --wait (default None: the sweep file's slurm.wait applies)
    add_common(p)


def run(args) -> int:
    # the sweep runner loads only when a sweep runs, not for --help
    from trainperf.runner import sweep

    # the store (and sqlite3) loads only when a command runs, not for --help
    from trainperf.store.db import Store, StoreError, require_existing_store

    try:
        retry = args.retry_failed or args.target == "retry"
        target = args.file if args.target == "retry" else args.target
        if args.file is not None and args.target != "retry":
            raise SpecError(f"unexpected {printable(args.file)!r} after {printable(args.target)!r}: give one sweep file "
                            "(or retry FILE)")
        if bool(target) == bool(args.workload):
            raise SpecError("give a sweep file, the word status, retry FILE, or --workload W for one run (not both)")
        if target == "status":
            if retry:
                raise SpecError("sweep status shows progress; retry the failed items with `trainperf sweep retry FILE`")
            require_existing_store(args.db, "your sweep")
            store = Store(args.db, read_only_ok=True)
            counts = sweep.status_counts(store)
            if not args.json:
                for line in status_lines(store):
                    print(line)
            return _print_counts(args, counts, exit_code=EXIT_OK)
        if args.workload:
            name, items = sweep.checked_sweep(_single_run(args), "the command line", args.overrides)
        else:
            if args.nproc_per_node is not None or args.name:
                raise SpecError("--nproc-per-node and --name go with --workload; a sweep file gives nproc_per_node "
                                "per run block and its own name")
            data = _with_slurm_options(sweep.read_sweep_file(target), args.slurm_options)
            # a bad file creates no store
            name, items = sweep.checked_sweep(data, f"sweep file {printable(target)!r}", args.overrides)
        if items[0].get("backend") == "slurm":
            sweep.check_paths_before_queueing(items, args.overrides)  # a typo now, not after the queue wait
        if args.dry_run:
            return _dry_run(args, name, items)
        check_out_folder(args.out)
        store = Store(args.db)
        echo = (lambda line: print(line, file=sys.stderr, flush=True)) if args.json else (
            lambda line: print(line, flush=True))
        counts = sweep.run_sweep(store, name, items, args.db, args.out, args.overrides, echo=echo, wait=args.wait,
                                 take_over=args.take_over, retry_failed=retry)
    except (SpecError, StoreError) as exc:
        return bad_input(str(exc), args.json)
    except Interrupted as exc:
        print(f"trainperf: sweep stopped ({exc}); the same command resumes it", file=sys.stderr)
        return EXIT_FAILED
    failed = sum(c["failed"] for c in counts.values())
    if failed and not args.json:
        again = "the same command with --retry-failed" if args.workload else f"`trainperf sweep retry {printable(target)}`"
        print(f"{failed} item{'' if failed == 1 else 's'} failed (`trainperf sweep status` lists them with their "
              f"reasons); {again} runs them again")
    return _print_counts(args, counts, exit_code=EXIT_FAILED if failed else EXIT_OK)


def _print_counts(args, counts: dict, exit_code: int) -> int:
    if args.json:
        print(json.dumps(counts, indent=2))
    else:
        for name, c in counts.items():
            total = sum(c.values())
            print(f"sweep {name}: {c['success']} success, {c['failed']} failed, {c['pending']} pending, "
                  f"{c['running']} running of {total}")
    return exit_code


def _dry_run(args, name: str, items: list[dict]) -> int:
    """Every item of the sweep and, for Slurm, the script `sbatch` would be given; nothing runs or is stored."""
    import os
    from pathlib import Path

    # the sbatch script writer loads only for a Slurm sweep's dry run
    from trainperf.runner.slurm import render_script, script_dir

    rows = []
    for item in items:
        sets = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in item["overrides"].items()]
        row = {"item_id": item["item_id"], "workload": item["workload"], "nproc": item["nproc"],
               "set": sets + list(args.overrides), "backend": item.get("backend", "local")}
        if item.get("backend") == "slurm":
            directory = script_dir(item["slurm"], name, args.out)
            row["script_path"] = str(Path(directory) / f"{item['item_id']}.sbatch")
            row["script"] = render_script(item, item["slurm"], sweep_id=name, db=args.db, out=args.out,
                                          extra_sets=args.overrides, directory=directory, workdir=os.getcwd())
        rows.append(row)
    if args.json:
        print(json.dumps({"sweep": name, "items": rows}, indent=2))
        return EXIT_OK
    print(f"sweep {name}: {len(rows)} item{'' if len(rows) == 1 else 's'} (dry run: nothing runs, nothing is stored)")
    for r in rows:
        print(f"  {r['item_id']}  {r['workload']} x{r['nproc']} {' '.join('--set ' + s for s in r['set'])}".rstrip())
        if "script" in r:
            print(f"--- {r['script_path']} ---\n{r['script']}")
    return EXIT_OK


def _slurm_options(options: list[str]) -> dict:
    """{key: value} of the --slurm KEY=VALUE options, each value parsed as a sweep file's would be."""
    # numbers, booleans and strings, as in a sweep file
    from trainperf.core.untrusted import parse_untrusted_yaml

    slurm = {}
    for kv in options:
        key, eq, value = kv.partition("=")
        if not eq or not key:
            raise SpecError(f"--slurm {printable(kv)!r}: expected KEY=VALUE, e.g. partition=h200 or nodes=2")
        key = key.strip()
        # 01:00:00 is a Slurm time, not YAML's 3600
        slurm[key] = value if key == "time" else parse_untrusted_yaml(value, where=f"--slurm {printable(kv)!r}")
    return slurm


def _with_slurm_options(data: dict, options: list[str]) -> dict:
    """A sweep file's data with the command line's --slurm keys over its own: any --slurm sends it to Slurm."""
    if not options:
        return data
    file_slurm = data.get("slurm") if isinstance(data.get("slurm"), dict) else {}
    return data | {"backend": "slurm", "slurm": {**file_slurm, **_slurm_options(options)}}


def _single_run(args) -> dict:
    """The sweep of one run the command line describes (no file): Slurm when any --slurm is given. Its
    job asks for as many GPUs per node as it starts processes, unless told (or the run is on CPU)."""
    slurm = _slurm_options(args.slurm_options)
    nproc = args.nproc_per_node or slurm.get("gpus_per_node") or 1
    if slurm and "gpus_per_node" not in slurm:
        on_cpu = any(s.replace(" ", "") == "hardware.device=cpu" for s in args.overrides)
        slurm["gpus_per_node"] = 0 if on_cpu else nproc
    data = {"name": args.name or f"{args.workload}-x{nproc}",
            "runs": [{"workload": args.workload, "nproc_per_node": nproc}]}
    if slurm:
        data |= {"backend": "slurm", "slurm": slurm}
    return data
