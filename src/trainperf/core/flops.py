"""Model FLOPs and MFU: the honest numbers (the peak FLOP/s per GPU is core.hardware's).

Model FLOPs count what the model needs, never recomputation:
  * every Linear of N weights costs 2·N FLOPs per token forward, 2·N for the input gradient and 2·N
    for the weight gradient. Full training: 6·N_linear. LoRA with a frozen base: the base has no
    weight-gradient GEMM, so 4·N_base, plus 6·N_adapters for the adapters (A and B).
  * the LM head is a Linear and counts; the embedding is a lookup and does not.
  * causal attention, forward: QK^T and PV each cost 2·S·d per token over the full square; the causal
    mask halves it on average, so 2·S·d per token per layer (d = heads·head_dim). Backward is 2× the
    forward (dQ, dK and dV, dP), so training costs 3× the forward -- with or without LoRA, since
    input gradients must flow through attention either way.
MFU = model FLOPs per second per GPU / the GPU's dense bf16 peak (H100/H200 SXM: 989 TFLOP/s; the
1,979 figure assumes 2:4 sparsity).
"""

from __future__ import annotations

from trainperf.core.families import family
from trainperf.core.spec import LoRASpec, ModelSpec


def projection_shapes(m: ModelSpec) -> dict[str, tuple[int, int]]:
    """(input width, output width) of each decoder-layer projection, by its module name; ``qkv_proj``
    is the fused q, k and v of a ``fused_qkv`` model. The family says (ModelFamily.projection_shapes):
    a GPT has the same attention projections and a two-GEMM MLP, no gate."""
    return family(m.family).projection_shapes(m)


def linear_params(m: ModelSpec) -> dict[str, int]:
    """Weights of every projection summed over the layers (q, k, v unfused: a fused qkv holds the same),
    and of the LM head."""
    return family(m.family).linear_params(m)


def lora_params(m: ModelSpec, lora: LoRASpec) -> int:
    if not lora.enabled:
        return 0
    shapes = projection_shapes(m)
    return m.num_layers * sum(lora.rank * (shapes[t][0] + shapes[t][1]) for t in lora.target_modules)


def total_params(m: ModelSpec) -> int:
    """Weights: the projections and LM head, and what the family holds besides (ModelFamily.other_params:
    the embedding and norms; a GPT's tied output layer is its embedding, counted once, plus its
    position table)."""
    return sum(linear_params(m).values()) + family(m.family).other_params(m)


def attention_fwd_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    return family(m.family).attention_fwd_flops_per_token(m, seq_len)


def train_flops_per_token(m: ModelSpec, lora: LoRASpec, seq_len: int) -> float:
    n_linear = sum(family(m.family).active_linear_params(m).values())  # a token's weights: an MoE's routed experts only
    attn = 3.0 * attention_fwd_flops_per_token(m, seq_len)
    if lora.enabled:
        return 4.0 * n_linear + 6.0 * lora_params(m, lora) + attn
    return 6.0 * n_linear + attn


def mfu(flops_per_token: float, tokens_per_s_per_gpu: float, peak_flops: float | None) -> float | None:
    if not peak_flops:
        return None
    return flops_per_token * tokens_per_s_per_gpu / peak_flops
