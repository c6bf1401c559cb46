"""Bad input: a clear one-line error, exit code 2, nothing launched, nothing stored.

Three levels:

* unit tests of ``trainperf.core.spec`` (coercion, config layering, validation, derived quantities);
* in-process tests of ``trainperf.runner.local.prepare`` for extra dataset/checkpoint problems;
* the CLI as a user runs it, one fresh interpreter per case.

Every CLI invocation costs an interpreter plus a torch import (~2 s of CPU), so the module runs all
the invocations the selected tests need concurrently, once, in a module-scoped pool; each
parametrized test then checks its own result. None of the bad inputs may get as far as building the
mini-lora base checkpoint or generating a dataset.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch

from conftest import trainperf_cmd
from trainperf.data.tokens import TokenSplit, save_split
from trainperf.model.checkpoint import save_hf_checkpoint
from trainperf.model.llama import LlamaForCausalLM
from trainperf.core.spec import RunSpec, eval_interval_samples, set_value
from trainperf.core.resolve import load_config_file, parse_override, resolve_spec
from trainperf.core.errors import SpecError
from trainperf.core.layout import data_parallel_size, grad_accum_steps
from trainperf.runner.checks import validate_run
from trainperf.workloads.mini import SEQ, VOCAB, mini_lora_defaults, mini_model, mini_pretrain_defaults

# ---------------------------------------------------------------------------------------------
# Builders for inputs on disk


def make_checkpoint(dest: Path, **config_changes) -> Path:
    """A real HF checkpoint of the mini model, then ``config.json`` edited (value None deletes)."""
    cfg = mini_model()
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    save_hf_checkpoint({k: v.detach() for k, v in model.state_dict().items()}, cfg, str(dest))
    if config_changes:
        edit_config(dest, **config_changes)
    return dest


def edit_config(ckpt: Path, **changes) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (ckpt / "config.json").write_text(json.dumps(cfg))


def make_dataset(dest: Path, rows: int = 32, seq: int = SEQ, high: int = VOCAB,
                 splits=("train", "validation")) -> Path:
    g = torch.Generator().manual_seed(0)
    for split in splits:
        ids = torch.randint(0, high, (rows, seq), generator=g)
        save_split(TokenSplit(ids, torch.ones(rows, seq, dtype=torch.bool)), dest / f"{split}.safetensors")
    return dest


def garbage(path: Path, n: int = 256) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes((i * 37 + 11) % 256 for i in range(n)))


# ---------------------------------------------------------------------------------------------
# 1. Unit level: trainperf.core.spec


def _spec() -> RunSpec:
    return RunSpec(workload="unit")


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("train.max_steps", "12", 12),
        ("train.max_steps", 12.0, 12),  # YAML may give 12.0
        ("lora.rank", "8", 8),
        ("train.lr", "1e-3", 1e-3),
        ("train.lr", 2, 2.0),
        ("train.compile", "yes", True),
        ("train.compile", "TRUE", True),
        ("train.compile", "off", False),
        ("train.compile", "0", False),
        ("train.compile", 1, True),
        ("parallel.sp", False, False),
        ("lora.target_modules", "q_proj, v_proj,", ["q_proj", "v_proj"]),
        ("lora.target_modules", "o_proj", ["o_proj"]),
        ("lora.target_modules", ("gate_proj", "up_proj"), ["gate_proj", "up_proj"]),
        ("model.path", "none", None),
        ("model.path", "null", None),
        ("model.path", "", None),
        ("model.path", None, None),
        ("model.path", "/ckpt/dir", "/ckpt/dir"),
        ("data.path", "None", None),
        ("train.recompute", "full", "full"),
        ("mlperf.platform", 5, "5"),
    ],
)
def test_set_value_coerces(key, value, expected):
    spec = _spec()
    set_value(spec, key, value)
    section, name = key.split(".")
    got = getattr(getattr(spec, section), name)
    assert got == expected
    assert type(got) is type(expected)


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("train.max_steps", "1.5", ["train.max_steps", "integer", "'1.5'"]),
        ("train.max_steps", 2.5, ["train.max_steps", "integer"]),
        ("train.max_steps", True, ["train.max_steps", "integer"]),
        ("train.max_steps", "ten", ["train.max_steps", "integer", "'ten'"]),
        ("train.lr", "fast", ["train.lr", "number", "'fast'"]),
        ("train.lr", False, ["train.lr", "number"]),
        ("train.compile", "maybe", ["train.compile", "true or false", "'maybe'"]),
        ("train.compile", 2, ["train.compile", "true or false"]),
        ("lora.target_modules", 5, ["lora.target_modules", "list"]),
        ("train.recompute", {"a": 1}, ["train.recompute", "string"]),
        ("mlperf.platform", ["a"], ["mlperf.platform", "string"]),
        ("model.path", ["x"], ["model.path", "string"]),
        ("train.bogus", 1, ["train.bogus", "valid keys", "global_batch_size"]),
        ("bogus.key", 1, ["'bogus'", "valid sections", "train"]),
        ("nodot", 1, ["'nodot'", "section.key"]),
        ("train.lr", "nan", ["train.lr", "finite number", "'nan'"]),
        ("train.grad_clip", "inf", ["train.grad_clip", "finite number"]),
        ("hardware.host_mem_gib", float("nan"), ["hardware.host_mem_gib", "finite number"]),
    ],
)
def test_set_value_rejects(key, value, words):
    with pytest.raises(SpecError) as info:
        set_value(_spec(), key, value)
    msg = str(info.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg


def test_parse_override():
    assert parse_override("train.lr= 0.1 ") == ("train.lr", "0.1")
    assert parse_override("mlperf.platform=a=b") == ("mlperf.platform", "a=b")
    with pytest.raises(SpecError, match="train.lr.*section.key=value"):
        parse_override("train.lr")


CONFIG_YAML = """\
workload: ignored-here
train:
  lr: 0.1
  max_steps: 7
  compile: yes
model:
  path: null
lora:
  target_modules: [q_proj, v_proj]
eval:
  target: 2
"""

CONFIG_TOML = """\
workload = "ignored-here"

[train]
lr = 0.1
max_steps = 7
compile = true

[lora]
target_modules = ["q_proj", "v_proj"]

