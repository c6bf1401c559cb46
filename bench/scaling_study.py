"""The 1 -> 2 -> 4 -> 8 GPU scaling study of the llama2_70b_lora closed recipe on one host,
in as few GPU jobs as possible; resumable through its store.

    python bench/scaling_study.py --gpus 8 --db D/scaling.db --out D [--phase preflight|runs|report|all]
                                  [--steps 4] [--deadline-s 540]

* preflight: `trainperf preflight --nproc-per-node GPUS` into the same store (GEMM per GPU, collectives
  on 2, 4, ... GPUs as the harness groups them).
* runs: for every GPU count 2, 4, ... up to GPUS (1 GPU cannot hold the 70B base: `plan` says so and the
  study prints it), the layout `trainperf plan llama2_70b_lora --gpus N` ranks first, and on 8 GPUs also
  the two layouts NVIDIA published for 8 GPUs (DP2 x TP4 + SP, DP4 x CP2); each a few steps of the
  closed recipe's values on a 70B-shape model with random weights (open division, throughput only, no
  eval), compiled per layer (plan ranks under compile too) except context-parallel layouts, which run
  eager (compile + CP is refused on torch 2.11). A layout already measured in the store is not run again.
* report: `trainperf report --db ... --html D/scaling.html`: the projected time-to-train table (measured
  samples/s x the RCP's samples to converge + the recipe's evals), speedup and efficiency.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

WORKLOAD = "llama2_70b_lora"
NVIDIA_8GPU = {"DP2xTP4+SP": ["parallel.tp=4", "parallel.sp=true", "parallel.dp_shard=2"],
               "DP4xCP2": ["parallel.cp=2", "parallel.dp_shard=4"]}
THROUGHPUT = ["mlperf.division=open", "data.train_samples=64", "data.eval_samples=173",
              "eval.every_samples=1000000000", "train.untimed_warmup_steps=1"]
# per-layer compile is the engine's fastest path (70B bf16 2 x H200: 0.178 samples/s/GPU compiled);
# context parallel runs eager (compile + CP is refused on torch 2.11, core/validate.py)
COMPILED = ["train.compile=true"]


def compiled_unless_cp(sets: list[str]) -> list[str]:
    cp = next((int(s.split("=", 1)[1]) for s in sets if s.startswith("parallel.cp=")), 1)
    return sets if cp > 1 else COMPILED + sets


def trainperf(*args: str, timeout: float | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainperf", *args], capture_output=True, text=True, timeout=timeout)


def planned_first(gpus: int) -> tuple[list[str] | None, str]:
    out = trainperf("plan", WORKLOAD, "--gpus", str(gpus), "--gpus-per-node", str(max(gpus, 1)), "--top", "1", "--json",
                    *[a for s in COMPILED for a in ("--set", s)])
    try:
        plan = json.loads(out.stdout)
    except json.JSONDecodeError:
        return None, out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "plan failed"
    if not plan.get("ranked"):
        nf = plan.get("not_fitting") or []
        return None, f"no layout fits on {gpus} GPU(s) ({nf} considered)"
    best = plan["ranked"][0]
    return best["set"].replace("--set ", "").split(), best["id"]


def layout_of(gpus: int, sets: list[str]) -> str:
    from trainperf.core.layout import layout_string
    from trainperf.core.layout import resolve_layout
    from trainperf.core.resolve import resolve_spec
    from trainperf.workloads import get_workload

    spec = resolve_spec(get_workload(WORKLOAD).defaults(), None, THROUGHPUT + sets)
    resolve_layout(spec, gpus)
    return layout_string(spec.parallel)


def measured_layouts(db: str) -> set[tuple[int, str]]:
    if not Path(db).exists():
        return set()
    with sqlite3.connect(db) as con:
        try:
            return {(n, lay) for n, lay in con.execute(
                "SELECT world_size, layout FROM runs WHERE workload = ? AND step_time_s IS NOT NULL", (WORKLOAD,))}
        except sqlite3.OperationalError:
            return set()


def phase_runs(args) -> None:
    t0 = time.perf_counter()
    counts = [n for n in (1, 2, 4, 8) if n <= args.gpus]
    todo: list[tuple[int, str, list[str]]] = []
    for n in counts:
        sets, why = planned_first(n)
        if sets is None:
            print(f"{n} GPU(s): {why} -- not run", flush=True)
            continue
        todo.append((n, f"plan {why}", compiled_unless_cp(sets)))
        if n == 8:
            todo += [(8, f"NVIDIA {name}", compiled_unless_cp(s)) for name, s in NVIDIA_8GPU.items()]
    for n, label, sets in todo:
        if time.perf_counter() - t0 > args.deadline_s:
            print(f"deadline: {label} on {n} GPUs not started", flush=True)
            continue
        if (n, layout_of(n, sets)) in measured_layouts(args.db):
            print(f"{n} GPUs {label}: already measured in {args.db}", flush=True)
            continue
        cmd = ["run", WORKLOAD, "--nproc-per-node", str(n), "--json", "--db", args.db, "--out", args.out,
               "--set", f"train.max_steps={args.steps}"]
        for s in THROUGHPUT + sets:
            cmd += ["--set", s]
        proc = trainperf(*cmd)
        try:
            s = json.loads(proc.stdout)
        except json.JSONDecodeError:
            s = {"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
        if s.get("step_time_s"):
            gbs = 8
            print(f"{n} GPUs {label} [{s['layout']}]: {s['step_time_s']:.2f} s/step, "
                  f"{gbs / s['step_time_s'] / n:.3f} samples/s/GPU, MFU {100 * (s.get('mfu') or 0):.1f}%, "
                  f"{s.get('peak_mem_gib', 0):.1f} GiB (predicted {s.get('predicted', {}).get('step_time_s', 0):.2f} s, "
                  f"{s.get('predicted', {}).get('peak_mem_gib', 0):.1f} GiB)", flush=True)
        else:
            print(f"{n} GPUs {label}: {s.get('error') or s.get('status_reason')}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--db", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--phase", choices=["preflight", "runs", "report", "all"], default="all")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--deadline-s", type=float, default=540, help="start no run after this many seconds")
    args = ap.parse_args()
    if args.phase in ("preflight", "all"):
        p = trainperf("preflight", "--nproc-per-node", str(args.gpus), "--db", args.db)
        print(p.stdout[-6000:] or p.stderr[-2000:], flush=True)
    if args.phase in ("runs", "all"):
        phase_runs(args)
    if args.phase in ("report", "all"):
        r = trainperf("report", "--db", args.db, "--workload", WORKLOAD, "--html", str(Path(args.out) / "scaling.html"))
        print(r.stdout[-8000:] or r.stderr[-2000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
