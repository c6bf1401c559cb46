"""Fit the planner's free factors to runs measured on this cluster.

The GEMM and attention efficiencies come from micro-benchmarks; what is left is fitted over the
stored GPU runs by least squares on the relative step-time error (scipy): the eager non-GEMM work per
token per layer (``other_s_per_token_layer_h``, the GPU side) and one scale on every host-time
constant (``host_s_*``: how fast this cluster's CPUs issue ops, which differs between machines). A
GPU-bound set of runs leaves the host scale where it was (it has no gradient there). The result is
written as a GPU YAML file for ``plan --gpu FILE``.
"""

from __future__ import annotations

import dataclasses
import json
import statistics

from trainperf.core.errors import SpecError
from trainperf.core.spec import RunSpec
from trainperf.plan.costs import estimate
from trainperf.plan.hardware import PricedGPU, preset_for_device
from trainperf.plan.hardware import scale_host_time as with_host_scale


def measured_runs(store) -> list[tuple[RunSpec, dict, float, float | None]]:
    """(spec, hardware, measured step seconds, measured peak GiB) of every stored GPU run of this engine
    with a step time."""
    out = []
    for row in store.list_runs(limit=10_000):
        hw = json.loads(row.get("hardware_json") or "{}")
        if hw.get("device") != "cuda" or not row.get("step_time_s") or row.get("engine"):
            continue  # (another engine's imported runs fit that engine's profile, plan/engines.py)
        out.append((RunSpec.from_dict(json.loads(row["spec_json"])), hw, row["step_time_s"], row.get("peak_mem_gib")))
    return out


def calibrate(store, gpu_name: str) -> tuple[PricedGPU, list[dict]]:
    runs = [r for r in measured_runs(store) if gpu_name.lower() in (r[1].get("gpu") or "").lower()]
    if not runs:
        raise SpecError(f"no measured GPU runs of {gpu_name!r} in the store to calibrate from; run some first")
    base = preset_for_device(runs[0][1]["gpu"])
    if base is None:
        raise SpecError(f"no preset for {runs[0][1]['gpu']!r} to calibrate")
    from scipy.optimize import least_squares

    def gpu_with(x) -> PricedGPU:
        return with_host_scale(dataclasses.replace(base, other_s_per_token_layer_h=x[0] * 1e-10), x[1])

    def residuals(x):
        return [estimate(spec, gpu_with(x), hw.get("gpus", 1)).step_time_s / step - 1 for spec, hw, step, _ in runs]

    x0 = [base.other_s_per_token_layer_h / 1e-10, 1.0]
    fit = least_squares(residuals, x0, bounds=([0.0, 0.05], [1e3, 20.0]), x_scale=[1.0, 1.0])
    fitted = gpu_with([float(v) for v in fit.x])
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


def write_gpu_yaml(gpu: PricedGPU, path: str, base_key: str) -> None:
    import yaml

    fields = dataclasses.asdict(gpu)
    fields["base"] = base_key
    with open(path, "w") as fh:
        yaml.safe_dump(fields, fh, sort_keys=True)


def calibrate_to_yaml(db: str, gpu_name: str, path: str) -> dict:
    """``plan --calibrate GPU_YAML``: fit the model to the stored runs of ``gpu_name``, write the fitted GPU
    to ``path``, and say how well the preset and the fit predict those runs. SpecError / StoreError."""
    # the store (and sqlite3) loads only when a fit is asked for
    from trainperf.store.db import Store

    store = Store(db)
    fitted, report = calibrate(store, gpu_name)
    store.close()
    write_gpu_yaml(fitted, path, gpu_name.lower())
    return {"gpu": fitted.name, "other_s_per_token_layer_h": fitted.other_s_per_token_layer_h, "written": path,
            "preset": summary(report, "preset"), "calibrated": summary(report, "calibrated"), "runs": report}
