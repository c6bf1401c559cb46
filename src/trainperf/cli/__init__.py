"""trainperf: one entry point, one sub-command per question.

Exit codes: 0 success, 1 the run failed (e.g. target not reached), 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from trainperf.core.errors import SpecError

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
DEFAULT_DB = "trainperf.db"
DEFAULT_OUT = "runs"


_ARGV: list[str] = []


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own errors: one line, exit 2 (JSON too with --json)
        if "--json" in _ARGV:
            print(json.dumps({"error": message, "exit_code": EXIT_BAD_INPUT}))
        self.exit(EXIT_BAD_INPUT, f"trainperf: error: {message}\n")


_HEADROOM_HELP = ("fraction of GPU memory a layout must leave free to be ranked, in [0, 0.5) (default 0.08: the "
                  "memory prediction was measured up to 8.8%% low, 8B LoRA TP2+SP on H200; 0 ranks up to the "
                  "full capacity, as before)")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.add_argument("--db", default=DEFAULT_DB, help=f"results store, an SQLite file (default ./{DEFAULT_DB})")


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML or TOML file of section: {key: value} overrides")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one spec value (repeatable), e.g. --set train.global_batch_size=32")
    p.add_argument("--nproc-per-node", type=int, default=None,
                   help="processes to launch with torchrun (default 1, or the plan's GPU count)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"directory for run artefacts (default ./{DEFAULT_OUT})")
    p.add_argument("--layout-from-plan", metavar="PLAN_ID", help="use a layout `trainperf plan` ranked (e.g. 3fa2c1:P1)")
    p.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="serve live Prometheus metrics (step, step time, tokens/s, MFU, memory) from rank 0 on PORT")
    p.add_argument("--metrics-host", metavar="ADDR", help="address for --metrics-port (default 127.0.0.1: this host only)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trainperf", description="Prove, tune and explain how fast a GPU cluster trains LLMs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("run", help="train a workload to its quality target (MLPerf clock, log, store)",
                       description="Train WORKLOAD until its eval loss meets the target; exit 1 if max steps come first.")
    p.add_argument("workload", help="workload name (see `trainperf workloads`)")
    _run_args(p)
    _common(p)

    p = sub.add_parser("plan", help="rank every layout for N GPUs by predicted time (no GPU needed)",
                       description="Top-down estimate of memory, communication and step time for every valid "
                                   "layout of WORKLOAD on N GPUs; ranks those that fit.")
    p.add_argument("workload", help="workload name (see `trainperf workloads`)")
    p.add_argument("--gpus", type=int, default=0, help="GPUs in the job (required unless --calibrate)")
    p.add_argument("--gpus-per-node", type=int, default=0, help="GPUs per node (default: min(gpus, 8))")
    p.add_argument("--gpu", default="h200", help="h100 | h200 | a100 | b200 | a YAML file of GPU fields")
    p.add_argument("--config", help="YAML or TOML file of section: {key: value} overrides")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--top", type=int, default=10, help="how many ranked layouts to show (default 10)")
    p.add_argument("--objective", choices=["time", "throughput"], default="time",
                   help="rank by time to train (needs --samples or an MLPerf RCP) or by tokens/s")
    p.add_argument("--samples", type=float, help="samples to converge (default: the MLPerf RCP mean, if any)")
    p.add_argument("--datasheet", action="store_true",
                   help="use the GPU preset as is, not the figures the newest `trainperf preflight` of this GPU measured")
    p.add_argument("--gbs", metavar="LIST|rcp",
                   help="also search the global batch size: comma-separated values, or `rcp` for the GBS values "
                        "the benchmark's RCPs cover (samples to converge from the RCPs, interpolated)")
    p.add_argument("--explain", action="store_true", help="say which term makes each runner-up slower")
    p.add_argument("--memory-headroom", type=float, default=None, metavar="FRACTION", help=_HEADROOM_HELP)
    p.add_argument("--calibrate", metavar="GPU_YAML",
                   help="fit the model to the GPU runs in the store (of --gpu) and write the fitted GPU as YAML")
    _common(p)

    p = sub.add_parser("tune", help="measure the planner's best layouts in short trials, keep the fastest",
                       description="Successive halving over the planner's top layouts: short real runs, the faster "
                                   "half continues with twice the steps, until one is left or the budget is spent.")
    p.add_argument("workload", help="workload name (see `trainperf workloads`)")
    p.add_argument("--gpus", type=int, required=True, help="GPUs (processes) on this node")
    p.add_argument("--gpu", default="h200", help="planner preset or YAML file for the initial ranking")
    p.add_argument("--top", type=int, default=8, help="how many planned layouts to try (default 8)")
    p.add_argument("--budget-minutes", type=float, default=30.0, help="stop starting trials after this (default 30)")
    p.add_argument("--steps", type=int, default=4, help="steps per trial in the first round (doubles each round)")
    p.add_argument("--abandon-factor", type=float, default=1.25,
                   help="skip a layout whose planner prediction, recalibrated on the trials so far, exceeds this "
                        "many times the best measured step (0: try every layout; default 1.25)")
    p.add_argument("--memory-headroom", type=float, default=None, metavar="FRACTION",
                   help=_HEADROOM_HELP.replace("be ranked", "be tried"))
    p.add_argument("--keep-within", type=float, default=0.03,
                   help="a later round re-measures only layouts within this fraction of the round's best "
                        "(0: the faster half, as plain successive halving; default 0.03)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"directory for run artefacts (default ./{DEFAULT_OUT})")
    _common(p)

    p = sub.add_parser("sweep", help="run every item of a sweep file (resumable), or `sweep status`",
                       description="`trainperf sweep FILE` runs the runs a sweep file spans, one after another, "
                                   "skipping those already finished; `trainperf sweep status` shows progress.")
    p.add_argument("target", help="a sweep file (YAML/TOML), or the word status")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="applied to every run of the sweep")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"directory for run artefacts (default ./{DEFAULT_OUT})")
    p.add_argument("--take-over", action="store_true",
                   help="also run items another sweep process claimed (when that process is gone but cannot be asked: "
                        "another host, or its pid reused)")
    from trainperf.runner.slurm import add_slurm_args

    add_slurm_args(p)  # --wait (default None: the sweep file's slurm.wait applies)
    _common(p)

    p = sub.add_parser("workloads", help="list workloads", description="List the workloads with one-line descriptions.")
    _common(p)

    p = sub.add_parser("report", help="table of stored runs", description="Show the runs in the results store.")
    p.add_argument("--workload", help="only runs of this workload")
    p.add_argument("--limit", type=int, default=50, help="newest N runs (default 50)")
    p.add_argument("--html", metavar="FILE", help="also write the full report as one self-contained HTML page")
    _common(p)

    from trainperf.cli import preflight as preflight_cli

    preflight_cli.add_arguments(sub.add_parser("preflight", help=preflight_cli.HELP, description=preflight_cli.DESCRIPTION))
    from trainperf.cli import trace as trace_cli

    trace_cli.add_arguments(sub.add_parser("trace", help=trace_cli.HELP, description=trace_cli.DESCRIPTION))
    p = sub.add_parser("data", help="dataset tools: `data convert` token files -> the packed pretraining format",
                       description="`trainperf data convert INPUTS... --out DIR --vocab-size V [--eod-id E] "
                                   "(--validation-documents N | --validation-inputs ...)`: plain token files "
                                   "(.txt, .jsonl, .npy) into the packed format llama31_8b reads (see data/pretok.py).")
    p.add_argument("action", choices=["convert"], help="what to do")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="the action's own arguments (see `data convert --help`)")
    p = sub.add_parser("score", help="MLPerf score of a set of runs: olympic mean, RCP check, package export",
                       description="Score runs from their MLPerf logs as MLPerf does: olympic mean of the run times "
                                   "(minutes), RCP check and scaling for closed-division runs; exit 1 if the score "
                                   "is not a valid MLPerf score.")
    p.add_argument("inputs", nargs="*", metavar="RUN",
                   help="run ids from the store, result directories, or mllog files (result_*.txt, mllog.txt)")
    p.add_argument("--workload", help="score the most recent finished runs of this workload in the store")
    p.add_argument("--last", type=int, default=None,
                   help="with --workload: how many of its newest runs (default: the runs its benchmark requires)")
    p.add_argument("--ruleset", default="6.0.0", help="MLPerf training ruleset for RCPs and checks (default 6.0.0)")
    p.add_argument("--export", metavar="DIR", help="also write a submission package under DIR/<org>/ and check it")
    p.add_argument("--org", help="submitter for --export (default: the logs' submission_org)")
    p.add_argument("--system", help="system name for --export (default: the logs' submission_platform)")
    _common(p)

    p = sub.add_parser("demo", help="the main job on embedded defaults: mini-lora on 2 processes, then the report",
                       description="Run mini-lora to its target on 2 processes (GPUs if present, else CPU), store it, "
                                   "and print the report table.")
    p.add_argument("--nproc-per-node", type=int, default=2, help="processes (default 2)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"directory for run artefacts (default ./{DEFAULT_OUT})")
    _common(p)
    return parser


def _bad_input(msg: str, as_json: bool) -> int:
    if as_json:
        print(json.dumps({"error": msg, "exit_code": EXIT_BAD_INPUT}))
    print(f"trainperf: error: {msg}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _interactive() -> bool:
    return sys.stderr.isatty() and not os.environ.get("CI")


def _headroom(args) -> float:
    """--memory-headroom, validated before any work (SpecError naming the valid range)."""
    from trainperf.plan.search import DEFAULT_MEMORY_HEADROOM, check_headroom

    return check_headroom(DEFAULT_MEMORY_HEADROOM if args.memory_headroom is None else args.memory_headroom)


def cmd_plan(args) -> int:
    from trainperf.core.layout import layers_per_stage
    from trainperf.core.resolve import resolve_spec
    from trainperf.plan.costs import eight_bit_optimizer_hint
    from trainperf.plan.hardware import load_gpu
    from trainperf.plan.search import explain, plan
    from trainperf.workloads import get_workload

    try:
        headroom = _headroom(args)
    except SpecError as exc:
        return _bad_input(str(exc), args.json)
    if args.calibrate:
        return _calibrate(args)
    try:
        if args.gpus < 1:
            raise SpecError(f"--gpus={args.gpus}: give the number of GPUs to plan for (>= 1)")
        if args.top < 1:
            raise SpecError(f"--top {args.top}: give how many ranked layouts to show (>= 1)")
        if args.samples is not None and not args.samples > 0:
            raise SpecError(f"--samples {args.samples}: give the samples to converge (> 0)")
        # the spec first (resolve_spec coerces each value and checks the named choices, e.g. hardware.fp8):
        # bad input fails before the GPU file is read or the store is opened for a preflight
        base = resolve_spec(get_workload(args.workload).defaults(), args.config, args.overrides)
        gpu = load_gpu(args.gpu)
        measured_note = None
        if not args.datasheet:  # the newest preflight of this GPU model beats the datasheet figures
            import dataclasses

            from trainperf.store.db import Store, StoreError

            try:
                store = Store(args.db)
                found = store.latest_preflight(gpu.name)
                store.close()
            except StoreError:
                found = None
            overrides = dict(found["overrides"]) if found else {}
            table = overrides.get("kernel_table")
            if table and not Path(table).is_file():  # the preflight's run folder was removed
                del overrides["kernel_table"]
                print(f"trainperf: note: preflight {found['preflight_id']}'s kernel table {table} is gone; "
                      "using the preset's rates", file=sys.stderr)
            if overrides:
                gpu = dataclasses.replace(gpu, **overrides)
                measured_note = (f"using measured figures of preflight {found['preflight_id']} "
                                 f"({', '.join(f'{k}={v}' for k, v in overrides.items())}); --datasheet ignores them")
        per_node = args.gpus_per_node or min(args.gpus, 8)
        gbs_values = None
        if args.gbs:
            from trainperf.plan.search import rcp_batch_sizes

            try:
                gbs_values = rcp_batch_sizes(base) if args.gbs == "rcp" else [int(x) for x in args.gbs.split(",")]
            except ValueError:
                raise SpecError(f"--gbs {args.gbs!r}: expected comma-separated integers or `rcp`") from None
            if not gbs_values or min(gbs_values) < 1:
                raise SpecError(f"--gbs {args.gbs!r}: no global batch sizes to search (workload {args.workload!r} "
                                "has no MLPerf RCPs)" if args.gbs == "rcp" else f"--gbs {args.gbs!r}: sizes must be >= 1")
        fits, oom = plan(base, gpu, args.gpus, per_node, args.samples, args.objective, gbs_values, headroom)
    except SpecError as exc:
        return _bad_input(str(exc), args.json)
    import secrets

    from trainperf.store.db import Store, StoreError

    plan_key = secrets.token_hex(3)
    for c in fits:
        c.id = f"{plan_key}:{c.id}"
    try:
        store = Store(args.db)
        store.save_plan([{"plan_id": c.id, "workload": args.workload, "gpus": args.gpus, "gpus_per_node": per_node,
                          "gpu": gpu.name, "overrides": c.overrides,
                          "predicted": {"step_time_s": c.est.step_time_s, "peak_mem_gib": c.est.allocated_gib,
                                        "tokens_per_s_per_gpu": c.est.tokens_per_s_per_gpu}} for c in fits[:args.top]])
        store.close()
    except StoreError as exc:
        return _bad_input(str(exc), args.json)
    rows = [{"id": c.id, "set": c.set_line, "step_time_s": c.est.step_time_s,
             "tokens_per_s_per_gpu": c.est.tokens_per_s_per_gpu, "mfu": c.est.mfu,
             "memory_gib": c.est.reserved_gib, "time_to_train_s": c.time_to_train_s,
             "time": c.est.time, "memory": {k: v / 2**30 for k, v in c.est.memory.items()},
             "host_offload_gib": c.est.host_offload_bytes / 2**30,
             "comm_gib": {k: v / 2**30 for k, v in c.est.comm.items()}} for c in fits[:args.top]]
    usable = round((1 - headroom) * gpu.hbm_gib, 3)
    over = sum(1 for c in oom if c.est.fits)  # would fit without the headroom
    hint = eight_bit_optimizer_hint(oom[0].spec, gpu, per_node, usable) if oom and not fits else ""
    if args.json:
        print(json.dumps({"gpu": gpu.name, "measured": measured_note, "gpus": args.gpus, "gpus_per_node": per_node, "ranked": rows,
                          "memory_headroom": headroom, "usable_gib": usable, "fitting": len(fits),
                          "not_fitting": len(oom), "over_headroom": over, "hint": hint or None,
                          "explain": [explain(fits[0], c) for c in fits[1:args.top]] if args.explain and fits else []},
                         indent=2))
        return EXIT_OK if fits else EXIT_FAILED
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if Console().is_terminal else 200)
    table = Table(title=f"trainperf plan: {args.workload} on {args.gpus} x {gpu.name} ({per_node} per node) -- "
                        f"{len(fits)} layouts fit, {len(oom)} do not"
                        + (f" ({over} only for the memory headroom)" if over else "")
                        + f" -- memory headroom {100 * headroom:g}% ({usable:.1f} of {gpu.hbm_gib:g} GiB usable)")
    for col in ("id", "GBS", "tp", "sp", "cp", "pp", "sched", "rep", "shard", "mbs", "recompute", "step s", "tok/s/GPU",
                "MFU", "mem GiB") + (("TTT min",) if fits and fits[0].time_to_train_s else ()):
        table.add_column(col, justify="right")
    for c in fits[:args.top]:
        o = c.overrides
        cells = [c.id, str(c.spec.train.global_batch_size), str(o["parallel.tp"]), "y" if o["parallel.sp"] else "-", str(o["parallel.cp"]),
                 str(o["parallel.pp"]), o["parallel.pp_schedule"] if o["parallel.pp"] > 1 else "-",
                 str(o["parallel.dp_replicate"]), str(o["parallel.dp_shard"]), str(o["train.micro_batch_size"]),
                 o["train.recompute"] + (f" {o['train.recompute_layers']}/{layers_per_stage(c.spec)}"
                                         if "train.recompute_layers" in o else "")
                 + (" +sel" if o.get("train.recompute_others") == "selective" else "")
                 + (f" +{o['train.offload_layers']} host" if o.get("train.offload_layers") else ""),
                 f"{c.est.step_time_s:.3f}", f"{c.est.tokens_per_s_per_gpu:,.0f}",
                 f"{100 * c.est.mfu:.1f}%", f"{c.est.reserved_gib:.1f}"]
        if c.time_to_train_s:
            cells.append(f"{c.time_to_train_s / 60:.1f}")
        table.add_row(*cells)
    console.print(table)
    if measured_note:
        console.print(measured_note)
    if not fits:
        console.print(f"[red]no layout fits[/red]: the smallest needs {oom[0].est.reserved_gib:.1f} GiB of "
                      f"{usable:.1f} usable of {gpu.hbm_gib:.0f} GiB ({oom[0].set_line})"
                      + (f"; {over} fit only without the {100 * headroom:g}% memory headroom (--memory-headroom 0 "
                         "ranks them, at the risk of an OOM)" if over else "")
                      + (f"; {hint}" if hint else ""))
        return EXIT_FAILED
    launch = (f"trainperf run {args.workload} --nproc-per-node {args.gpus}" if args.gpus <= per_node else
              f"srun -N {args.gpus // per_node} --ntasks-per-node {per_node} trainperf run {args.workload}")
    console.print(f"run the best: {launch} --layout-from-plan {fits[0].id}   (or: {fits[0].set_line})")
    if args.explain:
        best = fits[0]
        terms = ", ".join(f"{k} {v:.3f}s" for k, v in sorted(best.est.time.items(), key=lambda kv: -kv[1]) if v > 0)
        console.print(f"{best.id} step time: {terms}")
        for c in fits[1:args.top]:
            console.print("  " + explain(best, c))
    return EXIT_OK


def _calibrate(args) -> int:
    from trainperf.plan.calibrate import calibrate, summary, write_gpu_yaml
    from trainperf.store.db import Store, StoreError

    try:
        store = Store(args.db)
        fitted, report = calibrate(store, args.gpu)
        store.close()
    except (SpecError, StoreError) as exc:
        return _bad_input(str(exc), args.json)
    write_gpu_yaml(fitted, args.calibrate, args.gpu.lower())
    out = {"gpu": fitted.name, "other_s_per_token_layer_h": fitted.other_s_per_token_layer_h, "written": args.calibrate,
           "preset": summary(report, "preset"), "calibrated": summary(report, "calibrated"), "runs": report}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for which in ("preset", "calibrated"):
            s = out[which]
            print(f"{which:10s} {s['runs']} runs: median |step error| {100 * s['median_abs_step_error']:.1f}%, "
                  f"max {100 * s['max_abs_step_error']:.1f}%")
        print(f"wrote {args.calibrate}: use it with `trainperf plan ... --gpu {args.calibrate}`")
    return EXIT_OK


def cmd_tune(args) -> int:
    from trainperf.core.resolve import resolve_spec
    from trainperf.plan.hardware import load_gpu
    from trainperf.plan.search import plan
    from trainperf.runner.tune import successive_halving
    from trainperf.workloads import get_workload

    try:
        headroom = _headroom(args)
        if args.gpus < 1 or args.top < 1 or args.steps < 2:
            raise SpecError("--gpus and --top must be >= 1 and --steps >= 2 (the first step is warm-up)")
        if not args.budget_minutes > 0 or args.abandon_factor < 0 or args.keep_within < 0:
            raise SpecError(f"--budget-minutes must be > 0, --abandon-factor and --keep-within >= 0 (got "
                            f"{args.budget_minutes}, {args.abandon_factor}, {args.keep_within})")
        base = resolve_spec(get_workload(args.workload).defaults(), None, args.overrides)
        import torch

        if base.hardware.device != "cpu" and torch.cuda.is_available():  # trials run here, on these GPUs
            visible = torch.cuda.device_count()
            if args.gpus > visible:
                raise SpecError(f"--gpus {args.gpus}: tune measures its trials on this machine's GPUs and {visible} "
                                f"{'is' if visible == 1 else 'are'} visible; give --gpus <= {visible}")
        elif base.hardware.device != "cuda" and base.hardware.memory_check:  # trials on the CPU
            from trainperf.runner.local import check_host_memory

            check_host_memory(base)
        fits, _ = plan(base, load_gpu(args.gpu), args.gpus, args.gpus, objective="throughput", headroom=headroom)
    except SpecError as exc:
        return _bad_input(str(exc), args.json)
    echo = (lambda line: print(line, file=sys.stderr)) if args.json else print
    res = successive_halving(args.workload, args.gpus, fits[:args.top], args.db, args.out, args.overrides,
                             args.budget_minutes * 60, args.steps, echo, abandon_factor=args.abandon_factor,
                             keep_within=args.keep_within)
    trials = [{"id": t.candidate.id, "set": t.candidate.set_line, "steps": t.steps, "step_time_s": t.step_time_s,
               "planned_step_time_s": t.candidate.est.step_time_s, "run_id": t.run_id, "error": t.error,
               "wall_s": round(t.wall_s, 2)}
              for t in res.trials]
    command = (f"trainperf run {args.workload} --nproc-per-node {args.gpus} {res.winner.set_line} "
               + " ".join(f"--set {o}" for o in args.overrides)).strip() if res.winner else None
    if args.json:
        print(json.dumps({"winner": res.winner.id if res.winner else None, "command": command, "trials": trials,
                          "elapsed_s": res.elapsed_s, "memory_headroom": headroom}, indent=2))
    elif res.winner:
        print(f"winner {res.winner.id} after {len(trials)} trials in {res.elapsed_s:.0f} s:\n  {command}")
    else:
        print("no trial finished: nothing to recommend (see the reasons above)")
    return EXIT_OK if res.winner else EXIT_FAILED


def cmd_sweep(args) -> int:
    from trainperf.runner import sweep
    from trainperf.parallel.launcher import Interrupted
    from trainperf.store.db import Store, StoreError, require_existing_store

    try:
        if args.target == "status":
            require_existing_store(args.db, "your sweep")
            store = Store(args.db, read_only_ok=True)
            counts = sweep.status_counts(store)
            if not args.json:
                from trainperf.runner.slurm import status_lines

                for line in status_lines(store):
                    print(line)
        else:
            name, items = sweep.load_sweep(args.target, args.overrides)  # a bad file creates no store
            store = Store(args.db)
            echo = (lambda line: print(line, file=sys.stderr)) if args.json else print
            counts = sweep.run_sweep(store, name, items, args.db, args.out, args.overrides, echo=echo, wait=args.wait,
                                     take_over=args.take_over)
    except (SpecError, StoreError) as exc:
        return _bad_input(str(exc), args.json)
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


def cmd_workloads(args) -> int:
    from trainperf.workloads import WORKLOADS

    if args.json:
        print(json.dumps([{"name": w.name, "description": w.description} for w in WORKLOADS.values()], indent=2))
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table

    table = Table(title="trainperf workloads")
    table.add_column("workload")
    table.add_column("description")
    for w in WORKLOADS.values():
        table.add_row(w.name, w.description)
    Console().print(table)
    return EXIT_OK


def cmd_report(args) -> int:
    from trainperf.report.table import print_table, rows_for_json
    from trainperf.store.db import Store, StoreError, require_existing_store

    if args.limit < 1:
        return _bad_input(f"--limit {args.limit}: give the number of newest runs to show (>= 1)", args.json)
    try:
        require_existing_store(args.db, "your runs")  # a misspelt --db would otherwise show "0 runs"
    except StoreError as exc:
        return _bad_input(str(exc), args.json)
    html = getattr(args, "html", None)
    if html and not Path(html).parent.is_dir():
        return _bad_input(f"--html {html!r}: folder {str(Path(html).parent)!r} does not exist", args.json)
    try:
        store = Store(args.db, read_only_ok=True)  # a report of a store one may not write (reaping is skipped)
    except StoreError as exc:
        return _bad_input(str(exc), args.json)
    store.reap_dead_runs()
    runs = store.list_runs(workload=args.workload, limit=args.limit)
    if html:
        from trainperf.report.html import render

        steps = {r["run_id"]: store.steps(r["run_id"]) for r in runs}
        try:
            Path(html).write_text(render(runs, steps))
        except OSError as exc:
            return _bad_input(f"--html {html!r}: cannot write it ({exc.strerror})", args.json)
    store.close()
    if args.json:
        print(json.dumps(rows_for_json(runs), indent=2))
    else:
        print_table(runs)
    return EXIT_OK


SUMMARY_KEYS = ("run_id", "workload", "status", "status_reason", "time_to_train_s", "samples_to_target",
                "final_eval_loss", "target", "step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu",
                "peak_mem_gib", "peak_reserved_gib", "optimizer", "optimizer_state_gib", "cuda_alloc_retries", "cuda_alloc_conf", "activation_offload_gib_per_step", "pinned_host_gib", "layout",
                "placement", "world_size", "mllog", "out_dir", "adapter", "seed", "predicted")


def _print_summary(summary: dict) -> None:
    from rich.console import Console

    c = Console(stderr=False)
    ok = summary["status"] == "success"
    head = "[green]reached target[/green]" if ok else "[red]FAILED[/red]"
    c.print(f"{head} {summary['workload']} run {summary['run_id']}")
    if ok:
        c.print(f"  time to train  {summary['time_to_train_s']:.2f} s  ({summary['samples_to_target']} samples, "
                f"eval loss {summary['final_eval_loss']:.4f} <= target {summary['target']:.4f})")
    else:
        c.print(f"  {summary.get('status_reason')}")
    if summary.get("tokens_per_s"):
        mfu = summary.get("mfu")
        c.print(f"  throughput     {summary['tokens_per_s']:,.0f} tokens/s ({summary['tokens_per_s_per_gpu']:,.0f} per "
                f"process), {summary['model_tflops_per_gpu']:.3f} model TFLOP/s per process, MFU "
                + (f"{100 * mfu:.1f}%" if mfu is not None else "n/a (no peak FLOP/s known for this device)"))
        c.print(f"  peak memory    {summary['peak_mem_gib']:.2f} GiB")
    if summary.get("layout"):
        where = ", ".join(f"{k} {v}" for k, v in (summary.get("placement") or {}).items())
        c.print(f"  layout         {summary['layout']} on {summary.get('world_size')} processes" + (f" ({where})" if where else ""))
    c.print(f"  mllog          {summary['mllog']}")


def cmd_run(args, workload: str | None = None) -> int:
    from trainperf.runner import local

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
        from trainperf.store.db import check_store_path

        check_store_path(args.db)  # a bad --db fails here, before any work (prepare may build data)
        if Path(args.out).exists() and not Path(args.out).is_dir():
            raise SpecError(f"--out {args.out!r} is a file; give a folder for the runs' artefacts")
        ext = local.external_launcher()
        world = local.external_world_size() if ext else args.nproc_per_node
        spec, _info = local.prepare(workload, args.config, args.overrides, world)
    except SpecError as exc:
        return _bad_input(str(exc), args.json)
    except Exception as exc:
        from trainperf.store.db import StoreError

        if isinstance(exc, StoreError):
            return _bad_input(str(exc), args.json)
        raise
    progress = _interactive() and not args.json
    if ext:
        summary = local.run_as_external_rank(spec, args.out, args.db, progress)
        if int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) != 0:
            return EXIT_OK if summary.get("status") == "success" else EXIT_FAILED
    else:
        summary = local.launch(spec, args.out, args.db, args.nproc_per_node, progress)
    summary["wall_s"] = time.perf_counter() - t0
    if args.json:
        print(json.dumps({k: summary.get(k) for k in SUMMARY_KEYS} | {"evals": summary.get("evals", []),
                                                                     "wall_s": summary["wall_s"]}, indent=2))
    else:
        _print_summary(summary)
    return EXIT_OK if summary.get("status") == "success" else EXIT_FAILED


def _apply_plan(args, workload: str) -> None:
    """Put a stored plan's layout in front of the user's own --set overrides (which still win)."""
    from trainperf.store.db import Store

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


def cmd_score(args) -> int:
    from trainperf.mlperf.score import (
        export_package,
        gather_runs,
        print_score,
        score_runs,
    )

    try:
        runs = gather_runs(args.inputs, db=args.db, workload=args.workload, last=args.last, ruleset=args.ruleset)
        result = score_runs(runs, ruleset=args.ruleset)
        if args.export:
            result.export = export_package(result, args.export, org=args.org, system=args.system)
    except SpecError as exc:
        return _bad_input(str(exc), args.json)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print_score(result)
    return EXIT_OK if result.valid else EXIT_FAILED


def cmd_demo(args) -> int:
    import torch

    args.config, args.overrides, args.layout_from_plan = None, [], None
    if not torch.cuda.is_available() or torch.cuda.device_count() < args.nproc_per_node:
        args.overrides.append("hardware.device=cpu")
    rc = cmd_run(args, workload="mini-lora")
    if not args.json and rc != EXIT_BAD_INPUT:  # nothing ran: no table under the error
        report_args = argparse.Namespace(db=args.db, json=False, workload=None, limit=10, html=None)
        cmd_report(report_args)
    return rc


def _preflight(args) -> int:
    from trainperf.cli import preflight as preflight_cli

    return preflight_cli.run(args)


def _trace(args) -> int:
    from trainperf.cli import trace as trace_cli

    return trace_cli.run(args)


def cmd_data(args) -> int:
    from trainperf.data import pretok

    return pretok.main(args.rest)


def main(argv: list[str] | None = None) -> int:
    _ARGV[:] = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(_ARGV)
    handlers = {"run": cmd_run, "plan": cmd_plan, "tune": cmd_tune, "sweep": cmd_sweep, "workloads": cmd_workloads, "report": cmd_report,
                "demo": cmd_demo, "score": cmd_score, "data": cmd_data,
                "preflight": _preflight, "trace": _trace}
    import sqlite3

    from trainperf.store.db import StoreError

    try:
        return handlers[args.command](args)
    except StoreError as exc:  # a store that went bad after it opened (e.g. read-only, full disk)
        return _bad_input(str(exc), getattr(args, "json", False))
    except sqlite3.DatabaseError as exc:  # a damaged page found by a query, after the open's checks
        if isinstance(exc, (sqlite3.IntegrityError, sqlite3.InterfaceError, sqlite3.ProgrammingError)):
            raise  # a row this trainperf should not have written: a bug, not a damaged file
        db = getattr(args, "db", None)
        if "malformed" in str(exc) or "not a database" in str(exc):
            return _bad_input(f"results store {db!r} is damaged ({exc}); restore it from a backup or give another "
                              "--db", getattr(args, "json", False))
        return _bad_input(f"results store {db!r}: {exc}", getattr(args, "json", False))  # e.g. disk full, I/O error


if __name__ == "__main__":
    sys.exit(main())
