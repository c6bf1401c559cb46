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
import os
import sys
from pathlib import Path

from trainperf.cli.errors import EXIT_FAILED, EXIT_OK, SpecError, bad_input
from trainperf.cli.paths import check_out_folder
from trainperf.trace import SUMMARY_FILE, TRACE_DIR
from trainperf.trace.overhead import OVERHEAD_GOAL_PCT
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
    from trainperf.runner import local

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
        ext = local.external_launcher()
        world = local.external_world_size() if ext else args.nproc_per_node
        spec, _ = local.prepare(args.workload, args.config, trace_overrides(args), world)
    except (SpecError, StoreError) as exc:
        return bad_input(str(exc), args.json)
    if ext:
        summary = local.run_as_external_rank(spec, args.out, db, False)
        if int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) != 0:
            return EXIT_OK  # rank 0 analyses (every rank's trace must be on its file system)
    else:
        summary = local.launch(spec, args.out, db, args.nproc_per_node, False)
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


# ---------------------------------------------------------------------------------------------
# rich output


def _ms(x) -> str:
    return "-" if x is None else f"{1e3 * x:,.2f}"


def _us(x) -> str:
    return "-" if x is None else f"{1e6 * x:,.1f}"


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1f}%"


def _bytes(n) -> str:
    if n is None:
        return "-"
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= f:
            return f"{n / f:.2f} {unit}"
    return f"{n} B"


def _gbps(x) -> str:
    return "-" if x is None else (f"{x:,.1f}" if x >= 1 else f"{x:.3g}")


def print_summary(s: dict, top: int = 10) -> None:
    from rich.console import Console

    console = Console(width=None if Console().is_terminal else 160)
    _print_ranks(console, s)
    _print_collectives(console, s, top)
    _print_comm_and_skew(console, s)
    _print_top_kernels(console, s, top)
    _print_idle_gaps(console, s, top)
    _print_overhead(console, s)
    console.print(f"summary: {s.get('summary_file')}")


def _print_ranks(console, s: dict) -> None:
    """The heading, the profiled steps and the per-rank table."""
    from rich.table import Table

    run = s.get("run") or {}
    head = f"trainperf trace: {run.get('workload') or ''} {s.get('mode', '')} trace of {len(s['ranks'])} ranks"
    if run.get("layout"):
        head += f", {run['layout']}"
    console.print(f"[bold]{head}[/bold]  ({s['trace_dir']})")
    steps = sorted({k for ks in s["steps_per_rank"].values() for k in ks})
    console.print(f"profiled steps (ProfilerStep#k = loop step k+1): {steps}")

    t = Table(title="per rank, mean per step (ms)")
    for col in ("rank", "step", "compute", "comm", "overlap", "exposed comm", "mem", "exposed mem", "idle",
                "wait in coll."):
        t.add_column(col, justify="right")
    for r in s["per_rank"]:
        t.add_row(str(r["rank"]), _ms(r["step_s"]), _ms(r["compute_s"]), _ms(r["comm_s"]), _pct(r["overlap_pct"]),
                  _ms(r["exposed_comm_s"]), _ms(r["mem_s"]), _ms(r["exposed_mem_s"]), _ms(r["idle_s"]),
                  _ms(r["collective_wait_s"]))
    tot = s["totals"]
    t.add_row("mean", _ms(tot["step_s"]), _ms(tot["compute_s"]), _ms(tot["comm_s"]), _pct(tot["overlap_pct"]),
              _ms(tot["exposed_comm_s"]), _ms(tot["mem_s"]), _ms(tot["exposed_mem_s"]), _ms(tot["idle_s"]),
              _ms(tot["collective_wait_s"]),
              style="bold")
    console.print(t)


def _print_collectives(console, s: dict, top: int) -> None:
    """The collectives table, largest first."""
    from rich.table import Table

    if s["collectives"]:
        t = Table(title="collectives (time per rank over the profiled steps; bandwidth from the transfer time = "
                        "the fastest rank's duration; GB/s = 1e9 B/s)")
        for col in ("op", "group", "n", "dtype", "size S", "calls/rank", "total ms/rank", "mean us", "transfer us",
                    "algbw GB/s", "busbw GB/s"):
            t.add_column(col, justify="right" if col not in ("op", "group", "dtype") else "left")
        for c in s["collectives"][:top]:
            t.add_row(c["op"], str(c["group"]), str(c["group_size"] or "?"), str(c["dtype"] or "?"), _bytes(c["bytes"]),
                      f"{c['count_per_rank']:g}", _ms(c["total_s_per_rank"]), _us(c["mean_s"]), _us(c["transfer_s"]),
                      _gbps(c["algbw_gbps"]), _gbps(c["busbw_gbps"]))
        if len(s["collectives"]) > top:
            t.caption = f"{len(s['collectives']) - top} more in --json / {SUMMARY_FILE}"
        console.print(t)


