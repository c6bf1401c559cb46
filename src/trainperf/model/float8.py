"""FP8 GEMMs through torchao's float8 training (``hardware.fp8 = tensorwise | rowwise``).

Full training: torchao's ``convert_to_float8_training`` swaps the decoder layers' Linears for its
Float8Linear (forward, input gradient and weight gradient in float8 with dynamic scales; the LM head
stays in bf16, as torchtitan does).

LoRA: the base weights are frozen, and torchao's Float8Linear would still compute their weight
gradient -- a third GEMM a frozen base does not need (the FLOPs the LoRA-aware MFU rightly leaves
out). ``FrozenFloat8Matmul`` uses torchao's own scaling and scaled-matmul tensor for the forward
(x e4m3 · W e4m3) and the input gradient (dy e5m2 · W e4m3) only, and saves just W for backward.
The adapters (rank 16) stay in bf16: their GEMMs are too thin for float8 to pay.

``hardware.frozen_dtype = fp8`` (LoRA, tensorwise) also *stores* those frozen weights in float8:
quantised once, from the full tensor, exactly as the per-use dynamic cast would (the weight is
frozen, so its amax and scale never change), with the scale kept beside it (``weight_scale``, a
buffer the module registers when it is built that way: ``stored_frozen_weight``). Half
the bytes per shard; FSDP2 gathers them in its compute dtype under bf16 mixed precision (bf16 holds
every float8 value exactly) and the matmul re-types them to float8 with the stored scale -- the
dynamic path's values without its amax pass (bit-identical losses on CPU; not yet run on a GPU).
"""

from __future__ import annotations

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F


def float8_config(recipe: str, emulate: bool = False):
    """torchao's config for a recipe; ``emulate`` (a CPU run: no float8 GEMM hardware, and CPU's
    ``_scaled_mm`` is a reference loop, ~1000x slower) multiplies the float8-rounded operands in high
    precision instead -- the same values up to accumulation order."""
    import dataclasses

    from torchao.float8 import Float8LinearConfig

    config = Float8LinearConfig.from_recipe_name(recipe)
    return dataclasses.replace(config, emulate=True) if emulate else config


def linear_mm_config(config):
    """The three GEMM configs (output, grad input, grad weight) as torchao's Float8Linear builds them."""
    from torchao.float8.float8_training_tensor import LinearMMConfig, ScaledMMConfig

    def one(gemm):
        return ScaledMMConfig(config.emulate, gemm.use_fast_accum, False, config.pad_inner_dim)

    return LinearMMConfig(one(config.gemm_config_output), one(config.gemm_config_grad_input),
                          one(config.gemm_config_grad_weight))


def _to_float8(t: torch.Tensor, cast_config, mm_config, role, axis: int, config):
    from torchao.float8.float8_scaling_utils import (
        get_maybe_axiswise_dim,
        hp_tensor_to_float8_dynamic,
    )

    return hp_tensor_to_float8_dynamic(t, cast_config.target_dtype, mm_config, gemm_input_role=role,
                                       scaling_granularity=cast_config.scaling_granularity,
                                       axiswise_dim=get_maybe_axiswise_dim(axis, cast_config.scaling_granularity),
                                       round_scales_to_power_of_2=config.round_scales_to_power_of_2)


FLOAT8_STORAGE = torch.float8_e4m3fn  # tensorwise recipe's weight dtype


