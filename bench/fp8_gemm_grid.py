"""Measured float8 GEMM rates on a grid of shapes, on one GPU: the planner's float8 shape table.

The planner prices an engine's float8 projections at its fitted efficiency times how fast cuBLASLt's
tensorwise float8 GEMM runs at each shape against the grid's best (plan/kernels.py, Fp8GemmGrid):
a weight gradient whose reduction runs over 2,048 tokens, or a projection split eight ways, is slower
per FLOP than a large square one. The H200's grid ships as src/trainperf/plan/data/h200_fp8_gemm.json.

    python bench/fp8_gemm_grid.py --out src/trainperf/plan/data/h200_fp8_gemm.json [--iters 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json

import torch

from trainperf.preflight.kernels import measure_fp8_gemm_grid


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="fp8_gemm_grid.json")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    grid = measure_fp8_gemm_grid("cuda" if torch.cuda.is_available() else "cpu", args.iters, rounds=args.rounds)
    with open(args.out, "w") as fh:
        json.dump(grid, fh, indent=1)
    rates = grid["gemm_fp8_tflops"]
    print(json.dumps({"shapes": len(rates), "min_tflops": min(rates.values()), "max_tflops": max(rates.values()),
                      "seconds": grid["seconds"], "out": args.out}))


if __name__ == "__main__":
    main()
