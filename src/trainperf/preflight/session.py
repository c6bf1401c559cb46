"""One ``trainperf preflight``: the request from the options, the measurements (torchrun workers started
here, this process alone, or one rank of a job torchrun / srun started), the verdicts, the kernel
table, preflight.json and the store row. The command line parses options and prints the result."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

from trainperf.core.errors import SpecError
from trainperf.parallel.launcher import run_torchrun, torchrun_command
from trainperf.preflight import checks


class WorkersFailed(RuntimeError):
    pass


def external() -> bool:
    """This process is one rank of a job torchrun/srun started (as ``trainperf.runner.local`` decides)."""
    if "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ):
        return True
    return int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "SLURM_PROCID" in os.environ


def reporting_rank(is_external: bool) -> int:
    """This process's rank (0 when it started the workers itself or measures alone)."""
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) if is_external else 0


def build_request(device: str, nproc_per_node: int | None, quick: bool, iters: int | None, max_bytes: str | None,
                  out: str) -> tuple[dict, int, bool]:
    """(request, processes, external). Raises SpecError on bad input, before anything starts."""
    is_external = external()
    if device != "cpu":
        import torch
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        raise SpecError("--device cuda but no CUDA device is visible; use --device cpu (figures not meaningful)")
    if is_external:
        nproc = int(os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_NTASKS") or 1)
    else:
        nproc = nproc_per_node
        if nproc is None:
            nproc = torch.cuda.device_count() if device == "cuda" else 2
        if nproc < 1:
            raise SpecError(f"--nproc-per-node={nproc}: must be >= 1")
        if device == "cuda" and nproc > torch.cuda.device_count():
            raise SpecError(f"--nproc-per-node {nproc} exceeds the {torch.cuda.device_count()} visible GPUs")
    iters = iters if iters is not None else (3 if device == "cpu" else 10 if quick else 20)
    if iters < 1:
        raise SpecError(f"--iters={iters}: must be >= 1")
    size_cap = None
    if max_bytes is not None:
        size_cap = checks.parse_size(max_bytes)
        if size_cap < 8:
            raise SpecError(f"--max-bytes {max_bytes!r}: must be at least 8 bytes")
    out_dir = Path(out)
    if out_dir.exists() and not out_dir.is_dir():
        raise SpecError(f"--out {out!r} is a file, not a directory")
    req = {"device": device, "quick": bool(quick), "iters": iters,
           "warmup": 1 if device == "cpu" else 3 if quick else 5,
           "sizes": checks.sweep_sizes(quick, device, size_cap),
           "gemm_n": 8192 if device == "cuda" else 128,
           "hbm_bytes": (2**30 if quick else 4 * 2**30) if device == "cuda" else 4 * 2**20}
    return req, nproc, is_external


def new_run_dir(root: Path) -> Path:
    base = root / f"preflight-{time.strftime('%Y%m%d-%H%M%S')}"
    d, k = base, 1
    while True:
        try:
            d.mkdir(parents=True, exist_ok=False)
            return d
        except FileExistsError:
            k += 1
            d = Path(f"{base}-{k}")


def launch_workers(req: dict, nproc: int, run_dir: Path) -> dict:
    """Start ``nproc`` torchrun workers on this host; their raw measurements (WorkersFailed if they fail)."""
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


def run_preflight(req: dict, nproc: int, is_external: bool, out: str, db: str | None, kernels: str,
                  iters: int | None, preset_for: Callable[[dict], tuple], announce: Callable[[Path | None], None]) -> dict:
    """Measure, judge and keep one preflight; its result (preflight.json's content, ``stored_as`` added on
    rank 0). ``preset_for(raw)``: (the GPU preset to judge against or None, where it came from);
    ``announce(run_dir)``: called on rank 0 before measuring. WorkersFailed when the workers fail."""
    rank = reporting_rank(is_external)
    run_dir = None if is_external else new_run_dir(Path(out))
    if rank == 0:
        announce(run_dir)
    if is_external or nproc == 1:
        # the measurements import torch: only in the process that measures
        from trainperf.preflight.measure import measure_all

        raw = measure_all(req)
    else:
        raw = launch_workers(req, nproc, run_dir)
    preset, source = preset_for(raw)
    result = checks.evaluate(raw, preset, source)
    if rank != 0:
        return result
    if run_dir is None:
        run_dir = new_run_dir(Path(out))
    result["out_dir"] = str(run_dir)
    result["result_path"] = str(run_dir / "preflight.json")
    if wants_kernel_table(kernels, req["device"], bool(req["quick"])):
        try:  # a failure here must not lose the checks already measured
            measure_kernel_table_into(result, req["device"], run_dir, iters)
        except Exception as exc:  # noqa: BLE001 -- out of memory, an SDPA backend missing, ...
            result.setdefault("notes", []).append(f"kernel table not measured: {type(exc).__name__}: {exc}")
    (run_dir / "preflight.json").write_text(json.dumps(result, indent=2))
    result["stored_as"] = store_result(result, run_dir.name, db)
    return result


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


def store_result(result: dict, preflight_id: str, db: str | None) -> str | None:
    """Keep the result in the store (one transaction); the JSON in the run dir is written first, so a
    store problem loses nothing."""
    if not db:
        return None
    # the store (and sqlite3) loads only when a preflight is kept
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
