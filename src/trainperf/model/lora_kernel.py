"""LoRA's input side in one pass: dropout drawn inside the adapter's A GEMM, for every adapter that
reads the same input (q, k and v read one normed x).

``hardware.lora_kernel=fused`` routes ``B(A(dropout(x)))``'s first half here. Unfused, each adapter
draws a mask (bool, one byte per element of x), writes a dropped copy of x, reads it for its rank-r
GEMM, and keeps mask and copy for the backward. Fused, one forward kernel reads x once for all the
adapters sharing it and writes only their rank-r outputs and a 1-bit record of each mask; the backward
reads x and those bits and writes one input gradient for them all and each A's gradient, either in
one kernel or in two lighter ones (dx, dA) -- whichever ran faster on the shape's first call.

The masks come from Philox4x32-10 (Salmon et al. 2011; Triton's ``tl.randint4x``) keyed by a 64-bit
seed drawn from PyTorch's generator once per call, so torch.manual_seed and checkpoint's RNG replay
behave as they do for F.dropout. Each Philox call yields eight 16-bit half words; one half word decides
one element for one adapter (keep when >= round(p * 2**16)): eight decisions per call, where one per
call made the kernel bound by the generator. ``keep_masks`` says which counter and half word each
element and adapter take. ``philox4x32`` is the same generator in plain PyTorch: the op's CPU
implementation, and what the GPU tests compare the kernel's mask bits with, bit for bit.

Distribution: keep with probability 1 - p to within 2**-16 (p = 0.1: 0.899994), kept values scaled by
the inverse of that probability (an exact expectation); the masks are other draws than F.dropout's
(another generator), like any two seeds.
"""

from __future__ import annotations

import torch

from trainperf.model.lora_layout import (  # noqa: F401
    MAX_ADAPTERS,
    SEGMENT,
    SLOTS,
    WORD_BITS,
    column_groups,
    counters_per_row,
    drop_threshold,
    elements_per_call,
    keep_scale,
    padded_width,
    slots_per_element,
    takes_rank,
)

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


def check_counter_range(rows: int, width: int, n: int) -> None:
    if rows * counters_per_row(width, n) > 2**32:
        raise ValueError(f"the fused LoRA kernel numbers Philox counters in 32 bits; {rows} x {width} needs more")


