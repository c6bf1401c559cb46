"""CPU tests of hardware.lora_kernel=fused: the Philox generator against its published answers, the
masks' distribution, the op's backward against autograd of the same math, the model's grouping of
q/k/v, recomputation and torch.compile drawing the forward's masks again, validation and the
planner's memory. The Triton kernels themselves run on a GPU (tests/gpu/test_gpu.py) or, where Triton is
installed, under its CPU interpreter (the last test here)."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

from trainperf.core.errors import SpecError
from trainperf.core.spec import LoRASpec, ModelSpec, RunSpec
from trainperf.core.validate import check_choices, check_lora_kernel, validate
from trainperf.model import lora_kernel
from trainperf.model.llama import LlamaForCausalLM
from trainperf.model.lora import LoRALinear, apply_lora, fused_kernel_applies
from trainperf.model.lora_kernel import (
    keep_masks,
    keep_scale,
    lora_dropout_a,
    philox4x32_rounds,
)
from trainperf.model.options import ModelOptions
from trainperf.parallel.parallelize import apply_activation_checkpointing, apply_compile
from trainperf.runner.checks import check_kernels


def _words(*values):
    return [torch.tensor([v], dtype=torch.int64) for v in values]


@pytest.mark.parametrize("counter, key, expected", [
    # Random123's known-answer tests for philox4x32_10 (kat_vectors)
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_philox_matches_random123s_known_answers(counter, key, expected):
    out = philox4x32_rounds(*_words(*counter), *key)
    assert [int(w) for w in out] == list(expected)


def test_masks_keep_one_minus_p_independently_per_adapter():
    """Four masks from one seed: each keeps 90% (within 5 sigma over 2**18 elements), pairs keep
    together 81% (independent), and another seed draws other masks."""
    rows, cols, p = 512, 512, 0.1
    masks = keep_masks(987654321, rows, cols, 4, p)
    n = rows * cols
    sigma = (p * (1 - p) / n) ** 0.5
    for m in masks:
        assert abs(m.float().mean().item() - 0.9) < 5 * sigma
    for i in range(4):
        for j in range(i + 1, 4):
            assert abs((masks[i] & masks[j]).float().mean().item() - 0.81) < 5 * (0.81 * 0.19 / n) ** 0.5
    assert not torch.equal(keep_masks(987654322, rows, cols, 1, p)[0], masks[0])
    assert lora_kernel.drop_threshold(0.1) == 6554  # of 2**16: keeps 58982 / 65536 = 0.899994
    assert lora_kernel.keep_scale(0.1) == pytest.approx(65536 / 58982)


def test_the_ops_backward_is_autograd_of_the_same_math():
    torch.manual_seed(0)
    x = torch.randn(24, 40, dtype=torch.float64, requires_grad=True)
    a = torch.randn(48, 40, dtype=torch.float64, requires_grad=True)
    seed, p = torch.tensor([2**35 + 7]), 0.25
    h, bits = lora_dropout_a(x, a, seed, p, 3)
    dh = torch.randn_like(h)
    dx, da = torch.autograd.grad(h, (x, a), dh)
    masks = keep_masks(2**35 + 7, 24, 40, 3, p)
    ref = torch.cat([(x * m * keep_scale(p)) @ ai.t() for m, ai in zip(masks, a.chunk(3))], dim=-1)
    rdx, rda = torch.autograd.grad(ref, (x, a), dh)
    torch.testing.assert_close(h, ref)
    torch.testing.assert_close(dx, rdx)
    torch.testing.assert_close(da, rda)
    assert (dx[~(masks[0] | masks[1] | masks[2])] == 0).all()  # dropped by all three: no gradient
    # the backward reads the forward's masks from 1-bit records, not from the generator
    assert bits.dtype == torch.int32 and bits.shape == (24, 1, 8)
    assert all(torch.equal(u, m) for u, m in zip(lora_kernel.unpack_keep_bits(bits, 3, 40), masks))


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_keep_bits_round_trip_on_ragged_widths(n):
    width = 100  # not a multiple of any column group
    masks = keep_masks(5, 7, lora_kernel.padded_width(width, n), n, 0.5)
    bits = lora_kernel.pack_keep_bits(masks, n)
    assert bits.shape == (7, lora_kernel.counters_per_row(width, n) // 32, 8)
    assert bits.dtype == torch.int32 and (bits < 0).any()  # bit 31 set somewhere: the sign wraps
    back = lora_kernel.unpack_keep_bits(bits, n, width)
    assert all(torch.equal(b, m[:, :width]) for b, m in zip(back, masks))


@pytest.mark.parametrize("x_shape, a_shape, dtype, message", [
    ((8, 64), (24, 64), torch.bfloat16, "powers of two >= 16"),  # rank 8
    ((8, 64), (48, 32), torch.bfloat16, "powers of two >= 16"),  # A's width is not x's
    ((8, 64), (48, 64), torch.float32, "bf16 or fp16"),  # fp32 would run tf32 dots
])
def test_what_the_gpu_kernels_refuse(x_shape, a_shape, dtype, message):
    x, a = torch.zeros(x_shape, dtype=dtype), torch.zeros(a_shape, dtype=dtype)
    with pytest.raises(ValueError, match=message):
        lora_kernel.check_kernel_inputs(x, a, 3)
    assert lora_kernel.check_kernel_inputs(torch.zeros(8, 64, dtype=torch.bfloat16),
                                           torch.zeros(48, 64, dtype=torch.bfloat16), 3) == 16


def test_the_op_traces_with_shapes_from_its_fake():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, a, seed = torch.empty(10, 64), torch.empty(48, 64), torch.empty(1, dtype=torch.int64)
        h, bits = torch.ops.trainperf.lora_dropout_a(x, a, seed, 0.1, 3)
        dx, da = torch.ops.trainperf.lora_dropout_a_backward(h, x, a, bits, 0.1, 3)
    assert (h.shape, bits.shape, dx.shape, da.shape) == ((10, 48), (10, 1, 8), (10, 64), (48, 64))


CFG = ModelSpec(vocab_size=64, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2,
                max_position_embeddings=32)


def _lora_model(targets=("q_proj", "k_proj", "v_proj", "o_proj"), rank=16, dropout=0.1, cfg=CFG, kernel="torch"):
    torch.manual_seed(3)
    model = LlamaForCausalLM(cfg, ModelOptions(lora_kernel=kernel))
    apply_lora(model, LoRASpec(rank=rank, alpha=32.0, dropout=dropout, target_modules=list(targets)))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)  # B starts at zero: give the adapters a gradient path through A
    return model


def _grads(model, ids, seed=11):
    torch.manual_seed(seed)
    loss = model(ids).float().logsumexp(-1).mean()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_the_model_groups_q_k_v_and_matches_explicit_masks(monkeypatch):
    """With the fused kernel, q/k/v share one op call (three masks from one seed), o and the MLP's
    adapters get their own; loss and every adapter gradient equal autograd through explicit masks."""
    calls = []
    real = lora_kernel.lora_dropout_a

    def recording(x, a, seed, p, n):
        calls.append(n)
        return real(x, a, seed, p, n)

    def explicit(x, a, seed, p, n):
        masks = keep_masks(int(seed.item()), x.shape[0], x.shape[1], n, p)
        return torch.cat([(x * m * keep_scale(p)) @ ai.t() for m, ai in zip(masks, a.chunk(n))], dim=-1), None

    model = _lora_model(("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), kernel="fused")
    ids = torch.randint(0, 64, (2, 16))
    monkeypatch.setattr(lora_kernel, "lora_dropout_a", recording)
    loss, grads = _grads(model, ids)
    assert calls == [3, 1, 2, 1] * 2  # per layer: q/k/v, o, gate/up, down
    model.zero_grad()
    monkeypatch.setattr(lora_kernel, "lora_dropout_a", explicit)
    ref_loss, ref_grads = _grads(model, ids)
    torch.testing.assert_close(loss, ref_loss)
    assert grads.keys() == ref_grads.keys() and any("lora_A" in n for n in grads)
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], msg=name)


def test_fused_drops_what_dropout_would_on_average():
    """Eval and dropout 0 take the plain path; the fused path's mean output over many draws is the
    undropped output (unbiased scaling)."""
    model = _lora_model(kernel="fused")
    q = model.model.layers["0"].self_attn.q_proj
    x = torch.randn(4, 8, 64)
    q.eval()
    assert not fused_kernel_applies(x, (q,))
    clean = q(x)
    q.train()
    assert fused_kernel_applies(x, (q,))
    mean = torch.stack([q(x) for _ in range(400)]).mean(0)
    spread = (clean - q.base(x)).abs().mean()
    assert ((mean - clean).abs().mean() / spread) < 0.1
    q.dropout = 0.0
    assert not fused_kernel_applies(x, (q,))


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_recomputation_redraws_the_forwards_masks(mode):
    """Selective (the policy keeps the op's output and its seed) and full recompute (checkpoint replays
    the generator) give the gradients of the run that keeps everything."""
    ids = torch.randint(0, 64, (2, 16))
    plain = _lora_model(kernel="fused")
    recomputed = copy.deepcopy(plain)
    apply_activation_checkpointing(recomputed, mode)
    loss, grads = _grads(plain, ids)
    loss2, grads2 = _grads(recomputed, ids)
    torch.testing.assert_close(loss2, loss)
    for name in grads:
        torch.testing.assert_close(grads2[name], grads[name], msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_compiled_layers_draw_the_eager_masks(mode):
    """Per-layer torch.compile (AOT autograd, as under Inductor) keeps the op one node and draws its
    seed from the same generator: the eager model's loss and gradients."""
    ids = torch.randint(0, 64, (2, 16))
    eager = _lora_model(kernel="fused")
    compiled = copy.deepcopy(eager)
    if mode != "none":
        apply_activation_checkpointing(compiled, mode)
    apply_compile(compiled, backend="aot_eager")
    loss, grads = _grads(eager, ids)
    loss2, grads2 = _grads(compiled, ids)
    torch.testing.assert_close(loss2, loss)
    for name in grads:
        torch.testing.assert_close(grads2[name], grads[name], msg=name)