[eval]
target = 2
"""


@pytest.mark.parametrize("name, text", [("c.yaml", CONFIG_YAML), ("c.yml", CONFIG_YAML), ("c.toml", CONFIG_TOML)])
def test_config_file_layers_between_defaults_and_set(tmp_path, name, text):
    cfg = tmp_path / name
    cfg.write_text(text)
    base = mini_pretrain_defaults()
    spec = resolve_spec(base, str(cfg), ["train.lr=0.2", "lora.rank=4"])
    assert spec.workload == "mini-pretrain"
    assert spec.train.lr == 0.2  # --set beats the file
    assert spec.train.max_steps == 7  # the file beats the defaults
    assert spec.train.compile is True
    assert spec.lora.target_modules == ["q_proj", "v_proj"]
    assert spec.lora.rank == 4
    assert spec.eval.target == 2.0 and isinstance(spec.eval.target, float)
    assert spec.model.path is None
    assert spec.train.global_batch_size == base.train.global_batch_size  # untouched default
    assert spec.model.hidden_size == base.model.hidden_size
    # the workload's defaults are not mutated
    assert base.train.lr == mini_pretrain_defaults().train.lr
    assert base.train.max_steps == mini_pretrain_defaults().train.max_steps


def test_resolve_spec_without_config_or_overrides_is_a_copy():
    base = mini_lora_defaults()
    spec = resolve_spec(base, None, [])
    assert spec.to_dict() == base.to_dict()
    spec.lora.target_modules.append("o_proj")
    assert base.lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]


def test_spec_round_trips_through_dict():
    spec = resolve_spec(mini_lora_defaults(), None, ["train.lr=0.5", "model.path=/x"])
    again = RunSpec.from_dict(json.loads(spec.to_json()))
    assert again.to_dict() == spec.to_dict()


@pytest.mark.parametrize(
    "name, text, words",
    [
        ("bad.yaml", "train:\n  lr: [1\n  x: : :\n", ["bad.yaml", "could not be parsed"]),
        ("bad.toml", "[train\nlr = \n", ["bad.toml", "could not be parsed"]),
        ("list.yaml", "- 1\n- 2\n", ["list.yaml", "mapping"]),
        ("c.ini", "[train]\nlr=1\n", ["c.ini", ".yaml", ".toml"]),
    ],
)
def test_load_config_file_rejects(tmp_path, name, text, words):
    (tmp_path / name).write_text(text)
    with pytest.raises(SpecError) as info:
        load_config_file(str(tmp_path / name))
    msg = str(info.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg


@pytest.mark.parametrize(
    "name, text, words",
    [
        ("unk.yaml", "bogus:\n  x: 1\n", ["unknown section 'bogus'", "train"]),
        ("unk.toml", "[bogus]\nx = 1\n", ["unknown section 'bogus'", "train"]),
        ("sec.yaml", "train: 5\n", ["section 'train'", "mapping"]),
        ("key.yaml", "train:\n  bogus: 1\n", ["train.bogus", "valid keys"]),
        ("type.toml", '[train]\nlr = "fast"\n', ["train.lr", "number", "'fast'"]),
    ],
)
def test_resolve_spec_rejects_config_contents(tmp_path, name, text, words):
    (tmp_path / name).write_text(text)
    with pytest.raises(SpecError) as info:
        resolve_spec(mini_pretrain_defaults(), str(tmp_path / name), [])
    for w in words:
        assert w in str(info.value), str(info.value)


def test_resolve_spec_rejects_missing_config(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        resolve_spec(mini_pretrain_defaults(), str(tmp_path / "missing.yaml"), [])


@pytest.mark.parametrize("world, dp_replicate, dp_shard", [(1, 1, 1), (2, 1, 2), (4, 2, 2), (8, 2, 4)])
def test_validate_fills_dp_shard_from_world_size(world, dp_replicate, dp_shard):
    spec = mini_pretrain_defaults()
    spec.parallel.dp_replicate = dp_replicate
    spec.train.micro_batch_size = 1
    assert spec.parallel.dp_shard == -1
    validate_run(spec, world)
    assert spec.parallel.dp_shard == dp_shard
    assert data_parallel_size(spec.parallel) == world


def test_grad_accum_steps():
    spec = mini_pretrain_defaults()
    spec.train.global_batch_size, spec.train.micro_batch_size = 16, 2
    validate_run(spec, 2)
    assert grad_accum_steps(spec) == 4  # 16 / (dp 2 x micro 2)
    spec = mini_pretrain_defaults()  # GBS 16, micro 8, one process
    validate_run(spec, 1)
    assert grad_accum_steps(spec) == 2


@pytest.mark.parametrize("every, gbs, expected", [(384, 10, 390), (256, 16, 256), (1, 16, 16), (257, 16, 272)])
def test_eval_interval_rounds_up_to_gbs_multiple(every, gbs, expected):
    spec = _spec()
    spec.eval.every_samples, spec.train.global_batch_size = every, gbs
    assert eval_interval_samples(spec) == expected


@pytest.mark.parametrize("override, words", [
    ("train.weight_decay=-1", ["train.weight_decay=-1.0", ">= 0"]),
    ("train.beta1=2", ["train.beta1=2.0", "[0, 1)"]),
    ("train.beta2=-0.1", ["train.beta2=-0.1", "[0, 1)"]),
    ("train.eps=-1", ["train.eps=-1.0", "> 0"]),
    ("train.min_lr_ratio=5", ["train.min_lr_ratio=5.0", "[0, 1]"]),
    ("train.log_every=0", ["train.log_every=0", ">= 1"]),
    ("train.log_every=-1", ["train.log_every=-1", ">= 1"]),
    ("eval.batch_size=0", ["eval.batch_size=0", ">= 1"]),
    ("model.rope_theta=-1", ["model.rope_theta=-1.0", "> 0"]),
    ("model.rms_norm_eps=-1", ["model.rms_norm_eps=-1.0", "> 0"]),
    ("parallel.pp_stages_per_rank=-1", ["parallel.pp_stages_per_rank=-1", ">= 0"]),
    ("hardware.peak_tflops=-5", ["hardware.peak_tflops=-5.0", ">= 0"]),
    ("hardware.gpu=h999", ["hardware.gpu='h999'", "h200", "peak_tflops"]),
    ("data.eval_samples=-1", ["data.eval_samples=-1", ">= 0"]),
    ("model.num_heads=7", ["model.hidden_size=64", "model.num_heads=7"]),
    ("data.seq_len=100000", ["data.seq_len=100000", "max_position_embeddings"]),
])
def test_resolve_spec_rejects_values_out_of_range(override, words):
    """What needs no world size fails in resolve_spec already, so `plan`, `tune` and sweeps (which price
    or queue specs without validate()) refuse it too, in one line."""
    with pytest.raises(SpecError) as info:
        resolve_spec(mini_pretrain_defaults(), None, [override])
    msg = str(info.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg


def test_a_gpu_name_is_only_checked_when_its_peak_is_looked_up():
    assert resolve_spec(mini_pretrain_defaults(), None, ["hardware.gpu=rtx4090", "hardware.peak_tflops=165"])


def test_a_checkpoint_may_raise_max_position_embeddings_before_its_config_is_applied():
    """validate before model.path's config.json is read cannot know its context length; after, it does."""
    spec = resolve_spec(mini_pretrain_defaults(), None, ["model.path=/some/ck", "data.seq_len=512"])
    validate_run(spec, 1, before_checkpoint=True)
    with pytest.raises(SpecError, match="data.seq_len=512 exceeds model.max_position_embeddings=256"):
        validate_run(spec, 1)