def keep_masks(seed: int, rows: int, cols: int, n: int, p: float, device=None) -> list[torch.Tensor]:
    """The n boolean keep masks (rows x cols) the kernels draw for ``seed``.

    A row's columns come in groups of SEGMENT x E (E = elements_per_call(n)); column c of group g, at position e * SEGMENT + j inside it, takes counter
    row * counters_per_row + g * SEGMENT + j, and adapter i its half word e * slots + i of that call
    (word (e * slots + i) // 2, low half first). Each kernel program draws one run of SEGMENT counters
    for E x SEGMENT contiguous columns: no shuffling of random words between lanes."""
    check_counter_range(rows, cols, n)
    per_row = counters_per_row(cols, n)
    slots = slots_per_element(n)
    group = SEGMENT * elements_per_call(n)
    col = torch.arange(cols, device=device, dtype=torch.int64)
    e, j = (col % group) // SEGMENT, col % SEGMENT
    counter = (torch.arange(rows, device=device, dtype=torch.int64)[:, None] * per_row
               + ((col // group) * SEGMENT + j)[None, :])
    words = torch.stack(philox4x32(counter, seed))  # (4, rows, cols)
    threshold = drop_threshold(p)
    masks = []
    for i in range(n):
        slot = e * slots + i  # per column
        word = _pick(words, slot // 2)
        half = (word >> (WORD_BITS * (slot % 2))[None, :]) & (2**WORD_BITS - 1)
        masks.append(half >= threshold)
    return masks


def _pick(words: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """words[index[c], :, c] for each column c of the stacked words (4, rows, cols)."""
    return words.gather(0, index[None, None, :].expand(1, words.shape[1], -1))[0]


def check_kernel_inputs(x: torch.Tensor, a: torch.Tensor, n: int, float32_ok: bool = False) -> int:
    """What the GPU kernels take (ValueError otherwise); returns the adapter rank. ``float32_ok``: under
    Triton's CPU interpreter, which computes fp32 exactly (and garbles bf16); on a GPU fp32 dots would
    run in tf32."""
    rank = a.shape[0] // n
    if a.shape != (n * rank, x.shape[1]) or not takes_rank(rank):
        raise ValueError(f"the fused LoRA kernel takes adapter ranks that are powers of two >= 16; got A {tuple(a.shape)} "
                         f"for {n} adapters of input width {x.shape[1]}")
    if x.dtype not in (torch.bfloat16, torch.float16) + ((torch.float32,) if float32_ok else ()) or a.dtype != x.dtype:
        raise ValueError(f"the fused LoRA kernel takes bf16 or fp16 x and A of one dtype; got {x.dtype} and {a.dtype}")
    check_counter_range(x.shape[0], x.shape[1], n)
    return rank


def pack_keep_bits(masks: list[torch.Tensor], n: int) -> torch.Tensor:
    """The kernels' record of the forward's masks (each rows x padded_width): int32 (rows, groups,
    SLOTS); bit j of [row, g, e * slots + i] is adapter i's keep of column g * group + e * SEGMENT + j.
    1 bit per element and adapter (3 x 4 MiB for q/k/v over 8192 x 4096), where F.dropout keeps a byte."""
    rows, width = masks[0].shape
    slots = slots_per_element(n)
    per_group = elements_per_call(n)
    groups = width // (SEGMENT * per_group)
    weights = 2 ** torch.arange(SEGMENT, device=masks[0].device, dtype=torch.int64)
    bits = torch.zeros(rows, groups, SLOTS, dtype=torch.int64, device=masks[0].device)
    for i, mask in enumerate(masks):
        runs = mask.view(rows, groups, per_group, SEGMENT).to(torch.int64)
        bits[:, :, [e * slots + i for e in range(per_group)]] = (runs * weights).sum(-1)
    return torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)


def unpack_keep_bits(bits: torch.Tensor, n: int, width: int) -> list[torch.Tensor]:
    """pack_keep_bits' inverse, trimmed to ``width`` columns."""
    rows, groups, _ = bits.shape
    slots = slots_per_element(n)
    per_group = elements_per_call(n)
    shifts = torch.arange(SEGMENT, device=bits.device, dtype=torch.int32)
    unpacked = (bits[..., None] >> shifts) & 1  # (rows, groups, SLOTS, SEGMENT)
    return [unpacked[:, :, [e * slots + i for e in range(per_group)]].reshape(rows, -1)[:, :width].bool()
            for i in range(n)]


# ---------------------------------------------------------------------------------------------
# the op: h = [dropout_i(x) @ a_i^T for each adapter i], concatenated along the last dim, and the masks'
# bits for the backward

@torch.library.custom_op("trainperf::lora_dropout_a", mutates_args=())
def lora_dropout_a(x: torch.Tensor, a: torch.Tensor, seed: torch.Tensor, p: float,
                   n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x: (M, K); a: (n * r, K), the adapters' A weights stacked; seed: int64 (1,). Returns h (M, n * r)
    and the keep bits (pack_keep_bits)."""
    if x.is_cuda:
        from trainperf.model.lora_triton import forward

        return forward(x, a, seed, p, n)
    padded = keep_masks(int(seed.item()), x.shape[0], padded_width(x.shape[1], n), n, p, x.device)
    masks = [m[:, :x.shape[1]] for m in padded]
    scale = keep_scale(p)
    h = torch.cat([(x * mask * scale) @ a_i.t() for mask, a_i in zip(masks, a.chunk(n))], dim=-1)
    return h, pack_keep_bits(padded, n)


@lora_dropout_a.register_fake
def _(x, a, seed, p, n):
    groups = column_groups(x.shape[1], n)
    return x.new_empty(x.shape[0], a.shape[0]), x.new_empty(x.shape[0], groups, SLOTS, dtype=torch.int32)


@torch.library.custom_op("trainperf::lora_dropout_a_backward", mutates_args=())
def lora_dropout_a_backward(dh: torch.Tensor, x: torch.Tensor, a: torch.Tensor, bits: torch.Tensor,
                            p: float, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of x (M, K; all adapters' contributions summed) and of a (n * r, K)."""
    if x.is_cuda:
        from trainperf.model.lora_triton import backward

        return backward(dh, x, a, bits, p, n)
    masks = unpack_keep_bits(bits, n, x.shape[1])
    scale = keep_scale(p)
    dx = torch.zeros_like(x)
    da = []
    for mask, a_i, dh_i in zip(masks, a.chunk(n), dh.chunk(n, dim=-1)):
        dx += (dh_i @ a_i) * mask * scale
        da.append(dh_i.t() @ (x * mask * scale))
    return dx, torch.cat(da)


@lora_dropout_a_backward.register_fake
def _(dh, x, a, bits, p, n):
    return torch.empty_like(x), torch.empty_like(a)


def _setup_context(ctx, inputs, output):
    x, a, _seed, p, n = inputs
    ctx.save_for_backward(x, a, output[1])
    ctx.p, ctx.n = p, n


def _backward(ctx, dh, _dbits):
    x, a, bits = ctx.saved_tensors
    dx, da = lora_dropout_a_backward(dh.contiguous(), x, a, bits, ctx.p, ctx.n)
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
    h, _bits = lora_dropout_a(x.reshape(-1, width), a, seed, p, n)
    return h.view(*lead, a.shape[0])