def test_modules_with_hooks_or_mixed_ranks_are_not_grouped():
    model = _lora_model(kernel="fused")
    attn = model.model.layers["0"].self_attn
    x = torch.randn(2, 4, 64)
    assert fused_kernel_applies(x, (attn.q_proj, attn.k_proj, attn.v_proj))
    handle = attn.k_proj.register_forward_pre_hook(lambda mod, args: None)  # as tensor parallel's would
    assert not fused_kernel_applies(x, (attn.q_proj, attn.k_proj, attn.v_proj))
    handle.remove()
    attn.v_proj.kernel = "torch"
    assert not fused_kernel_applies(x, (attn.q_proj, attn.k_proj, attn.v_proj))
    assert not fused_kernel_applies(x, (attn.q_proj, torch.nn.Linear(64, 64)))
    assert isinstance(attn.q_proj, LoRALinear)


def _lora_spec(**hardware) -> RunSpec:
    spec = RunSpec(workload="x", lora=LoRASpec(rank=16, alpha=32.0, dropout=0.1))
    for key, value in hardware.items():
        setattr(spec.hardware, key, value)
    return spec


def test_bad_lora_kernel_name_names_the_valid_ones():
    with pytest.raises(SpecError, match=r"hardware.lora_kernel='triton': valid values are torch, fused"):
        check_choices(_lora_spec(lora_kernel="triton"))


