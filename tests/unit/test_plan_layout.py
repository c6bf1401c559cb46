"""`plan --layout`: exactly the layout a user names is priced (virtual-stage counts the search does not
try included) and placed in the ranking; a bad field is one line, exit 2. In-process but for a few CLI
cases."""

from __future__ import annotations

import dataclasses
import json

import pytest

from trainperf.core.errors import SpecError
from trainperf.mlperf.recipes import RECIPES, llama2_70b_lora_defaults
from trainperf.plan.engines import FACTORS, EngineProfile, apply_profile
from trainperf.plan.hardware import PRESETS
from trainperf.plan.search import (MEGATRON_VIRTUAL_STAGES, layout_overrides, layout_world_size, parse_layout, plan,
                                   price_layout)

from tests.fixtures.cli import run_cli


def _nemo_h100():
    return apply_profile(PRESETS["h100"], EngineProfile("nemo", {k: v[1] for k, v in FACTORS.items()}))


def _fp8(spec):
    spec.hardware.fp8 = "tensorwise"
    if spec.lora.enabled:
        spec.hardware.frozen_dtype = "fp8"
    return spec


def test_parse_layout_reads_every_field():
    f = parse_layout("tp=4, sp, cp=2,dp=96,mbs=1,gbs=96,recompute=FULL,schedule=interleaved1f1b,vp=12")
    assert f == {"tp": 4, "sp": True, "cp": 2, "dp": 96, "mbs": 1, "gbs": 96, "recompute": "full",
                 "schedule": "Interleaved1F1B", "vp": 12}
    assert layout_world_size(f) == 768 and layout_world_size(parse_layout("tp=8")) is None
    assert parse_layout("sp=false,tp=2")["sp"] is False


@pytest.mark.parametrize("text, needle", [
    ("", "empty"), ("tp=4,zz=1", "'zz=1' is not a layout field"), ("tp=0", "whole number"), ("tp=x", "whole number"),
    ("tp=-2", "whole number"), ("tp=4,tp=8", "given twice"), ("recompute=some", "none, selective, full"),
    ("sp=maybe", "sp=true|false"), ("tp=1e9", "whole number"), ("tp=\x1b[2J", "\\x1b"),
])
def test_parse_layout_refuses_in_one_line(text, needle):
    with pytest.raises(SpecError) as exc:
        parse_layout(text)
    assert needle in str(exc.value) and "\n" not in str(exc.value) and "\x1b" not in str(exc.value)


@pytest.mark.parametrize("fields, gpus, needle", [
    ({"tp": 3}, 8, "does not divide --gpus 8"), ({"tp": 4, "dp": 4}, 8, "names 16 GPUs"),
    ({"vp": 4, "pp": 2, "schedule": "1F1B"}, 8, "needs schedule=Interleaved1F1B"),
    ({"rep": 2}, 8, None), ({"rep": 3}, 8, "data-parallel size 8"), ({"rep": 2, "shard": 2}, 8, "names 4 GPUs"),
])
def test_layout_overrides_check_the_degrees(fields, gpus, needle):
    if needle is None:
        o = layout_overrides(fields, gpus, megatron=False)
        assert (o["parallel.dp_replicate"], o["parallel.dp_shard"]) == (2, 4)
        return
    with pytest.raises(SpecError, match=needle):
        layout_overrides(fields, gpus, megatron=False)


def test_named_layout_is_priced_exactly_and_placed_in_the_ranking():
    base = _fp8(RECIPES["gpt3"]())
    base.train.global_batch_size = 2048
    gpu = _nemo_h100()
    fits, _ = plan(base, gpu, 256, 8, megatron=True)
    assert 12 not in MEGATRON_VIRTUAL_STAGES  # a published gpt3 run used 12: outside the search
    named = price_layout(base, gpu, 256, 8, parse_layout("tp=4,sp,pp=8,vp=12,dp=8,mbs=2"), fits, megatron=True)
    c = named.candidate
    assert (c.spec.parallel.pp_stages_per_rank, c.spec.parallel.pp_schedule) == (12, "Interleaved1F1B")
    assert not named.searched and named.fits and named.ranked == len(fits)
    assert named.rank == 1 + sum(1 for f in fits if f.time_to_train_s < c.time_to_train_s)
    assert named.over_best == pytest.approx(c.time_to_train_s / fits[0].time_to_train_s - 1)
    same = price_layout(base, gpu, 256, 8, parse_layout("tp=4,sp,pp=8,vp=6,dp=8,mbs=2"), fits, megatron=True)
    assert same.searched and fits[same.rank - 1].est.step_time_s == pytest.approx(same.candidate.est.step_time_s)


def test_named_layout_without_gbs_takes_the_best_gbs_the_search_tried():
    from trainperf.plan.search import accepted_batch_sizes

    base = _fp8(llama2_70b_lora_defaults())
    gpu, acc = _nemo_h100(), accepted_batch_sizes(llama2_70b_lora_defaults())
    fits, _ = plan(base, gpu, 768, 8, gbs_values=acc, megatron=True)
    named = price_layout(base, gpu, 768, 8, parse_layout("tp=4,sp,cp=2"), fits, gbs_values=acc, megatron=True)
    assert named.candidate.spec.train.global_batch_size % 96 == 0 and named.candidate.time_to_train_s
    with pytest.raises(SpecError, match="not a layout the engine runs"):  # 80 layers over pp 8 x vp 7: no
        price_layout(base, gpu, 768, 8, parse_layout("tp=4,sp,pp=8,vp=7,gbs=96"), fits, gbs_values=acc,
                     megatron=True)
    with pytest.raises(SpecError, match="a multiple of 96"):
        price_layout(base, gpu, 768, 8, parse_layout("tp=4,sp,cp=2,gbs=100"), fits, megatron=True)


def test_plan_cli_prices_a_named_layout_and_refuses_a_bad_one(tmp_path):
    db = ["--db", str(tmp_path / "t.db")]
    ok = run_cli("plan", "llama2_70b_lora", "--gpu", "h100", "--layout", "tp=4,sp,dp=2", "--json", "--top", "1", *db,
                 cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    named = json.loads(ok.stdout)["named_layout"]
    assert json.loads(ok.stdout)["gpus"] == 8 and named["layout"]["tp"] == 4 and named["layout"]["dp"] == 2
    assert named["rank"] >= 1 and named["step_time_s"] > 0
    bad = run_cli("plan", "llama2_70b_lora", "--gpus", "16", "--layout", "tp=4,dp=2", *db, cwd=tmp_path)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "names 8 GPUs" in bad.stderr
    missing = run_cli("plan", "--layout-from-run", "nope", *db, cwd=tmp_path)
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1