def test_lora_alpha_must_be_positive_only_when_lora_is_on():
    with pytest.raises(SpecError, match=r"lora.alpha=0.0: must be > 0"):
        resolve_spec(mini_lora_defaults(), None, ["lora.alpha=0"])
    assert resolve_spec(mini_pretrain_defaults(), None, ["lora.alpha=0"]).lora.alpha == 0  # no adapters: unused


@pytest.mark.parametrize(
    "overrides, world, words",
    [
        (["train.global_batch_size=12"], 1, ["train.global_batch_size=12", "multiple of 8"]),
        (["train.global_batch_size=24"], 2, ["data-parallel size 2", "multiple of 16"]),
        (["model.num_heads=3"], 1, ["model.hidden_size=64", "model.num_heads=3"]),
        (["model.num_kv_heads=3"], 1, ["model.num_heads=4", "model.num_kv_heads=3"]),
        (["model.num_heads=0"], 1, ["model.num_heads=0", ">= 1"]),
        (["train.recompute=bogus"], 1, ["'bogus'", "none, selective, full"]),
        (["parallel.tp=3"], 3, ["model.num_heads=4", "parallel.tp=3"]),
        (["parallel.tp=2", "model.num_kv_heads=1"], 2, ["model.num_kv_heads=1", "parallel.tp=2"]),
        (["parallel.tp=2", "parallel.sp=true", "data.seq_len=63"], 2, ["data.seq_len=63", "parallel.tp=2"]),
        (["parallel.sp=true"], 1, ["parallel.sp=true", "tp > 1"]),
        (["parallel.cp=2", "data.seq_len=66"], 2, ["data.seq_len=66", "2 x parallel.cp = 4"]),
        (["parallel.cp=2", "hardware.device=cpu"], 2, ["parallel.cp > 1", "CUDA", "cp=1 on CPU"]),
        (["parallel.cp=2", "hardware.dtype=fp32"], 2, ["hardware.dtype=fp32", "bf16"]),
        (["parallel.pp=2", "model.num_layers=3"], 2, ["model.num_layers=3", "2 pipeline stages"]),
        (["parallel.pp=2", "train.micro_batch_size=16"], 2, ["1 micro-batches", "fewer than the 2 pipeline stages"]),
        (["parallel.pp=2", "parallel.pp_schedule=Interleaved1F1B", "parallel.pp_stages_per_rank=1"], 2,
         ["Interleaved1F1B", "pp_stages_per_rank >= 2"]),
        (["parallel.pp=2", "parallel.pp_schedule=ZeroBubble"], 2, ["'ZeroBubble'", "GPipe, 1F1B, Interleaved1F1B"]),
        (["parallel.dp_shard=3"], 2, ["dp_shard=3", "world size is 2"]),
        (["parallel.dp_shard=0"], 1, ["parallel.dp_shard=0"]),
        (["parallel.dp_replicate=3"], 2, ["dp_replicate", "2"]),
        (["data.seq_len=512"], 1, ["data.seq_len=512", "max_position_embeddings=256"]),
        (["lora.rank=4", "lora.target_modules=q_proj,bogus"], 1, ["lora.target_modules", "q_proj, k_proj"]),
        (["hardware.device=tpu"], 1, ["hardware.device='tpu'"]),
        (["hardware.fp8=e5m2"], 1, ["hardware.fp8='e5m2'", "none, tensorwise, rowwise"]),
        (["hardware.fp8=tensorwise", "parallel.tp=2"], 2, ["hardware.fp8=tensorwise", "parallel.tp=2", "tp=1"]),
        (["hardware.fp8=tensorwise", "model.hidden_size=72", "model.num_heads=4", "model.num_kv_heads=4"], 1,
         ["hardware.fp8=tensorwise", "hidden_size=72", "divisible by 16"]),
        (["train.recompute_layers=1"], 1, ["train.recompute_layers=1", "train.recompute=full or selective"]),
        (["train.recompute=full", "train.recompute_layers=99"], 1, ["train.recompute_layers=99", "-1 (every layer)"]),
        (["train.recompute=full", "train.recompute_layers=1", "train.recompute_others=full"], 1,
         ["train.recompute_others='full'", "none, selective"]),
        (["train.recompute=full", "train.recompute_others=selective"], 1,
         ["train.recompute_others=selective", "train.recompute_layers=0..layers per stage"]),
        (["parallel.cp=2", "parallel.dp_shard=1", "hardware.device=cuda", "train.compile=true"], 2,
         ["train.compile=true", "parallel.cp=2", "parallel.cp=1"]),
        (["train.offload_layers=99"], 1, ["train.offload_layers=99", "0..2"]),
        (["hardware.host_mem_gib=-1"], 1, ["hardware.host_mem_gib=-1", ">= 0"]),
        (["train.recompute=full", "train.offload_layers=1", "train.recompute_layers=2"], 1,
         ["train.recompute_layers=2", "0..1", "after the 1 offloaded ones"]),
        (["hardware.frozen_dtype=fp8"], 1, ["hardware.frozen_dtype=fp8", "lora.rank > 0", "hardware.fp8=tensorwise"]),
        (["hardware.frozen_dtype=e5m2"], 1, ["hardware.frozen_dtype='e5m2'", "auto, fp32, bf16, fp8"]),
    ],
)
def test_validate_rejects(overrides, world, words):
    with pytest.raises(SpecError) as info:  # a misspelt named choice already fails in resolve_spec
        validate_run(resolve_spec(mini_pretrain_defaults(), None, overrides), world)
    msg = str(info.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg


@pytest.mark.parametrize("section, key, valid", [
    ("hardware", "fp8", "none, tensorwise, rowwise"),
    ("hardware", "frozen_dtype", "auto, fp32, bf16, fp8"),
    ("train", "recompute", "none, selective, full"),
    ("parallel", "pp_schedule", "GPipe, 1F1B, Interleaved1F1B"),
])
def test_named_choices_checked_by_resolve_spec_and_validate(section, key, valid):
    """One check (specs.check_choices) behind both: resolve_spec, which plan and tune use without
    validate_run(), and validate, for a spec edited after it was resolved."""
    with pytest.raises(SpecError) as by_resolve:
        resolve_spec(mini_pretrain_defaults(), None, [f"{section}.{key}=bogus"])
    spec = mini_pretrain_defaults()
    setattr(getattr(spec, section), key, "bogus")
    with pytest.raises(SpecError) as by_validate:
        validate_run(spec, 1)
    assert str(by_resolve.value) == str(by_validate.value) == f"{section}.{key}='bogus': valid values are {valid}"


# ---------------------------------------------------------------------------------------------
# In-process: prepare() rejects more dataset / checkpoint problems before anything starts.


def _prepare_case(tmp: Path, kind: str) -> tuple[str, list[str]]:
    if kind == "ckpt-no-config":
        ck = make_checkpoint(tmp / "ck")
        (ck / "config.json").unlink()
        return "mini-lora", [f"model.path={ck}"]
    if kind == "ckpt-no-safetensors":
        ck = make_checkpoint(tmp / "ck")
        (ck / "model.safetensors").unlink()
        return "mini-lora", [f"model.path={ck}"]
    if kind == "ckpt-missing-shard":
        ck = make_checkpoint(tmp / "ck")
        (ck / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "model-2.safetensors"}}))
        return "mini-lora", [f"model.path={ck}"]
    if kind == "ckpt-config-lacks-key":
        return "mini-lora", [f"model.path={make_checkpoint(tmp / 'ck', num_hidden_layers=None)}"]
    if kind == "ckpt-more-layers":
        return "mini-lora", [f"model.path={make_checkpoint(tmp / 'ck', num_hidden_layers=3)}"]
    if kind == "ckpt-wider-mlp":
        return "mini-lora", [f"model.path={make_checkpoint(tmp / 'ck', intermediate_size=200)}"]
    if kind == "ckpt-tied":
        return "mini-lora", [f"model.path={make_checkpoint(tmp / 'ck', tie_word_embeddings=True)}"]
    if kind == "data-no-validation":
        return "mini-pretrain", [f"data.path={make_dataset(tmp / 'ds', splits=('train',))}", "eval.target=1"]
    if kind == "data-seq-mismatch":
        return "mini-pretrain", [f"data.path={make_dataset(tmp / 'ds', seq=32)}", "eval.target=1"]
    if kind == "data-too-few-rows":
        return "mini-pretrain", [f"data.path={make_dataset(tmp / 'ds', rows=4)}", "eval.target=1"]
    if kind == "data-wrong-tensors":
        from safetensors.torch import save_file

        (tmp / "ds").mkdir()
        for split in ("train", "validation"):
            save_file({"tokens": torch.zeros(32, SEQ, dtype=torch.int32)}, str(tmp / "ds" / f"{split}.safetensors"))
        return "mini-pretrain", [f"data.path={tmp / 'ds'}", "eval.target=1"]
    if kind == "data-no-target":
        return "mini-pretrain", [f"data.path={make_dataset(tmp / 'ds')}"]
    if kind == "data-float-ids":
        from safetensors.torch import save_file

        (tmp / "ds").mkdir()
        for split in ("train", "validation"):
            save_file({"input_ids": torch.zeros(32, SEQ), "loss_mask": torch.ones(32, SEQ, dtype=torch.bool)},
                      str(tmp / "ds" / f"{split}.safetensors"))
        return "mini-pretrain", [f"data.path={tmp / 'ds'}", "eval.target=1"]
    if kind == "ckpt-contradicted":
        return "mini-lora", [f"model.path={make_checkpoint(tmp / 'ck')}", "model.num_layers=3"]
    if kind == "generated-no-eval-rows":
        return "mini-lora", ["data.eval_samples=0"]
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind, words",
    [
        ("ckpt-no-config", ["model.path", "no config.json"]),
        ("ckpt-no-safetensors", ["model.path", "no *.safetensors"]),
        ("ckpt-missing-shard", ["model.path", "model-2.safetensors", "missing"]),
        ("ckpt-config-lacks-key", ["config.json lacks", "num_hidden_layers"]),
        ("ckpt-more-layers", ["lacks tensor", "model.layers.2."]),
        ("ckpt-wider-mlp", ["mlp.", "[176, 64]", "[200, 64]"]),
        ("ckpt-tied", ["tie_word_embeddings"]),
        ("data-no-validation", ["data.path", "no validation.safetensors"]),
        ("data-seq-mismatch", ["data.path", "32 tokens", "data.seq_len=64"]),
        ("data-too-few-rows", ["data.path", "4 training rows", "(16)"]),
        ("data-wrong-tensors", ["data.path", "input_ids and loss_mask", "tokens"]),
        ("data-no-target", ["eval.target"]),
        ("data-float-ids", ["data.path", "input_ids are F32", "integers"]),
        ("ckpt-contradicted", ["model.num_layers=3 contradicts", "num_hidden_layers=2", "drop the model.num_layers"]),
        ("generated-no-eval-rows", ["data.eval_samples=0", "mini-lora generates", "at least 1 row"]),
    ],
)
def test_prepare_rejects(tmp_path, kind, words):
    from trainperf.runner.local import prepare

    workload, overrides = _prepare_case(tmp_path, kind)
    with pytest.raises(SpecError) as info:
        prepare(workload, None, overrides, 1)
    msg = str(info.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg


def test_prepare_accepts_good_checkpoint_and_dataset(tmp_path):
    """The positive control for the checkpoint/dataset cases: the same builders, unedited, pass."""
    from trainperf.runner.local import prepare

    ck, ds = make_checkpoint(tmp_path / "ck"), make_dataset(tmp_path / "ds")
    spec, _ = prepare("mini-lora", None, [f"model.path={ck}", f"data.path={ds}", "eval.target=1.5"], 1)
    assert spec.model.path == str(ck) and spec.data.path == str(ds)
    assert spec.model.hidden_size == 64 and spec.parallel.dp_shard == 1
    assert spec.train.seed >= 0  # -1 was replaced by a drawn seed


# ---------------------------------------------------------------------------------------------
# 2-4. The CLI, one fresh interpreter per invocation, all run concurrently once per module.


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]  # "{in}" is replaced by the case's input directory
    expect: tuple[str, ...] = ()  # substrings of the error line (or of stdout for non-error cases)
    setup: Callable[[Path], None] | None = None  # builds inputs in the input directory
    bug: str | None = None  # a known bug: the test is xfail(strict=True) with this reason


