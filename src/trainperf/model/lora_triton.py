"""Triton kernels of the fused LoRA input side (model/lora_kernel.py says what and why).

Imported only when the op runs on a GPU: CPU-only installs have no Triton. Under Triton's CPU
interpreter (TRITON_INTERPRET=1, how the tests run these kernels without a GPU) the blocks are fixed
instead of autotuned (the autotuner needs a GPU to time them).
"""

from __future__ import annotations

import os
import warnings

import torch
import triton
import triton.language as tl
from triton.runtime.errors import TritonError

from trainperf.model.lora_kernel import check_kernel_inputs
from trainperf.model.lora_layout import (
    SLOTS,
    column_groups,
    counters_per_row,
    drop_threshold,
    keep_scale,
    slots_per_element,
)

# Block sizes and split counts from a sweep on one H200 (x 8192 x 4096, rank 16, 1 and 3 adapters;
# bench/data/h200_2026-12-01_fused_lora_kernel.json, 4_block_and_split_sweep): the Philox state of a (BLOCK_M, 32) tile of counters is four
# words per counter, so small row blocks win; the autotuner picks among the best three per kernel, and
# the splits (launch parameters, outside the autotuner) cut the columns (forward) or rows (backward)
# so that several programs share each SM
FORWARD_CONFIGS = [triton.Config({"BLOCK_M": bm}, num_warps=w, num_stages=3) for bm, w in ((32, 2), (32, 4), (64, 8))]
BACKWARD_CONFIGS = [triton.Config({"BLOCK_M": bm}, num_warps=w, num_stages=3) for bm, w in ((32, 4), (64, 4), (64, 8))]
# the split backward's dx kernel: no cross-block state, so larger row blocks stay cheap (not yet swept)
DX_CONFIGS = [triton.Config({"BLOCK_M": bm}, num_warps=w, num_stages=3) for bm, w in ((32, 4), (64, 8), (128, 8))]
GROUPS_PER_PROGRAM = 8  # forward: column groups one program walks (q/k/v: 8 splits; 0.13 ms in the sweep)
BACKWARD_PROGRAMS = 512  # backward: column groups x row splits (q/k/v: 64 x 8; 0.17 ms in the sweep)


@triton.jit
def half_word_keeps(w0, w1, w2, w3, SLOT: tl.constexpr, threshold):
    """Half word SLOT (0..7: word SLOT // 2, low half first) of one Philox call >= threshold."""
    if SLOT // 2 == 0:
        w = w0
    elif SLOT // 2 == 1:
        w = w1
    elif SLOT // 2 == 2:
        w = w2
    else:
        w = w3
    if SLOT % 2 == 1:
        w = w >> 16
    return (w & 0xFFFF).to(tl.int32) >= threshold


@triton.jit
def add_to_slot(SLOT: tl.constexpr, value, d0, d1, d2, d3, d4, d5, d6, d7):
    """d[SLOT] += value (Triton has no indexable register arrays; SLOT is static)."""
    if SLOT == 0:
        d0 += value
    elif SLOT == 1:
        d1 += value
    elif SLOT == 2:
        d2 += value
    elif SLOT == 3:
        d3 += value
    elif SLOT == 4:
        d4 += value
    elif SLOT == 5:
        d5 += value
    elif SLOT == 6:
        d6 += value
    else:
        d7 += value
    return d0, d1, d2, d3, d4, d5, d6, d7


@triton.jit
def pick_slot(SLOT: tl.constexpr, d0, d1, d2, d3, d4, d5, d6, d7):
    if SLOT < 4:
        return pick(SLOT, d0, d1, d2, d3)
    else:
        return pick(SLOT - 4, d4, d5, d6, d7)


@triton.jit
def pick(I: tl.constexpr, t0, t1, t2, t3):
    if I == 0:
        return t0
    elif I == 1:
        return t1
    elif I == 2:
        return t2
    else:
        return t3


