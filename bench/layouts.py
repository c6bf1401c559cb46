"""One model, every 2-GPU layout: tokens/s per GPU, MFU, peak memory and the first losses, side by side.

Each layout is a real `trainperf run synthetic-lora` (random Llama-2-7B-shape weights, random tokens,
LoRA r16 on q/k/v/o, seq 8192, fixed seed so every layout starts from the same weights and batches),
next to the 1-GPU run. The runs end as 'failed' by design (the probe has no reachable target).

    python bench/layouts.py [--steps 20] [--gbs 4] [--only 1gpu,ddp,fsdp,tp_sp,cp,pp] [--db FILE] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import time

from common import append_json_line

LAYOUTS = {  # name: (GPUs, overrides)
    "1gpu": (1, ["parallel.dp_shard=1"]),
    "ddp": (2, ["parallel.dp_replicate=2", "parallel.dp_shard=1"]),
    "fsdp": (2, ["parallel.dp_shard=2"]),
    "tp_sp": (2, ["parallel.tp=2", "parallel.sp=true", "parallel.dp_shard=1"]),
    "cp": (2, ["parallel.cp=2", "parallel.dp_shard=1"]),
    "pp": (2, ["parallel.pp=2", "parallel.pp_schedule=1F1B", "parallel.dp_shard=1"]),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--gbs", type=int, default=4)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--only", default=",".join(LAYOUTS))
    ap.add_argument("--db", default="bench-layouts.db")
    ap.add_argument("--out", default="runs")
    ap.add_argument("--json", help="append one JSON line per layout to this file")
    ap.add_argument("--set", dest="extra", action="append", default=[], help="extra trainperf --set overrides")
    args = ap.parse_args()
    rows = []
    for name in args.only.split(","):
        gpus, overrides = LAYOUTS[name]
        sets = [*overrides, f"train.max_steps={args.steps}", f"train.global_batch_size={args.gbs}",
                f"data.seq_len={args.seq}", "train.seed=1", "train.log_every=1", *args.extra]
        cmd = [sys.executable, "-m", "trainperf", "run", "synthetic-lora", "--nproc-per-node", str(gpus), "--json",
               "--db", args.db, "--out", args.out] + [x for s in sets for x in ("--set", s)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode not in (0, 1):
            print(f"{name}: exit {proc.returncode}\n{proc.stderr[-3000:]}", flush=True)
            continue
        s = json.loads(proc.stdout)
        with sqlite3.connect(args.db) as c:
            losses = [r[0] for r in c.execute("SELECT loss FROM steps WHERE run_id = ? ORDER BY step LIMIT 3", (s["run_id"],))]
        row = {"layout": name, "gpus": gpus, "spec": s["layout"], "tokens_per_s_per_gpu": s["tokens_per_s_per_gpu"],
               "mfu": s["mfu"], "peak_mem_gib": s["peak_mem_gib"], "first_losses": losses,
               "wall_s": wall, "run_id": s["run_id"], "date": time.strftime("%Y-%m-%d")}
        rows.append(row)
        print(f"{name:6s} {gpus} GPU  {row['tokens_per_s_per_gpu']:>9,.0f} tok/s/GPU  MFU {100 * (row['mfu'] or 0):5.1f}%  "
              f"peak {row['peak_mem_gib']:6.1f} GiB  losses {[round(x, 4) for x in losses]}  ({wall:.0f} s)", flush=True)
        append_json_line(args.json, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