def _ckpt_garbage(d: Path) -> None:
    ck = make_checkpoint(d / "ck")
    garbage(ck / "model.safetensors")


def _ckpt_bad_json(d: Path) -> None:
    ck = make_checkpoint(d / "ck")
    (ck / "config.json").write_text('{"hidden_size": 64,')


def _ckpt_config_not_object(d: Path) -> None:
    ck = make_checkpoint(d / "ck")
    (ck / "config.json").write_text("[1, 2]")


def _ckpt_index_not_mapping(d: Path) -> None:
    ck = make_checkpoint(d / "ck")
    (ck / "model.safetensors.index.json").write_text(json.dumps({"weight_map": ["model.safetensors"]}))


def _data_garbage(d: Path) -> None:
    garbage(d / "ds" / "train.safetensors")
    garbage(d / "ds" / "validation.safetensors")


def _configs(d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "unk.yaml").write_text("bogus:\n  x: 1\n")
    (d / "bad.yaml").write_text("train:\n  lr: [1\n  x: : :\n")
    (d / "bad.toml").write_text("[train\nlr = \n")
    (d / "fp8.yaml").write_text("hardware:\n  fp8: bogus\n")


BAD = [
    Case("unknown-workload", ("run", "nope"), ("'nope'", "mini-lora", "mini-pretrain")),
    Case("unknown-key", ("run", "mini-pretrain", "--set", "train.bogus=1"),
         ("train.bogus", "valid keys", "global_batch_size")),
    Case("unknown-section", ("run", "mini-pretrain", "--set", "foo.bar=1"), ("'foo'", "valid sections", "train")),
    Case("wrong-type-int", ("run", "mini-pretrain", "--set", "train.global_batch_size=abc"),
         ("train.global_batch_size", "integer", "'abc'")),
    Case("wrong-type-float", ("run", "mini-pretrain", "--set", "train.lr=fast"), ("train.lr", "number", "'fast'")),
    Case("unknown-optimizer", ("run", "mini-pretrain", "--set", "train.optimizer=sgd"),
         ("train.optimizer='sgd'", "adamw, adamw8bit")),
    Case("closed-8bit-optimizer", ("run", "llama31_8b", "--set", "train.optimizer=adamw8bit"),
         ("train.optimizer='adamw8bit'", "closed division", "mlperf.division=open")),
    Case("wrong-type-bool", ("run", "mini-pretrain", "--set", "parallel.sp=maybe"),
         ("parallel.sp", "true or false", "'maybe'")),
    Case("gbs-not-divisible", ("run", "mini-pretrain", "--set", "train.global_batch_size=12"),
         ("train.global_batch_size=12", "micro_batch_size 8", "multiple of 8")),
    Case("gbs-not-divisible-dp", ("run", "mini-pretrain", "--nproc-per-node", "2", "--set", "train.global_batch_size=24"),
         ("train.global_batch_size=24", "data-parallel size 2", "multiple of 16")),
    Case("hidden-not-divisible-by-heads", ("run", "mini-pretrain", "--set", "model.num_heads=3"),
         ("model.hidden_size=64", "model.num_heads=3")),
    Case("heads-not-divisible-by-kv-heads", ("run", "mini-lora", "--set", "model.num_kv_heads=3"),
         ("model.num_heads=4", "model.num_kv_heads=3")),
    Case("checkpoint-missing", ("run", "mini-lora", "--set", "model.path={in}/no-such-ckpt"),
         ("model.path", "no-such-ckpt", "not a directory")),
    Case("checkpoint-corrupt-safetensors", ("run", "mini-lora", "--set", "model.path={in}/ck"),
         ("model.path", "model.safetensors", "not a readable safetensors"), _ckpt_garbage),
    Case("checkpoint-corrupt-config", ("run", "mini-lora", "--set", "model.path={in}/ck"),
         ("model.path", "config.json", "not valid JSON"), _ckpt_bad_json),
    Case("checkpoint-shape-mismatch", ("run", "mini-lora", "--set", "model.path={in}/ck"),
         ("model.embed_tokens.weight", "[64, 64]", "[64, 128]", "config.json"),
         lambda d: make_checkpoint(d / "ck", hidden_size=128)),
    # control for the checkpoint cases: the same builder, unedited, passes the checkpoint checks
    Case("checkpoint-good-then-dataset-missing",
         ("run", "mini-lora", "--set", "model.path={in}/ck", "--set", "data.path={in}/no-such-data"),
         ("data.path", "no-such-data", "not a directory"), lambda d: make_checkpoint(d / "ck")),
    Case("dataset-missing", ("run", "mini-pretrain", "--set", "data.path=/nonexistent"),
         ("data.path", "'/nonexistent'", "not a directory")),
    Case("dataset-corrupt", ("run", "mini-pretrain", "--set", "data.path={in}/ds"),
         ("data.path", "train.safetensors", "not a readable safetensors"), _data_garbage),
    Case("layout-tp-heads", ("run", "mini-pretrain", "--nproc-per-node", "2", "--set", "parallel.tp=2",
                             "--set", "model.num_kv_heads=1"), ("model.num_kv_heads=1", "parallel.tp=2")),
    Case("layout-cp-cpu", ("run", "mini-pretrain", "--nproc-per-node", "2", "--set", "parallel.cp=2",
                           "--set", "hardware.device=cpu"), ("parallel.cp > 1", "CUDA")),
    Case("layout-pp-layers", ("run", "mini-pretrain", "--nproc-per-node", "2", "--set", "parallel.pp=2",
                              "--set", "model.num_layers=3"), ("model.num_layers=3", "pipeline stages")),
    Case("layout-pp-micro", ("run", "mini-pretrain", "--nproc-per-node", "2", "--set", "parallel.pp=2",
                             "--set", "train.micro_batch_size=16"), ("micro-batches", "pipeline stages")),
    Case("layout-sp-without-tp", ("run", "mini-pretrain", "--set", "parallel.sp=true"), ("parallel.sp=true", "tp > 1")),
    Case("layout-product-not-world", ("run", "mini-pretrain", "--nproc-per-node", "2", "--set", "parallel.dp_shard=3"),
         ("dp_shard=3", "= 3 processes", "world size is 2")),
    Case("config-unknown-section", ("run", "mini-pretrain", "--config", "{in}/unk.yaml"),
         ("unk.yaml", "unknown section 'bogus'", "train"), _configs),
    Case("config-unparsable-yaml", ("run", "mini-pretrain", "--config", "{in}/bad.yaml"),
         ("bad.yaml", "could not be parsed"), _configs),
    Case("config-unparsable-toml", ("run", "mini-pretrain", "--config", "{in}/bad.toml"),
         ("bad.toml", "could not be parsed"), _configs),
    Case("config-missing", ("run", "mini-pretrain", "--config", "{in}/missing.yaml"), ("missing.yaml", "does not exist")),
    Case("set-without-equals", ("run", "mini-pretrain", "--set", "train.lr"), ("train.lr", "section.key=value")),
    Case("bad-recompute", ("run", "mini-pretrain", "--set", "train.recompute=sometimes"),
         ("train.recompute='sometimes'", "none, selective, full")),
    Case("nproc-zero", ("run", "mini-pretrain", "--nproc-per-node", "0"), ("--nproc-per-node=0", ">= 1")),
    # plan and tune price a spec without validate(): resolve_spec's named-choice check stops them
    Case("plan-bad-fp8", ("plan", "mini-lora", "--gpus", "2", "--set", "hardware.fp8=bogus"),
         ("hardware.fp8='bogus'", "valid values are none, tensorwise, rowwise")),
    Case("plan-bad-frozen-dtype", ("plan", "mini-lora", "--gpus", "2", "--set", "hardware.frozen_dtype=bogus"),
         ("hardware.frozen_dtype='bogus'", "auto, fp32, bf16, fp8")),
    Case("plan-bad-recompute", ("plan", "mini-lora", "--gpus", "2", "--set", "train.recompute=bogus"),
         ("train.recompute='bogus'", "none, selective, full")),
    Case("plan-bad-fp8-config", ("plan", "mini-lora", "--gpus", "2", "--config", "{in}/fp8.yaml"),
         ("hardware.fp8='bogus'", "none, tensorwise, rowwise"), _configs),
    Case("tune-bad-recompute", ("tune", "mini-lora", "--gpus", "1", "--set", "train.recompute=bogus"),
         ("train.recompute='bogus'", "none, selective, full")),
    Case("nproc-not-int", ("run", "mini-pretrain", "--nproc-per-node", "two"), ("--nproc-per-node", "'two'")),
    Case("unknown-command", ("bogus",), ("'bogus'", "run", "workloads")),
    # once bugs, now fixed
    Case("checkpoint-config-non-numeric", ("run", "mini-lora", "--set", "model.path={in}/ck"),
         ("model.path", "hidden_size"), lambda d: make_checkpoint(d / "ck", hidden_size="abc")),
    Case("checkpoint-config-zero-heads", ("run", "mini-lora", "--set", "model.path={in}/ck"),
         ("num_attention_heads",), lambda d: make_checkpoint(d / "ck", num_attention_heads=0)),
    Case("checkpoint-config-not-object", ("run", "mini-lora", "--set", "model.path={in}/ck"),
         ("model.path", "config.json"), _ckpt_config_not_object),
    Case("checkpoint-index-not-mapping", ("run", "mini-lora", "--set", "model.path={in}/ck"),
         ("model.path", "index"), _ckpt_index_not_mapping),
    Case("dataset-train-samples-zero", ("run", "mini-pretrain", "--set", "data.train_samples=0"),
         ("data.train_samples",), None),
    Case("dataset-token-ids-outside-vocab",
         ("run", "mini-pretrain", "--set", "data.path={in}/ds", "--set", "eval.target=1.0",
          "--set", "train.max_steps=2"),
         ("data.path", "vocabulary"), lambda d: make_dataset(d / "ds", high=1000)),
]

