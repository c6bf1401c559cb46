"""Measured bf16 GEMM and attention rates for the shapes our models run, on one GPU.

The planner's kernel table (src/trainperf/plan/kernels.py; the H200's ships as
src/trainperf/plan/data/h200_kernels.json). `trainperf preflight` measures the same table on a GPU
machine and hands it to `plan`; this script writes it on its own. With FlashAttention-4 installed the
table also holds its attention rates (hardware.attention=flash4).

    python bench/kernel_rates.py --out kernel_rates.json [--iters 10]
"""

from __future__ import annotations

import argparse
import json

import torch

from trainperf.preflight.kernels import measure_kernel_table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="kernel_rates.json")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--queue-ahead", action="store_true",
                    help="time each call behind ~5 ms of queued GPU work: the kernels' own rates, without "
                         "launch costs (the planner's constants were fitted without this)")
    args = ap.parse_args()
    table = measure_kernel_table("cuda" if torch.cuda.is_available() else "cpu", args.iters,
                                 queue_ahead=args.queue_ahead)
    with open(args.out, "w") as fh:
        json.dump(table, fh, indent=1)
    print(json.dumps({"gemm_shapes": len(table["gemm_tflops"]), "attention": table["attention_tflops_fwd_bwd"],
                      "attention_flash4": table.get("attention_flash4_tflops_fwd_bwd", "not installed"),
                      "seconds": table["seconds"], "out": args.out}))


if __name__ == "__main__":
    main()