@pytest.mark.parametrize("change, message", [
    (dict(device="cpu"), "Triton kernel for CUDA GPUs.*hardware.lora_kernel=torch on CPU"),
    (dict(dtype="fp32"), "runs bf16 only"),
    (dict(tp=2), "parallel.tp=2 is not supported"),
    (dict(rank=8), "lora.rank 16, 32, 64.*got 8"),
    (dict(rank=0), "is for LoRA runs"),
])
def test_fused_lora_kernel_is_refused_where_it_cannot_run(change, message, monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())  # as if triton were installed
    spec = _lora_spec(lora_kernel="fused", device="cuda")
    if "device" in change or "dtype" in change:
        for key, value in change.items():
            setattr(spec.hardware, key, value)
    if "tp" in change:
        spec.parallel.tp = change["tp"]
    if "rank" in change:
        spec.lora.rank = change["rank"]
    with pytest.raises(SpecError, match=message):
        check_lora_kernel(spec, cuda=True)
        check_kernels(spec)  # the kernel's own tile sizes: checked on the launching machine


def test_fused_lora_kernel_on_cpu_fails_validation_in_one_line():
    spec = _lora_spec(lora_kernel="fused", device="cpu")
    with pytest.raises(SpecError) as err:
        validate(spec, 1, cuda=False)
    assert "\n" not in str(err.value)