def _store_garbage(d: Path) -> None:
    garbage(d / "g.db")


def _store_under_a_file(d: Path) -> None:
    (d / "afile").write_text("x")


def _store_damaged_page(d: Path) -> None:
    from trainperf.store.db import Store

    store = Store(d / "damaged.db")
    for i in range(30):
        store.create_run(f"r{i}", "mini", {"x": "y" * 2000}, "dp", 1, "open", False, 1.0, "/tmp", pid=1)
    store.close()  # the last connection folds the WAL into the file
    with open(d / "damaged.db", "r+b") as fh:  # zero the second page: the open's checks pass, a query does not
        fh.seek(4096)
        fh.write(bytes(4096))


def _empty_store(path: Path) -> None:
    from trainperf.store.db import Store

    Store(path).close()


STORE_BAD = [
    Case("report-missing-store", ("report", "--db", "{in}/typo.db"), ("no results store at", "typo.db", "--db")),
    Case("sweep-status-missing-store", ("sweep", "status", "--db", "{in}/typo.db"), ("no results store at", "typo.db")),
    Case("store-garbage-run", ("run", "mini-pretrain", "--db", "{in}/g.db"), ("g.db", "not a usable SQLite database"),
         _store_garbage),
    Case("store-garbage-trace", ("trace", "mini-pretrain", "--db", "{in}/g.db"), ("g.db", "not a usable SQLite"),
         _store_garbage),
    Case("store-garbage-preflight", ("preflight", "--device", "cpu", "--quick", "--db", "{in}/g.db"),
         ("g.db", "not a usable SQLite"), _store_garbage),
    Case("store-under-a-file", ("plan", "mini-lora", "--gpus", "1", "--db", "{in}/afile/sub/t.db"),
         ("cannot create its folder", "--db"),
         _store_under_a_file),
    Case("store-damaged-page", ("report", "--db", "{in}/damaged.db"), ("damaged.db", "is damaged", "malformed"),
         _store_damaged_page),
    Case("report-negative-limit", ("report", "--limit", "-5"), ("--limit -5", ">= 1")),
    Case("report-html-missing-folder", ("report", "--html", "{in}/nodir/r.html", "--db", "{in}/e.db"),
         ("--html", "nodir", "does not exist"), lambda d: _empty_store(d / "e.db")),
]