def quantize_frozen_weight(full: torch.Tensor, config) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8 data, scale) of a whole frozen weight, as torchao's dynamic weight cast makes them
    (data = saturate(W * scale), scale = float8 max / amax(W), tensorwise)."""
    from torchao.float8.float8_training_tensor import GemmInputRole

    w8 = _to_float8(full, config.cast_config_weight, linear_mm_config(config), GemmInputRole.WEIGHT, 0, config)
    return w8._data, w8._scale


def _stored_float8(weight: torch.Tensor, scale: torch.Tensor, orig_dtype, mm_config):
    """A float8-stored frozen weight (gathered as bf16 by FSDP2, or float8 as stored) as torchao's
    float8 tensor: the exact re-typing back to float8, with the stored scale."""
    from torchao.float8.float8_training_tensor import (
        Float8TrainingTensor,
        GemmInputRole,
    )

    return Float8TrainingTensor(weight.to(FLOAT8_STORAGE), scale, orig_dtype, mm_config, GemmInputRole.WEIGHT)


class FrozenFloat8Matmul(torch.autograd.Function):
    """y = x W^T in float8 for a frozen W: forward and input gradient, no weight gradient.
    ``scale``: W is stored in float8 with this scale (hardware.frozen_dtype=fp8), else None."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, mm_config, config, scale=None) -> torch.Tensor:
        from torchao.float8.float8_training_tensor import GemmInputRole

        ctx.save_for_backward(weight, scale)
        ctx.mm_config, ctx.config = mm_config, config
        x2 = x.reshape(-1, x.shape[-1])
        x8 = _to_float8(x2, config.cast_config_input, mm_config, GemmInputRole.INPUT, -1, config)
        if scale is None:
            w8_t = _to_float8(weight.t(), config.cast_config_weight, mm_config, GemmInputRole.WEIGHT, 0, config)
        else:
            w8_t = _stored_float8(weight, scale, x.dtype, mm_config).t()
        return torch.mm(x8, w8_t).reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        from torchao.float8.float8_training_tensor import GemmInputRole

        weight, scale = ctx.saved_tensors
        config, mm_config = ctx.config, ctx.mm_config
        g2 = grad_out.reshape(-1, grad_out.shape[-1])
        if torch.compiler.is_compiling() and weight.dtype != FLOAT8_STORAGE:
            # Compiled, this weight cast and the forward's are the same op on the same input
            # (tensorwise): the partitioner may merge them and keep the float8 copy of every
            # unsharded weight from forward to backward (a byte per element; 1 < 2 bytes of the bf16
            # weight, unless it knows the weight stays alive anyway -- pytorch/pytorch#141881). Under
            # FSDP2 that is a whole unsharded layer per layer: the 70B recipe on 2 x H200 ran out of
            # memory in its first forward. A data dependency on the incoming gradient (x * 0 is not
            # folded: NaN semantics; fused into the cast) pins this cast to the backward pass.
            weight = weight + g2[:1, :1].to(weight.dtype) * 0
        g8 = _to_float8(g2, config.cast_config_grad_output, mm_config, GemmInputRole.GRAD_OUTPUT, -1, config)
        if scale is None:
            w8 = _to_float8(weight.t(), config.cast_config_weight_for_grad_input, mm_config, GemmInputRole.WEIGHT,
                            -1, config).t()
        else:
            w8 = _stored_float8(weight, scale, grad_out.dtype, mm_config)
        grad_x = torch.mm(g8, w8).reshape(*grad_out.shape[:-1], weight.shape[1])
        return grad_x, None, None, None, None


