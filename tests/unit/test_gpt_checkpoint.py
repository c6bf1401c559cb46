"""GPT checkpoints, in process: the safetensors layout with Megatron names (sharded with an index, the
vocabulary at any padding) loads into the model exactly; a torch.distributed.checkpoint folder converts
into it (per-layer or stacked layers, TE LayerNorm names) with no pickle beyond DCP's metadata classes;
names or shapes that do not match the config are refused in one line."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from trainperf.core.errors import SpecError
from trainperf.model import checkpoint as ckpt
from trainperf.model.dcp_convert import convert_dcp_to_safetensors, read_dcp_metadata
from trainperf.model.families import build
from trainperf.model.options import ModelOptions
from trainperf.workloads import mini


def _model(seed: int = 0, tp: int = 1):
    torch.manual_seed(seed)
    cfg = mini.mini_gpt_model()
    model = build(cfg, ModelOptions(tp=tp))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    return cfg, model


def _logits(model, ids):
    with torch.no_grad():
        return model(ids)[..., : model.cfg.vocab_size]


def _load(path, tp: int = 1):
    cfg = mini.mini_gpt_model()
    model = build(cfg, ModelOptions(tp=tp))
    index = ckpt.inspect_checkpoint(str(path))
    ckpt.check_checkpoint(index, cfg)
    ckpt.load_checkpoint_into(model, index)
    return model


def test_megatron_safetensors_round_trip_sharded_and_repadded(tmp_path):
    cfg, model = _model()
    state = {k: v.detach().clone() for k, v in model.named_parameters()}
    ckpt.save_megatron_checkpoint(state, cfg, tmp_path / "ck", shards=3)
    config = json.loads((tmp_path / "ck" / "config.json").read_text())
    assert config["ffn_hidden_size"] == 256 and config["num_attention_heads"] == 4
    assert (tmp_path / "ck" / "model.safetensors.index.json").is_file()
    index = ckpt.inspect_checkpoint(str(tmp_path / "ck"))
    assert "output_layer.weight" not in index.tensors  # the tied copy is stored once
    fields = ckpt.config_to_model_fields(index.config, "gpt", "here")
    assert fields["intermediate_size"] == 256 and fields["num_kv_heads"] == 4
    ids = torch.randint(0, cfg.vocab_size, (2, 16))
    assert torch.equal(_logits(_load(tmp_path / "ck"), ids), _logits(model, ids))
    loaded = _load(tmp_path / "ck", tp=4)  # padded to 48 x 4 rows: the extra rows are zero
    assert loaded.embedding.word_embeddings.weight.shape[0] == 192
    assert torch.equal(loaded.embedding.word_embeddings.weight[96:], torch.zeros(96, 64))
    assert torch.allclose(_logits(loaded, ids), _logits(model, ids))


def test_gpt_checkpoint_names_and_shapes_are_checked_against_the_config(tmp_path):
    cfg, model = _model()
    state = {k: v.detach().clone() for k, v in model.named_parameters()}
    bad = dict(state)
    bad["decoder.layers.1.mlp.linear_fc1.weight"] = torch.zeros(128, 64)
    ckpt.save_megatron_checkpoint(bad, cfg, tmp_path / "shape")
    with pytest.raises(SpecError, match=r"linear_fc1.weight' has shape \[128, 64\], config.json implies \[256, 64\]"):
        ckpt.check_checkpoint(ckpt.inspect_checkpoint(str(tmp_path / "shape")), cfg)
    missing = {k: v for k, v in state.items() if "layers.1." not in k}
    ckpt.save_megatron_checkpoint(missing, cfg, tmp_path / "names")
    with pytest.raises(SpecError, match=r"lacks tensor 'decoder.layers.1"):
        ckpt.check_checkpoint(ckpt.inspect_checkpoint(str(tmp_path / "names")), cfg)
    short = dict(state)
    short["embedding.word_embeddings.weight"] = torch.zeros(32, 64)  # fewer rows than the vocabulary
    ckpt.write_safetensors_dir(short, ckpt.model_fields_to_megatron_config(cfg), tmp_path / "vocab", shards=1)
    with pytest.raises(SpecError, match=r"rows >= vocab_size 64"):
        ckpt.check_checkpoint(ckpt.inspect_checkpoint(str(tmp_path / "vocab")), cfg)
    llama = {"model_type": "llama", "vocab_size": 64, "hidden_size": 64}
    with pytest.raises(SpecError, match="lacks 'ffn_hidden_size' .a Hugging Face Llama config"):
        ckpt.config_to_model_fields(llama, "gpt", "model.path 'x'")


def _save_dcp(state: dict, dest) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save(state, checkpoint_id=str(dest), no_dist=True)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_dcp_folder_converts_to_safetensors_and_loads(tmp_path, capsys):
    from trainperf.cli.main import main

    cfg, model = _model(seed=1)
    state = {k: v.detach().clone() for k, v in model.named_parameters()}
    # Megatron Core's torch_dist form: layers stacked, TE's fused LayerNorm names, a model. prefix, and
    # entries that are not model tensors (optimizer state, _extra_state bytes)
    stacked = {}
    for name, t in state.items():
        if name.startswith("decoder.layers.0."):
            rest = name[len("decoder.layers.0."):]
            rest = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
                    "input_layernorm.bias": "self_attention.linear_qkv.layer_norm_bias"}.get(rest, rest)
            src = name.replace(".0.", ".{}.")
            orig = src.split("{}.", 1)
            stacked["model.decoder.layers." + rest] = torch.stack(
                [state[orig[0] + f"{i}." + orig[1]] for i in range(cfg.num_layers)])
        elif not name.startswith("decoder.layers."):
            stacked["model." + name] = t
    stacked["model.output_layer.weight"] = state["embedding.word_embeddings.weight"].clone()  # a tied copy: dropped
    stacked["optimizer.state.exp_avg.embedding.word_embeddings.weight"] = torch.zeros(3)
    stacked["model.decoder.layers.self_attention.core_attention._extra_state"] = b"te"
    _save_dcp(stacked, tmp_path / "dcp")
    rc = main(["checkpoint", "convert", str(tmp_path / "dcp"), "--out", str(tmp_path / "ck"), "--num-attention-heads",
               "4", "--vocab-size", "64", "--make-vocab-size-divisible-by", "48", "--shards", "2", "--json"])
    assert rc == 0 and json.loads(capsys.readouterr().out) == {
        "out": str(tmp_path / "ck"), "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 64}
    rc = main(["checkpoint", "convert", str(tmp_path / "dcp"), "--out", str(tmp_path / "bad"), "--num-attention-heads", "3"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--num-attention-heads 3 does not divide the hidden size 64" in err
    assert not (tmp_path / "bad").exists()
    ids = torch.randint(0, cfg.vocab_size, (2, 16))
    assert torch.equal(_logits(_load(tmp_path / "ck"), ids), _logits(model, ids))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_dcp_metadata_that_names_other_code_is_refused(tmp_path):
    _save_dcp({"embedding.word_embeddings.weight": torch.zeros(4, 2)}, tmp_path / "dcp")
    assert read_dcp_metadata(tmp_path / "dcp").state_dict_metadata  # DCP's own metadata reads
    (tmp_path / "evil").mkdir()

    class Payload:
        def __reduce__(self):
            import os

            return (os.system, ("true",))

    (tmp_path / "evil" / ".metadata").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(SpecError, match=r"refers to (posix|os)\.system"):
        read_dcp_metadata(tmp_path / "evil")
    with pytest.raises(SpecError, match="no .metadata file"):
        read_dcp_metadata(tmp_path)
    _save_dcp({"embedding.word_embeddings.weight": torch.zeros(4, 2), "output_layer.weight": torch.ones(4, 2)},
              tmp_path / "untied")
    with pytest.raises(SpecError, match="an untied output layer"):
        convert_dcp_to_safetensors(tmp_path / "untied", tmp_path / "out", num_heads=1)
    _save_dcp({"decoder.layers.0.mlp.linear_fc1.weight": torch.zeros(4, 2)}, tmp_path / "partial")
    with pytest.raises(SpecError, match="no tensor 'embedding.word_embeddings.weight'"):
        convert_dcp_to_safetensors(tmp_path / "partial", tmp_path / "out", num_heads=1)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------
# Bad input before launch: checkpoints and data that contradict the workload

def _prepare(workload: str, *sets: str):
    from trainperf.runner import local

    return local.prepare(workload, None, list(sets), 1)


def test_checkpoints_that_contradict_the_family_or_config_exit_2_in_one_line(tmp_path, capsys):
    from trainperf.cli.main import main
    from trainperf.workloads import fabricate

    gpt = fabricate.write_gpt_checkpoint(tmp_path / "gpt")
    data = fabricate.write_gpt_chain_megatron(tmp_path / "d", train_rows=4, eval_rows=1)
    base = ["hardware.device=cpu", "mlperf.division=open", f"data.path={data}", "train.global_batch_size=4"]
    weights = fabricate.gpt_chain_weights()
    weights["decoder.layers.0.mlp.linear_fc2.weight"] = torch.zeros(16, 8)
    ckpt.save_megatron_checkpoint(weights, fabricate.tiny_gpt_model(), tmp_path / "bad_shape")
    with pytest.raises(SpecError, match=r"'decoder.layers.0.mlp.linear_fc2.weight' has shape \[16, 8\], config.json "
                                        r"implies \[16, 16\]"):
        _prepare("gpt3", f"model.path={tmp_path / 'bad_shape'}", *base)
    llama = fabricate.write_base_checkpoint(tmp_path / "llama")
    with pytest.raises(SpecError, match="lacks 'ffn_hidden_size' .a Hugging Face Llama config"):
        _prepare("gpt3", f"model.path={llama}", *base)
    with pytest.raises(SpecError, match="lacks 'intermediate_size' .a Megatron GPT config"):  # a GPT checkpoint, Llama run
        _prepare("llama31_405b", f"model.path={gpt}", *base)
    rc = main(["run", "gpt3", "--json", "--db", str(tmp_path / "t.db"), "--set", f"model.path={tmp_path / 'bad_shape'}",
               *[x for s in base for x in ("--set", s)]])
    out, err = capsys.readouterr()
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "linear_fc2.weight" in json.loads(out)["error"]
    assert not (tmp_path / "t.db").exists()  # refused before anything is stored or launched


def test_closed_gpt3_needs_the_4000_step_checkpoint_when_its_config_says(tmp_path):
    from trainperf.workloads import fabricate

    data = fabricate.write_gpt_chain_megatron(tmp_path / "d", train_rows=4, eval_rows=1)
    ck = fabricate.write_gpt_checkpoint(tmp_path / "ck")
    cfg = json.loads((ck / "config.json").read_text())
    (ck / "config.json").write_text(json.dumps({**cfg, "consumed_train_samples": 1536 * 3000}))
    with pytest.raises(SpecError, match=r"consumed_train_samples=4608000; the closed division of gpt3 starts from the "
                                        r"4000-step checkpoint \(6,144,000 samples"):
        _prepare("gpt3", f"model.path={ck}", f"data.path={data}", "hardware.device=cpu")
    (ck / "config.json").write_text(json.dumps({**cfg, "consumed_train_samples": 1536 * 4000}))
    with pytest.raises(SpecError, match="model.vocab_size=16 is not the gpt3-175b architecture"):  # the next check
        _prepare("gpt3", f"model.path={ck}", f"data.path={data}", "hardware.device=cpu")


def test_data_that_contradicts_the_recipe_is_refused(tmp_path):
    from trainperf.workloads import fabricate

    data = fabricate.write_gpt_chain_megatron(tmp_path / "d", train_rows=4, eval_rows=1)  # uint16 ids
    tiny = ["model.hidden_size=64", "model.intermediate_size=128", "model.num_layers=1", "model.num_heads=2",
            "model.num_kv_heads=2", "hardware.device=cpu", "mlperf.division=open", "train.global_batch_size=2",
            "data.seq_len=1024"]
    with pytest.raises(SpecError, match=r"stores uint16 ids \(at most 65,536 distinct\), but the model's vocabulary "
                                        r"has 128,256"):
        _prepare("llama31_405b", f"data.path={data}", *tiny)  # GPT-2-sized data for Llama 3's tokenizer
    ck = fabricate.write_gpt_checkpoint(tmp_path / "ck")
    with pytest.raises(SpecError, match=r"token id 15, outside the model's vocabulary \[0, 8\)"):
        # the same data for a checkpoint whose config says 8 tokens
        cfg = json.loads((ck / "config.json").read_text())
        cfg["vocab_size"] = 8
        (ck / "config.json").write_text(json.dumps(cfg))
        _prepare("gpt3", f"model.path={ck}", f"data.path={data}", "hardware.device=cpu", "mlperf.division=open",
                 "train.global_batch_size=4")
    with pytest.raises(SpecError, match=r"data.seq_len=1024 is not allowed in the closed division \(max_sequence_length "
                                        r"is fixed to 2048"):
        _prepare("gpt3", f"model.path={ck}", f"data.path={data}", "data.seq_len=1024")