JSON_BAD = [
    Case("json-unknown-workload", ("run", "nope", "--json"), ("'nope'", "mini-pretrain")),
    Case("json-wrong-type", ("run", "mini-pretrain", "--json", "--set", "train.lr=fast"), ("train.lr", "'fast'")),
    Case("json-unparsable-config", ("run", "mini-pretrain", "--json", "--config", "{in}/bad.yaml"),
         ("bad.yaml", "could not be parsed"), _configs),
    Case("json-argparse-error", ("run", "mini-pretrain", "--json", "--nproc-per-node", "two"),
         ("--nproc-per-node", "'two'"), None),
    Case("json-plan-bad-fp8", ("plan", "mini-lora", "--gpus", "2", "--json", "--set", "hardware.fp8=bogus"),
         ("hardware.fp8='bogus'", "none, tensorwise, rowwise")),
]

OTHER = [
    Case("workloads-json", ("workloads", "--json")),
    Case("run-help", ("run", "--help")),
    Case("report-json-empty", ("report", "--json", "--db", "{in}/empty.db"), (), lambda d: _empty_store(d / "empty.db")),
    Case("plan-good-fp8", ("plan", "mini-lora", "--gpus", "2", "--json", "--set", "hardware.fp8=tensorwise")),
]

CASES = {c.id: c for c in BAD + STORE_BAD + JSON_BAD + OTHER}
assert len(CASES) == len(BAD) + len(STORE_BAD) + len(JSON_BAD) + len(OTHER), "duplicate case ids"


