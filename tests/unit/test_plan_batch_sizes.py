"""Every global batch size MLPerf accepts is searchable: an RCP's own, any between two RCPs (priced by
the RCP the checker interpolates), any below the smallest (priced by the smallest), from the rules'
smallest GBS; the llama31_405b rate rule for any GBS. In-process, no GPU."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from trainperf.core.errors import SpecError
from trainperf.mlperf.recipes import (check_schedule_for_gbs, llama2_70b_lora_defaults, llama31_405b_defaults,
                                      llama405_eval_skips, llama405_lr, RECIPES)
from trainperf.mlperf.score import rcp_reference_samples
from trainperf.plan.engines import FACTORS, EngineProfile, apply_profile
from trainperf.plan.hardware import PRESETS
from trainperf.plan.search import (GBS_PER_GAP, AcceptedBatchSizes, _apply, accepted_batch_sizes, plan,
                                   rcp_batch_sizes, rcp_samples)


def _nemo_h100():
    return apply_profile(PRESETS["h100"], EngineProfile("nemo", {k: v[1] for k, v in FACTORS.items()}))


@pytest.mark.parametrize("step", [1, 3, 7, 8, 24, 96, 160, 1000])
def test_accepted_sizes_are_the_points_and_a_bounded_sample_of_each_gap(step):
    acc = AcceptedBatchSizes((8, 16, 32, 128))
    got = acc.values(step)
    assert got == sorted(set(got)) and all(g % step == 0 and 1 <= g <= 128 for g in got)
    assert [g for g in (8, 16, 32, 128) if g % step == 0] == [g for g in got if g in (8, 16, 32, 128)]
    for lo, hi in ((0, 8), (8, 16), (16, 32), (32, 128)):
        inside = [k * step for k in range(1, 128 // step + 1) if lo < k * step < hi]
        picked = [g for g in got if lo < g < hi]
        assert len(picked) == min(len(inside), GBS_PER_GAP)
        if inside:  # both ends of each gap a layout admits
            assert picked[0] == inside[0] and picked[-1] == inside[-1]


def test_accepted_sizes_respect_the_rules_smallest_gbs_and_a_layouts_own_floor():
    acc = AcceptedBatchSizes((1536, 2048, 3072), least=1536)
    assert min(acc.values(1)) == 1536 and max(acc.values(1)) == 3072
    assert min(AcceptedBatchSizes((8, 16)).values(2, least=6)) == 6


def test_gbs_between_rcps_is_priced_by_the_checkers_interpolation():
    spec = llama2_70b_lora_defaults()
    spec.train.global_batch_size = 96  # 768 GPUs at DP 96: between the RCPs at 16 and 128 (32 is pruned)
    got = rcp_samples(spec)
    assert got == pytest.approx(rcp_reference_samples("llama2_70b_lora", 96)[0])
    lo, hi = rcp_reference_samples("llama2_70b_lora", 16)[0], rcp_reference_samples("llama2_70b_lora", 128)[0]
    assert got == pytest.approx(float(np.interp(96, [16, 128], [lo, hi])))


def test_gbs_below_the_smallest_rcp_is_priced_by_the_smallest():
    spec = llama31_405b_defaults()
    at_1152 = rcp_samples(spec)
    for gbs in (576, 1008, 1120):  # published closed 405B runs (University of Florida v5.1, NVIDIA v5.0)
        assert rcp_samples(dataclasses.replace(spec, train=dataclasses.replace(spec.train, global_batch_size=gbs))) \
            == pytest.approx(at_1152)
    gpt3 = RECIPES["gpt3"]()
    gpt3.train.global_batch_size = 1024  # below the gpt3 rules' smallest GBS (1536): no reference
    assert rcp_samples(gpt3) is None
    lora = llama2_70b_lora_defaults()
    lora.train.global_batch_size = 4
    assert rcp_samples(lora) == pytest.approx(rcp_samples(llama2_70b_lora_defaults()))  # against GBS 8's


def test_405b_rate_rule_holds_for_the_published_small_batches():
    for gbs in (576, 1008, 1120):
        spec = llama31_405b_defaults(gbs)
        assert spec.train.lr * 1152 == gbs * 8e-5 or spec.train.lr == llama405_lr(gbs)
        check_schedule_for_gbs(spec)  # the closed rules accept it
        assert spec.eval.skip_first == llama405_eval_skips(gbs)
    with pytest.raises(SpecError, match="9216"):
        check_schedule_for_gbs(llama31_405b_defaults(9216 * 2))


def test_a_searched_gbs_brings_its_own_skipped_evals():
    base = llama31_405b_defaults()
    assert _apply(base, {"train.global_batch_size": 2304}).eval.skip_first == llama405_eval_skips(2304)
    assert _apply(llama2_70b_lora_defaults(), {"train.global_batch_size": 96}).eval.skip_first == -1


def test_768_gpus_of_llama2_70b_lora_plan_at_a_gbs_between_rcps():
    base = llama2_70b_lora_defaults()
    base.hardware.fp8, base.hardware.frozen_dtype = "tensorwise", "fp8"
    acc = accepted_batch_sizes(base)
    assert acc.points == tuple(rcp_batch_sizes(base))
    fits, _ = plan(base, _nemo_h100(), 768, 8, gbs_values=acc, megatron=True)
    assert fits and all(c.time_to_train_s for c in fits[:20])
    gbs = {c.spec.train.global_batch_size for c in fits}
    assert gbs and all(g % 3 == 0 for g in gbs) and not gbs & {8, 16, 32, 128}  # 768 = 3 x 256: only DP takes 3
    assert 96 in gbs


def test_405b_at_2560_gpus_prices_nvidias_gbs_1120():
    base = llama31_405b_defaults()
    base.hardware.fp8 = "tensorwise"
    fits, _ = plan(base, _nemo_h100(), 2560, 8, gbs_values=[1120], megatron=True)
    assert fits and fits[0].spec.train.global_batch_size == 1120 and fits[0].time_to_train_s > 0
