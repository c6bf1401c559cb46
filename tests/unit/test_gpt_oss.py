"""CPU tests of the gpt-oss MoE model against transformers' GptOssForCausalLM (fp32)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from trainperf.core.errors import SpecError
from trainperf.core.spec import ModelSpec
from trainperf.core.families import family
from trainperf.model import gpt_oss, moe
from trainperf.model.checkpoint import check_checkpoint, inspect_checkpoint, load_checkpoint_into
from trainperf.model.loss import masked_loss_sum, shift_targets

transformers = pytest.importorskip("transformers")

SEQ = 12


def hf_config(**kw):
    base = dict(vocab_size=96, hidden_size=64, intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts_per_tok=3, sliding_window=5,
                max_position_embeddings=64, router_aux_loss_coef=0.02, output_router_logits=True,
                rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                                 "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 16},
                tie_word_embeddings=False, attn_implementation="eager")
    base.update(kw)
    return transformers.GptOssConfig(**base)


@pytest.fixture(scope="module")
def hf_ckpt(tmp_path_factory):
    """A random HF GptOssForCausalLM saved as config.json + safetensors; returns (dir, model)."""
    torch.manual_seed(0)
    cfg = hf_config()
    model = transformers.GptOssForCausalLM(cfg).float().eval()
    with torch.no_grad():  # transformers starts router and sinks near zero: make every term matter
        for name, p in model.named_parameters():
            if name.endswith(("sinks", "router.bias", "proj_bias", "proj.bias")):
                p.normal_(0, 0.5)
    d = tmp_path_factory.mktemp("hf_gpt_oss")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(d / "model.safetensors"))
    (d / "config.json").write_text(cfg.to_json_string())
    return d, model


def load_ours(path):
    index = inspect_checkpoint(str(path))
    spec = ModelSpec(name="tiny-gpt-oss", family="gpt_oss",
                     **family("gpt_oss").config_to_model_fields(index.config, "model.path"))
    check_checkpoint(index, spec)
    model = gpt_oss.GptOssForCausalLM(spec)
    load_checkpoint_into(model, index)
    return model.eval(), spec


def batch():
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, 96, (2, SEQ), generator=g)


def our_loss(model, ids, coeff):
    labels, mask = shift_targets(ids, torch.ones_like(ids))
    logits = model(ids)
    ce = masked_loss_sum(logits, labels, mask.float()) / mask.sum()
    return logits, ce + coeff * moe.model_aux_loss(model)


def test_config_json_maps_to_spec(hf_ckpt):
    model, spec = load_ours(hf_ckpt[0])
    assert (spec.head_dim, spec.num_experts, spec.experts_per_token, spec.sliding_window) == (16, 8, 3, 5)
    assert (spec.rope_factor, spec.rope_original_max_positions, spec.rope_theta) == (4.0, 16, 150000.0)
    assert [layer.self_attn.window for layer in model.model.layers.values()] == [5, 0, 5, 0]


def test_hf_parity_forward_loss_and_gradients(hf_ckpt):
    d, hf = hf_ckpt
    ours, _ = load_ours(d)
    ids = batch()
    out = hf(input_ids=ids, labels=ids)
    logits, loss = our_loss(ours, ids, 0.02)
    assert torch.allclose(logits, out.logits, atol=1e-5, rtol=0), (logits - out.logits).abs().max()
    assert abs(loss.item() - out.loss.item()) < 1e-5, (loss.item(), out.loss.item())
    assert out.aux_loss.item() > 0
    out.loss.backward()
    loss.backward()
    theirs = dict(hf.named_parameters())
    for name, p in ours.named_parameters():
        ref = theirs[name].grad
        assert p.grad is not None and ref is not None, name
        assert torch.allclose(p.grad, ref, atol=1e-5, rtol=1e-4), (name, (p.grad - ref).abs().max())


def test_parity_is_sensitive_to_window_and_sinks(hf_ckpt):
    """The reference check above fails when a gpt-oss detail is dropped (it could not pass by accident)."""
    d, hf = hf_ckpt
    ours, _ = load_ours(d)
    ids = batch()
    ref = hf(input_ids=ids).logits
    for layer in ours.model.layers.values():
        layer.self_attn.window = 0
    assert (ours(ids) - ref).abs().max() > 1e-3
    ours, _ = load_ours(d)
    with torch.no_grad():
        for layer in ours.model.layers.values():
            layer.self_attn.sinks.fill_(-1e4)
    assert (ours(ids) - ref).abs().max() > 1e-3


def test_grouped_gemm_equals_per_expert_loop():
    torch.manual_seed(1)
    x, w = torch.randn(10, 8), torch.randn(3, 8, 6)
    counts = torch.tensor([4, 0, 6])
    y = moe.grouped_mm(x, w, counts, None)
    assert torch.allclose(y, torch.cat([x[:4] @ w[0], x[4:] @ w[2]]))


def test_router_scores_softmax_over_top_k():
    r = moe.TopKRouter(4, 5, 2)
    with torch.no_grad():
        r.weight.zero_()
        r.bias.copy_(torch.tensor([0.0, 3.0, 1.0, 2.0, -1.0]))
    _, scores, idx = r(torch.randn(1, 4))
    assert idx.tolist() == [[1, 3]]
    assert torch.allclose(scores, torch.softmax(torch.tensor([[3.0, 2.0]]), -1))


def test_missing_and_misshaped_expert_tensors(hf_ckpt):
    d, _ = hf_ckpt
    index = inspect_checkpoint(str(d))
    spec = ModelSpec(family="gpt_oss", **family("gpt_oss").config_to_model_fields(index.config, "model.path"))
    full = dict(index.tensors)
    del index.tensors["model.layers.1.mlp.experts.down_proj"]
    with pytest.raises(SpecError, match=r"lacks tensor 'model.layers.1.mlp.experts.down_proj'"):
        check_checkpoint(index, spec)
    index.tensors = dict(full)
    f, shape, dt = full["model.layers.0.mlp.experts.gate_up_proj"]
    index.tensors["model.layers.0.mlp.experts.gate_up_proj"] = (f, [4, shape[1], shape[2]], dt)
    with pytest.raises(SpecError, match=r"shape \[4, 64, 64\], config.json implies \[8, 64, 64\]") as e:
        check_checkpoint(index, spec)
    assert "\n" not in str(e.value)


def test_config_without_experts_is_spec_error():
    cfg = json.loads(hf_config().to_json_string())
    del cfg["num_local_experts"]
    with pytest.raises(SpecError, match="lacks 'num_local_experts'"):
        family("gpt_oss").config_to_model_fields(cfg, "model.path")
