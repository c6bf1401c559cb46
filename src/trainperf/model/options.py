"""What the model computes with, fixed when it is built: the kernels its layers call and the forms
its weights take. Read by the modules' constructors, never patched in afterwards."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ModelOptions:
    attention: str = "sdpa"  # hardware.attention: sdpa | flash4 (FlashAttention-4's op, model/flash4.py)
    lora_kernel: str = "torch"  # hardware.lora_kernel: torch (F.dropout, then A) | fused (model/lora_kernel.py)
    fp8: str = "none"  # hardware.fp8: none | tensorwise | rowwise (model/float8.py)
    # float8-rounded operands multiplied in high precision: off GPU there are no float8 GEMMs (and
    # CPU's reference _scaled_mm is ~1000x slower)
    emulate_fp8: bool = False
    # hardware.frozen_dtype=fp8: the decoder layers' frozen weights stored in float8, quantised from
    # this dtype (the one the rest of the frozen base is stored in); None keeps them as built
    frozen_float8_from: torch.dtype | None = None
    # context parallel's ring attention takes no enable_gqa: grouped K/V heads are repeated up front
    repeat_kv: bool = False
    # tensor-parallel degree: a fused qkv_proj is stored in the row order that gives each TP rank its
    # own slice of q, k and v (checkpoint.to_storage applies it on load)
    tp: int = 1
    # sequence parallel: between pipeline stages each TP rank holds 1/tp of the sequence, so a later
    # stage's RoPE tables are built for the whole sequence, not the shard it receives
    sequence_parallel: bool = False
