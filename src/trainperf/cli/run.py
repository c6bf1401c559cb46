"""``trainperf run WORKLOAD``: train a workload to its quality target (MLPerf clock, log, store)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from trainperf.cli.errors import EXIT_FAILED, EXIT_OK, SpecError, bad_input
from trainperf.cli.options import add_common, add_out
from trainperf.cli.paths import check_out_folder
from trainperf.core.results import RUN_JSON_KEYS

HELP = "train a workload to its quality target (MLPerf clock, log, store)"
DESCRIPTION = "Train WORKLOAD until its eval loss meets the target; exit 1 if max steps come first."

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("workload", help="workload name (see `trainperf workloads`)")
    p.add_argument("--config", help="YAML or TOML file of section: {key: value} overrides")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one spec value (repeatable), e.g. --set train.global_batch_size=32")
    p.add_argument("--nproc-per-node", type=int, default=None,
                   help="processes to launch with torchrun (default 1, or the plan's GPU count)")
    add_out(p)
    p.add_argument("--layout-from-plan", metavar="PLAN_ID", help="use a layout `trainperf plan` ranked (e.g. 3fa2c1:P1)")
    p.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="serve live Prometheus metrics (step, step time, tokens/s, MFU, memory) from rank 0 on PORT")
    p.add_argument("--trial", action="store_true",
                   help="store the run as a tune trial: kept out of `report` and `score` unless asked for")
    p.add_argument("--metrics-host", metavar="ADDR", help="address for --metrics-port (default 127.0.0.1: this host only)")
    # set by `trainperf sweep`: the item this run is for, linked to the run's row when the row is made
    p.add_argument("--sweep-item", help=argparse.SUPPRESS)
    add_common(p)


def _sweep_item(text: str | None) -> dict | None:
    """The {sweep_id, item_id, owner_pid} a sweep passes with --sweep-item, or None."""
    if text is None:
        return None
    try:
        item = json.loads(text)
    except json.JSONDecodeError:
        item = None
    if (not isinstance(item, dict) or not isinstance(item.get("sweep_id"), str)
            or not isinstance(item.get("item_id"), str) or not isinstance(item.get("owner_pid"), int)):
        raise SpecError("--sweep-item: expected the JSON object {sweep_id, item_id, owner_pid} a sweep passes")
    return item


def _interactive() -> bool:
    return sys.stdout.isatty() and not os.environ.get("CI")  # the bar and the plain lines go to stdout


def _print_summary(summary: dict) -> None:
    """The closing lines of a run, whatever way it ended (a summary of an abnormal end has few keys)."""
    from rich.console import Console
    from rich.markup import escape  # reasons and paths are data: "[/...]" in an error is not markup

    c = Console(stderr=False, soft_wrap=not _interactive())  # a log file keeps each line whole
    ok = summary.get("status") == "success"
    probe = not ok and (summary.get("status_reason") or "").startswith("throughput probe")
    head = ("[green]reached target[/green]" if ok else "[yellow]probe completed[/yellow]" if probe
            else f"[red]{str(summary.get('status') or 'failed').upper()}[/red]")
    c.print(f"{head} {escape(str(summary.get('workload', '')))} run {escape(str(summary.get('run_id')))}")
    if ok and summary.get("time_to_train_s") is not None:
        c.print(f"  time to train  {summary['time_to_train_s']:.2f} s  ({summary.get('samples_to_target')} samples, "
                f"eval loss {summary.get('final_eval_loss') or float('nan'):.4f} <= target "
                f"{summary.get('target') or float('nan'):.4f})")
    elif not ok:
        c.print(f"  {escape(summary.get('status_reason') or 'the run ended without a reason recorded')}")
    if summary.get("tokens_per_s") and summary.get("tokens_per_s_per_gpu") and summary.get("model_tflops_per_gpu"):
        mfu = summary.get("mfu")
        c.print(f"  throughput     {summary['tokens_per_s']:,.0f} tokens/s ({summary['tokens_per_s_per_gpu']:,.0f} per "
                f"process), {summary['model_tflops_per_gpu']:.3f} model TFLOP/s per process, MFU "
                + (f"{100 * mfu:.1f}%" if mfu is not None else "n/a (no peak FLOP/s known for this device)"))
    if summary.get("peak_mem_gib") is not None:
        c.print(f"  peak memory    {summary['peak_mem_gib']:.2f} GiB")
    if summary.get("layout"):
        where = ", ".join(f"{k} {v}" for k, v in (summary.get("placement") or {}).items())
        c.print(f"  layout         {escape(summary['layout'])} on {summary.get('world_size')} processes" + (f" ({escape(where)})" if where else ""))
    c.print(f"  mllog          {escape(str(summary.get('mllog')))}")


def _apply_plan(args, workload: str) -> None:
    """Put a stored plan's layout in front of the user's own --set overrides (which still win)."""
    # the store (and sqlite3) loads only when a command runs, not for --help
    from trainperf.store.db import Store

    if not Path(args.db).exists():  # no store holds no plan; asking must not create one
        raise SpecError(f"--layout-from-plan {args.layout_from_plan!r}: no results store at {args.db!r}, so no "
                        "plans (see `trainperf plan`)")
    store = Store(args.db)
    row = store.get_plan(args.layout_from_plan)
    store.close()
    if row is None:
        raise SpecError(f"--layout-from-plan {args.layout_from_plan!r}: no such plan in {args.db} (see `trainperf plan`)")
    if row["workload"] != workload:
        raise SpecError(f"--layout-from-plan {args.layout_from_plan!r} was planned for {row['workload']!r}, not {workload!r}")
    if row["gpus"] > row["gpus_per_node"]:
        raise SpecError(f"plan {args.layout_from_plan!r} spans {row['gpus']} GPUs on several nodes: start it under srun "
                        "with the printed --set line")
    if args.nproc_per_node is not None and args.nproc_per_node != row["gpus"]:
        raise SpecError(f"--nproc-per-node {args.nproc_per_node} but plan {args.layout_from_plan!r} is for {row['gpus']} GPUs")
    args.nproc_per_node = row["gpus"]
    plan_sets = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in row["overrides"].items()]
    args.overrides = plan_sets + list(args.overrides)


def run(args, workload: str | None = None) -> int:
    # torch and the model load only when a run starts, not for --help
    from trainperf.runner.ranks import prepare_here, run_here

    # the store (and sqlite3) loads only when a command runs, not for --help
    from trainperf.store.db import StoreError, check_store_path

    workload = workload or args.workload
    t0 = time.perf_counter()
    try:
        if getattr(args, "layout_from_plan", None):
            _apply_plan(args, workload)
        if getattr(args, "metrics_port", None) is not None:
            args.overrides = [*args.overrides, f"train.metrics_port={args.metrics_port}"]
        if getattr(args, "metrics_host", None):
            args.overrides = [*args.overrides, f"train.metrics_host={args.metrics_host}"]
        if args.nproc_per_node is None:
            args.nproc_per_node = 1
        if args.nproc_per_node < 1:
            raise SpecError(f"--nproc-per-node={args.nproc_per_node}: must be >= 1")
        sweep_item = _sweep_item(getattr(args, "sweep_item", None))
        check_store_path(args.db)  # a bad --db fails here, before any work (prepare may build data)
        check_out_folder(args.out)
        spec = prepare_here(workload, args.config, args.overrides, args.nproc_per_node)
    except (SpecError, StoreError) as exc:
        return bad_input(str(exc), args.json)
    # a terminal gets the bar, a log file or pipe plain lines; with --json they go to stderr (an sbatch .err)
    progress = "stderr" if args.json else "bar" if _interactive() else "lines"
    summary, reports = run_here(spec, args.out, args.db, args.nproc_per_node, progress,
                                purpose="trial" if args.trial else "run", sweep_item=sweep_item)
    if not reports:  # another rank of an external job: rank 0 prints
        return EXIT_OK if summary.get("status") == "success" else EXIT_FAILED
    summary["wall_s"] = time.perf_counter() - t0
    if args.json:
        print(json.dumps({k: summary.get(k) for k in RUN_JSON_KEYS} | {"evals": summary.get("evals", []),
                                                                     "wall_s": summary["wall_s"]}, indent=2))
    else:
        _print_summary(summary)
    return EXIT_OK if summary.get("status") == "success" else EXIT_FAILED
