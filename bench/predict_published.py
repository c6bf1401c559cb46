"""The planner's prediction, for this engine, of the published MLPerf llama2_70b_lora configurations
(NVIDIA, MLCommons training_results_v4.1, llama2_70b_lora). CPU only.

    python bench/predict_published.py

For each configuration: the published layout and GBS run through the cost model with every recompute
mode; the fastest one that fits is shown, with its predicted time to train (RCP samples at that GBS,
evals included) next to the published score. NVIDIA runs FP8 with fused kernels; trainperf is bf16.
"""

from __future__ import annotations

from trainperf.plan.costs import estimate
from trainperf.plan.hardware import PRESETS
from trainperf.plan.search import rcp_samples, time_to_train
from trainperf.core.layout import resolve_layout
from trainperf.core.resolve import resolve_spec
from trainperf.core.validate import validate_layout
from trainperf.mlperf.recipes import llama2_70b_lora_defaults

CONFIGS = [  # name, gpu, gpus, gpus per node, overrides, published minutes
    ("8xH100 DP2 TP4 SP", "h100", 8, 8, ["parallel.tp=4", "parallel.sp=true"], 27.93),
    ("8xH200 DP4 CP2", "h200", 8, 8, ["parallel.cp=2"], 24.12),
    ("64xH100 DP8 TP4 CP2", "h100", 64, 8, ["parallel.tp=4", "parallel.sp=true", "parallel.cp=2"], 4.57),
    ("1024xH100 DP128 TP4 CP2 (GBS 128)", "h100", 1024, 8,
     ["parallel.tp=4", "parallel.sp=true", "parallel.cp=2", "train.global_batch_size=128", "train.lr=6e-4"], 1.19),
]


def main() -> None:
    print("| configuration | published (NVIDIA, FP8) | trainperf predicted | recompute | step s | GiB/GPU | RCP samples |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for name, gpu_name, gpus, per_node, overrides, published in CONFIGS:
        gpu = PRESETS[gpu_name]
        best = None
        for recompute in ("none", "selective", "full"):
            spec = resolve_spec(llama2_70b_lora_defaults(), None,
                                ["hardware.device=cuda", f"train.recompute={recompute}", *overrides])
            resolve_layout(spec, gpus)
            validate_layout(spec, cuda=True)  # layouts priced for GPUs
            est = estimate(spec, gpu, per_node)
            samples = rcp_samples(spec)
            ttt = time_to_train(spec, est, samples)
            row = (est.fits, -ttt if est.fits else -est.reserved_gib, recompute, est, ttt, samples)
            if best is None or row[:2] > best[:2]:
                best = row
        fits, _, recompute, est, ttt, samples = best
        pred = f"{ttt / 60:.1f} min" if fits else f"does not fit ({est.reserved_gib:.0f} GiB)"
        print(f"| {name} | {published} min | {pred} | {recompute} | {est.step_time_s:.2f} | {est.reserved_gib:.0f} | {samples:.0f} |")


if __name__ == "__main__":
    main()
