"""``trainperf plan WORKLOAD --gpus N``: rank every layout for N GPUs by predicted time (no GPU needed).

Steps: resolve the inputs, pick the GPU (the preset, or the figures the newest preflight of it
measured), search, store the ranked layouts, print them (or JSON). ``--calibrate`` instead fits the
model to the stored runs of the GPU.
"""

from __future__ import annotations

import argparse
import json

from trainperf.cli.errors import EXIT_FAILED, EXIT_OK, SpecError, bad_input
from trainperf.cli.options import HEADROOM_HELP, add_common, memory_headroom

HELP = "rank every layout for N GPUs by predicted time (no GPU needed)"
DESCRIPTION = ("Top-down estimate of memory, communication and step time for every valid "
               "layout of WORKLOAD on N GPUs; ranks those that fit.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("workload", nargs="?", default="", help="workload name (see `trainperf workloads`; not with --calibrate)")
    p.add_argument("--gpus", type=int, default=0, help="GPUs in the job (required unless --calibrate)")
    p.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node (default: min(gpus, 8))")
    p.add_argument("--gpu", default="h200", help="h100 | h200 | a100 | b200, a cluster preset (h100-sxm | h200-sxm | "
                                                 "h200-nvl | b200-sxm | gb200 | gb300: NIC and NVLink domain) or a YAML "
                                                 "file of GPU fields")
    p.add_argument("--config", help="YAML or TOML file of section: {key: value} overrides")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--top", type=int, default=10, help="how many ranked layouts to show (default 10)")
    p.add_argument("--objective", choices=["time", "throughput"], default="time",
                   help="rank by time to train (needs --samples or an MLPerf RCP) or by tokens/s")
    p.add_argument("--samples", help="samples to converge (default: the MLPerf RCP mean, if any)")
    p.add_argument("--datasheet", action="store_true",
                   help="use the GPU preset as is, not the figures the newest `trainperf preflight` of this GPU measured")
    p.add_argument("--gbs", metavar="LIST|rcp",
                   help="also search the global batch size: comma-separated values, or `rcp` for every GBS the "
                        "benchmark's RCP checker accepts (its RCPs, between two interpolated, below the smallest "
                        "against it; samples to converge as the checker computes them)")
    p.add_argument("--options", metavar="LIST|all|none", default="none",
                   help="also search this engine's speed settings, each shown in the table: compile (train.compile), "
                        "fp8 (hardware.fp8=tensorwise), frozen_dtype (LoRA's base in fp8), attention (flash4); "
                        "comma-separated, all, or none (the default: the spec's own)")
    p.add_argument("--layout", metavar="FIELDS",
                   help="also price exactly this layout and show where it ranks: comma-separated tp=N,sp,cp=N,pp=N,"
                        "vp=N (virtual stages per rank, any count the model admits),dp=N (or rep=N,shard=N),mbs=N,"
                        "gbs=N,recompute=...,schedule=...; --gpus defaults to the GPUs it names")
    p.add_argument("--layout-from-run", metavar="RUN_ID",
                   help="the same for the layout of a stored or imported run (its GPUs, layout and GBS)")
    p.add_argument("--explain", action="store_true", help="say which term makes each runner-up slower")
    p.add_argument("--memory-headroom", type=float, default=None, metavar="FRACTION", help=HEADROOM_HELP)
    p.add_argument("--calibrate", metavar="GPU_YAML", nargs="?", const="",
                   help="fit the model to the GPU runs in the store (of --gpu) and write the fitted GPU as YAML; with "
                        "--engine NAME (not trainperf): fit that engine's profile to its imported runs and print it")
    p.add_argument("--engine", default="trainperf",
                   help="whose speed to predict: trainperf (this engine, the default) or an engine whose MLPerf runs "
                        "`trainperf import` stored (e.g. nemo): its profile is fitted to them")
    add_common(p)


def run(args) -> int:
    # the store (and sqlite3) loads only when a command runs, not for --help
    from trainperf.store.db import StoreError

    try:
        headroom = memory_headroom(args)
    except SpecError as exc:
        return bad_input(str(exc), args.json)
    if args.calibrate is not None:
        if args.engine != "trainperf":
            return calibrate_engine(args)
        if not args.calibrate:
            return bad_input("--calibrate needs GPU_YAML (where to write the fitted GPU), or --engine NAME to fit "
                             "another engine's profile", args.json)
        return calibrate(args)
    # the planner loads only when a plan is asked for, not for --help
    from trainperf.plan.request import PlanRequest, make_plan

    # the workload registry imports torch and the model: only when a plan is asked for
    from trainperf.workloads import get_workload

    req = PlanRequest.from_options(args, headroom)
    try:
        ranking = make_plan(req, lambda name: get_workload(name).defaults())
    except (SpecError, StoreError) as exc:
        return bad_input(str(exc), args.json)
    # the plan as data, for --json (the planner's)
    from trainperf.plan.output import plan_json

    # the rich table, loaded with the planner it prints
    from trainperf.cli.plan_output import print_table

    if args.json:
        print(json.dumps(plan_json(req, ranking), indent=2))
        return EXIT_OK if ranking.fits else EXIT_FAILED
    return print_table(req, ranking)


def calibrate(args) -> int:
    """``plan --calibrate GPU_YAML``: fit the model to the stored runs of --gpu and write the fitted GPU."""
    # the planner's fit loads only when it is asked for, not for --help
    from trainperf.plan.calibrate import calibrate_to_yaml

    # the store (and sqlite3) loads only when a command runs, not for --help
    from trainperf.store.db import StoreError

    try:
        out = calibrate_to_yaml(args.db, args.gpu, args.calibrate)
    except (SpecError, StoreError) as exc:
        return bad_input(str(exc), args.json)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for which in ("preset", "calibrated"):
            s = out[which]
            print(f"{which:10s} {s['runs']} runs: median |step error| {100 * s['median_abs_step_error']:.1f}%, "
                  f"max {100 * s['max_abs_step_error']:.1f}%")
        print(f"wrote {args.calibrate}: use it with `trainperf plan ... --gpu {args.calibrate}`")
    return EXIT_OK


def calibrate_engine(args) -> int:
    """``plan --calibrate --engine NAME``: fit NAME's profile to its stored runs and print each factor."""
    # engine profiles are part of the planner, loaded only when a fit is asked for
    from trainperf.plan.engines import FACTORS, fit_stored_engine, median_abs

    # the store (and sqlite3) loads only when a command runs, not for --help
    from trainperf.store.db import StoreError

    try:
        profile, points, errors = fit_stored_engine(args.db, args.engine)
    except (SpecError, StoreError) as exc:
        return bad_input(str(exc), args.json)
    if args.json:
        print(json.dumps({"profile": profile.to_dict(), "meaning": {k: v[0] for k, v in FACTORS.items()},
                          "points": errors, "median_abs_error": median_abs([e["error"] for e in errors])}, indent=2))
        return EXIT_OK
    print(f"engine {args.engine}: profile fitted to {len(points)} stored configurations (one point each: the run "
          "with the median tokens/s per GPU)")
    for line in profile.describe():
        print("  " + line)
    print(f"  {'configuration':55s} {'stored':>9s} {'fitted':>9s}  tokens/s per GPU")
    for e in errors:
        print(f"  {e['point'][:55]:55s} {e['measured_tokens_per_s_per_gpu']:9,.0f} "
              f"{e['predicted_tokens_per_s_per_gpu']:9,.0f}  {100 * e['error']:+.1f}%")
    print(f"  median |error| {100 * median_abs([e['error'] for e in errors]):.1f}% on the points it was fitted to; "
          f"`trainperf plan WORKLOAD --gpus N --engine {args.engine}` predicts with it")
    return EXIT_OK
