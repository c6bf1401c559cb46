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
from pathlib import Path

import pytest
import torch
from trainperf.core.spec import RunSpec, eval_interval_samples, set_value
from trainperf.core.resolve import load_config_file, parse_override, resolve_spec
from trainperf.core.errors import SpecError
from trainperf.core.layout import data_parallel_size, grad_accum_steps
from trainperf.runner.checks import validate_run
from trainperf.workloads.mini import SEQ, mini_lora_defaults, mini_pretrain_defaults

from tests.fixtures.inputs import make_checkpoint, make_dataset, garbage


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
workload: mini-pretrain  # the workload being run: accepted
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
workload = "mini-pretrain"  # the workload being run: accepted

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
    if kind == "ckpt-tensor-in-two-shards":  # two shards, the index names each tensor once, one is in both
        from safetensors.torch import load_file, save_file

        ck = make_checkpoint(tmp / "ck")
        tensors = load_file(str(ck / "model.safetensors"))
        names = sorted(tensors)
        first, second = names[: len(names) // 2], names[len(names) // 2:]
        save_file({n: tensors[n] for n in first}, str(ck / "model-1.safetensors"))
        save_file({n: tensors[n] for n in [*second, first[0]]}, str(ck / "model-2.safetensors"))
        (ck / "model.safetensors").unlink()
        weight_map = {**{n: "model-1.safetensors" for n in first}, **{n: "model-2.safetensors" for n in second}}
        (ck / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
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
        ("ckpt-tensor-in-two-shards", ["stored twice", "model-1.safetensors and model-2.safetensors",
                                       "the index names model-1.safetensors", "keep one copy"]),
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
