"""Fit the planner's free efficiency factor to runs measured on this cluster.

The GEMM and attention efficiencies come from micro-benchmarks; what is left -- eager non-GEMM work
per token per layer (``other_s_per_token_layer_h``) -- enters the step time linearly, so it has a
closed-form least-squares fit over the stored GPU runs: step = A + k*B, where B is the
elementwise time at k = 1. The result is written as a GPU YAML file for ``plan --gpu FILE``.
"""

from __future__ import annotations

import dataclasses
import json
import statistics

from trainperf.plan.costs import estimate
from trainperf.plan.hardware import GPU, preset_for_device
from trainperf.specs import RunSpec, SpecError


def measured_runs(store) -> list[tuple[RunSpec, dict, float, float | None]]:
    """(spec, hardware, measured step seconds, measured peak GiB) of every stored GPU run with a step time."""
    out = []
    for row in store.list_runs(limit=10_000):
        hw = json.loads(row.get("hardware_json") or "{}")
        if hw.get("device") != "cuda" or not row.get("step_time_s"):
            continue
        out.append((RunSpec.from_dict(json.loads(row["spec_json"])), hw, row["step_time_s"], row.get("peak_mem_gib")))
    return out


def calibrate(store, gpu_name: str) -> tuple[GPU, list[dict]]:
    runs = [r for r in measured_runs(store) if gpu_name.lower() in (r[1].get("gpu") or "").lower()]
    if not runs:
        raise SpecError(f"no measured GPU runs of {gpu_name!r} in the store to calibrate from; run some first")
    base = preset_for_device(runs[0][1]["gpu"])
    if base is None:
        raise SpecError(f"no preset for {runs[0][1]['gpu']!r} to calibrate")
    unit = dataclasses.replace(base, other_s_per_token_layer_h=1e-10)
    zero = dataclasses.replace(base, other_s_per_token_layer_h=0.0)
    num = den = 0.0
    for spec, hw, step, _ in runs:
        per_node = hw.get("gpus", 1)
        a = estimate(spec, zero, per_node).step_time_s
        b = (estimate(spec, unit, per_node).step_time_s - a) / 1e-10
        num, den = num + b * (step - a), den + b * b
    fitted = dataclasses.replace(base, other_s_per_token_layer_h=max(num / den, 0.0) if den else base.other_s_per_token_layer_h)
    report = []
    for spec, hw, step, peak in runs:
        for label, gpu in (("preset", base), ("calibrated", fitted)):
            est = estimate(spec, gpu, hw.get("gpus", 1))
            report.append({"workload": spec.workload, "gpus": hw.get("gpus"), "which": label, "measured_step_s": step,
                           "predicted_step_s": est.step_time_s, "step_error": est.step_time_s / step - 1,
                           "measured_peak_gib": peak, "predicted_peak_gib": est.allocated_gib,
                           "peak_error": (est.allocated_gib / peak - 1) if peak else None})
    return fitted, report


def summary(report: list[dict], which: str) -> dict:
    errs = [abs(r["step_error"]) for r in report if r["which"] == which]
    return {"runs": len(errs), "median_abs_step_error": statistics.median(errs), "max_abs_step_error": max(errs)}


def write_gpu_yaml(gpu: GPU, path: str, base_key: str) -> None:
    import yaml

    fields = dataclasses.asdict(gpu)
    fields["base"] = base_key
    with open(path, "w") as fh:
        yaml.safe_dump(fields, fh, sort_keys=True)
