"""LoRA's input side in one pass: dropout drawn inside the adapter's A GEMM, for every adapter that
reads the same input (q, k and v read one normed x).

``hardware.lora_kernel=fused`` routes ``B(A(dropout(x)))``'s first half here. Unfused, each adapter
draws a mask (bool, one byte per element of x), writes a dropped copy of x, reads it for its rank-r GEMM,
and keeps mask and copy for the backward; the 7B step spent 0.08 s of 2.1 s in those draws and 0.06 s
in the rank-16 GEMMs, all bandwidth-bound (docs/PERFORMANCE.md, seventh session). Fused, x is read
once per pass for all adapters sharing it and nothing x-sized is stored or written in the forward; the
backward reads x once and writes one input gradient for them all.

The masks come from a counter-based generator, so the backward regenerates them instead of keeping
them: Philox4x32-10 (Salmon et al. 2011) keyed by a 64-bit seed drawn from PyTorch's generator once per
call (so checkpoint's RNG replay and torch.manual_seed behave as for F.dropout), counter = the
element's flat index in x. One Philox call gives four 32-bit words; adapter i of the group keeps the
element when word i >= round(p * 2**32): up to four adapters, independent masks, one call. The kernel
is Triton's Philox (``tl.randint4x``); ``philox4x32`` below is the same function in plain PyTorch, the
op's CPU implementation and what the GPU tests compare the kernel with bit for bit.

Distribution: keep with probability 1 - p (to 2**-32), kept values scaled by 1 / (1 - p), as F.dropout;
the masks are different draws from F.dropout's (another generator), like any two seeds.
"""

from __future__ import annotations


import torch

MAX_ADAPTERS = 4  # Philox4x32 yields four words per counter: one per adapter
PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
MASK32 = 0xFFFFFFFF


def _mulhilo(a: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of a * b for a (int64 holding uint32) and a 32-bit constant b, without
    overflowing int64: b split in 16-bit halves keeps every partial product under 2**48."""
    b_hi, b_lo = b >> 16, b & 0xFFFF
    upper, lower = a * b_hi, a * b_lo
    hi = (upper + (lower >> 16)) >> 16
    lo = (((upper & 0xFFFF) << 16) + lower) & MASK32
    return hi, lo


def philox4x32_rounds(c0, c1, c2, c3, k0: int, k1: int, rounds: int = 10) -> list[torch.Tensor]:
    """Philox4x32-``rounds`` of the counter words c0..c3 (int64 tensors holding uint32) and key (k0, k1)."""
    for _ in range(rounds):
        hi0, lo0 = _mulhilo(c0, PHILOX_M0)
        hi1, lo1 = _mulhilo(c2, PHILOX_M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + PHILOX_W0) & MASK32, (k1 + PHILOX_W1) & MASK32
    return [c0, c1, c2, c3]


def philox4x32(counter: torch.Tensor, seed: int) -> list[torch.Tensor]:
    """Philox4x32-10 of counter (c0 = ``counter``, a uint32 in int64; c1 = c2 = c3 = 0) and the 64-bit key
    ``seed``: the four output words (int64 holding uint32), as Triton's ``randint4x``."""
    c0 = counter.to(torch.int64) & MASK32
    zero = torch.zeros_like(c0)
    return philox4x32_rounds(c0, zero, zero, zero, seed & MASK32, (seed >> 32) & MASK32)


def drop_threshold(p: float) -> int:
    """A word >= this keeps its element: keep probability 1 - p to within 2**-32."""
    return min(round(p * 2**32), 2**32 - 1)


def keep_masks(seed: int, rows: int, cols: int, n: int, p: float, device=None) -> list[torch.Tensor]:
    """The n boolean keep masks (rows x cols) the kernels draw for ``seed``."""
    if rows * cols > 2**32:
        raise ValueError(f"the fused LoRA kernel numbers elements in 32 bits; {rows} x {cols} is more")
    counter = torch.arange(rows * cols, device=device, dtype=torch.int64).view(rows, cols)
    threshold = drop_threshold(p)
    return [word >= threshold for word in philox4x32(counter, seed)[:n]]


# ---------------------------------------------------------------------------------------------
# the op: h = [dropout_i(x) @ a_i^T for each adapter i], concatenated along the last dim

@torch.library.custom_op("trainperf::lora_dropout_a", mutates_args=())
def lora_dropout_a(x: torch.Tensor, a: torch.Tensor, seed: torch.Tensor, p: float, n: int) -> torch.Tensor:
    """x: (M, K); a: (n * r, K), the adapters' A weights stacked; seed: int64 (1,). Returns (M, n * r)."""
    if x.is_cuda:
        from trainperf.model.lora_triton import forward

        return forward(x, a, seed, p, n)
    masks = keep_masks(int(seed.item()), x.shape[0], x.shape[1], n, p, x.device)
    scale = 1.0 / (1.0 - p)
    return torch.cat([(x * mask * scale) @ a_i.t() for mask, a_i in zip(masks, a.chunk(n))], dim=-1)


@lora_dropout_a.register_fake
def _(x, a, seed, p, n):
    return x.new_empty(x.shape[0], a.shape[0])


@torch.library.custom_op("trainperf::lora_dropout_a_backward", mutates_args=())
def lora_dropout_a_backward(dh: torch.Tensor, x: torch.Tensor, a: torch.Tensor, seed: torch.Tensor,
                            p: float, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of x (M, K; all adapters' contributions summed) and of a (n * r, K)."""
    if x.is_cuda:
        from trainperf.model.lora_triton import backward

        return backward(dh, x, a, seed, p, n)
    masks = keep_masks(int(seed.item()), x.shape[0], x.shape[1], n, p, x.device)
    scale = 1.0 / (1.0 - p)
    dx = torch.zeros_like(x)
    da = []
    for mask, a_i, dh_i in zip(masks, a.chunk(n), dh.chunk(n, dim=-1)):
        dx += (dh_i @ a_i) * mask * scale
        da.append(dh_i.t() @ (x * mask * scale))
    return dx, torch.cat(da)


@lora_dropout_a_backward.register_fake
def _(dh, x, a, seed, p, n):
    return torch.empty_like(x), torch.empty_like(a)


def _setup_context(ctx, inputs, output):
    x, a, seed, p, n = inputs
    ctx.save_for_backward(x, a, seed)
    ctx.p, ctx.n = p, n


def _backward(ctx, dh):
    x, a, seed = ctx.saved_tensors
    dx, da = lora_dropout_a_backward(dh.contiguous(), x, a, seed, ctx.p, ctx.n)
    return dx, da, None, None, None


lora_dropout_a.register_autograd(_backward, setup_context=_setup_context)


def shared_input_lora_a(x: torch.Tensor, weights: list[torch.Tensor], p: float) -> torch.Tensor:
    """``cat([dropout_i(x) @ A_i^T])`` for the A weights of the adapters that read ``x`` (… , K):
    returns (…, n * r) in x's dtype, one fresh seed per call from PyTorch's generator."""
    n = len(weights)
    if not 1 <= n <= MAX_ADAPTERS:
        raise ValueError(f"the fused LoRA kernel takes 1 to {MAX_ADAPTERS} adapters per input, got {n}")
    lead, width = x.shape[:-1], x.shape[-1]
    a = torch.cat([w.to(x.dtype) for w in weights]) if n > 1 else weights[0].to(x.dtype)
    seed = torch.randint(0, 2**62, (1,), device=x.device, dtype=torch.int64)
    h = lora_dropout_a(x.reshape(-1, width), a, seed, p, n)
    return h.view(*lead, a.shape[0])
