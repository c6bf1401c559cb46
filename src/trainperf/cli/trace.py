"""``trainperf trace WORKLOAD``: run a workload for a few steps with torch.profiler on every rank (the
normal run path, with ``train.profile_*`` set), analyse the per-rank traces and report compute /
communication / overlap / exposed communication / idle per step and rank, the collectives per
parallel dimension with algbw and busbw, rank skew and stragglers, the top kernels, and the
profiler's own overhead. ``--analyze RUN_DIR`` analyses traces already recorded.

Output: rich tables (or ``--json``: one object) and RUN_DIR/trace_summary.json.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from trainperf.cli.errors import EXIT_FAILED, EXIT_OK, SpecError, bad_input
from trainperf.cli.paths import check_out_folder
from trainperf.cli.trace_tables import print_summary
from trainperf.trace import SUMMARY_FILE, TRACE_DIR
from trainperf.trace.summary import analyze_dir

HELP = "profile a few training steps on every rank: compute, comm, overlap, collectives, stragglers"
DESCRIPTION = ("Run WORKLOAD for a few steps with torch.profiler on every rank (after warm-up), then report compute / "
               "communication / overlap / exposed communication / idle per step and rank, the collectives per parallel "
               "dimension (bytes, algbw, busbw), rank skew and stragglers, the top kernels and the profiler's own "
               "overhead; writes RUN_DIR/trace_summary.json. --analyze RUN_DIR re-analyses recorded traces.")
NO_EVALS = 10**15  # eval.every_samples for a trace run: no eval inside the few steps


def add_arguments(p) -> None:
    p.add_argument("workload", nargs="?", help="workload name (see `trainperf workloads`); omit with --analyze")
    p.add_argument("--config", help="YAML or TOML file of section: {key: value} overrides")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one spec value (repeatable)")
    p.add_argument("--nproc-per-node", type=int, default=1, help="processes to launch with torchrun (default 1)")
    p.add_argument("--steps", type=int, default=3, help="training steps recorded by the profiler (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="profiler warm-up steps before them (default 1)")
    p.add_argument("--skip", type=int, default=2,
                   help="unprofiled steps first: step 1 warms the run up, the others are the overhead baseline "
                        "(default 2)")
    p.add_argument("--after", type=int, default=3,
                   help="unprofiled steps after the window, the rest of the overhead baseline (default 3)")
    p.add_argument("--analyze", metavar="RUN_DIR", help="only analyse the traces in RUN_DIR/trace (no run)")
    p.add_argument("--top", type=int, default=10, help="rows of the collective and top-kernel tables (default 10)")
    p.add_argument("--out", default="runs", help="directory for run artefacts (default ./runs)")
    p.add_argument("--db", default=None,
                   help="results store for the traced run (default: OUT/trace.db, apart from trainperf.db: a trace "
                        "run stops after a few steps and would show as a failed run in `trainperf report`)")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout (one object)")


def trace_overrides(args) -> list[str]:
    """The user's overrides between ours: open division first (a trace is no MLPerf result; the user
    may still say otherwise), the profile window and step count last (they define the trace)."""
    total = args.skip + args.warmup + args.steps + args.after
    return (["mlperf.division=open"] + list(args.overrides) +
            [f"train.profile_steps={args.steps}", f"train.profile_warmup={args.warmup}",
             f"train.profile_wait={args.skip}", f"train.max_steps={total}", f"eval.every_samples={NO_EVALS}"])


def loop_has_hook() -> bool:
    # the spec's dataclasses load only when a trace runs, not for --help
    from trainperf.core.spec import TrainSpec

    return "profile_steps" in {f.name for f in dataclasses.fields(TrainSpec)}


def run(args) -> int:
    if args.analyze:
        run_dir = Path(args.analyze)
        trace_dir = run_dir / TRACE_DIR if (run_dir / TRACE_DIR).is_dir() else run_dir
        if not trace_dir.is_dir():
            return bad_input(f"--analyze {args.analyze!r}: no such directory", args.json)
        return _report(trace_dir, trace_dir.parent if trace_dir.name == TRACE_DIR else trace_dir, None, args)
    if not args.workload:
        return bad_input("give a WORKLOAD to trace, or --analyze RUN_DIR", args.json)
    if args.steps < 1 or args.warmup < 0 or args.skip < 1 or args.after < 0 or args.nproc_per_node < 1:
        return bad_input("need --steps >= 1, --warmup >= 0, --skip >= 1 (step 1 is never profiled), --after >= 0 "
                          "and --nproc-per-node >= 1", args.json)
    if not loop_has_hook():
        return bad_input("this trainperf's training loop has no profiler hook yet (train.profile_steps)", args.json)
    # torch and the model load only when a traced run starts, not for --help
    from trainperf.runner.ranks import prepare_here, run_here

    # the store (and sqlite3) loads only when a command runs, not for --help
    from trainperf.store.db import StoreError, check_store_path

    db = args.db or str(Path(args.out) / "trace.db")
    try:
        check_store_path(db)  # a bad --db fails before any work
    except StoreError as exc:
        return bad_input(str(exc), args.json)
    try:
        check_out_folder(args.out)  # made by the run once the spec is good: a refusal leaves nothing
    except SpecError as exc:
        return bad_input(str(exc), args.json)
    try:
        spec = prepare_here(args.workload, args.config, trace_overrides(args), args.nproc_per_node)
    except (SpecError, StoreError) as exc:
        return bad_input(str(exc), args.json)
    summary, reports = run_here(spec, args.out, db, args.nproc_per_node, False)
    if not reports:
        return EXIT_OK  # rank 0 analyses (every rank's trace must be on its file system)
    run_dir = Path(summary.get("out_dir") or "")
    trace_dir = run_dir / TRACE_DIR
    if not trace_dir.is_dir() or not any(trace_dir.glob("rank*.json*")):
        msg = f"the traced run wrote no traces ({summary.get('status')}: {summary.get('status_reason')})"
        if args.json:
            print(json.dumps({"error": msg, "run_id": summary.get("run_id"), "exit_code": EXIT_FAILED}))
        print(f"trainperf: {msg}", file=sys.stderr)
        return EXIT_FAILED
    run_info = {"run_id": summary.get("run_id"), "workload": args.workload, "layout": summary.get("layout"),
                "world_size": summary.get("world_size"), "steps": summary.get("steps"),
                "median_step_time_s": summary.get("step_time_s"), "tokens_per_s": summary.get("tokens_per_s"),
                "mfu": summary.get("mfu"), "hardware": summary.get("hardware")}
    return _report(trace_dir, run_dir, run_info, args)


def _report(trace_dir: Path, run_dir: Path, run_info: dict | None, args) -> int:

    try:
        result = analyze_dir(trace_dir)
    except (FileNotFoundError, ValueError) as exc:
        return bad_input(f"{trace_dir}: {exc}", args.json)
    if run_info:
        result["run"] = run_info
    path = run_dir / SUMMARY_FILE
    path.write_text(json.dumps(result, indent=1))
    result["summary_file"] = str(path)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_summary(result, args.top)
    return EXIT_OK