@triton.jit
def scaled_x_tile(x_ptr, rows, cols, row_ok, K, stride_xm, scale):
    """x's (rows, 32) tile times the inverse keep probability, in x's dtype (zeros outside x)."""
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + cols[None, :],
                mask=row_ok[:, None] & (cols[None, :] < K), other=0.0)
    return (x.to(tl.float32) * scale).to(x.dtype)


@triton.jit
def kept(bits_rows, SLOT: tl.constexpr, row_ok, j):
    """The (rows, 32) keep mask that bit record SLOT of these rows' column group holds (the forward's bits)."""
    packed = tl.load(bits_rows + SLOT, mask=row_ok, other=0)
    return ((packed[:, None] >> j[None, :]) & 1) != 0


@triton.jit
def store_dx(dx_ptr, dx, rows, cols, row_ok, K, scale):
    tl.store(dx_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], (dx * scale).to(dx_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (cols[None, :] < K))


@triton.jit
def zero_slots(R: tl.constexpr, SEG: tl.constexpr):
    """The eight (R, 32) dA accumulators of one column group: one per mask slot."""
    z = tl.zeros((R, SEG), dtype=tl.float32)
    return z, z, z, z, z, z, z, z


@triton.jit
def store_da_parts(part_ptr, split, g, K, d0, d1, d2, d3, d4, d5, d6, d7,
                   N: tl.constexpr, R: tl.constexpr, S: tl.constexpr):
    """part[split, i * R + r, cols] = this split's share of dA_i over column group g."""
    E: tl.constexpr = 8 // S
    SEG: tl.constexpr = 32
    j = tl.arange(0, SEG)
    ranks = tl.arange(0, R)
    for e in tl.static_range(E):
        cols = g * (SEG * E) + e * SEG + j
        for i in tl.static_range(N):
            out = part_ptr + (split * (N * R) + i * R + ranks[:, None]).to(tl.int64) * K + cols[None, :]
            tl.store(out, pick_slot(e * S + i, d0, d1, d2, d3, d4, d5, d6, d7), mask=cols[None, :] < K)


@triton.jit
def forward_kernel(x_ptr, a_ptr, part_ptr, bits_ptr, seed_ptr, M, K, stride_xm, per_row, groups, groups_per_split,
                   threshold, scale, N: tl.constexpr, R: tl.constexpr, S: tl.constexpr, BLOCK_M: tl.constexpr):
    """part[split, rows, i * R:(i + 1) * R] = dropout_i(x) @ a_i^T over this split's column groups, and
    the masks' bits (lora_kernel.pack_keep_bits) for the backward."""
    E: tl.constexpr = 8 // S  # elements per Philox call
    SEG: tl.constexpr = 32
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    split = tl.program_id(1)
    row_ok = rows < M
    j = tl.arange(0, SEG)
    ranks = tl.arange(0, R)
    seed = tl.load(seed_ptr)
    acc0 = tl.zeros((BLOCK_M, R), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_M, R), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, R), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_M, R), dtype=tl.float32)
    first = split * groups_per_split
    for g in range(first, tl.minimum(first + groups_per_split, groups)):
        w0, w1, w2, w3 = tl.randint4x(seed, rows[:, None] * per_row + g * SEG + j[None, :])
        for e in tl.static_range(E):
            cols = g * (SEG * E) + e * SEG + j
            xs = scaled_x_tile(x_ptr, rows, cols, row_ok, K, stride_xm, scale)
            zero = tl.zeros_like(xs)
            for i in tl.static_range(N):
                keep = half_word_keeps(w0, w1, w2, w3, e * S + i, threshold)
                packed = tl.sum(tl.where(keep, (1 << j)[None, :], 0), axis=1)  # distinct bits: sum == or
                tl.store(bits_ptr + (rows.to(tl.int64) * groups + g) * 8 + e * S + i, packed, mask=row_ok)
                a = tl.load(a_ptr + (i * R + ranks)[None, :] * K + cols[:, None], mask=cols[:, None] < K, other=0.0)
                part = tl.dot(tl.where(keep, xs, zero), a)
                if i == 0:
                    acc0 += part
                elif i == 1:
                    acc1 += part
                elif i == 2:
                    acc2 += part
                else:
                    acc3 += part
    out = part_ptr + (split * M + rows[:, None]).to(tl.int64) * (N * R) + ranks[None, :]
    for i in tl.static_range(N):
        tl.store(out + i * R, pick(i, acc0, acc1, acc2, acc3), mask=row_ok[:, None])


