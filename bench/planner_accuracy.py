"""Out-of-sample check of the planner: run layouts it was not fitted on, compare with what it predicted.

Every GPU run stores the planner's prediction made before it started (summary["predicted"]), so this
script only runs the cases and tabulates measured vs predicted step time and peak memory, then the
median / max |error| and the rank correlation of throughput.

    python bench/planner_accuracy.py --out DIR [--only NAME ...] [--gpus 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SHAPES = {
    "7b": [],  # synthetic-lora's default: Llama-2-7B shape
    "3b": ["model.hidden_size=3200", "model.intermediate_size=8640", "model.num_layers=26", "model.num_heads=32",
           "model.num_kv_heads=32"],
    "8b": ["model.vocab_size=128256", "model.hidden_size=4096", "model.intermediate_size=14336", "model.num_layers=32",
           "model.num_heads=32", "model.num_kv_heads=8", "model.rope_theta=500000"],
    "1b": ["model.hidden_size=2048", "model.intermediate_size=5504", "model.num_layers=24", "model.num_heads=16",
           "model.num_kv_heads=16"],
}

# (name, processes, shape, overrides) -- none of these is one of the runs the constants were fitted on
CASES = [
    ("7b-lora-s4096-1gpu", 1, "7b", ["data.seq_len=4096"]),
    ("7b-lora-s8192-selective-1gpu", 1, "7b", ["train.recompute=selective"]),
    ("7b-lora-s2048-mb2-gbs8-1gpu", 1, "7b", ["data.seq_len=2048", "train.micro_batch_size=2", "train.global_batch_size=8"]),
    ("3b-lora-s8192-1gpu", 1, "3b", []),
    ("3b-full-s4096-selective-1gpu", 1, "3b", ["lora.rank=0", "data.seq_len=4096", "train.recompute=selective"]),
    ("7b-full-s4096-full-fsdp2", 2, "7b", ["lora.rank=0", "data.seq_len=4096", "train.recompute=full", "parallel.dp_shard=2"]),
    ("8b-lora-s8192-fsdp2", 2, "8b", ["parallel.dp_shard=2"]),
    ("8b-lora-s8192-tp2sp", 2, "8b", ["parallel.tp=2", "parallel.sp=true", "parallel.dp_shard=1"]),
    ("8b-lora-s8192-cp2-full", 2, "8b", ["parallel.cp=2", "parallel.dp_shard=1", "train.recompute=full"]),
    ("7b-lora-s4096-pp2-gpipe-gbs8", 2, "7b", ["parallel.pp=2", "parallel.pp_schedule=GPipe", "parallel.dp_shard=1",
                                               "data.seq_len=4096", "train.global_batch_size=8"]),
    ("7b-lora-s4096-mb2-ddp", 2, "7b", ["parallel.dp_replicate=2", "parallel.dp_shard=1", "data.seq_len=4096",
                                        "train.micro_batch_size=2", "train.global_batch_size=8"]),
    ("1b-full-s2048-mb4-ddp", 2, "1b", ["lora.rank=0", "parallel.dp_replicate=2", "parallel.dp_shard=1",
                                        "data.seq_len=2048", "train.micro_batch_size=4", "train.global_batch_size=16"]),
]


def spearman(a: list[float], b: list[float]) -> float:
    def ranks(x):
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        for pos, i in enumerate(order):
            r[i] = float(pos)
        return r
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    return cov / (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5


def run_case(case, args, out: Path, gpu: int | None = None) -> dict:
    """One layout as a real `trainperf run`; ``gpu``: pin a one-process case to that GPU."""
    name, nproc, shape, extra = case
    cmd = [sys.executable, "-m", "trainperf", "run", "synthetic-lora", "--nproc-per-node", str(nproc), "--json",
           "--out", str(out / "runs"), "--db", str(out / f"planner{'' if gpu is None else gpu}.db")]
    for o in ["train.seed=1", f"train.max_steps={args.steps}", "train.untimed_warmup_steps=1", *SHAPES[shape], *extra]:
        cmd += ["--set", o]
    env = dict(os.environ, **({} if gpu is None else {"CUDA_VISIBLE_DEVICES": str(gpu)}))
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.per_run_timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"name": name, "error": "timeout"}
    try:
        s = json.loads(p.stdout)
    except json.JSONDecodeError:
        return {"name": name, "error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "no output"}
    if not s.get("step_time_s") or not s.get("predicted"):
        # a short run misses its (synthetic) target by design: that is not an error here
        return {"name": name, "error": s.get("error") or s.get("status_reason"),
                "step_s": s.get("step_time_s"), "peak_gib": s.get("peak_mem_gib")}
    pred = s["predicted"]
    return {"name": name, "gpus": nproc, "wall_s": round(time.time() - t0, 1),
            "step_s": s["step_time_s"], "pred_step_s": pred["step_time_s"],
            "peak_gib": s["peak_mem_gib"], "pred_peak_gib": pred["peak_mem_gib"],
            "tokens_per_s_per_gpu": s["tokens_per_s_per_gpu"], "mfu": s["mfu"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench_runs")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--per-run-timeout", type=int, default=110)
    ap.add_argument("--gpus", type=int, default=1,
                    help="GPUs on this machine: one-process cases run side by side, one per GPU (default 1)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cases = [c for c in CASES if not args.only or c[0] in args.only]
    single = [c for c in cases if c[1] == 1]
    rows = []
    n = max(1, args.gpus)

    def on_gpu(g: int) -> list[dict]:  # GPU g's share of the one-process cases, one after another
        done = []
        for case in single[g::n]:
            done.append(run_case(case, args, out, g if n > 1 else None))
            print(json.dumps(done[-1]), flush=True)
        return done

    with ThreadPoolExecutor(max_workers=n) as pool:  # each thread waits on its GPU's subprocesses
        for done in pool.map(on_gpu, range(n)):
            rows += done
    for case in (c for c in cases if c[1] > 1):
        rows.append(run_case(case, args, out))
        print(json.dumps(rows[-1]), flush=True)
    ok = [r for r in rows if "error" not in r]
    for r in ok:
        r["step_err"] = r["pred_step_s"] / r["step_s"] - 1
        r["mem_err"] = r["pred_peak_gib"] / r["peak_gib"] - 1
    summary = {"cases": rows}
    if ok:
        summary.update({
            "median_abs_step_err": statistics.median(abs(r["step_err"]) for r in ok),
            "max_abs_step_err": max(abs(r["step_err"]) for r in ok),
            "median_abs_mem_err": statistics.median(abs(r["mem_err"]) for r in ok),
            "max_abs_mem_err": max(abs(r["mem_err"]) for r in ok),
        })
        if len(ok) > 2:
            summary["spearman_throughput"] = spearman([r["tokens_per_s_per_gpu"] for r in ok],
                                                      [r["tokens_per_s_per_gpu"] * r["step_s"] / r["pred_step_s"] for r in ok])
    (out / "planner_accuracy.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k != "cases"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
