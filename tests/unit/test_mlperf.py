"""The MLPerf workloads: llama2_70b_lora's closed recipe and rules, llama31_8b's, their logs.

The closed-division run below is the full recipe (seq 8192, GBS 8, lr 4e-4, r16/alpha 32/dropout 0.1
on qkv_proj+o_proj, clip 0.3, wd 1e-4, eval every 384 samples after skipping 3, all 173 validation
rows, target 0.925) on fabricated data in the real parquet format; only the 70B architecture (and the
3901-row training set size) is stood in for by a one-layer model, which a CPU can run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainperf.runner import local
from trainperf.core.errors import SpecError
from trainperf.core.spec import eval_interval_samples, eval_skip_count
from trainperf.workloads import fabricate
from trainperf.mlperf import recipes as mlperf
from trainperf.mlperf.recipes import LORA_FIXED, PRETRAIN_FIXED, check_closed_rules


# ---------------------------------------------------------------------------------------------
# The rules, without running anything

@pytest.mark.parametrize("gbs,skip,first_eval", [(8, 3, 1536), (16, 4, 1920), (64, 10, 4224), (128, 18, 7296), (1, 2, 1152)])
def test_lora_eval_schedule_matches_the_rules(gbs, skip, first_eval):
    spec = mlperf.llama2_70b_lora_defaults()
    spec.train.global_batch_size = gbs
    assert eval_skip_count(spec) == skip
    assert (skip + 1) * eval_interval_samples(spec) == first_eval


def test_lora_eval_interval_rounds_up_to_whole_batches():
    spec = mlperf.llama2_70b_lora_defaults()
    spec.train.global_batch_size = 9  # 384 / 9 is not whole: CEIL(384/9) * 9 = 387
    assert eval_interval_samples(spec) == 387


def test_closed_defaults_are_the_reference_recipe():
    s = mlperf.llama2_70b_lora_defaults()
    assert (s.lora.rank, s.lora.alpha, s.lora.dropout, s.lora.target_modules) == (16, 32.0, 0.1, ["qkv_proj", "o_proj"])
    t = s.train
    assert (t.beta1, t.beta2, t.eps, t.weight_decay, t.grad_clip) == (0.9, 0.999, 1e-8, 1e-4, 0.3)
    assert (t.lr, t.warmup_steps, t.min_lr_ratio, t.global_batch_size, t.max_steps) == (4e-4, 0, 0.0, 8, 1024)
    assert (s.data.seq_len, s.eval.every_samples, s.eval.target) == (8192, 384, 0.925)
    assert (s.model.num_layers, s.model.hidden_size, s.model.num_kv_heads, s.model.fused_qkv) == (80, 8192, 8, True)


def _closed_lora_spec(tmp: Path):
    s = mlperf.llama2_70b_lora_defaults()
    s.model.path, s.data.path = str(tmp / "m"), str(tmp / "d")
    return s


@pytest.mark.parametrize("dotted,value,_why", LORA_FIXED)
def test_every_fixed_lora_value_is_refused_in_closed(tmp_path, dotted, value, _why):
    spec = _closed_lora_spec(tmp_path)
    section, key = dotted.split(".")
    changed = {list: lambda: ["qkv_proj"], bool: lambda: not value, int: lambda: value + 1,
               float: lambda: value * 2 + 0.05, str: lambda: "adamw8bit"}[type(value)]()
    setattr(getattr(spec, section), key, changed)
    with pytest.raises(SpecError) as err:
        check_closed_rules(spec)
    assert dotted in str(err.value) and "closed division" in str(err.value) and "\n" not in str(err.value)
    spec.mlperf.division = "open"
    check_closed_rules(spec)  # the same change is fine in the open division


@pytest.mark.parametrize("dotted,value,_why", PRETRAIN_FIXED)
def test_every_fixed_pretrain_value_is_refused_in_closed(dotted, value, _why):
    spec = mlperf.llama31_8b_defaults()
    section, key = dotted.split(".")
    changed = "adamw8bit" if isinstance(value, str) else value + 1 if isinstance(value, int) else value * 2 + 0.05
    setattr(getattr(spec, section), key, changed)
    with pytest.raises(SpecError, match=dotted.replace(".", r"\.")):
        check_closed_rules(spec)


def test_tunables_are_allowed_in_closed(tmp_path):
    spec = _closed_lora_spec(tmp_path)
    spec.train.global_batch_size, spec.train.lr, spec.train.warmup_steps, spec.train.max_steps = 16, 5e-4, 10, 800
    check_closed_rules(spec)
    pre = mlperf.llama31_8b_defaults()
    pre.train.global_batch_size, pre.train.lr, pre.train.warmup_steps = 64, 8e-4, 96
    pre.train.decay_steps = 1_200_000 - 96
    check_closed_rules(pre)
    pre.train.decay_steps = 1_000_000
    with pytest.raises(SpecError, match="decay_steps"):
        check_closed_rules(pre)


def test_closed_needs_the_checkpoint_the_architecture_and_the_real_data_sizes(tmp_path):
    spec = mlperf.llama2_70b_lora_defaults()
    spec.data.path = str(tmp_path)
    with pytest.raises(SpecError, match="model.path"):
        check_closed_rules(spec)
    spec = _closed_lora_spec(tmp_path)
    spec.model.num_layers = 2
    with pytest.raises(SpecError, match="num_layers=2 is not the llama2-70b"):
        check_closed_rules(spec)
    spec = _closed_lora_spec(tmp_path)
    with pytest.raises(SpecError, match="validation has 100 rows"):
        check_closed_rules(spec, {"train": 3901, "validation": 100})
    check_closed_rules(spec, {"train": 3901, "validation": 173})


# ---------------------------------------------------------------------------------------------
# Bad inputs, before anything is launched

def test_missing_shard_and_wrong_shape_are_named(tmp_path):
    ck = fabricate.write_base_checkpoint(tmp_path / "ck")
    data = fabricate.write_govreport_like(tmp_path / "d", 16, 4, 64)
    args = ["--set", f"model.path={ck}", "--set", f"data.path={data}", "--set", "mlperf.division=open",
            "--set", "data.seq_len=64", "--set", "hardware.device=cpu"]
    overrides = [a for a in args if a != "--set"]
    spec, _ = local.prepare("llama2_70b_lora", None, overrides, 1)  # the valid pair is accepted
    assert spec.model.num_layers == 1 and spec.mlperf.comparable is False
    shard = sorted(ck.glob("*.safetensors"))[0]
    shard.rename(tmp_path / "moved.safetensors")
    with pytest.raises(SpecError, match="shard .* named in the index is missing"):
        local.prepare("llama2_70b_lora", None, overrides, 1)
    (tmp_path / "moved.safetensors").rename(shard)
    cfg = json.loads((ck / "config.json").read_text())
    cfg["intermediate_size"] = 32
    (ck / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match=r"mlp\..*_proj.weight' has shape"):
        local.prepare("llama2_70b_lora", None, overrides, 1)


def test_every_run_logs_its_own_seed():
    seeds = {local.prepare("mini-lora", None, ["hardware.device=cpu"], 1)[0].train.seed for _ in range(3)}
    assert len(seeds) == 3