@triton.jit
def backward_kernel(x_ptr, a_ptr, dh_ptr, dx_ptr, part_ptr, bits_ptr, M, K, stride_xm, groups, rows_per_split,
                    scale, N: tl.constexpr, R: tl.constexpr, S: tl.constexpr, BLOCK_M: tl.constexpr):
    """One column group over a split of the rows, the masks read from the forward's bits (no Philox):
    dx for those rows and columns (all adapters summed), and part[split, i * R + r, cols] = the split's
    share of dA_i."""
    E: tl.constexpr = 8 // S
    SEG: tl.constexpr = 32
    g = tl.program_id(0)
    split = tl.program_id(1)
    j = tl.arange(0, SEG)
    ranks = tl.arange(0, R)
    d0, d1, d2, d3, d4, d5, d6, d7 = zero_slots(R, SEG)
    first = split * rows_per_split
    for m0 in range(first, tl.minimum(first + rows_per_split, M), BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        bits_rows = bits_ptr + (rows.to(tl.int64) * groups + g) * 8
        dh_rows = dh_ptr + rows[:, None].to(tl.int64) * (N * R) + ranks[None, :]
        # dh_i as (BLOCK_M, R) for dx and, read again transposed, (R, BLOCK_M) for dA (tiny, from cache)
        dh_cols = dh_ptr + rows[None, :].to(tl.int64) * (N * R) + ranks[:, None]
        dh0 = tl.load(dh_rows, mask=row_ok[:, None], other=0.0)
        dht0 = tl.load(dh_cols, mask=row_ok[None, :], other=0.0)
        dh1 = dh0
        dh2 = dh0
        dh3 = dh0
        dht1 = dht0
        dht2 = dht0
        dht3 = dht0
        if N > 1:
            dh1 = tl.load(dh_rows + R, mask=row_ok[:, None], other=0.0)
            dht1 = tl.load(dh_cols + R, mask=row_ok[None, :], other=0.0)
        if N > 2:
            dh2 = tl.load(dh_rows + 2 * R, mask=row_ok[:, None], other=0.0)
            dht2 = tl.load(dh_cols + 2 * R, mask=row_ok[None, :], other=0.0)
        if N > 3:
            dh3 = tl.load(dh_rows + 3 * R, mask=row_ok[:, None], other=0.0)
            dht3 = tl.load(dh_cols + 3 * R, mask=row_ok[None, :], other=0.0)
        for e in tl.static_range(E):
            cols = g * (SEG * E) + e * SEG + j
            xs = scaled_x_tile(x_ptr, rows, cols, row_ok, K, stride_xm, scale)
            zero = tl.zeros_like(xs)
            dx = tl.zeros((BLOCK_M, SEG), dtype=tl.float32)
            for i in tl.static_range(N):
                keep = kept(bits_rows, e * S + i, row_ok, j)
                dh = pick(i, dh0, dh1, dh2, dh3)
                a = tl.load(a_ptr + (i * R + ranks)[:, None] * K + cols[None, :], mask=cols[None, :] < K, other=0.0)
                dx += tl.where(keep, tl.dot(dh, a), 0.0)
                dht = pick(i, dht0, dht1, dht2, dht3)
                d0, d1, d2, d3, d4, d5, d6, d7 = add_to_slot(e * S + i, tl.dot(dht, tl.where(keep, xs, zero)),
                                                              d0, d1, d2, d3, d4, d5, d6, d7)
            store_dx(dx_ptr, dx, rows, cols, row_ok, K, scale)
    store_da_parts(part_ptr, split, g, K, d0, d1, d2, d3, d4, d5, d6, d7, N, R, S)


@triton.jit
def dx_kernel(a_ptr, dh_ptr, dx_ptr, bits_ptr, M, K, groups, scale,
              N: tl.constexpr, R: tl.constexpr, S: tl.constexpr, BLOCK_M: tl.constexpr):
    """The backward's input gradient alone: one block of rows by one column group, all adapters summed.
    It reads neither x nor carries accumulators across row blocks, so it needs far fewer registers
    than backward_kernel (ptxas: 91-149 against 239-255) and every (rows, group) tile is a program."""
    E: tl.constexpr = 8 // S
    SEG: tl.constexpr = 32
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    g = tl.program_id(1)
    row_ok = rows < M
    j = tl.arange(0, SEG)
    ranks = tl.arange(0, R)
    bits_rows = bits_ptr + (rows.to(tl.int64) * groups + g) * 8
    dh_rows = dh_ptr + rows[:, None].to(tl.int64) * (N * R) + ranks[None, :]
    for e in tl.static_range(E):
        cols = g * (SEG * E) + e * SEG + j
        dx = tl.zeros((BLOCK_M, SEG), dtype=tl.float32)
        for i in tl.static_range(N):
            keep = kept(bits_rows, e * S + i, row_ok, j)
            dh = tl.load(dh_rows + i * R, mask=row_ok[:, None], other=0.0)
            a = tl.load(a_ptr + (i * R + ranks)[:, None] * K + cols[None, :], mask=cols[None, :] < K, other=0.0)
            dx += tl.where(keep, tl.dot(dh, a), 0.0)
        store_dx(dx_ptr, dx, rows, cols, row_ok, K, scale)


@triton.jit
def da_kernel(x_ptr, dh_ptr, part_ptr, bits_ptr, M, K, stride_xm, groups, rows_per_split, scale,
              N: tl.constexpr, R: tl.constexpr, S: tl.constexpr, BLOCK_M: tl.constexpr):
    """The backward's weight gradients alone: backward_kernel without dx (no dh row tiles, no dx tile)."""
    E: tl.constexpr = 8 // S
    SEG: tl.constexpr = 32
    g = tl.program_id(0)
    split = tl.program_id(1)
    j = tl.arange(0, SEG)
    ranks = tl.arange(0, R)
    d0, d1, d2, d3, d4, d5, d6, d7 = zero_slots(R, SEG)
    first = split * rows_per_split
    for m0 in range(first, tl.minimum(first + rows_per_split, M), BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        bits_rows = bits_ptr + (rows.to(tl.int64) * groups + g) * 8
        dh_cols = dh_ptr + rows[None, :].to(tl.int64) * (N * R) + ranks[:, None]
        for e in tl.static_range(E):
            cols = g * (SEG * E) + e * SEG + j
            xs = scaled_x_tile(x_ptr, rows, cols, row_ok, K, stride_xm, scale)
            zero = tl.zeros_like(xs)
            for i in tl.static_range(N):
                keep = kept(bits_rows, e * S + i, row_ok, j)
                dht = tl.load(dh_cols + i * R, mask=row_ok[None, :], other=0.0)
                d0, d1, d2, d3, d4, d5, d6, d7 = add_to_slot(e * S + i, tl.dot(dht, tl.where(keep, xs, zero)),
                                                              d0, d1, d2, d3, d4, d5, d6, d7)
    store_da_parts(part_ptr, split, g, K, d0, d1, d2, d3, d4, d5, d6, d7, N, R, S)


INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
if INTERPRETED:
    BLOCKS = {"BLOCK_M": 16}
else:
    BLOCKS = {}
    forward_kernel = triton.autotune(FORWARD_CONFIGS, key=["M", "K", "N", "R"])(forward_kernel)
    backward_kernel = triton.autotune(BACKWARD_CONFIGS, key=["M", "K", "N", "R"])(backward_kernel)
    dx_kernel = triton.autotune(DX_CONFIGS, key=["M", "K", "N", "R"])(dx_kernel)
    da_kernel = triton.autotune(BACKWARD_CONFIGS, key=["M", "K", "N", "R"])(da_kernel)


def forward(x, a, seed, p, n):
    rank = check_kernel_inputs(x, a, n, float32_ok=INTERPRETED)
    x = x if x.stride(-1) == 1 else x.contiguous()
    rows, width = x.shape
    per_row = counters_per_row(width, n)
    groups = column_groups(width, n)
    per_split = min(GROUPS_PER_PROGRAM, groups)
    n_splits = triton.cdiv(groups, per_split)
    part = torch.empty(n_splits, rows, n * rank, dtype=torch.float32, device=x.device)
    bits = torch.zeros(rows, groups, SLOTS, dtype=torch.int32, device=x.device)  # unused slots stay 0
    grid = lambda meta: (triton.cdiv(rows, meta["BLOCK_M"]), n_splits)  # noqa: E731
    forward_kernel[grid](x, a.contiguous(), part, bits, seed, rows, width, x.stride(0), per_row, groups, per_split,
                         drop_threshold(p), keep_scale(p), N=n, R=rank, S=slots_per_element(n), **BLOCKS)
    return (part[0] if n_splits == 1 else part.sum(0)).to(x.dtype), bits


def _row_splits(rows: int, groups: int) -> tuple[int, int]:
    """(row splits, rows per split) of the dA reduction: BACKWARD_PROGRAMS programs in all, each split a
    multiple of 128 rows (a multiple of every config's BLOCK_M)."""
    block = 128
    row_blocks = triton.cdiv(rows, block)
    n_splits = max(1, min(row_blocks, triton.cdiv(BACKWARD_PROGRAMS, groups)))
    rows_per_split = triton.cdiv(row_blocks, n_splits) * block
    return triton.cdiv(rows, rows_per_split), rows_per_split


def backward_one_pass(dh, x, a, bits, p, n):
    """dx and dA in one kernel: x and the bits read once."""
    rank = check_kernel_inputs(x, a, n, float32_ok=INTERPRETED)
    x = x if x.stride(-1) == 1 else x.contiguous()
    rows, width = x.shape
    groups = column_groups(width, n)
    n_splits, rows_per_split = _row_splits(rows, groups)
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    part = torch.empty(n_splits, n * rank, width, dtype=torch.float32, device=x.device)
    backward_kernel[(groups, n_splits)](x, a.contiguous(), dh.contiguous(), dx, part, bits, rows, width, x.stride(0),
                                        groups, rows_per_split, keep_scale(p), N=n, R=rank, S=slots_per_element(n),
                                        **BLOCKS)
    return dx, (part[0] if n_splits == 1 else part.sum(0)).to(a.dtype)


def backward_split(dh, x, a, bits, p, n):
    """dx and dA in two lighter kernels: the bits read twice, x once (dA only), far fewer registers."""
    rank = check_kernel_inputs(x, a, n, float32_ok=INTERPRETED)
    x = x if x.stride(-1) == 1 else x.contiguous()
    a, dh = a.contiguous(), dh.contiguous()
    rows, width = x.shape
    groups = column_groups(width, n)
    slots = slots_per_element(n)
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    grid = lambda meta: (triton.cdiv(rows, meta["BLOCK_M"]), groups)  # noqa: E731
    dx_kernel[grid](a, dh, dx, bits, rows, width, groups, keep_scale(p), N=n, R=rank, S=slots, **BLOCKS)
    n_splits, rows_per_split = _row_splits(rows, groups)
    part = torch.empty(n_splits, n * rank, width, dtype=torch.float32, device=x.device)
    da_kernel[(groups, n_splits)](x, dh, part, bits, rows, width, x.stride(0), groups, rows_per_split, keep_scale(p),
                                  N=n, R=rank, S=slots, **BLOCKS)
    return dx, (part[0] if n_splits == 1 else part.sum(0)).to(a.dtype)


BACKWARDS = {"one-pass": backward_one_pass, "split": backward_split}
backward_picks: dict[tuple, str] = {}  # (rows, width, adapters, rank, dtype, device) -> the faster backward


def _time_ms(fn, reps: int = 20, sleep_cycles: int = 20_000_000) -> float:
    """GPU milliseconds per call of ``fn``, the host's launch cost left out. Timing calls back to back
    from the host (triton.testing.do_bench) measures the launches when a kernel is as short as these
    (0.07-0.2 ms): on an H200 that picked the one-pass form for every q/k/v/o/down shape although the
    split form ran 2-22% faster on the GPU (bench/lora_kernel.py's CUDA-graph times). Here the stream
    is held in ``torch.cuda._sleep`` while the host queues every call, each between two events and
    after a write of the L2 cache's size (as do_bench clears it: no call finds its inputs cached);
    if the sleep ran out before the calls were queued, it is retried longer, and if it never holds
    (``fn`` waits for the GPU itself), the host's timing is what is left, with a warning."""
    fn()
    torch.cuda.synchronize()
    # one L2's worth (50 MiB on an H200), allocated during the first backward, at its peak memory
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    l2_bytes = getattr(props, "L2_cache_size", 0) or 64 * 2**20
    l2_flush = torch.empty(l2_bytes // 4, dtype=torch.int32, device="cuda")
    for _ in range(4):
        marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        torch.cuda._sleep(sleep_cycles)
        for start, end in marks:
            l2_flush.zero_()
            start.record()
            fn()
            end.record()
        queued_in_time = not marks[0][0].query()  # the sleep still held the stream when the last call was queued
        marks[-1][1].synchronize()
        if queued_in_time:
            return sum(start.elapsed_time(end) for start, end in marks) / reps
        sleep_cycles *= 4
    import triton.testing

    warnings.warn("the fused LoRA backward's pick could not queue its timed calls ahead of the GPU; "
                  "timing them from the host instead", stacklevel=2)
    return triton.testing.do_bench(fn, warmup=5, rep=20)


def pick_backward(dh, x, a, bits, p, n) -> str:
    """Time both backwards' GPU work on this shape once (as Triton's autotuner times its configs, the
    first call of a shape waits for the GPU) and keep the faster; the interpreter and CUDA-graph
    capture, where nothing can be timed, take the one-pass kernel."""
    if INTERPRETED or torch.cuda.is_current_stream_capturing():
        return "one-pass"
    key = (*x.shape, n, a.shape[0] // n, x.dtype, x.device)
    if key not in backward_picks:
        times, failures = {}, []
        for name, fn in BACKWARDS.items():
            try:
                fn(dh, x, a, bits, p, n)  # compiles and autotunes its kernels
            except TritonError as exc:  # a form that cannot compile or launch on this GPU is no candidate
                failures.append(f"{name}: {exc}")
                continue
            times[name] = _time_ms(lambda: fn(dh, x, a, bits, p, n))
        if not times:
            raise RuntimeError("no fused LoRA backward runs on this GPU: " + "; ".join(failures))
        backward_picks[key] = min(times, key=times.get)
    return backward_picks[key]


def backward(dh, x, a, bits, p, n):
    """dx (all adapters summed) and each A's gradient, the masks read from the forward's bits."""
    return BACKWARDS[pick_backward(dh, x, a, bits, p, n)](dh, x, a, bits, p, n)
