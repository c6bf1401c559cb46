"""Time to train as MLPerf times it: steps, evals (the slower of the GPU's forward and the host's eager
launch per layer), the run's set-up; the engine terms fitted to runs' time outside their steps; the
RCP's spread as a p10-p90 band. In-process, no GPU."""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import pytest

from trainperf.core.layout import data_parallel_size
from trainperf.mlperf.recipes import EVAL_ROWS, RECIPES, llama2_70b_lora_defaults, llama31_405b_defaults
from trainperf.plan.costs import estimate
from trainperf.plan.engines import (FACTORS, EngineProfile, EngineRun, apply_profile, engine_run_from_row,
                                    fit_time_terms)
from trainperf.plan.hardware import PRESETS
from trainperf.plan.search import (P10_P90_Z, evals_to, rcp_samples, rcp_stdev_at, samples_band, time_to_train,
                                   time_to_train_terms)

RATES = EngineProfile("nemo", {k: v[1] for k, v in FACTORS.items()})


def _lora(tp=4, cp=2, dp=8):
    spec = llama2_70b_lora_defaults()
    p = spec.parallel
    p.tp, p.sp, p.cp, p.dp_shard, p.dp_replicate = tp, tp > 1, cp, dp, 1
    spec.hardware.device, spec.hardware.fp8, spec.hardware.frozen_dtype = "cuda", "tensorwise", "fp8"
    spec.train.recompute = "none"
    return spec


def _gpt3():
    spec = RECIPES["gpt3"](2048)
    p = spec.parallel
    p.tp, p.sp, p.pp, p.pp_schedule, p.pp_stages_per_rank, p.dp_shard, p.dp_replicate = 4, True, 8, \
        "Interleaved1F1B", 6, 8, 1
    spec.train.micro_batch_size, spec.train.recompute = 2, "none"
    spec.hardware.device, spec.hardware.fp8 = "cuda", "tensorwise"
    return spec


def _gpu(h=0.0, setup=0.0):
    return apply_profile(PRESETS["h100"], dataclasses.replace(RATES, time_terms={"eval_host_s_per_layer": h,
                                                                                 "run_setup_s": setup}))


def test_terms_add_up_and_the_eval_is_the_slower_of_gpu_and_host():
    spec = _lora()
    gpu_only, hosted = estimate(spec, _gpu(), 8), estimate(spec, _gpu(h=5e-3, setup=12.0), 8)
    assert hosted.step_time_s == pytest.approx(gpu_only.step_time_s)  # the steps do not change
    assert hosted.eval_seconds_per_row == pytest.approx(max(gpu_only.eval_seconds_per_row, 5e-3 * 80))
    terms = time_to_train_terms(spec, hosted, 3200)
    assert terms["setup"] == 12.0 and sum(terms.values()) == pytest.approx(time_to_train(spec, hosted, 3200))
    rows = math.ceil(EVAL_ROWS["llama2_70b_lora"] / data_parallel_size(spec.parallel))
    assert terms["evals"] == pytest.approx(evals_to(spec, 3200) * rows * hosted.eval_seconds_per_row)
    # an estimate without the new fields (report's measured-run projection) still prices evals and steps
    bare = SimpleNamespace(step_time_s=1.0, eval_seconds_per_row=0.1)
    assert time_to_train_terms(spec, bare, 3200)["setup"] == 0.0


def _point(spec, gpus_per_node, h, setup, samples, label):
    """A run as the fit sees it, whose time outside its steps is what (h, setup) price."""
    gpu = _gpu(h, setup)
    est = estimate(spec, gpu, gpus_per_node)
    gpus = spec.parallel.tp * spec.parallel.cp * spec.parallel.pp * spec.parallel.dp_shard
    ttt = time_to_train(spec, est, samples)
    unit = spec.data.seq_len if spec.mlperf.benchmark == "gpt3" else 1
    return EngineRun(label, spec, PRESETS["h100"], gpus_per_node, est.tokens_per_s_per_gpu, ttt, label, samples * unit)


def test_fit_recovers_the_eval_host_cost_and_the_set_up():
    h, setup = 4.5e-3, 11.0
    points = [_point(_lora(4, 2, 8), 8, h, setup, 3072, "lora64"), _point(_lora(4, 1, 2), 8, h, setup, 3072, "lora8"),
              _point(_lora(1, 2, 4), 8, h, setup, 3840, "lora8cp"), _point(_gpt3(), 8, h, setup, 589_824, "gpt3")]
    got = fit_time_terms(RATES, points)
    assert got["eval_host_s_per_layer"] == pytest.approx(h, abs=1e-4)
    assert got["run_setup_s"] == pytest.approx(setup, abs=0.5)
    assert fit_time_terms(RATES, points[:2]) == {}  # too few runs to fit


def test_band_is_the_rcps_spread_and_interpolates_like_the_mean():
    spec = llama2_70b_lora_defaults()
    mean = rcp_samples(spec)
    lo, hi = samples_band(spec, mean)
    sd = rcp_stdev_at(spec, "5.1.0")
    assert lo < mean < hi and hi - mean == pytest.approx(P10_P90_Z * sd)
    sds = {}
    for gbs in (16, 64, 128):
        spec.train.global_batch_size = gbs
        sds[gbs] = rcp_stdev_at(spec, "5.1.0")
    assert sds[64] == pytest.approx(sds[16] + (sds[128] - sds[16]) * (64 - 16) / (128 - 16))  # as the mean
    spec.mlperf.division, spec.mlperf.comparable = "open", False
    assert samples_band(spec, 1000.0) is None or rcp_samples(spec) is None


def test_a_v50_405b_run_is_counted_at_its_rounds_eval_cadence():
    spec = llama31_405b_defaults()
    row = {"hardware_json": json.dumps({"gpu": "NVIDIA H100-SXM5-80GB", "gpus_per_node": 8}),
           "tokens_per_s_per_gpu": 334.0, "spec_json": json.dumps(spec.to_dict()), "run_id": "r", "status": "success",
           "time_to_train_s": 13_840.0, "workload": "llama31_405b", "world_size": 512, "layout": "x",
           "software_json": json.dumps({"round": "v5.0"}), "samples_to_target": 276_480}
    v50 = engine_run_from_row(row)
    assert evals_to(v50.spec, 276_480) == 6  # the published v5.0 logs: evals at 46,080 x 1..6
    row["software_json"] = json.dumps({"round": "v5.1"})
    assert evals_to(engine_run_from_row(row).spec, 276_480) == math.ceil(276_480 / 18_432) - 14
