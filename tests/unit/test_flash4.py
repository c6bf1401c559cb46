"""CPU tests of hardware.attention=flash4: the custom op's plumbing and the model's (batch, seq, heads,
head_dim) path, with FlashAttention-4's kernels replaced by an exact reference of the same calling
convention (the real kernels need a Hopper/Blackwell GPU: tests/gpu/test_gpu.py runs them); and the
validation that refuses flash4 where it cannot run, before any work."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from trainperf.core.errors import SpecError
from trainperf.core.spec import ModelSpec, RunSpec
from trainperf.core.validate import check_attention, check_choices, validate
from trainperf.model.llama import LlamaForCausalLM
from trainperf.model.options import ModelOptions


def _expand(t: torch.Tensor, heads: int) -> torch.Tensor:  # GQA: each kv head serves heads / kv_heads q heads
    return t.repeat_interleave(heads // t.shape[2], dim=2)


def _reference_attention(q, k, v, scale, causal):
    """softmax(q k^T * scale) v on (b, s, h, d), and the rows' log-sum-exp (b, h, s), in fp64."""
    scores = torch.einsum("bshd,bthd->bhst", q.double(), _expand(k, q.shape[2]).double()) * scale
    if causal:
        s = q.shape[1]
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    lse = scores.logsumexp(-1)
    out = torch.einsum("bhst,bthd->bshd", (scores - lse[..., None]).exp(), _expand(v, q.shape[2]).double())
    return out.to(q.dtype), lse.float()


@pytest.fixture
def fake_fa4(monkeypatch):
    """flash_attn.cute.interface with _flash_attn_fwd / _flash_attn_bwd of FA4 4.0.0b36's signatures,
    computed by the reference; records each call's keyword arguments."""
    calls = []

    def fwd(q, k, v, softmax_scale=None, causal=False, return_lse=False, **kw):
        calls.append(("fwd", dict(softmax_scale=softmax_scale, causal=causal, return_lse=return_lse, **kw)))
        out, lse = _reference_attention(q, k, v, softmax_scale, causal)
        return out, lse, None, None, None

    def bwd(q, k, v, out, dout, lse, softmax_scale=None, causal=False, **kw):
        """Attention's backward by hand (the op's kernels run below autograd), from the saved lse."""
        calls.append(("bwd", dict(softmax_scale=softmax_scale, causal=causal, **kw)))
        again, again_lse = _reference_attention(q, k, v, softmax_scale, causal)
        assert torch.allclose(again_lse, lse) and torch.allclose(again, out)  # what forward saved
        heads, kv_heads = q.shape[2], k.shape[2]
        qd, kd, vd, od, dod = (t.double() for t in (q, _expand(k, heads), _expand(v, heads), out, dout))
        scores = torch.einsum("bshd,bthd->bhst", qd, kd) * softmax_scale
        if causal:
            scores = scores.masked_fill(torch.ones(q.shape[1], q.shape[1], dtype=torch.bool).triu(1), float("-inf"))
        p = (scores - lse.double()[..., None]).exp()
        dp = torch.einsum("bshd,bthd->bhst", dod, vd)
        ds = p * (dp - torch.einsum("bshd,bshd->bhs", dod, od)[..., None])
        dq = torch.einsum("bhst,bthd->bshd", ds, kd) * softmax_scale
        dk = torch.einsum("bhst,bshd->bthd", ds, qd) * softmax_scale
        dv = torch.einsum("bhst,bshd->bthd", p, dod)

        def per_kv_head(g):  # sum the gradients of the q heads that shared a kv head
            b, t, _, d = g.shape
            return g.reshape(b, t, kv_heads, heads // kv_heads, d).sum(3)

        return dq.to(q.dtype), per_kv_head(dk).to(k.dtype), per_kv_head(dv).to(v.dtype)

    interface = types.ModuleType("flash_attn.cute.interface")
    interface._flash_attn_fwd, interface._flash_attn_bwd = fwd, bwd
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", types.ModuleType("flash_attn.cute"))
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", interface)
    return calls


def test_the_op_passes_fa4_the_scale_the_causal_flag_and_what_backward_needs(fake_fa4):
    from trainperf.model.flash4 import causal_attention

    torch.manual_seed(0)
    q = torch.randn(2, 12, 4, 8, requires_grad=True)
    k, v = (torch.randn(2, 12, 2, 8, requires_grad=True) for _ in range(2))
    causal_attention(q, k, v).square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    assert [name for name, _ in fake_fa4] == ["fwd", "bwd"]
    assert fake_fa4[0][1] == {"softmax_scale": pytest.approx(8 ** -0.5), "causal": True, "return_lse": True}
    assert fake_fa4[1][1] == {"softmax_scale": pytest.approx(8 ** -0.5), "causal": True}
    # the same through SDPA (b, h, s, d): values and gradients of q and of the shared kv heads
    for t in (q, k, v):
        t.grad = None
    torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                     is_causal=True, enable_gqa=True).square().sum().backward()
    for mine, sdpa in zip(grads, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(mine, sdpa, rtol=1e-4, atol=1e-5)


def test_the_op_traces_as_one_node_with_shapes_from_its_fake():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, k = torch.empty(2, 16, 4, 8), torch.empty(2, 16, 2, 8)
        out, lse = torch.ops.trainperf.flash4_attn(q, k, k, 0.35, True)
        dq, dk, dv = torch.ops.trainperf.flash4_attn_backward(out, q, k, k, out, lse, 0.35, True)
    assert (out.shape, lse.shape, lse.dtype) == ((2, 16, 4, 8), (2, 4, 16), torch.float32)
    assert (dq.shape, dk.shape, dv.shape) == ((2, 16, 4, 8), (2, 16, 2, 8), (2, 16, 2, 8))


def _built_with_flash4(sdpa: LlamaForCausalLM) -> LlamaForCausalLM:
    """The same model and weights, built with hardware.attention=flash4 (on meta: it draws nothing)."""
    with torch.device("meta"):
        fa4 = LlamaForCausalLM(sdpa.cfg, ModelOptions(attention="flash4"))
    fa4.load_state_dict({k: v.clone() for k, v in sdpa.state_dict().items()}, assign=True)
    return fa4


@pytest.mark.parametrize("fused", [False, True], ids=["qkv", "fused_qkv"])
def test_the_model_with_flash4_matches_sdpa_in_logits_and_gradients(fake_fa4, fused):
    """RoPE on (b, s, h, d) with cos/sin broadcast over heads, no transposes, GQA without repeat."""
    cfg = ModelSpec(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
                    max_position_embeddings=32, fused_qkv=fused)
    torch.manual_seed(1)
    sdpa = LlamaForCausalLM(cfg)
    for p in sdpa.parameters():
        torch.nn.init.normal_(p, std=0.2)  # O(1) logits: a wrong RoPE broadcast cannot hide in rounding
    fa4 = _built_with_flash4(sdpa)
    ids = torch.randint(0, 64, (2, 16))
    logits = [m(ids) for m in (sdpa, fa4)]
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-4, atol=1e-4)
    for x in logits:
        x.float().logsumexp(-1).sum().backward()
    for (name, a), b in zip(sdpa.named_parameters(), fa4.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5, msg=name)
    assert sum(name == "fwd" for name, _ in fake_fa4) == 2  # both layers went through the op