def _print_comm_and_skew(console, s: dict) -> None:
    """Communication per parallel dimension, rank skew and the straggler."""
    if s.get("comm_by_group"):
        console.print("communication per step by parallel dimension (per rank): " + "; ".join(
            f"{g}: {_ms(v['comm_s_per_step'])} ms in {v['calls_per_step']:.3g} calls, {_bytes(v['bytes_per_step'])}, "
            f"transfer {_ms(v['transfer_s_per_step'])} ms" for g, v in s["comm_by_group"].items()))
    sk = s.get("skew") or {}
    if sk and len(s["ranks"]) > 1:
        console.print("step time by rank: " + ", ".join(f"{k}: {_ms(v)} ms" for k, v in sk["step_s_by_rank"].items())
                      + f"; slowest rank {sk['slowest_rank']} (+{_ms(sk['slowest_minus_fastest_s'])} ms over the fastest, "
                        f"{_pct(sk['slowest_over_median_pct'])} over the median)")
        st = sk.get("straggler")
        if st:
            console.print(f"straggler: rank {st['rank']} -- the other ranks wait "
                          f"{_ms(st['others_wait_more_by_s_per_step'])} ms per step longer inside collectives for it; "
                          f"it started last in {st['arrived_last']} of {st['matched_collectives']} matched collectives")
    if s.get("note"):
        console.print(f"[yellow]{s['note']}[/yellow]")


def _print_top_kernels(console, s: dict, top: int) -> None:
    """The top kernels (GPU) or leaf ops (CPU)."""
    from rich.table import Table

    if s["top"]:
        t = Table(title="top kernels" if s.get("mode") == "gpu" else "top ops (leaf CPU ops; gloo work)")
        for col in ("name", "kind", "calls/rank", "total ms/rank", "mean us", "% of compute"):
            t.add_column(col, justify="left" if col in ("name", "kind") else "right")
        for k in s["top"][:top]:
            name = k["name"] if len(k["name"]) <= 90 else k["name"][:87] + "..."
            t.add_row(name, k["kind"], f"{k['count_per_rank']:g}", _ms(k["total_s_per_rank"]), _us(k["mean_s"]),
                      _pct(k["pct_of_compute"]))
        console.print(t)


def _print_idle_gaps(console, s: dict, top: int) -> None:
    """Where the GPU sat idle, by cause."""
    from rich.table import Table

    gaps = s.get("idle_gaps")
    if gaps and gaps["by_cause"]:
        t = Table(title=f"where the GPU sat idle: gaps of {_us(gaps['min_gap_s'])} us or more, "
                        f"{_ms(gaps['inside_s_per_step'])} ms per step inside the step and "
                        f"{_ms(gaps['edges_s_per_step'])} ms at its start and end (the trace waits for the GPU "
                        f"after every step; training does not) -- cause, and the host ops at the sync or launch")
        for col in ("cause", "where (host)", "gaps/step", "ms/step"):
            t.add_column(col, justify="left" if col in ("cause", "where (host)") else "right")
        for g in gaps["by_cause"][:top]:
            where = g["where"] if len(g["where"]) <= 90 else g["where"][:87] + "..."
            t.add_row(g["cause"], where, f"{g['count_per_step']:.3g}", _ms(g["total_s_per_step"]))
        if len(gaps["by_cause"]) > top:
            t.caption = f"{len(gaps['by_cause']) - top} more, and the largest gaps one by one, in --json / {SUMMARY_FILE}"
        console.print(t)


def _print_overhead(console, s: dict) -> None:
    """The profiler's own overhead and, when large, the unprofiled step estimate."""
    o = s.get("overhead") or {}
    if o.get("overhead_pct") is not None:
        r0 = next(iter(o["per_rank"].values()))
        console.print(f"profiler overhead: {o['overhead_pct']:+.1f}% step time (median over ranks; rank "
                      f"{next(iter(o['per_rank']))}: {_ms(r0['profiled_step_s'])} ms profiled vs "
                      f"{_ms(r0['baseline_step_s'])} ms unprofiled), trace export {r0['export_s']:.2f} s once")
    u = (s.get("unprofiled_estimate") or {}).get("totals")
    if u and o.get("overhead_pct") is not None and o["overhead_pct"] > OVERHEAD_GOAL_PCT:
        console.print(f"unprofiled step, estimated (the profiler's {_ms(u['profiler_extra_s'])} ms of host time "
                      f"taken out of idle, then collective waits): step {_ms(u['step_s'])} ms = compute "
                      f"{_ms(u['compute_s'])} + exposed comm {_ms(u['exposed_comm_s'])} + idle {_ms(u['idle_s'])} ms "
                      f"(+ mem copies, overlaps)")
    if s.get("overhead_hint"):
        console.print(f"[yellow]{s['overhead_hint']}[/yellow]")
