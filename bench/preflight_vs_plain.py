"""Preflight on this machine's GPUs: does its harness measure what a plain loop measures?

Runs `trainperf preflight --json` (or `python -m trainperf.cli.preflight` where the subcommand is not
mounted), then prints, for the bf16 GEMM, the HBM copy and every collective at the largest size, the
harness time (CUDA events after warm-up and a barrier), the plain time (torch.cuda.synchronize +
time.perf_counter around the same N calls) and harness/plain throughput, which should be >= 0.97; and
the headline figures next to the ones measured by hand on 2 x H200 (plain synchronize + perf_counter loops).

    python bench/preflight_vs_plain.py [--nproc-per-node 2] [--quick] [--out runs] [--save FILE]

Exit 0 if every ratio is >= 0.97, 1 if not, 2 if preflight itself did not produce a result.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

LIMIT = 0.97
# measured by hand on 2 x H200 (NVLink), torch 2.11 + CUDA 13, plain synchronize + perf_counter loops
REFERENCE = {"gemm bf16 TFLOP/s": "781-796", "gemm fp8 TFLOP/s": "1455", "hbm copy TB/s": "4.27",
             "all_reduce busbw 1 GiB": "327", "all_gather busbw 1 GiB": "277", "reduce_scatter busbw 1 GiB": "277",
             "all_to_all busbw 4 GiB": "337", "sendrecv busbw 4 GiB": "365"}


def preflight_cmd() -> list[str]:
    try:
        from trainperf.cli import build_parser

        sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
        if "preflight" in sub.choices:
            return [sys.executable, "-m", "trainperf", "preflight"]
    except Exception:  # noqa: BLE001
        pass
    return [sys.executable, "-m", "trainperf.cli.preflight"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc-per-node", type=int, default=None, help="GPUs (default: every visible GPU)")
    ap.add_argument("--quick", action="store_true", help="preflight --quick (sizes 1 KiB..1 GiB x16)")
    ap.add_argument("--out", default="runs", help="preflight's --out (default ./runs)")
    ap.add_argument("--save", help="also write this script's summary as JSON here")
    args = ap.parse_args()

    cmd = preflight_cmd() + ["--json", "--out", args.out] + (["--quick"] if args.quick else [])
    if args.nproc_per_node:
        cmd += ["--nproc-per-node", str(args.nproc_per_node)]
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    try:
        res = json.loads(p.stdout)
    except json.JSONDecodeError:
        print(f"preflight exited {p.returncode} without a result:\n{p.stderr[-4000:]}", file=sys.stderr)
        return 2
    if "error" in res:
        print(f"preflight: {res['error']}", file=sys.stderr)
        return 2

    gpu = res["ranks"][0].get("device_name")
    print(f"preflight of {res['world_size']} x {gpu} ({res['device']}), exit code {res['exit_code']}, "
          f"{res['summary']}, {res['elapsed_s']:.1f} s of measurement, result {res['result_path']}")
    print(f"torch {res['versions']['torch']}, CUDA {res['versions']['cuda']}, NCCL {res['versions']['nccl']}, "
          f"NCCL env {res.get('nccl_env') or '{}'}")

    print(f"\n{'harness vs plain':34s} {'size':>9s} {'harness ms':>11s} {'plain ms':>11s} {'ratio':>7s}")
    for b in res["baseline"]:
        flag = "" if b["ratio"] >= LIMIT else "   < 0.97"
        per_rank = "  per rank " + " ".join(f"{r:.3f}" for r in b["per_rank"]) if "per_rank" in b else ""
        print(f"{b['check']:34s} {b['size']:>9s} {1e3 * b['harness_s']:11.3f} {1e3 * b['plain_s']:11.3f} "
              f"{b['ratio']:7.3f}{flag}{per_rank}")
    ratios = [b["ratio"] for b in res["baseline"]]

    headline: dict[str, str] = {}
    for dtype in ("bf16", "fp8"):
        v = [g["tflops"] for g in res["gemm"] if g["dtype"] == dtype and not g.get("skipped")]
        if v:
            headline[f"gemm {dtype} TFLOP/s"] = f"{min(v):.0f}-{max(v):.0f}"
    if res["hbm"]:
        headline["hbm copy TB/s"] = " ".join(f"{h['tbps']:.2f}" for h in res["hbm"])
    for c in res["collectives"]:
        if c["group"] == "world" and c["size"] in (2**30, 4 * 2**30):
            headline[f"{c['collective']} busbw {c['size'] // 2**30} GiB"] = f"{c['busbw_gbps']:.0f}"
    for size in (2**30, 4 * 2**30):
        v = [p["busbw_gbps"] for p in res["pairs"] if p["size"] == size]
        if v:
            headline[f"sendrecv busbw {size // 2**30} GiB"] = f"{min(v):.0f}-{max(v):.0f} over {len(v)} pairs"
    print(f"\n{'figure':34s} {'this run':>28s}   reference (2 x H200, by hand)")
    for k, v in headline.items():
        print(f"{k:34s} {v:>28s}   {REFERENCE.get(k, '-')}")
    bad = [r for r in res["checks"] if r["verdict"] in ("warn", "fail")]
    for r in bad:
        print(f"{r['verdict']}: {r['check']} {r['subject']} {r['size']} {r['value']:.4g} {r['unit']} "
              f"({r['pct'] or 0:.0f}% of {r['datasheet']}) {r['note']}")
    print(f"\nmeasured preset fields: {res.get('measured_overrides')}")
    ok = bool(ratios) and min(ratios) >= LIMIT
    print(f"harness/plain: min {min(ratios):.3f}, median {statistics.median(ratios):.3f} over {len(ratios)} checks -- "
          + ("all >= 0.97" if ok else "SOME BELOW 0.97"))
    if args.save:
        Path(args.save).write_text(json.dumps({"baseline": res["baseline"], "headline": headline,
                                               "summary": res["summary"], "exit_code": res["exit_code"],
                                               "measured_overrides": res.get("measured_overrides"),
                                               "result_path": res["result_path"]}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
