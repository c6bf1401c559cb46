"""``trainperf preflight``: is every GPU and link as fast as its datasheet?

Mounted in ``trainperf.cli`` with ``add_arguments(parser)`` and ``run(args) -> int``; also runnable
alone as ``python -m trainperf.cli.preflight ...``. Exit codes: 0 no check failed, 1 a check failed
(or the workers did), 2 bad input (one-line error).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from trainperf.cli.errors import EXIT_FAILED, SpecError, bad_input
from trainperf.parallel.launcher import run_torchrun, torchrun_command
from trainperf.preflight import checks

HELP = "is every GPU and link as fast as its datasheet? (GEMM, HBM, collectives, every pair)"
DESCRIPTION = ("Measure bf16/fp8 GEMM and HBM copy on every GPU, sweep all_reduce / all_gather / reduce_scatter / "
               "all_to_all over message sizes (nccl-tests busbw), send/recv between every pair of ranks, and judge "
               "each against the GPU's datasheet and against the best GPU/pair of the same run. Exit 1 if any check "
               "fails.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc-per-node", type=int, default=None,
                   help="processes (GPUs) to test with torchrun (default: every visible GPU; 2 on CPU); "
                        "ignored when torchrun/srun already started this process as one rank")
    p.add_argument("--quick", action="store_true",
                   help="a few message sizes (1 KiB..1 GiB x16) and fewer iterations instead of 8 B..4 GiB doubling")
    p.add_argument("--gpu", default=None,
                   help="datasheet to judge against: h100 | h200 | a100 | b200 | a GPU YAML (default: detected)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                   help="cuda (NCCL) or cpu (gloo, figures not meaningful); default cuda when visible")
    p.add_argument("--max-bytes", default=None, metavar="SIZE",
                   help="largest message of the sweep, e.g. 1G or 64K (default 4G, quick 1G; CPU 1M, quick 8K)")
    p.add_argument("--iters", type=int, default=None,
                   help="timed iterations per measurement (default 20, quick 10; CPU 3)")
    p.add_argument("--kernels", choices=["auto", "yes", "no"], default="auto",
                   help="also measure the planner's kernel table (GEMM and attention rates by shape, ~10 s on a GPU; "
                        "plan then uses it): auto = on GPU unless --quick")
    p.add_argument("--db", default="trainperf.db",
                   help="results store: the result is kept there and `plan` uses its measured figures (default ./trainperf.db)")
    p.add_argument("--out", default="runs",
                   help="directory under which preflight-<timestamp>/preflight.json is written (default ./runs)")
    if "--json" not in p._option_string_actions:  # trainperf's common options may already define it
        p.add_argument("--json", action="store_true", help="one JSON object on stdout")


# -- request ------------------------------------------------------------------------------------

def _external() -> bool:
    """This process is one rank of a job torchrun/srun started (as ``trainperf.runner.local`` decides)."""
    if "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ):
        return True
    return int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "SLURM_PROCID" in os.environ


def build_request(args) -> tuple[dict, int, bool]:
    """(request, processes, external). Raises SpecError on bad input, before anything starts."""
    external = _external()
    device = args.device
    if device != "cpu":
        import torch
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        raise SpecError("--device cuda but no CUDA device is visible; use --device cpu (figures not meaningful)")
    if external:
        nproc = int(os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_NTASKS") or 1)
    else:
        nproc = args.nproc_per_node
        if nproc is None:
            nproc = torch.cuda.device_count() if device == "cuda" else 2
        if nproc < 1:
            raise SpecError(f"--nproc-per-node={nproc}: must be >= 1")
        if device == "cuda" and nproc > torch.cuda.device_count():
            raise SpecError(f"--nproc-per-node {nproc} exceeds the {torch.cuda.device_count()} visible GPUs")
    iters = args.iters if args.iters is not None else (3 if device == "cpu" else 10 if args.quick else 20)
    if iters < 1:
        raise SpecError(f"--iters={iters}: must be >= 1")
    max_bytes = None
    if args.max_bytes is not None:
        max_bytes = checks.parse_size(args.max_bytes)
        if max_bytes < 8:
            raise SpecError(f"--max-bytes {args.max_bytes!r}: must be at least 8 bytes")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise SpecError(f"--out {args.out!r} is a file, not a directory")
    req = {"device": device, "quick": bool(args.quick), "iters": iters,
           "warmup": 1 if device == "cpu" else 3 if args.quick else 5,
           "sizes": checks.sweep_sizes(args.quick, device, max_bytes),
           "gemm_n": 8192 if device == "cuda" else 128,
           "hbm_bytes": (2**30 if args.quick else 4 * 2**30) if device == "cuda" else 4 * 2**20}
    return req, nproc, external


def _resolve_preset(args, raw: dict):
    """(preset or None, where it came from)."""
    # the GPU presets load only once something was measured, not for --help
    from trainperf.plan.hardware import load_gpu, preset_for_device

    if args.gpu:
        return load_gpu(args.gpu), f"--gpu {args.gpu}"
    if raw["device"] != "cuda":
        return None, None
    names = sorted({r.get("device_name") or "" for r in raw["ranks"]})
    preset = preset_for_device(names[0]) if names else None
    if preset is None:
        return None, f"no preset for {names[0]!r}: datasheet checks are n/a (give --gpu)"
    return preset, f"detected {names[0]}" + (f" (mixed GPUs: {', '.join(names)})" if len(names) > 1 else "")


def _new_run_dir(root: Path) -> Path:
    base = root / f"preflight-{time.strftime('%Y%m%d-%H%M%S')}"
    d, k = base, 1
    while True:
        try:
            d.mkdir(parents=True, exist_ok=False)
            return d
        except FileExistsError:
            k += 1
            d = Path(f"{base}-{k}")


# -- running --------------------------------------------------------------------------------------

class WorkersFailed(RuntimeError):
    pass


def _launch(req: dict, nproc: int, run_dir: Path) -> dict:
    (run_dir / "request.json").write_text(json.dumps(req, indent=2))
    env = dict(os.environ)
    if req["device"] == "cpu":
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    cmd = torchrun_command(nproc, "trainperf.preflight.worker", str(run_dir))
    log = run_dir / "workers.log"
    with open(log, "w") as fh:
        rc = run_torchrun(cmd, env, stdout=fh)
    raw_file = run_dir / "raw.json"
    if rc != 0 or not raw_file.is_file():
        tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-1:] or ["(no output)"]
        raise WorkersFailed(f"preflight workers failed (torchrun exit code {rc}): {tail[0][:300]} -- log: {log}")
    raw = json.loads(raw_file.read_text())
    raw_file.unlink()
    return raw


def run(args) -> int:
    # the store (and sqlite3) loads only when a command runs, not for --help
    from trainperf.store.db import StoreError, check_store_path

    try:
        req, nproc, external = build_request(args)
        if args.gpu:
            # the GPU presets load only when --gpu is given
            from trainperf.plan.hardware import load_gpu

            load_gpu(args.gpu)  # a bad --gpu is bad input: say so before measuring
        if getattr(args, "db", None):  # so is a --db that cannot store the result
            check_store_path(args.db)
    except (SpecError, StoreError) as exc:
        return bad_input(str(exc), args.json)
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) if external else 0
    run_dir = None
    if not external:
        run_dir = _new_run_dir(Path(args.out))
    if not args.json and rank == 0:
        print(f"preflight: {nproc} process(es) on {req['device']}"
              + (f", log {run_dir / 'workers.log'}" if run_dir and nproc > 1 else ""), file=sys.stderr)
    try:
        if external or nproc == 1:
            # the measurements import torch: only in the process that measures
            from trainperf.preflight.measure import measure_all

            raw = measure_all(req)
        else:
            raw = _launch(req, nproc, run_dir)
    except WorkersFailed as exc:
        if args.json:
            print(json.dumps({"error": str(exc), "exit_code": EXIT_FAILED}))
        print(f"trainperf: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    preset, source = _resolve_preset(args, raw)
    result = checks.evaluate(raw, preset, source)
    if rank != 0:
        return result["exit_code"]
    if run_dir is None:
        run_dir = _new_run_dir(Path(args.out))
    result["out_dir"] = str(run_dir)
    result["result_path"] = str(run_dir / "preflight.json")
    if wants_kernel_table(getattr(args, "kernels", "auto"), req["device"], bool(args.quick)):
        try:  # a failure here must not lose the checks already measured
            measure_kernel_table_into(result, req["device"], run_dir, args.iters)
        except Exception as exc:  # noqa: BLE001 -- out of memory, an SDPA backend missing, ...
            result.setdefault("notes", []).append(f"kernel table not measured: {type(exc).__name__}: {exc}")
    (run_dir / "preflight.json").write_text(json.dumps(result, indent=2))
    result["stored_as"] = _store(result, run_dir.name, getattr(args, "db", None))
    if args.json:
        print(json.dumps(result))
    else:
        print_result(result)
    return result["exit_code"]


def wants_kernel_table(choice: str, device: str, quick: bool) -> bool:
    return choice == "yes" or (choice == "auto" and device == "cuda" and not quick)


def measure_kernel_table_into(result: dict, device: str, run_dir: Path, iters: int | None = None) -> None:
    """Measure the kernel table on this process's device, write RUN_DIR/kernel_rates.json, and on a GPU
    make it one of the measured figures `plan` uses (CPU figures only exercise the path)."""
    # the kernel benchmarks import torch: only in the process that measures
    from trainperf.preflight.kernels import measure_kernel_table

    table = measure_kernel_table(device, iters=iters or (10 if device == "cuda" else 3))
    path = (run_dir / "kernel_rates.json").resolve()  # plan may run from another directory
    path.write_text(json.dumps(table, indent=1))
    result["kernel_table"] = {"path": str(path), "gemm_shapes": len(table["gemm_tflops"]),
                              "attention_shapes": len(table["attention_tflops_fwd_bwd"]), "seconds": table["seconds"]}
    if device == "cuda":
        overrides = result.setdefault("measured_overrides", {})
        overrides["kernel_table"] = str(path)
        # measured on this machine: no scaling by this machine's own 8192^3 GEMM rate
        overrides["kernel_table_gemm_eff"] = overrides.get("gemm_eff", 0.0)


def _store(result: dict, preflight_id: str, db: str | None) -> str | None:
    """Keep the result in the store (one transaction); the JSON in the run dir is written first, so a
    store problem loses nothing."""
    if not db:
        return None
    # the store (and sqlite3) loads only when a command runs, not for --help
    from trainperf.store.db import Store, StoreError

    try:
        store = Store(db)
        try:
            store.save_preflight(*checks.store_rows(result, preflight_id))
        finally:
            store.close()
    except (StoreError, OSError, Exception) as exc:  # sqlite3 errors included
        print(f"trainperf: warning: preflight not stored in {db}: {exc}", file=sys.stderr)
        return None
    return preflight_id


# -- output ---------------------------------------------------------------------------------------

def _num(v: float | None, unit: str = "") -> str:
    if v is None:
        return "-"
    if unit == "TB/s":
        return f"{v:.2f}"
    return f"{v:,.1f}" if v >= 10 else f"{v:.3g}"


def _verdict_cell(v: str) -> str:
    return {"pass": "[green]pass[/green]", "warn": "[yellow]warn[/yellow]", "fail": "[bold red]FAIL[/bold red]"}.get(v, v)


def print_result(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if Console().is_terminal else 200)
    gpu = (result.get("gpu_preset") or {}).get("name") or (result["ranks"][0].get("device_name") if result["ranks"] else "?")
    table = Table(title=f"trainperf preflight: {result['world_size']} x {gpu} on {len(result['nodes'])} node(s)"
                        + (" (quick)" if result.get("quick") else ""))
    for col, just in (("check", "left"), ("subject", "left"), ("size", "right"), ("value", "right"),
                      ("datasheet", "right"), ("%", "right"), ("verdict", "left"), ("note", "left")):
        table.add_column(col, justify=just)
    rows = result["checks"]
    pair_rows = [r for r in rows if r["check"].startswith("sendrecv")]
    collapse = len(pair_rows) > 28
    for r in rows:
        if collapse and r in pair_rows and r["verdict"] == "pass":
            continue
        table.add_row(r["check"], r["subject"], r["size"], f"{_num(r['value'], r['unit'])} {r['unit']}",
                      _num(r["datasheet"], r["unit"]), "-" if r["pct"] is None else f"{r['pct']:.0f}%",
                      _verdict_cell(r["verdict"]), r.get("note") or "")
    if collapse:
        vals = sorted(r["value"] for r in pair_rows)
        table.add_row("sendrecv busbw", f"{len(pair_rows)} pairs (passing ones not shown)", pair_rows[0]["size"],
                      f"min {vals[0]:,.1f} / median {vals[len(vals) // 2]:,.1f} / max {vals[-1]:,.1f} GB/s", "", "", "", "")
    console.print(table)

    sizes, grid = checks.iter_sizes_table(result.get("collectives", []), "world")
    if sizes:
        sweep = Table(title=f"busbw GB/s by message size (world, {result['world_size']} ranks; sendrecv: slowest pair)")
        sweep.add_column("size", justify="right")
        for c in (*checks.COLLECTIVES, "sendrecv"):
            sweep.add_column(c, justify="right")
        pairs_by_size: dict[int, list[float]] = {}
        for p in result.get("pairs", []):
            pairs_by_size.setdefault(p["size"], []).append(p["busbw_gbps"])
        for s in sizes:
            sweep.add_row(checks.fmt_bytes(s), *(_num(grid[s].get(c)) for c in checks.COLLECTIVES),
                          _num(min(pairs_by_size[s])) if s in pairs_by_size else "-")
        console.print(sweep)

    for g in result.get("slow_gpus", []):
        console.print(f"[red]slow GPU[/red]: {g['who']} {g['check']} {g['value']:.3g} is {g['slower_pct']:.0f}% below the best ({g['best']:.3g})")
    for p in result.get("slow_pairs", []):
        console.print(f"[red]slow pair[/red]: {p['who']} ({p['link']}) {p['value']:.1f} GB/s is {p['slower_pct']:.0f}% below "
                      f"the best pair ({p['best']:.1f})")
    base = result.get("baseline", [])
    if base:
        parts = ", ".join(f"{b['check']} {b['size']} {b['ratio']:.2f}" for b in base)
        ok = all(b["ok"] for b in base)
        lim = checks.THRESHOLDS["baseline_ratio"]
        if result["device"] != "cuda":
            verdict = "CPU: ratios not meaningful either"
        elif ok:
            verdict = f"all >= {lim}: the harness measures what a plain loop does"
        else:
            verdict = f"[yellow]some < {lim}: the harness reads lower than a plain loop[/yellow]"
        console.print(f"harness/plain throughput: {parts} -- {verdict}")
    kt = result.get("kernel_table")
    if kt:
        use = "plan uses it" if result["device"] == "cuda" else "CPU: exercises the path, plan ignores it"
        console.print(f"kernel table: {kt['gemm_shapes']} GEMM and {kt['attention_shapes']} attention shapes in "
                      f"{kt['seconds']} s -> {kt['path']} ({use})")
    for n in result.get("notes", []):
        console.print(f"note: {n}")
    if result.get("note"):
        console.print(f"[yellow]{result['note']}[/yellow]")
    if result.get("preset_source"):
        console.print(f"datasheet: {result['preset_source']}")
    s = result["summary"]
    ov = result.get("measured_overrides") or {}
    if ov:
        console.print("measured preset fields: " + ", ".join(f"{k}={v}" for k, v in ov.items()))
    console.print(f"{s['pass']} pass, {s['warn']} warn, {s['fail']} fail, {s['n/a']} n/a -- {result['result_path']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainperf preflight", description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
