"""FlashAttention-4's CuTe-DSL kernels (Hopper sm90 / Blackwell sm100) as one PyTorch custom op.

``hardware.attention=flash4`` routes causal attention here instead of SDPA. The kernels come from the
``flash-attn-4`` package (``flash_attn.cute``), JIT-compiled by NVIDIA's CUTLASS DSL on first use; the
package is optional and is imported only when the op runs on a GPU.

Why a custom op rather than ``flash_attn.cute.flash_attn_func``: that function is an
``autograd.Function`` whose body calls the DSL's compiler, which ``torch.compile`` cannot trace. As a
``torch.library`` op with a fake (shape-only) implementation and a registered backward, a compiled
decoder block keeps attention as one opaque node and the selective checkpoint policy can name it.

Layout is FlashAttention's (batch, seq, heads, head_dim): the model skips the two transposes SDPA's
(batch, heads, seq, head_dim) needs. Grouped-query attention needs no repeat: k and v keep their
fewer heads.
"""

from __future__ import annotations

import importlib.util
import warnings

import torch

PACKAGE = "flash_attn.cute"


def available(head_dim: int = 128) -> str | None:
    """None when FA4 can run here, else why not (one line, for a clear error before any GPU work)."""
    if importlib.util.find_spec("flash_attn") is None or importlib.util.find_spec(PACKAGE) is None:
        return ("hardware.attention=flash4 needs the flash-attn-4 package (flash_attn.cute) and its "
                "nvidia-cutlass-dsl; valid without it: hardware.attention=sdpa")
    if not torch.cuda.is_available():  # a launcher without GPUs: the ranks' GPUs are checked where they run
        return None
    major, _ = torch.cuda.get_device_capability()
    if major not in (9, 10):
        return (f"hardware.attention=flash4 runs on Hopper or Blackwell (sm90/sm100); this GPU is sm{major}x; "
                "valid here: hardware.attention=sdpa")
    if major == 10 and head_dim > 128 and head_dim != 256:  # FA4's sm100 kernels: up to 128, or exactly 256
        return (f"hardware.attention=flash4 on Blackwell takes head dims up to 128 or 256; this model's is {head_dim}; "
                "use hardware.attention=sdpa")
    return None


# The CUTLASS DSL warns, on each kernel's first (JIT) compilation, that FA4's unused aux_data argument
# is not a JIT argument (flash-attn-4 4.0.0b36 with nvidia-cutlass-dsl 4.8.1): noise. Filtered once
# here rather than around every call, which would reset the warnings machinery on the step's hot path.
warnings.filterwarnings("ignore", message="Argument aux_data", category=UserWarning)


@torch.library.custom_op("trainperf::flash4_attn", mutates_args=())
def flash4_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention output (b, s, h, d) and the row log-sum-exp (b, h, s, fp32) the backward needs."""
    from flash_attn.cute.interface import _flash_attn_fwd

    out, lse, *_ = _flash_attn_fwd(q, k, v, softmax_scale=scale, causal=causal, return_lse=True)
    return out, lse


@flash4_attn.register_fake
def _(q, k, v, scale, causal):
    b, s, h, _ = q.shape
    return q.new_empty(b, s, h, v.shape[-1]), q.new_empty(b, h, s, dtype=torch.float32)


@torch.library.custom_op("trainperf::flash4_attn_backward", mutates_args=())
def flash4_attn_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                         lse: torch.Tensor, scale: float,
                         causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from flash_attn.cute.interface import _flash_attn_bwd

    dq, dk, dv = _flash_attn_bwd(q, k, v, out, dout, lse, softmax_scale=scale, causal=causal)[:3]
    return dq, dk, dv


@flash4_attn_backward.register_fake
def _(dout, q, k, v, out, lse, scale, causal):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, scale, causal = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.scale, ctx.causal = scale, causal


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = flash4_attn_backward(dout.contiguous(), q, k, v, out, lse, ctx.scale, ctx.causal)
    return dq, dk, dv, None, None


flash4_attn.register_autograd(_backward, setup_context=_setup_context)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + causal mask) v on (batch, seq, heads, head_dim) tensors."""
    return flash4_attn(q, k, v, q.shape[-1] ** -0.5, True)[0]
