"""The model says what runs: kernel choices are options of its constructor (model/options.py), and how
each decoder layer's forward runs -- recompute, offload, compile -- is said by the LayerWrapper's
constructor (parallel/layer_wrapper.py). No module carries attributes patched in from outside."""

from __future__ import annotations

import copy

import pytest
import torch

from trainperf.core.spec import LoRASpec, ModelSpec
from trainperf.model.llama import DecoderLayer, LlamaForCausalLM
from trainperf.model.lora import LoRALinear
from trainperf.model.options import ModelOptions
from trainperf.parallel.layer_wrapper import LayerWrapper
from trainperf.parallel.offload import ActivationOffloader
from trainperf.parallel.parallelize import (
    apply_activation_checkpointing,
    apply_compile,
    wrap_layers,
)

CFG = ModelSpec(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=4, num_heads=4, num_kv_heads=2,
                max_position_embeddings=32)
LORA = LoRASpec(rank=4, alpha=8.0, dropout=0.1, target_modules=["q_proj", "v_proj", "gate_proj"])
# what parallel/ and train/ used to set on the model's modules after it was built
PATCHED_BEFORE = ("_forward_plain", "_recompute_mode", "_activation_offloader", "_storage_transforms", "_float8",
                  "_float8_hp_dtype")


def _attributes(model: torch.nn.Module) -> dict[str, set[str]]:
    """Each module's own attribute names (its instance dict), by module name."""
    return {name: set(vars(m)) for name, m in model.named_modules()}


def test_kernel_options_are_visible_on_the_built_model():
    options = ModelOptions(attention="flash4", lora_kernel="fused", repeat_kv=True)
    model = LlamaForCausalLM(CFG, options, lora=LORA)
    assert model.options is options
    for layer in model.model.layers.values():
        assert isinstance(layer, DecoderLayer)
        assert (layer.self_attn.kernel, layer.self_attn.repeat_kv) == ("flash4", True)
        lora = [m for m in layer.modules() if isinstance(m, LoRALinear)]
        assert len(lora) == 3 and all(m.kernel == "fused" and m.float8_gemm is None for m in lora)
        assert all(m.weight_scale is None and not m.weight.requires_grad for m in lora)
    plain = LlamaForCausalLM(CFG)
    assert (plain.model.layers["0"].self_attn.kernel, plain.model.layers["0"].self_attn.repeat_kv) == ("sdpa", False)
    # the parameter names do not depend on the options (checkpoints and adapters map the same way)
    with_lora = LlamaForCausalLM(CFG, lora=LORA)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in with_lora.named_parameters()]


def test_float8_options_build_the_frozen_projections_in_float8():
    pytest.importorskip("torchao")
    from trainperf.model.float8 import FLOAT8_STORAGE, FrozenFloat8Linear

    options = ModelOptions(fp8="tensorwise", emulate_fp8=True, frozen_float8_from=torch.bfloat16)
    model = LlamaForCausalLM(CFG, options, lora=LORA)
    attn = model.model.layers["1"].self_attn
    assert type(attn.k_proj) is FrozenFloat8Linear and isinstance(attn.q_proj, LoRALinear)
    for m in (attn.q_proj, attn.k_proj):
        assert m.weight.dtype == FLOAT8_STORAGE and m.weight_scale.dtype == torch.float32
        assert m.float8_stored_from == torch.bfloat16
    # one GEMM config shared by every module: compiled layers guard on the same object
    assert attn.q_proj.float8_gemm is attn.k_proj.float8_gemm is model.model.layers["0"].mlp.down_proj.float8_gemm
    assert "model.layers.1.self_attn.k_proj.weight_scale" in dict(model.named_buffers())
    unstored = LlamaForCausalLM(CFG, ModelOptions(fp8="tensorwise", emulate_fp8=True), lora=LORA)
    assert unstored.model.layers["1"].self_attn.k_proj.weight.dtype == torch.float32
    assert not list(unstored.named_buffers())


