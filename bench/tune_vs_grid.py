"""`trainperf tune` against the full grid it searches: does the tuner find the best layout, how much
trial time does it spend doing so, and how far is the workload's default layout from the best?

Three phases, each resumable through one state file (so a device call that runs out of time loses
nothing; run the same phase again and it carries on):

    python bench/tune_vs_grid.py grid  --state S.json [--gpus 2] [--grid-steps 10] [--deadline-s 560]
    python bench/tune_vs_grid.py tune  --state S.json [--gpus 2] [--budget-minutes 30]
    python bench/tune_vs_grid.py score --state S.json

``grid`` runs every layout `trainperf plan` enumerates as fitting (plus the workload's default layout,
no --set at all), each exactly as a tune trial runs (the same `trainperf run` command, see
runner/tune.py: trial_command) but for ``--grid-steps`` steps, and records step time, peak memory, the
planner's prediction and the trial's wall time. ``tune`` runs the real `trainperf tune --json` with
its defaults, timed. ``score`` prints the goal's three figures: the tuner's winner against the grid's
best (measured in the grid), the tuner's trial time against the grid's, and the default layout's
step time against the best -- plus the planner's rank correlation and errors over the whole grid.

The default problem is the llama2_70b_lora recipe (open division: random weights, fabricated rows) on
a 1B Llama-2-like shape at seq 4096, GBS 2, so that 33 layouts fit and a trial takes seconds;
change it with --set (the same overrides go to the grid, the default layout and tune).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

WORKLOAD = "llama2_70b_lora"
PROBLEM = ["mlperf.division=open", "model.hidden_size=2048", "model.intermediate_size=5504", "model.num_layers=24",
           "model.num_heads=16", "model.num_kv_heads=16", "data.seq_len=4096", "train.global_batch_size=2"]
DEFAULT_ID = "default"


def load(state: Path) -> dict:
    return json.loads(state.read_text()) if state.exists() else {"grid": {}, "tune": None}


def save(state: Path, data: dict) -> None:
    tmp = state.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(state)  # never a half-written state file


def planned(gpus: int, extra: list[str]):
    from trainperf.plan.hardware import load_gpu
    from trainperf.plan.search import DEFAULT_MEMORY_HEADROOM, plan
    from trainperf.core.resolve import resolve_spec
    from trainperf.workloads import get_workload

    base = resolve_spec(get_workload(WORKLOAD).defaults(), None, extra)
    fits, _ = plan(base, load_gpu("h200"), gpus, gpus, objective="throughput", headroom=DEFAULT_MEMORY_HEADROOM)  # as tune
    return fits


def phase_grid(args, extra: list[str]) -> None:
    from types import SimpleNamespace

    from trainperf.runner.tune import run_trial

    state = load(args.state)
    fits = planned(args.gpus, extra)
    todo = [SimpleNamespace(id=DEFAULT_ID, set_line="", est=None)] + fits
    t_start = time.perf_counter()
    for cand in todo:
        key = cand.set_line or DEFAULT_ID
        if key in state["grid"]:
            continue
        if time.perf_counter() - t_start > args.deadline_s:
            print(f"deadline: {sum(1 for c in todo if (c.set_line or DEFAULT_ID) not in state['grid'])} layouts left",
                  flush=True)
            break
        trial = run_trial(WORKLOAD, args.gpus, cand, args.grid_steps, args.db, args.out, extra, args.trial_timeout_s)
        s = trial.summary
        state["grid"][key] = {
            "id": cand.id, "set": cand.set_line, "step_time_s": trial.step_time_s, "wall_s": trial.wall_s,
            "peak_mem_gib": s.get("peak_mem_gib"), "mfu": s.get("mfu"), "error": trial.error,
            "predicted_step_time_s": cand.est.step_time_s if cand.est else (s.get("predicted") or {}).get("step_time_s"),
            "predicted_peak_gib": cand.est.allocated_gib if cand.est else (s.get("predicted") or {}).get("peak_mem_gib"),
        }
        save(args.state, state)
        print(f"{cand.id:>10s} {trial.wall_s:6.1f} s  " + (f"{trial.step_time_s:.4f} s/step" if trial.step_time_s
              else f"error: {trial.error}"), flush=True)


def phase_tune(args, extra: list[str]) -> None:
    state = load(args.state)
    cmd = [sys.executable, "-m", "trainperf", "tune", WORKLOAD, "--gpus", str(args.gpus), "--json", "--db", args.db,
           "--out", args.out, "--budget-minutes", str(args.budget_minutes), *[x for s in extra for x in ("--set", s)]]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    print(proc.stderr[-3000:], flush=True)
    try:
        res = json.loads(proc.stdout)
    except json.JSONDecodeError:
        res = {"error": proc.stdout[-2000:]}
    res["command_wall_s"] = wall
    state["tune"] = res
    save(args.state, state)


def spearman(a: list[float], b: list[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


def phase_score(args) -> dict:
    state = load(args.state)
    grid = state["grid"]
    ok = {k: v for k, v in grid.items() if v["step_time_s"]}
    best_key = min((k for k in ok if k != DEFAULT_ID), key=lambda k: ok[k]["step_time_s"])
    best = ok[best_key]["step_time_s"]
    grid_trial_s = sum(v["wall_s"] for k, v in grid.items() if k != DEFAULT_ID)
    out = {"layouts": len([k for k in grid if k != DEFAULT_ID]), "finished": len([k for k in ok if k != DEFAULT_ID]),
           "grid_best": {"id": ok[best_key]["id"], "set": best_key, "step_time_s": best},
           "grid_trial_s": grid_trial_s}
    if DEFAULT_ID in ok:
        out["default_step_time_s"] = ok[DEFAULT_ID]["step_time_s"]
        out["best_vs_default_speedup"] = ok[DEFAULT_ID]["step_time_s"] / best
    preds = [(v["predicted_step_time_s"], v["step_time_s"], v["predicted_peak_gib"], v["peak_mem_gib"])
             for k, v in ok.items() if k != DEFAULT_ID and v["predicted_step_time_s"]]
    if len(preds) >= 3:
        step_err = [100 * (p / m - 1) for p, m, _, _ in preds]
        mem_err = [100 * (p / m - 1) for _, _, p, m in preds if p and m]
        out["planner"] = {"spearman_throughput": spearman([1 / p for p, *_ in preds], [1 / m for _, m, *_ in preds]),
                          "median_abs_step_err_pct": statistics.median(abs(e) for e in step_err),
                          "max_abs_step_err_pct": max(abs(e) for e in step_err),
                          "median_abs_mem_err_pct": statistics.median(abs(e) for e in mem_err) if mem_err else None,
                          "oom_predicted_fit": sum(1 for v in grid.values() if v["error"] and "memory" in v["error"].lower())}
    tune = state.get("tune") or {}
    if tune.get("winner"):
        won = next(t for t in tune["trials"] if t["id"] == tune["winner"])
        in_grid = grid.get(won["set"])
        out["tune"] = {"winner": tune["winner"], "set": won["set"], "trials": len(tune["trials"]),
                       "trials_run": sum(1 for t in tune["trials"] if t.get("wall_s")),
                       "trial_s": sum(t.get("wall_s") or 0 for t in tune["trials"]),
                       "command_wall_s": tune.get("command_wall_s")}
        if in_grid and in_grid["step_time_s"]:
            out["tune"]["winner_grid_step_time_s"] = in_grid["step_time_s"]
            out["tune"]["winner_vs_best_pct"] = 100 * (in_grid["step_time_s"] / best - 1)
        out["tune"]["trial_time_vs_grid_pct"] = 100 * out["tune"]["command_wall_s"] / grid_trial_s
        if DEFAULT_ID in ok and in_grid and in_grid["step_time_s"]:
            out["tune"]["winner_vs_default_speedup"] = ok[DEFAULT_ID]["step_time_s"] / in_grid["step_time_s"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("phase", choices=["grid", "tune", "score"])
    ap.add_argument("--state", type=Path, required=True)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--grid-steps", type=int, default=10)
    ap.add_argument("--deadline-s", type=float, default=560, help="start no grid trial after this many seconds")
    ap.add_argument("--budget-minutes", type=float, default=30, help="tune's own --budget-minutes")
    ap.add_argument("--trial-timeout-s", type=float, default=180)
    ap.add_argument("--db", default="bench_runs/tune_vs_grid.db")
    ap.add_argument("--out", default="bench_runs/tune_vs_grid")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    extra = PROBLEM + args.overrides
    if args.phase == "grid":
        phase_grid(args, extra)
    elif args.phase == "tune":
        phase_tune(args, extra)
    print(json.dumps(phase_score(args) if args.state.exists() and load(args.state)["grid"] else {}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
