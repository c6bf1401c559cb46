"""The llama2_70b_lora closed recipe on a Llama-2-70B-shape model, a few steps, next to NVIDIA's
published figure.

Random weights are materialised shard by shard on the GPUs (no checkpoint on disk); data are
fabricated 8192-token rows (173 validation rows, as in GovReport), so the run is open division and
cannot reach the target -- it measures throughput, memory and one full eval pass, nothing else. Every
recipe value (r16/alpha32/dropout 0.1 on qkv_proj+o_proj, GBS 8, seq 8192, AdamW, clip 0.3) is the
closed one.

    python bench/mlperf_lora_70b.py --nproc 2 --steps 3 [--set parallel.tp=2 ...]
    python bench/mlperf_lora_70b.py --nproc 1 --plan --set hardware.fp8=tensorwise ...   # the layout from `plan`

With ``--plan`` the layout (recompute and offload mix, micro-batch) is the one `trainperf plan` ranks
first for these settings on ``--nproc`` GPUs, run with ``--layout-from-plan``; if that run dies before
a timed step (out of memory), the next ``--headroom`` is planned and run.

Prints samples/s per GPU, MFU, peak GiB, eval-pass seconds and the ratio to NVIDIA's v4.1 8xH200
result (2.47 samples/s for 8 GPUs, FP8, NeMo; MLCommons training_results_v4.1, NVIDIA, DGX H200,
llama2_70b_lora).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

if __package__:  # imported as bench.mlperf_lora_70b
    from .common import append_json_line
else:  # run as a script: python bench/mlperf_lora_70b.py
    from common import append_json_line
from trainperf.report.projection import eval_pass_seconds

NVIDIA_8XH200_SAMPLES_PER_S = 2.47  # v4.1 h200_ngc24.09_nemo result_0.txt tracked_stats.throughput


def plan_layout(nproc: int, overrides: list[str], db: str, headroom: float, gpu: str | None) -> dict:
    """`trainperf plan`'s fastest layout of the recipe with these settings on ``nproc`` GPUs that leaves
    ``headroom`` of the memory free: its row of ``plan --json`` (id, set line, step time, memory), or
    {"error": ...} when the planner refuses the settings or nothing fits."""
    cmd = [sys.executable, "-m", "trainperf", "plan", "llama2_70b_lora", "--gpus", str(nproc), "--json", "--top", "3",
           "--db", db, "--memory-headroom", str(headroom), "--set", "mlperf.division=open"]
    cmd += ["--gpu", gpu] if gpu else []
    for o in overrides:
        cmd += ["--set", o]
    out = subprocess.run(cmd, capture_output=True, text=True)
    try:
        answer = json.loads(out.stdout)
    except json.JSONDecodeError:
        return {"error": (out.stderr.strip().splitlines() or [f"plan exited {out.returncode}"])[-1]}
    if "error" in answer:  # bad settings: plan's own one-line error
        return {"error": answer["error"]}
    ranked = answer.get("ranked") or []
    if not ranked:
        return {"error": f"no layout fits {nproc} GPU(s) with {headroom:.0%} of the memory free"}
    return dict(ranked[0], headroom=headroom)


def run_recipe(args, overrides: list[str], plan_id: str | None) -> tuple[int, dict]:
    """One `trainperf run llama2_70b_lora` of ``args.steps`` timed steps: (exit code, its figures), the
    figures {"status", "status_reason", ...} only when it died before a timed step."""
    gbs = 8
    cmd = [sys.executable, "-m", "trainperf", "run", "llama2_70b_lora", "--nproc-per-node", str(args.nproc), "--json",
           "--out", args.out, "--db", str(Path(args.out) / "bench.db"),
           "--set", "mlperf.division=open", "--set", f"train.max_steps={args.steps}",
           "--set", f"eval.every_samples={gbs * args.steps}", "--set", "eval.skip_first=0",
           "--set", "data.train_samples=64", "--set", "data.eval_samples=173", "--set", "train.untimed_warmup_steps=1"]
    cmd += ["--layout-from-plan", plan_id] if plan_id else []
    for o in overrides:
        cmd += ["--set", o]
    out = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(out.stderr[-4000:])
    if out.returncode not in (0, 1):
        print(out.stdout[-4000:])
        return out.returncode, {}
    s = json.loads(out.stdout)
    if not s.get("step_time_s"):  # the run died before a timed step (OOM, a compile error): say so, no traceback
        return 1, {"status": s.get("status"), "status_reason": s.get("status_reason"), "run_id": s.get("run_id"),
                   "predicted": s.get("predicted")}
    samples_per_s = gbs / s["step_time_s"]
    per_gpu = samples_per_s / s["world_size"]
    nvidia_per_gpu = NVIDIA_8XH200_SAMPLES_PER_S / 8
    evals, _ = eval_pass_seconds(s["mllog"])
    return 0, {"layout": s["layout"], "gpus": s["world_size"], "step_time_s": s["step_time_s"],
               "samples_per_s": samples_per_s, "samples_per_s_per_gpu": per_gpu,
               "tokens_per_s_per_gpu": s["tokens_per_s_per_gpu"],
               "mfu": s["mfu"], "peak_mem_gib": s["peak_mem_gib"], "eval_pass_s": evals,
               "activation_offload_gib_per_step": s.get("activation_offload_gib_per_step"),
               "peak_reserved_gib": s.get("peak_reserved_gib"), "cuda_alloc_retries": s.get("cuda_alloc_retries"),
               "cuda_alloc_conf": s.get("cuda_alloc_conf"),
               "pinned_host_gib": s.get("pinned_host_gib"),
               "nvidia_8xh200_samples_per_s_per_gpu": nvidia_per_gpu, "ratio_to_nvidia_per_gpu": per_gpu / nvidia_per_gpu,
               "predicted": s.get("predicted"), "status": s["status"], "run_id": s["run_id"], "wall_s": s.get("wall_s")}


def run_planned(args) -> tuple[int, dict]:
    """Plan, then run the planned layout; on a run that dies before a timed step, plan again with the
    next headroom. Returns the last run's exit code and figures, with the plan row they ran under."""
    Path(args.out).mkdir(parents=True, exist_ok=True)
    code, result = 1, {}
    for headroom in args.headroom:
        plan = plan_layout(args.nproc, args.overrides, str(Path(args.out) / "bench.db"), headroom, args.gpu)
        if "error" in plan:
            print(json.dumps({"plan": plan}), flush=True)
            return 2, {"plan": plan}
        print(f"plan {plan['id']} ({headroom:.0%} headroom): {plan['set']} -- predicted {plan['step_time_s']:.2f} s, "
              f"{plan['memory_gib']:.1f} GiB", flush=True)
        code, result = run_recipe(args, args.overrides, plan["id"])
        result["plan"] = {k: plan[k] for k in ("id", "set", "step_time_s", "memory_gib", "headroom", "time", "memory")
                          if k in plan}
        if code == 0:
            break
        print(json.dumps(result), flush=True)
    return code, result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default="bench_runs")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--plan", action="store_true", help="run the layout `trainperf plan` ranks first (--layout-from-plan)")
    ap.add_argument("--headroom", default="0.08",
                    help="--plan: memory headrooms to plan with, comma-separated, each tried after the one before "
                         "died before a timed step (default 0.08, plan's own)")
    ap.add_argument("--gpu", help="--plan: the GPU preset to plan for (default: the one plan detects)")
    ap.add_argument("--json", help="append the result as one JSON line to this file")
    args = ap.parse_args()
    try:
        args.headroom = [float(h) for h in args.headroom.split(",")]
    except ValueError:
        ap.error(f"--headroom {args.headroom!r}: give fractions in [0, 0.5), comma-separated, e.g. 0.08,0.15")
    if not all(0 <= h < 0.5 for h in args.headroom):
        ap.error(f"--headroom {args.headroom}: each must be in [0, 0.5)")
    code, result = run_planned(args) if args.plan else run_recipe(args, args.overrides, None)
    if result:
        result.update(sets=args.overrides, nproc=args.nproc, date=time.strftime("%Y-%m-%d"))
        print(json.dumps(result, indent=2))
        append_json_line(args.json, result)
    return code


if __name__ == "__main__":
    sys.exit(main())
