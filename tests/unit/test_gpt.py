"""The GPT family and the gpt3 / llama31_405b recipes, in process: the model's Megatron names, tied and
padded vocabulary; the GBS-derived schedules; the closed rules and bad layouts refused with the rule."""

from __future__ import annotations

import pytest
import torch

from trainperf.core.errors import SpecError
from trainperf.core.flops import total_params
from trainperf.core.validate import validate
from trainperf.mlperf import recipes
from trainperf.model.families import build, init_full_tensor
from trainperf.model.options import ModelOptions
from trainperf.workloads import mini


def test_gpt_names_tie_and_vocabulary_padding():
    cfg = mini.mini_gpt_model()
    model = build(cfg)
    names = dict(model.named_parameters())
    assert "output_layer.weight" not in names  # the tied copy is the embedding itself
    assert model.output_layer.weight is model.embedding.word_embeddings.weight
    assert names["embedding.word_embeddings.weight"].shape == (96, 64)  # 64 padded to a multiple of 48
    assert names["decoder.layers.1.self_attention.linear_qkv.bias"].shape == (192,)
    assert names["decoder.layers.0.mlp.linear_fc1.weight"].shape == (256, 64)
    assert build(cfg, ModelOptions(tp=4)).padded_vocab == 192  # 48 x 4
    assert recipes.GPT3_175B.padded_vocab_size(1) == 50304 and recipes.GPT3_175B.padded_vocab_size(8) == 51200
    assert abs(total_params(recipes.GPT3_175B) / 1e9 - 174.6) < 0.3


def test_gpt_init_is_megatrons_and_the_tied_copy_starts_equal():
    cfg = mini.mini_gpt_model()
    emb = init_full_tensor("embedding.word_embeddings.weight", (96, 64), cfg, 3, "cpu")
    assert torch.equal(init_full_tensor("output_layer.weight", (96, 64), cfg, 3, "cpu"), emb)
    assert torch.equal(init_full_tensor("decoder.final_layernorm.bias", (64,), cfg, 3, "cpu"), torch.zeros(64))
    fc2 = init_full_tensor("decoder.layers.0.mlp.linear_fc2.weight", (64, 256), cfg, 3, "cpu")
    assert abs(fc2.std().item() - 0.02 / 2) < 0.002  # scaled by 1/sqrt(2 x layers)


def test_gpt_forward_is_causal():
    torch.manual_seed(0)
    model = build(mini.mini_gpt_model())
    ids = torch.randint(0, 64, (2, 16))
    changed = ids.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 64
    a, b = model(ids), model(changed)
    assert a.shape == (2, 16, 96)
    assert torch.allclose(a[:, :10], b[:, :10]) and not torch.allclose(a[:, 10:], b[:, 10:])


@pytest.mark.parametrize("gbs, lr, warmup, decay_after_warmup", [
    (1536, 2e-5, 265, 108_600 - 265), (2048, 2e-5, 199, 81_450 - 199), (4096, 3e-5, 100, 40_725 - 100)])
def test_gpt3_schedule_follows_the_gbs(gbs, lr, warmup, decay_after_warmup):
    defaults, spec = recipes.gpt3_defaults(), recipes.gpt3_defaults()
    spec.train.global_batch_size = gbs
    recipes.apply_gbs_schedule(spec, defaults)
    assert (spec.train.lr, spec.train.warmup_steps, spec.train.decay_steps) == (lr, warmup, decay_after_warmup)
    assert dict(recipes.hyperparameter_events(spec))["init_checkpoint_step"] == 4000 * 1536 // gbs


def test_llama405_schedule_table_and_formula():
    assert recipes.llama405_lr(2304) == 1.6e-4 and recipes.llama405_lr(1536) * 1152 == 1536 * 8e-5
    assert recipes.llama405_schedule(1152) == (8000, 1_192_000)
    assert recipes.llama405_eval_skips(1152) == 14  # NVIDIA v5.1: first eval at 15 x 18,432 samples
    assert recipes.llama31_405b_defaults().train.lr * recipes.llama31_405b_defaults().train.min_lr_ratio == pytest.approx(8e-7)


@pytest.mark.parametrize("workload, changes, named", [
    ("gpt3", {"train.eps": 1e-5}, "opt_adam_epsilon"),
    ("gpt3", {"train.lr": 3e-5}, "2e-5 for GBS <= 3072"),
    ("gpt3", {"train.global_batch_size": 1024}, "1536..8192"),
    ("llama31_405b", {"train.warmup_steps": 10}, "ceil(8000 x 1152 / GBS)"),
    ("llama31_405b", {"eval.skip_first": 0}, "FLOOR(0.0026 x GBS + 12)"),
    ("llama31_405b", {"data.eval_samples": 1024}, "5760"),
])
def test_closed_rules_name_the_rule(workload, changes, named):
    spec = recipes.RECIPES[workload]()
    spec.model.path, spec.data.path = "ckpt", "c4"
    for dotted, value in changes.items():
        section, key = dotted.split(".")
        setattr(getattr(spec, section), key, value)
    with pytest.raises(SpecError, match="closed division|rules give") as err:
        recipes.check_closed_rules(spec)
    assert named in str(err.value)


@pytest.mark.parametrize("sets, message", [
    ({"parallel.tp": 3}, "num_heads=4 is not divisible by parallel.tp=3"),
    ({"parallel.pp": 2, "parallel.pp_schedule": "Interleaved1F1B"}, "not divisible by the 4 pipeline stages"),
    ({"model.num_kv_heads": 2}, "multi-head attention"),
    ({"lora.rank": 8}, "lora.rank=8 is for model.family=llama"),
    ({"model.make_vocab_size_divisible_by": 0}, "make_vocab_size_divisible_by=0"),
])
def test_bad_gpt_layouts_are_refused_before_launch(sets, message):
    spec = mini.mini_gpt_pretrain_defaults()
    spec.hardware.device = "cpu"
    for dotted, value in sets.items():
        section, key = dotted.split(".")
        setattr(getattr(spec, section), key, value)
    world = spec.parallel.tp * spec.parallel.pp
    with pytest.raises(SpecError, match=message):
        validate(spec, world, cuda=False)


def test_megatron_indexed_dataset_reads_as_packed_rows(tmp_path):
    import numpy as np

    from trainperf.data import megatron
    from trainperf.data.tokens import dataset_format, inspect_any, load_any, verify_any

    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 50, n) for n in (7, 13, 5, 20)]
    megatron.write_indexed(tmp_path / "train_a_text_document", docs[:2])
    megatron.write_indexed(tmp_path / "train_b_text_document", docs[2:])  # a second shard, read after the first
    megatron.write_indexed(tmp_path / "validation_text_document", docs[:1] * 3)
    assert dataset_format(str(tmp_path)) == "megatron"
    assert inspect_any(str(tmp_path), 8, 50) == {"train": 5, "validation": 2}
    stream = np.concatenate(docs)
    ids, mask = load_any(str(tmp_path), "train", 8).take(torch.tensor([1, 4]))
    assert ids.tolist() == [stream[8:16].tolist(), stream[32:40].tolist()] and mask.all()  # row 2 straddles shards
    verify_any(str(tmp_path), "train", 50)
    with pytest.raises(SpecError, match="outside the model's vocabulary"):
        verify_any(str(tmp_path), "train", 40)
    (tmp_path / "validation_text_document.idx").write_bytes(b"not an index")
    with pytest.raises(SpecError, match="not a Megatron indexed-dataset index"):
        inspect_any(str(tmp_path), 8, 50)