@dataclass
class Result:
    proc: subprocess.CompletedProcess
    tmp: Path  # cwd of the invocation; --db tmp/t.db, --out tmp/runs, inputs under tmp/in


def _invoke(case: Case, tmp: Path) -> Result:
    inputs = tmp / "in"
    inputs.mkdir()
    if case.setup:
        case.setup(inputs)
    args = [a.replace("{in}", str(inputs)) for a in case.args]
    if case.id != "unknown-command" and "--help" not in args and "--db" not in args:
        args += ["--db", str(tmp / "t.db")]
        if args[0] == "run":
            args += ["--out", str(tmp / "runs")]
    env = dict(os.environ)
    env.pop("CI", None)
    for k in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "SLURM_NTASKS", "SLURM_PROCID"):
        env.pop(k, None)  # never look like one rank of an external launcher
    proc = subprocess.run(trainperf_cmd(*args), cwd=tmp, env=env, capture_output=True, text=True, timeout=180)
    return Result(proc, tmp)


@pytest.fixture(scope="module")
def cli(request, tmp_path_factory) -> dict[str, Future]:
    """Start every invocation the selected tests of this module need, concurrently; id -> Future[Result]."""
    wanted = []
    for item in request.session.items:
        cs = getattr(item, "callspec", None)
        if cs is not None and item.module is request.module and cs.params.get("case_id") in CASES:
            if cs.params["case_id"] not in wanted:
                wanted.append(cs.params["case_id"])
    workers = max(2, min(8, os.cpu_count() or 2))
    pool = ThreadPoolExecutor(max_workers=workers)
    futures = {}
    # the slowest (it launches a run) first, so it overlaps with the rest
    wanted.sort(key=lambda cid: cid != "dataset-token-ids-outside-vocab")
    for cid in wanted:
        futures[cid] = pool.submit(_invoke, CASES[cid], tmp_path_factory.mktemp(cid))
    yield futures
    pool.shutdown(wait=True)


def _params(cases: list[Case]):
    return [pytest.param(c.id, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=c.bug)] if c.bug else [])
            for c in cases]


def _diag(p: subprocess.CompletedProcess) -> str:
    return f"exit {p.returncode}\n--- stdout ---\n{p.stdout[-3000:]}\n--- stderr ---\n{p.stderr[-3000:]}"


def assert_one_line_error(p: subprocess.CompletedProcess, expect: tuple[str, ...]) -> str:
    assert p.returncode == 2, _diag(p)
    assert "Traceback" not in p.stderr, _diag(p)
    lines = p.stderr.strip("\n").splitlines()
    assert len(lines) == 1, _diag(p)
    line = lines[0]
    assert line.startswith("trainperf: error: "), _diag(p)
    assert len(line) > len("trainperf: error: ") + 10, line
    for s in expect:
        assert s in line, f"{s!r} not in {line!r}"
    return line


def assert_nothing_written(tmp: Path) -> None:
    db = tmp / "t.db"
    if db.exists():
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
    assert not (tmp / "runs").exists(), sorted(p.name for p in (tmp / "runs").iterdir())
    # nothing else either (no default ./trainperf.db, ./runs, ...): only the inputs and maybe an empty store
    extra = sorted(p.name for p in tmp.iterdir() if p.name != "in" and not p.name.startswith("t.db"))
    assert extra == [], extra


