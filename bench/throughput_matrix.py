"""The grid of side-by-side benchmarks: shapes x sequence lengths x recompute, one process per
cell, the cells spread over the visible GPUs (one cell per GPU at a time, each on its share of the CPU
cores), results as JSON lines and a Markdown table.

    python bench/throughput_matrix.py lora --shapes 1b,7b,13b --seqs 4096,8192 --recompute none,full \
        --compile --out lora.jsonl --deadline-s 540
    python bench/throughput_matrix.py pretrain ... --out pretrain.jsonl
    python bench/throughput_matrix.py table lora.jsonl pretrain.jsonl      # the table alone

`lora` runs bench/lora_throughput.py (trainperf vs Hugging Face + PEFT), `pretrain` runs
bench/pretrain_throughput.py (trainperf vs an eager Hugging Face baseline). A cell that would start
after --deadline-s is listed as not run; one that overruns its share is killed and listed as such.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = {"lora": HERE / "lora_throughput.py", "pretrain": HERE / "pretrain_throughput.py"}
BASELINE = {"lora": "hf_peft", "pretrain": "eager"}
SIZE_ORDER = {"13b": 0, "7b": 1, "1b": 2}  # biggest first: the long cells do not end up last on one GPU


def cells(shapes: list[str], seqs: list[int], recomputes: list[str]) -> list[tuple[str, int, str]]:
    grid = itertools.product(shapes, seqs, recomputes)
    return sorted(grid, key=lambda c: (SIZE_ORDER.get(c[0], 3), -c[1], c[2]))


def cpu_share(slot: int, slots: int) -> set[int]:
    """The CPU cores of one GPU's cell: an even share, so that one cell's compile workers do not slow
    the host-bound steps of the cell being timed on the other GPU (a 1B step is ~0.1-0.2 s)."""
    cores = sorted(os.sched_getaffinity(0))
    per = max(1, len(cores) // slots)
    return set(cores[slot * per:(slot + 1) * per]) or set(cores)


def run_grid(kind: str, grid, gpus: list[str], out: Path, extra: list[str], deadline_s: float, cell_timeout_s: float) -> list[str]:
    """Run every cell, one per GPU at a time; returns the cells that were not run or did not finish."""
    t0, pending, running, missed = time.monotonic(), list(grid), {}, []
    while pending or running:
        for gpu in [g for g in gpus if g not in running]:
            if not pending:
                break
            shape, seq, recompute = pending.pop(0)
            left = deadline_s - (time.monotonic() - t0)
            if left < 30:
                missed.append(f"{shape} seq {seq} recompute {recompute}: not run (deadline)")
                continue
            cmd = [sys.executable, str(SCRIPTS[kind]), "--shape", shape, "--seq", str(seq), "--recompute", recompute,
                   "--json", str(out), *extra]
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu)
            cores = cpu_share(gpus.index(gpu), len(gpus))
            # the cell's output goes to a file (a pipe read only at the end would block a chatty cell), in
            # a process group of its own (setsid) so that a kill takes its compile workers too
            log = tempfile.TemporaryFile(mode="w+")
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
                                    preexec_fn=lambda cores=cores: (os.setsid(), os.sched_setaffinity(0, cores)))
            running[gpu] = (proc, log, (shape, seq, recompute), time.monotonic() + min(cell_timeout_s, left))
        time.sleep(1)
        for gpu, (proc, log, cell, until) in list(running.items()):
            if proc.poll() is None and time.monotonic() < until:
                continue
            killed = proc.poll() is None
            if killed:
                os.killpg(proc.pid, signal.SIGKILL)
                missed.append(f"{cell[0]} seq {cell[1]} recompute {cell[2]}: killed after its time share")
            proc.wait()
            log.seek(0)
            text = log.read()
            log.close()
            print(f"--- {kind} {cell} on GPU {gpu}, rc={proc.returncode}, t={time.monotonic() - t0:.0f}s", flush=True)
            print("\n".join(line for line in text.splitlines()  # the scripts' result lines and any error
                            if line.startswith(("trainperf ", "hf_peft ", "eager ", "ratio ")) or "Error" in line),
                  flush=True)
            if proc.returncode != 0 and not killed:
                missed.append(f"{cell[0]} seq {cell[1]} recompute {cell[2]}: exit {proc.returncode}")
            del running[gpu]
    return missed


def _side(r: dict) -> str:
    if "oom" in r:
        return "does not fit"
    return f"{r['tokens_per_s']:,.0f} / {100 * (r.get('mfu') or 0):.1f}% / {r['peak_gib']:.1f}"


def table(paths: list[str]) -> str:
    """Markdown rows, one per cell: ours and the baseline (tokens/s / MFU / peak GiB) and the ratio."""
    rows = ["| bench | shape | seq | recompute (ours / baseline) | trainperf tok/s / MFU / GiB | baseline tok/s / MFU / GiB | ratio |",
            "|---|---|---:|---|---:|---:|---:|"]
    results = [json.loads(line) for path in paths for line in Path(path).read_text().splitlines() if line.strip()]
    results.sort(key=lambda r: (r.get("bench", "pretrain" if "eager" in r else "lora") == "pretrain", SIZE_ORDER.get(r["shape"], 3) * -1, r["seq"], r["recompute"]))
    for r in results:
        kind = r.get("bench") or ("pretrain" if "eager" in r else "lora")
        base = r.get(BASELINE[kind], {})
        ours = r["trainperf"]
        recompute = f"{ours.get('recompute', r['recompute'])} / {base.get('recompute', r['recompute'])}" if base else r["recompute"]
        ratio = f"{r['ratio']:.2f}x" if "ratio" in r else "-"
        rows.append(f"| {kind} | {r['shape']} | {r['seq']} | {recompute} | {_side(ours)} | "
                    f"{_side(base) if base else 'not run'} | {ratio} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=["lora", "pretrain", "table"])
    ap.add_argument("files", nargs="*", help="for `table`: the JSON-lines files to render")
    ap.add_argument("--shapes", default="1b,7b,13b")
    ap.add_argument("--seqs", default="4096,8192")
    ap.add_argument("--recompute", default="none,full")
    ap.add_argument("--gpus", default=os.environ.get("CUDA_VISIBLE_DEVICES", "0"),
                    help="comma-separated GPU indices to spread the cells over")
    ap.add_argument("--out", help="JSON-lines file the cells append to")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--deadline-s", type=float, default=1e9, help="start no cell after this many seconds")
    ap.add_argument("--cell-timeout-s", type=float, default=300)
    args = ap.parse_args()
    if args.kind == "table":
        print(table(args.files))
        return 0
    if not args.out:
        ap.error("--out FILE is needed to run a grid")
    grid = cells(args.shapes.split(","), [int(s) for s in args.seqs.split(",")], args.recompute.split(","))
    extra = ["--steps", str(args.steps), "--warmup", str(args.warmup)] + (["--compile"] if args.compile else [])
    missed = run_grid(args.kind, grid, args.gpus.split(","), Path(args.out), extra, args.deadline_s, args.cell_timeout_s)
    if Path(args.out).exists():
        print(table([args.out]))
    for m in missed:
        print(f"not measured: {m}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
