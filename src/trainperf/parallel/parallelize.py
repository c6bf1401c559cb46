"""Compose PyTorch's parallel techniques on one DeviceMesh, one function per technique, applied in a
fixed order (torchtitan's order): [TP/SP, CP: next issue] -> activation checkpointing -> compile ->
FSDP2/HSDP. This version builds the data-parallel part of the mesh: ``dp_replicate`` x ``dp_shard``.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from trainperf.specs import ParallelSpec


def build_mesh(p: ParallelSpec, device_type: str) -> DeviceMesh:
    """Outermost replication, then sharding (TP, CP and PP dims join in the next issue)."""
    return init_device_mesh(device_type, (p.dp_replicate, p.dp_shard), mesh_dim_names=("dp_replicate", "dp_shard"))


def layout_string(p: ParallelSpec) -> str:
    return f"dp_replicate={p.dp_replicate},dp_shard={p.dp_shard},tp={p.tp},cp={p.cp},pp={p.pp}"


def _selective_policy():
    """Save the outputs of matmuls and attention; recompute the cheap pointwise ops (norms, SiLU,
    RoPE, residual adds) in the backward pass. Memory of pointwise activations for ~no extra FLOPs."""
    from torch.utils.checkpoint import CheckpointPolicy

    save = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
            torch.ops.aten._scaled_dot_product_flash_attention.default,
            torch.ops.aten._scaled_dot_product_efficient_attention.default,
            torch.ops.aten._scaled_dot_product_cudnn_attention.default,
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _recomputed_forward(layer: nn.Module, mode: str, *args):
    """Run a decoder layer under torch.utils.checkpoint. Patching ``forward`` keeps parameter names
    unchanged (``checkpoint_wrapper`` would insert ``_checkpoint_wrapped_module`` into every name)."""
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    if mode == "full":
        return checkpoint(layer._forward_plain, *args, use_reentrant=False)
    context_fn = partial(create_selective_checkpoint_contexts, _selective_policy())
    return checkpoint(layer._forward_plain, *args, use_reentrant=False, context_fn=context_fn)


def apply_activation_checkpointing(model: nn.Module, mode: str) -> None:
    """train.recompute: none | selective (recompute pointwise ops) | full (recompute each layer)."""
    if mode == "none":
        return
    for layer in model.model.layers:
        layer._forward_plain = layer.forward
        layer.forward = partial(_recomputed_forward, layer, mode)


def apply_compile(model: nn.Module) -> None:
    """Compile each decoder layer separately (fast compile, reused across identical layers)."""
    for layer in model.model.layers:
        layer.forward = torch.compile(layer.forward, fullgraph=True)


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, param_dtype: torch.dtype | None) -> None:
    """FSDP2 per decoder layer, the embedding, and [norm, lm_head] with the root; HSDP when
    dp_replicate > 1 (replicate over the first mesh dim, shard over the second). Gradients are
    reduced in fp32 even when parameters are gathered in bf16."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model.model.embed_tokens, mesh=mesh, mp_policy=mp)
    # the root keeps norm + lm_head; not resharded after forward since backward needs them first
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)


def parallelize(model: nn.Module, p: ParallelSpec, mesh: DeviceMesh, recompute: str, compile_layers: bool,
                param_dtype: torch.dtype | None) -> None:
    apply_activation_checkpointing(model, recompute)
    if compile_layers:
        apply_compile(model)
    apply_fsdp(model, mesh, param_dtype)
