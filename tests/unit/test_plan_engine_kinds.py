"""A GPU is its datasheet and preflight; an engine is a kind with switches and rates. `plan --engine NAME`
takes the kind from the stored engine's name or a profile file; a Megatron engine's layouts are printed
in NeMo's variables and checked against Megatron's rules. In-process but for a few CLI lines."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import yaml

from tests.fixtures.cli import run_cli
from trainperf.core.errors import SpecError
from trainperf.mlperf.published import config_layout
from trainperf.mlperf.recipes import llama2_70b_lora_defaults
from trainperf.plan import engines
from trainperf.plan.engines import FACTORS, EngineProfile, apply_profile, load_profile, read_profile_file
from trainperf.plan.hardware import GPU, GPUS, PRESETS, PricedGPU, priced
from trainperf.plan.nemo import MegatronLayout, megatron_violations, nemo_lines, submission_exports
from trainperf.plan.profile import ENGINE_KINDS, EngineRates, EngineSwitches, kind_of_engine
from trainperf.plan.search import plan

PRIORS = {k: v[1] for k, v in FACTORS.items()}


def test_a_gpu_holds_no_engine_field_and_a_preset_is_the_two_together():
    gpu_fields = {f.name for f in dataclasses.fields(GPU)}
    engine_fields = {f.name for f in dataclasses.fields(EngineRates)} | {f.name for f in dataclasses.fields(EngineSwitches)}
    assert not gpu_fields & engine_fields
    assert {"pipelined_eval", "cp_ring_expanded_kv", "asymmetric_stages", "data_parallel"} <= engine_fields
    assert {"bf16_tflops", "hbm_gib", "nvlink_domain", "gemm_eff", "kernel_table"} <= gpu_fields
    assert {f.name for f in dataclasses.fields(PricedGPU)} == gpu_fields | engine_fields
    assert priced(GPUS["h100"]) == PRESETS["h100"]  # this engine's rates and switches by default


def test_the_kind_sets_the_switches_the_fitted_factors_the_rates():
    nemo = apply_profile(PRESETS["h100"], EngineProfile("nemo", PRIORS))
    assert {k: getattr(nemo, k) for k in dataclasses.asdict(EngineSwitches())} \
        == dataclasses.asdict(ENGINE_KINDS["megatron"].switches)
    assert nemo.gemm_eff == PRIORS["gemm_eff"] and nemo.hbm_gib == PRESETS["h100"].hbm_gib
    ours = ENGINE_KINDS["trainperf"]
    assert (ours.search, ours.launchable, ENGINE_KINDS["megatron"].search) == ("own", True, "megatron")


@pytest.mark.parametrize("name, kind", [("nemo", "megatron"), ("megatron", "megatron"), ("trainperf", "trainperf"),
                                        ("maxtext", None), ("unknown", None)])
def test_an_engine_name_says_its_kind(name, kind):
    found = kind_of_engine(name)
    assert (found.name if found else None) == kind


def test_stored_runs_of_an_engine_of_no_known_kind_are_refused_not_priced_as_megatron(monkeypatch):
    monkeypatch.setattr(engines, "engine_runs", lambda store, name: ["a run"])
    with pytest.raises(SpecError, match="no engine kind the planner models .*megatron: nemo, megatron"):
        load_profile(None, "maxtext")


def _profile_file(tmp_path, **changes):
    data = {"name": "nemo", "factors": dict(PRIORS), "time_terms": {"run_setup_s": 20.0}} | changes
    path = tmp_path / "nemo.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_profile_file_is_read_as_calibrate_json_writes_it(tmp_path):
    prof = read_profile_file(str(_profile_file(tmp_path)))
    assert (prof.kind, prof.factors, prof.time_terms) == ("megatron", PRIORS, {"run_setup_s": 20.0})
    whole = tmp_path / "out.json"  # the whole `plan --calibrate --engine nemo --json` output works too
    whole.write_text(json.dumps({"profile": {"name": "x", "kind": "megatron", "factors": PRIORS}, "points": []}))
    assert read_profile_file(str(whole)).name == "x"


@pytest.mark.parametrize("changes, message", [
    ({"factors": {"gemm_eff": 0.5}}, "factors must be exactly"),
    ({"name": "maxtext"}, "kind None; give kind: one of megatron"),
    ({"kind": "trainperf"}, "kind 'trainperf'"),
    ({"factors": PRIORS | {"gemm_eff": "fast"}}, "gemm_eff is 'fast'; give a number"),
    ({"factors": PRIORS | {"gemm_eff": 3.0}}, "gemm_eff is 3; give a number at most 0.95"),
    ({"time_terms": {"setup": 1}}, "time_terms some of"),
])
def test_a_bad_profile_file_is_one_line(tmp_path, changes, message):
    with pytest.raises(SpecError, match=message):
        read_profile_file(str(_profile_file(tmp_path, **changes)))


def _lay(**kw):
    base = dict(tp=1, cp=1, pp=1, vp=1, dp=8, sp=False, mbs=1, gbs=8, layers=80, heads=64, kv_heads=8, seq_len=8192)
    return MegatronLayout(**(base | kw))


@pytest.mark.parametrize("kw, message", [
    ({"sp": True}, "sequence_parallel needs tensor_model_parallel_size > 1"),
    ({"vp": 2}, "virtual_pipeline_model_parallel_size needs pipeline_model_parallel_size > 1"),
    ({"tp": 3, "dp": 1, "gbs": 1, "kv_heads": 1}, "num_attention_heads 64 must divide by tensor_model_parallel_size 3"),
    ({"pp": 8, "vp": 3, "dp": 1, "gbs": 16}, "num_layers 80 .* must divide by .* = 24"),
    ({"cp": 3, "dp": 1, "gbs": 1}, "split into 2 x context_parallel_size = 6 chunks"),
    ({"gbs": 12}, "global_batch_size 12 must divide by micro_batch_size x data-parallel size = 8"),
    ({"pp": 4, "dp": 2, "gbs": 6}, "3 micro-batches per step: a pipeline of 4 stages needs at least 4"),
    ({"pp": 4, "vp": 2, "dp": 2, "gbs": 12}, "6 micro-batches per step: the interleaved schedule needs a multiple"),
    ({"lora": True, "mbs": 2, "gbs": 16}, "micro_batch_size 1"),
    ({"dp_replicate": 2}, "no replicate x shard split"),
])
def test_each_megatron_rule_broken_is_named(kw, message):
    broken = megatron_violations(_lay(**kw))
    assert len(broken) == 1 and re.search(message, broken[0]), broken


def test_the_70b_lora_ranking_breaks_no_rule_and_reads_back_as_the_same_submission_layout():
    gpu = apply_profile(PRESETS["h100"], EngineProfile("nemo", PRIORS))
    base = llama2_70b_lora_defaults()
    base.hardware.fp8, base.hardware.frozen_dtype = "tensorwise", "fp8"
    fits, _ = plan(base, gpu, 64, 8, megatron=True)
    assert len(fits) > 20
    for c in fits:
        lay = MegatronLayout.of(c.spec)
        assert megatron_violations(lay) == [], c.set_line
        back = config_layout(submission_exports(lay, 8), 64)  # as `trainperf import` reads a config_*.sh
        assert (back["tp"], back["pp"], back["cp"], back["vp"], back["sp"], back["mbs"], back["dp"]) \
            == (lay.tp, lay.pp, lay.cp, lay.vp, lay.sp, lay.mbs, lay.dp)
        assert back["local_batch"] * back["dp"] == lay.gbs and back["nodes"] == 8
    block = yaml.safe_load("\n".join(x for x in nemo_lines(fits[0].spec, 8) if not x.startswith("export ")))
    assert block["model"]["global_batch_size"] == fits[0].spec.train.global_batch_size
    assert block["model"]["tensor_model_parallel_size"] == fits[0].spec.parallel.tp


def test_plan_with_a_profile_file_prints_a_nemo_block_and_refuses_a_layout_megatron_would_not_run(tmp_path):
    prof = _profile_file(tmp_path)
    ok = run_cli("plan", "llama2_70b_lora", "--gpus", "8", "--engine", prof, "--gpu", "h100", "--top", "3",
                 "--db", tmp_path / "t.db", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "as NeMo's trainer / model config" in ok.stdout and "tensor_model_parallel_size:" in ok.stdout
    assert "export MINIBS=" in ok.stdout and "--set parallel.tp" not in ok.stdout
    bad = run_cli("plan", "llama2_70b_lora", "--gpus", "8", "--engine", prof, "--gpu", "h100", "--layout",
                  "tp=1,sp,pp=2,vp=3,dp=4", "--db", tmp_path / "t.db", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stdout == ""
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and "sequence_parallel needs tensor_model_parallel_size > 1" in lines[0] \
        and "num_layers 80" in lines[0], bad.stderr