def test_planner_keeps_inputs_not_masks_with_the_fused_kernel():
    """Per token and layer, the fused kernel's activations are those of a run without dropout (A's
    inputs, not a mask and a dropped copy per adapter) plus its mask records: as many bytes as the
    forward allocates for them."""
    from trainperf.core.resolve import resolve_spec
    from trainperf.plan.costs import activation_bytes_per_token_layer
    from trainperf.workloads.mini import synthetic_lora_defaults

    spec = resolve_spec(synthetic_lora_defaults(), None, [])
    torch_path = activation_bytes_per_token_layer(spec, compiled=True)
    spec.hardware.lora_kernel = "fused"
    fused = activation_bytes_per_token_layer(spec, compiled=True)
    spec.hardware.lora_kernel, spec.lora.dropout = "torch", 0.0
    no_dropout = activation_bytes_per_token_layer(spec, compiled=True)
    for n, width in ((3, spec.model.hidden_size), (1, spec.model.hidden_size)):  # what the op allocates
        _, bits = lora_dropout_a(torch.zeros(2, width), torch.zeros(16 * n, width), torch.tensor([1]), 0.1, n)
        assert bits.numel() * 4 / 2 == (width / 2 if n == 3 else width / 8)
    h = spec.model.hidden_size
    records = h / 2 + h / 8  # q/k/v: 4 bits per element (3 adapters, 4 slots); o: 1 bit
    assert fused == no_dropout + records
    assert torch_path - fused == pytest.approx(4 * 3 * h - 2 * h - records)  # 4 x (mask + copy) against x kept once


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton not installed (CPU CI)")
def test_the_op_times_both_backwards_once_per_shape_and_keeps_the_faster(monkeypatch):
    """lora_triton.backward: the first call of a shape runs and times each form, later calls of that
    shape run the faster one only; a CUDA-graph capture (nothing can be timed) takes the one-pass form."""
    from trainperf.model import lora_triton

    runs = []
    speed = {"one-pass": 2.0, "split": 1.0}
    forms = {name: (lambda *args, name=name: runs.append(name) or name) for name in speed}
    monkeypatch.setattr(lora_triton, "BACKWARDS", forms)
    monkeypatch.setattr(lora_triton, "backward_picks", {})
    monkeypatch.setattr(lora_triton, "INTERPRETED", False)
    monkeypatch.setattr(lora_triton, "_time_ms", lambda fn: (fn(), speed[runs[-1]])[1])
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])

    x, a = torch.zeros(8, 64), torch.zeros(48, 64)
    assert lora_triton.backward(None, x, a, None, 0.1, 3) == "split"
    assert sorted(runs[:-1]) == ["one-pass", "one-pass", "split", "split"] and runs[-1] == "split"
    runs.clear()
    assert lora_triton.backward(None, x, a, None, 0.1, 3) == "split" and runs == ["split"]  # no timing again
    speed.update({"one-pass": 0.5})
    assert lora_triton.backward(None, torch.zeros(16, 64), a, None, 0.1, 3) == "one-pass"  # a new shape: timed
    assert len(lora_triton.backward_picks) == 2
    runs.clear()
    capturing[0] = True
    assert lora_triton.backward(None, torch.zeros(32, 64), a, None, 0.1, 3) == "one-pass" and runs == ["one-pass"]
    assert len(lora_triton.backward_picks) == 2  # a capture's choice is not remembered
    capturing[0] = False

    from triton.runtime.errors import OutOfResources

    def too_big(*args):
        raise OutOfResources(300000, 232448, "shared memory")

    monkeypatch.setitem(forms, "split", too_big)  # a form this GPU cannot launch is skipped
    assert lora_triton.backward(None, torch.zeros(64, 64), a, None, 0.1, 3) == "one-pass"
    monkeypatch.setitem(forms, "one-pass", too_big)
    with pytest.raises(RuntimeError, match="no fused LoRA backward runs on this GPU: one-pass: .*shared memory"):
        lora_triton.backward(None, torch.zeros(128, 64), a, None, 0.1, 3)