@pytest.mark.parametrize("case_id", _params(BAD))
def test_cli_bad_input(cli, case_id):
    case = CASES[case_id]
    res = cli[case_id].result()
    assert_one_line_error(res.proc, case.expect)
    assert res.proc.stdout.strip() == "", _diag(res.proc)
    assert_nothing_written(res.tmp)


@pytest.mark.parametrize("case_id", _params(STORE_BAD))
def test_cli_unusable_store(cli, case_id):
    """A --db that cannot hold results (garbage, under a file, a damaged page) or a report that cannot be
    written: one line, before any run, trace or preflight work (no run folder, nothing measured)."""
    res = cli[case_id].result()
    assert_one_line_error(res.proc, CASES[case_id].expect)
    assert res.proc.stdout.strip() == "", _diag(res.proc)
    assert_nothing_written(res.tmp)
    assert not (res.tmp / "in" / "typo.db").exists()


def test_run_and_trace_check_the_store_before_preparing_data(tmp_path, monkeypatch):
    """`prepare` may build a checkpoint and datasets (mini-lora: seconds; a real one: minutes): a bad
    --db must be refused before it."""
    from trainperf import cli as trainperf_cli
    from trainperf.runner import local

    def prepare(*args, **kwargs):
        raise AssertionError("prepare ran before the store was checked")

    monkeypatch.setattr(local, "prepare", prepare)
    garbage(tmp_path / "g.db")
    for command in (["run", "mini-lora"], ["trace", "mini-lora", "--out", str(tmp_path / "tr")]):
        assert trainperf_cli.main([*command, "--db", str(tmp_path / "g.db")]) == 2, command


@pytest.mark.parametrize("case_id", ["checkpoint-good-then-dataset-missing"])
def test_cli_checkpoint_control_gets_past_model_path(cli, case_id):
    """The control case fails on data.path, i.e. after the unedited checkpoint was accepted, so the
    checkpoint cases above fail because of their edits, not because of the builder."""
    line = cli[case_id].result().proc.stderr
    assert line.startswith("trainperf: error: data.path "), line
    assert "model.path" not in line, line


@pytest.mark.parametrize("case_id", _params(JSON_BAD))
def test_cli_json_bad_input(cli, case_id):
    case = CASES[case_id]
    res = cli[case_id].result()
    p = res.proc
    assert p.returncode == 2, _diag(p)
    try:
        obj = json.loads(p.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"stdout is not one JSON object\n{_diag(p)}")
    assert isinstance(obj, dict) and isinstance(obj.get("error"), str), obj
    for s in case.expect:
        assert s in obj["error"], obj
    assert obj.get("exit_code", 2) == 2, obj
    line = assert_one_line_error(p, case.expect)  # the human line still goes to stderr
    assert line == f"trainperf: error: {obj['error']}"
    assert_nothing_written(res.tmp)


@pytest.mark.parametrize("case_id", ["workloads-json"])
def test_cli_workloads_json(cli, case_id):
    p = cli[case_id].result().proc
    assert p.returncode == 0, _diag(p)
    rows = json.loads(p.stdout)
    by_name = {r["name"]: r for r in rows}
    assert {"mini-pretrain", "mini-lora"} <= set(by_name), rows
    for name in ("mini-pretrain", "mini-lora"):
        desc = by_name[name]["description"]
        assert isinstance(desc, str) and len(desc) > 10 and "\n" not in desc, by_name[name]


@pytest.mark.parametrize("case_id", ["run-help"])
def test_cli_run_help(cli, case_id):
    p = cli[case_id].result().proc
    assert p.returncode == 0, _diag(p)
    assert "--set" in p.stdout and "--config" in p.stdout and "--nproc-per-node" in p.stdout, p.stdout


@pytest.mark.parametrize("case_id", ["report-json-empty"])
def test_cli_report_json_empty_db(cli, case_id):
    res = cli[case_id].result()
    p = res.proc
    assert p.returncode == 0, _diag(p)
    assert json.loads(p.stdout) == []
    assert_nothing_written(res.tmp)


@pytest.mark.parametrize("case_id", ["plan-good-fp8"])
def test_cli_plan_accepts_a_valid_fp8_recipe(cli, case_id):
    """The control for the plan-bad-* cases: a valid hardware.fp8 still plans (exit 0, layouts ranked)."""
    p = cli[case_id].result().proc
    assert p.returncode == 0, _diag(p)
    out = json.loads(p.stdout)
    assert out["fitting"] > 0 and out["ranked"], out
    assert p.stderr.strip() == "", _diag(p)


def test_fp8_without_torchao_is_a_clear_error(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    spec = resolve_spec(mini_pretrain_defaults(), None, ["hardware.fp8=rowwise"])
    with pytest.raises(SpecError, match="needs torchao"):
        validate_run(spec, 1)


def test_a_cpu_run_larger_than_the_hosts_memory_is_refused_before_anything_is_built(monkeypatch):
    """On CPU the floor is the weights plus the trainable ones' gradients and AdamW state: 7B LoRA in
    fp32 is 25 GiB; full training of the same model four times that."""
    from trainperf.runner import local
    from trainperf.workloads.mini import synthetic_lora_defaults

    spec = resolve_spec(synthetic_lora_defaults(), None, ["hardware.device=cpu"])
    assert 24 < local.host_memory_floor_gib(spec) < 26
    full = resolve_spec(synthetic_lora_defaults(), None, ["hardware.device=cpu", "lora.rank=0"])
    assert local.host_memory_floor_gib(full) == pytest.approx(4 * local.host_memory_floor_gib(spec), rel=0.01)
    monkeypatch.setattr(local, "_available_host_gib", lambda: 16.0)
    with pytest.raises(SpecError, match=r"out of memory predicted: on CPU this run holds at least 25\.\d GiB .* 16\.0 GiB"):
        local.check_host_memory(spec)
    monkeypatch.setattr(local, "_available_host_gib", lambda: 64.0)
    local.check_host_memory(spec)  # fits
    assert local.host_memory_floor_gib(resolve_spec(mini_lora_defaults(), None, [])) < 0.01
