"""The llama2_70b_lora closed recipe on a Llama-2-70B-shape model, a few steps, next to NVIDIA's
published figure.

Random weights are materialised shard by shard on the GPUs (no checkpoint on disk); data are
fabricated 8192-token rows (173 validation rows, as in GovReport), so the run is open division and
cannot reach the target -- it measures throughput, memory and one full eval pass, nothing else. Every
recipe value (r16/alpha32/dropout 0.1 on qkv_proj+o_proj, GBS 8, seq 8192, AdamW, clip 0.3) is the
closed one.

    python bench/mlperf_lora_70b.py --nproc 2 --steps 3 [--set parallel.tp=2 ...]

Prints samples/s per GPU, MFU, peak GiB, eval-pass seconds and the ratio to NVIDIA's v4.1 8xH200
result (2.47 samples/s for 8 GPUs, FP8, NeMo; MLCommons training_results_v4.1, NVIDIA, DGX H200,
llama2_70b_lora).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from trainperf.report.projection import eval_pass_seconds

NVIDIA_8XH200_SAMPLES_PER_S = 2.47  # v4.1 h200_ngc24.09_nemo result_0.txt tracked_stats.throughput


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default="bench_runs")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    gbs = 8
    cmd = [sys.executable, "-m", "trainperf", "run", "llama2_70b_lora", "--nproc-per-node", str(args.nproc), "--json",
           "--out", args.out, "--db", str(Path(args.out) / "bench.db"),
           "--set", "mlperf.division=open", "--set", f"train.max_steps={args.steps}",
           "--set", f"eval.every_samples={gbs * args.steps}", "--set", "eval.skip_first=0",
           "--set", "data.train_samples=64", "--set", "data.eval_samples=173", "--set", "train.untimed_warmup_steps=1"]
    for o in args.overrides:
        cmd += ["--set", o]
    out = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(out.stderr[-4000:])
    if out.returncode not in (0, 1):
        print(out.stdout[-4000:])
        return out.returncode
    s = json.loads(out.stdout)
    if not s.get("step_time_s"):  # the run died before a timed step (OOM, a compile error): say so, no traceback
        print(json.dumps({"status": s.get("status"), "status_reason": s.get("status_reason"), "run_id": s.get("run_id"),
                          "predicted": s.get("predicted")}, indent=2))
        return 1
    samples_per_s = gbs / s["step_time_s"]
    per_gpu = samples_per_s / s["world_size"]
    nvidia_per_gpu = NVIDIA_8XH200_SAMPLES_PER_S / 8
    evals, _ = eval_pass_seconds(s["mllog"])
    result = {"layout": s["layout"], "gpus": s["world_size"], "step_time_s": s["step_time_s"],
              "samples_per_s": samples_per_s, "samples_per_s_per_gpu": per_gpu, "tokens_per_s_per_gpu": s["tokens_per_s_per_gpu"],
              "mfu": s["mfu"], "peak_mem_gib": s["peak_mem_gib"], "eval_pass_s": evals,
              "activation_offload_gib_per_step": s.get("activation_offload_gib_per_step"),
              "peak_reserved_gib": s.get("peak_reserved_gib"), "cuda_alloc_retries": s.get("cuda_alloc_retries"),
              "cuda_alloc_conf": s.get("cuda_alloc_conf"),
              "pinned_host_gib": s.get("pinned_host_gib"),
              "nvidia_8xh200_samples_per_s_per_gpu": nvidia_per_gpu, "ratio_to_nvidia_per_gpu": per_gpu / nvidia_per_gpu,
              "predicted": s.get("predicted"), "status": s["status"], "run_id": s["run_id"]}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