def frozen_linear(x: torch.Tensor, weight: torch.Tensor, float8, scale: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight)`` of a frozen weight; in float8 when ``float8`` is (mm_config, config);
    ``scale``: the weight is stored in float8 with this scale."""
    if float8 is None:
        return F.linear(x, weight)
    return FrozenFloat8Matmul.apply(x, weight, *float8, scale)


@functools.cache
def float8_gemm(recipe: str, emulate: bool):
    """(mm config, torchao config) of a recipe, or None for "none": one pair per recipe, shared by
    every module, so compiled layers guard on the same objects."""
    if recipe == "none":
        return None
    config = float8_config(recipe, emulate)
    return linear_mm_config(config), config


def stored_frozen_weight(weight: nn.Parameter, quantised_from: torch.dtype | None):
    """(weight, scale) as a frozen projection keeps them: as given with no scale, or -- stored in
    float8 (hardware.frozen_dtype=fp8; ``quantised_from``: the dtype the per-use dynamic cast would
    have quantised from) -- a float8 parameter and its scale, written when the weights are."""
    if quantised_from is None:
        return weight, None
    return (nn.Parameter(torch.empty_like(weight, dtype=FLOAT8_STORAGE), requires_grad=False),
            torch.ones((), dtype=torch.float32, device=weight.device))


class FrozenFloat8Linear(nn.Linear):
    """A frozen projection whose GEMM runs in float8 (``float8_gemm`` = (mm config, config)), built from
    the nn.Linear it replaces (same weight, same name). A class of its own rather than a per-instance
    ``forward``: compiled layers would guard on each instance's forward and recompile per layer. An
    nn.Linear still, so tensor parallel's styles place it."""

    def __init__(self, linear: nn.Linear, float8_gemm, float8_stored_from: torch.dtype | None = None):
        with torch.device("meta"):  # the weight is the given one's: allocate and draw nothing here
            super().__init__(linear.in_features, linear.out_features, bias=False)
        self.float8_gemm = float8_gemm
        self.float8_stored_from = float8_stored_from
        weight, scale = stored_frozen_weight(linear.weight, float8_stored_from)
        self.weight = weight
        self.register_buffer("weight_scale", scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return frozen_linear(x, self.weight, self.float8_gemm, self.weight_scale)


def float8_frozen_linears(model: nn.Module) -> list[nn.Module]:
    """The decoder layers' frozen Linears whose GEMMs run in float8 (LoRA's bases and, where LoRA
    does not target them, the other frozen projections) -- the weights frozen_dtype=fp8 stores."""
    from trainperf.model.lora import LoRALinear

    return [m for m in model.model.layers.modules() if isinstance(m, LoRALinear)
            or (isinstance(m, nn.Linear) and not m.weight.requires_grad)]


def apply_float8(model: nn.Module) -> int:
    """Float8 GEMMs in every decoder layer as ``model.options.fp8`` asks (the embedding and LM head stay
    bf16); returns how many Linears run them. Part of building the model (LlamaForCausalLM), after
    LoRA: LoRA layers are built with their float8 GEMM already (model/lora.py); the other frozen
    projections are rebuilt as FrozenFloat8Linear; without frozen projections (full training)
    torchao's Float8Linear replaces every decoder Linear."""
    options = model.options
    gemm = float8_gemm(options.fp8, options.emulate_fp8)
    if gemm is None:
        return 0
    frozen = float8_frozen_linears(model)
    if frozen:  # LoRA: frozen base GEMMs without a weight gradient; adapters stay bf16
        from trainperf.model.lora import LoRALinear

        plain = {id(m) for m in frozen if not isinstance(m, (LoRALinear, FrozenFloat8Linear))}
        for name, m in list(model.model.layers.named_modules()):
            if id(m) in plain:
                parent, _, leaf = name.rpartition(".")
                setattr(model.model.layers.get_submodule(parent), leaf,
                        FrozenFloat8Linear(m, gemm, options.frozen_float8_from))
        return len(frozen)
    from torchao.float8 import convert_to_float8_training

    layers = model.model.layers
    before = sum(isinstance(m, nn.Linear) for m in layers.modules())
    convert_to_float8_training(layers, config=gemm[1])
    return before


def write_float8_weight(model: nn.Module, name: str, param: torch.Tensor, full: torch.Tensor) -> None:
    """Quantise the whole weight ``full`` (storage order) and write this rank's block of it into the
    float8 parameter ``name``, its scale into the owner's ``weight_scale`` (every rank computes the
    same scale from the same whole tensor: no collective), with the recipe the owner was built with."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    owner = model.get_submodule(name.rpartition(".")[0])
    data, scale = quantize_frozen_weight(full.to(param.device, owner.float8_stored_from), owner.float8_gemm[1])
    if isinstance(param, DTensor):
        data = distribute_tensor(data, param.device_mesh, param.placements, src_data_rank=None).to_local()
        param = param.to_local()
    param.copy_(data)
    owner.weight_scale.copy_(scale)


def dequantize_float8_weight(model: nn.Module, name: str, full: torch.Tensor) -> torch.Tensor:
    """A whole float8-stored weight back in the base's dtype (what the GEMMs saw, not the original)."""
    owner = model.get_submodule(name.rpartition(".")[0])
    return (full.to(torch.float32) / owner.weight_scale.to(full.device)).to(owner.float8_stored_from)