def test_storage_order_is_the_models_say():
    fused = ModelSpec(**{**CFG.__dict__, "fused_qkv": True})
    name = "model.layers.0.self_attn.qkv_proj.weight"
    assert LlamaForCausalLM(fused).storage_transforms(name) is None
    to_storage, from_storage = LlamaForCausalLM(fused, ModelOptions(tp=2)).storage_transforms(name)
    full = torch.arange(fused.head_dim * (fused.num_heads + 2 * fused.num_kv_heads), dtype=torch.float32)[:, None]
    assert not torch.equal(to_storage(full), full) and torch.equal(from_storage(to_storage(full)), full)
    assert LlamaForCausalLM(fused, ModelOptions(tp=2)).storage_transforms("model.norm.weight") is None


def test_the_wrapper_says_how_each_layer_runs_and_keeps_names_and_numbers():
    torch.manual_seed(0)
    model = LlamaForCausalLM(CFG, lora=LORA)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    reference = copy.deepcopy(model)
    names = [n for n, _ in model.named_parameters()]
    offloader = ActivationOffloader(torch.device("cpu"))
    wrap_layers(model, ["full", "selective", "offload", "none"], offloader)
    layers = list(model.model.layers.values())
    assert all(isinstance(layer, LayerWrapper) and layer.compile_backend is None for layer in layers)
    assert [layer.memory_mode for layer in layers] == ["full", "selective", "offload", "none"]
    assert [layer.offloader is offloader for layer in layers] == [False, False, True, False]
    assert [layer.context_fn is not None for layer in layers] == [False, True, False, False]
    assert [n for n, _ in model.named_parameters()] == names
    ids = torch.randint(0, 64, (2, 16))
    losses = []
    for m in (reference, model):
        torch.manual_seed(5)
        loss = m(ids).float().logsumexp(-1).mean()
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[1], losses[0], rtol=0, atol=0)
    for (name, p), q in zip(reference.named_parameters(), model.parameters()):
        if p.requires_grad:
            torch.testing.assert_close(q.grad, p.grad, msg=name)
    assert offloader.stats.tensors > 0


def test_compile_keeps_each_layers_memory_mode():
    model = LlamaForCausalLM(CFG)
    apply_activation_checkpointing(model, "full", 1, others="selective")
    apply_compile(model, backend="aot_eager")
    layers = list(model.model.layers.values())
    assert [layer.memory_mode for layer in layers] == ["full", "selective", "selective", "selective"]
    assert all(layer.compile_backend == "aot_eager" for layer in layers)
    full, selective = layers[0], layers[1]
    # full: checkpoint(compiled layer forward); selective: compiled(checkpoint(layer forward))
    assert full.body._torchdynamo_orig_callable.__func__ is LayerWrapper.layer_forward
    assert selective.body._torchdynamo_orig_callable.__func__ is LayerWrapper.selective_forward


def test_no_module_carries_attributes_set_from_outside():
    """After wrapping (every memory mode, compiled), every module below the layer wrappers has exactly
    the attributes its constructor gave it -- those of the same module in a freshly built model --
    and none of the names parallel/ and train/ used to patch in; no instance has its own forward."""
    pytest.importorskip("torchao")
    options = ModelOptions(fp8="tensorwise", emulate_fp8=True, lora_kernel="fused", attention="flash4")
    model = LlamaForCausalLM(CFG, options, lora=LORA)
    built = _attributes(LlamaForCausalLM(CFG, options, lora=LORA))
    wrap_layers(model, ["full", "selective", "offload", "none"], ActivationOffloader(torch.device("cpu")),
                compile_backend="aot_eager")
    wrappers = {f"model.layers.{i}" for i in range(CFG.num_layers)}
    for name, attrs in _attributes(model).items():
        assert not attrs & set(PATCHED_BEFORE), (name, attrs & set(PATCHED_BEFORE))
        assert "forward" not in attrs and "__class__" not in attrs, name
        if name not in wrappers:
            assert attrs == built[name], (name, attrs ^ built[name])