def test_bad_attention_kernel_names_the_valid_ones():
    spec = RunSpec(workload="x")
    spec.hardware.attention = "flash3"
    with pytest.raises(SpecError, match=r"hardware.attention='flash3': valid values are sdpa, flash4"):
        check_choices(spec)


def test_flash4_is_refused_on_cpu_and_with_context_parallel():
    spec = RunSpec(workload="x")
    spec.hardware.attention, spec.hardware.device = "flash4", "cpu"
    with pytest.raises(SpecError, match="needs CUDA GPUs.*hardware.attention=sdpa"):
        validate(spec, 1, cuda=False)
    spec.hardware.device, spec.parallel.cp = "cuda", 2
    with pytest.raises(SpecError, match="parallel.cp=2 is not supported"):
        check_attention(spec, cuda=True)


@pytest.mark.parametrize("field, value, message", [
    ("hardware.dtype", "fp32", "runs bf16 only"),
    ("model.num_heads", 40, "head dims 8 to 256 in multiples of 8; this model.s is 102"),  # 4096 / 40
    ("model.num_heads", 8, "this model's is 512"),
])
def test_flash4_refuses_what_its_kernels_cannot_take(field, value, message):
    spec = RunSpec(workload="x")
    spec.hardware.attention, spec.hardware.device = "flash4", "cuda"
    section, key = field.split(".")
    setattr(getattr(spec, section), key, value)
    with pytest.raises(SpecError, match=message):
        check_attention(spec, cuda=True)


def test_flash4_without_its_package_says_what_to_install(monkeypatch):
    from trainperf.model import flash4

    monkeypatch.setattr(flash4.importlib.util, "find_spec", lambda name: None)
    assert "needs the flash-attn-4 package" in flash4.available()


@pytest.mark.parametrize("mode, forwards", [("selective", 2), ("full", 4)])
def test_recompute_keeps_or_reruns_the_flash4_op_as_the_policy_says(fake_fa4, mode, forwards):
    """Selective recompute saves the op's outputs (one FA4 forward per layer); full recompute reruns
    it in the backward (two per layer). Gradients match SDPA's either way."""
    from trainperf.parallel.parallelize import apply_activation_checkpointing

    cfg = ModelSpec(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
                    max_position_embeddings=32)
    torch.manual_seed(2)
    sdpa = LlamaForCausalLM(cfg)
    fa4 = _built_with_flash4(sdpa)
    apply_activation_checkpointing(fa4, mode)
    ids = torch.randint(0, 64, (2, 16))
    for m in (sdpa, fa4):
        m(ids).float().logsumexp(-1).sum().backward()
    for (name, a), b in zip(sdpa.named_parameters(), fa4.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5, msg=name)
    assert [name for name, _ in fake_fa4].count("fwd") == forwards
    assert [name for name, _ in fake_fa4].count("bwd") == 2
