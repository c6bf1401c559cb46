"""Projected time to train from throughput runs: the scaling table a cluster report needs before (or
instead of) full convergence runs.

A throughput run (random weights, fabricated data, a few steps) measures samples/s; MLPerf's RCP
checker knows how many samples the reference needs to converge at that global batch size. Projected
time to train = reference samples ÷ measured samples/s + the evals the recipe runs on the way (each
one the run's own measured eval pass when it made one, else the planner's estimate). It is a
projection and is always labelled so -- never a time to train: only a run that reaches the target
has one. Imported runs of another engine are not projected: their published logs already carry a
time to train, and this engine's GPU preset would price their evals as ours. The scaling-table helpers both tables share (layout columns, speedup and efficiency against
the smallest GPU count) live here too.
"""

from __future__ import annotations

import copy
import json
import math
import statistics
from pathlib import Path
from types import SimpleNamespace

from trainperf.core.layout import data_parallel_size
from trainperf.core.spec import RunSpec
from trainperf.mlperf.benchmarks import of_run
from trainperf.mlperf.score import rcp_reference_samples
from trainperf.plan.costs import estimate
from trainperf.plan.hardware import preset_for_device
from trainperf.plan.search import time_to_train
from trainperf.report.scaling import is_imported


def eval_pass_seconds(mllog: str | None) -> tuple[list[float], int | None]:
    """(seconds of every eval pass, validation rows per pass) read from an MLPerf log."""
    if not mllog or not Path(mllog).is_file():
        return [], None
    starts, spans, rows = {}, [], None
    for line in Path(mllog).read_text().splitlines():
        if ":::MLLOG" not in line:
            continue
        e = json.loads(line.split(":::MLLOG ", 1)[1])
        if e["key"] == "eval_samples":
            rows = int(e["value"])
        elif e["key"] == "eval_start":
            starts[e["metadata"]["samples_count"]] = e["time_ms"]
        elif e["key"] == "eval_stop" and e["metadata"]["samples_count"] in starts:
            spans.append((e["time_ms"] - starts[e["metadata"]["samples_count"]]) / 1000)
    return spans, rows


def _recipe_for(spec):
    """The benchmark's own recipe (eval schedule, validation rows) at the run's GBS and layout."""
    bench = of_run(spec)  # a mini workload borrowing the benchmark's log name has none
    if bench is None or not bench.runnable:
        return None
    recipe = bench.defaults()
    recipe.train.global_batch_size = spec.train.global_batch_size
    recipe.parallel = copy.deepcopy(spec.parallel)
    recipe.data.eval_samples = bench.eval_rows
    return recipe


def _same_problem(spec, recipe) -> bool:
    """The benchmark's model shape and sequence length: only then do its samples to converge apply."""
    shape = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads")
    return (all(getattr(spec.model, k) == getattr(recipe.model, k) for k in shape)
            and spec.data.seq_len == recipe.data.seq_len)


def project(run: dict) -> dict | None:
    """The projection of one stored run, or None (another engine's run, no step time, no benchmark, no
    reference)."""
    if is_imported(run) or not run.get("step_time_s"):
        return None
    try:
        spec = RunSpec.from_dict(json.loads(run["spec_json"]))
    except (KeyError, TypeError, ValueError):
        return None
    recipe = _recipe_for(spec)
    if recipe is None or not _same_problem(spec, recipe):
        return None  # a mini workload borrowing the benchmark's log name, or a shrunken model
    gbs = spec.train.global_batch_size
    ref = rcp_reference_samples(spec.mlperf.benchmark, gbs)
    if ref is None:
        return None
    samples, ref_kind = ref
    dp = data_parallel_size(spec.parallel)
    spans, rows = eval_pass_seconds(run.get("mllog_path"))
    if spans and rows:
        per_row, eval_source = statistics.median(spans) / math.ceil(rows / dp), "measured"
    else:
        hw = json.loads(run.get("hardware_json") or "{}")
        gpu = preset_for_device(hw.get("gpu") or "")
        if gpu is None:
            return None
        per_row = estimate(spec, gpu, hw.get("gpus") or run["world_size"]).eval_seconds_per_row
        eval_source = "planned"
    est = SimpleNamespace(step_time_s=run["step_time_s"], eval_seconds_per_row=per_row)
    total = time_to_train(recipe, est, samples)
    train_s = samples / gbs * run["step_time_s"]
    return {"run_id": run["run_id"], "workload": run["workload"], "benchmark": spec.mlperf.benchmark,
            "gpus": run["world_size"], "gbs": gbs, "samples_per_s": gbs / run["step_time_s"],
            "reference_samples": samples, "reference": ref_kind, "train_s": train_s, "eval_s": total - train_s,
            "eval_source": eval_source, "projected_s": total, "mfu": run.get("mfu"),
            "tokens_per_s_per_gpu": run.get("tokens_per_s_per_gpu")}


def projected_scaling_rows(runs: list[dict]) -> list[dict]:
    """Per benchmark and GPU count, the run with the shortest projection; speedup against the
    smallest GPU count and efficiency against ideal scaling."""
    best: dict[tuple[str, int], tuple[dict, dict]] = {}
    for r in runs:
        p = project(r)
        if p is None:
            continue
        k = (p["benchmark"], p["gpus"])
        if k not in best or p["projected_s"] < best[k][0]["projected_s"]:
            best[k] = (p, r)
    rows = [{**p, "layout": r["layout"], **layout_columns(r)} for _, (p, r) in sorted(best.items())]
    return with_speedup(rows, "benchmark", "projected_s")


def with_speedup(rows: list[dict], group: str, time_key: str) -> list[dict]:
    """Add to rows (one per group and GPU count) the speedup against the group's smallest GPU count
    and the efficiency against ideal (linear) scaling."""
    base: dict[str, dict] = {}
    for r in sorted(rows, key=lambda r: r["gpus"]):
        base.setdefault(r[group], r)
    for r in rows:
        b = base[r[group]]
        r["speedup"] = b[time_key] / r[time_key]
        r["efficiency"] = r["speedup"] / (r["gpus"] / b["gpus"])
    return rows


def layout_columns(run: dict) -> dict:
    """DP, TP, PP, CP, SP, GBS, MBS of a stored run (from its spec), for the operators' scaling table."""
    try:
        spec = json.loads(run.get("spec_json") or "{}")
    except ValueError:
        spec = {}
    p, t = spec.get("parallel", {}), spec.get("train", {})
    dp = (p.get("dp_replicate") or 1) * (p.get("dp_shard") or 1) if p.get("dp_shard", -1) > 0 else None
    return {"dp": dp, "tp": p.get("tp"), "pp": p.get("pp"), "cp": p.get("cp"), "sp": p.get("sp"),
            "gbs": t.get("global_batch_size"), "mbs": t.get("micro_batch_size")}
