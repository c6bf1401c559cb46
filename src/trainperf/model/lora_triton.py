"""Triton kernels of the fused LoRA input side (model/lora_kernel.py says what and why).

Imported only when the op runs on a GPU: CPU-only installs have no Triton. Under Triton's CPU
interpreter (TRITON_INTERPRET=1, how the tests run these kernels without a GPU) the blocks are fixed
instead of autotuned (the autotuner needs a GPU to time them).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from trainperf.model.lora_kernel import drop_threshold

FORWARD_CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_K": bk}, num_warps=w, num_stages=s)
               for bm, bk, w, s in ((64, 64, 4, 3), (64, 128, 4, 3), (128, 64, 8, 3), (32, 128, 4, 4))]
BACKWARD_CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_K": bk}, num_warps=w, num_stages=s)
               for bm, bk, w, s in ((64, 32, 4, 3), (128, 32, 4, 3), (64, 64, 4, 3), (128, 64, 8, 3))]

@triton.jit
def keep_words(seed, rows, cols, K):
    return tl.randint4x(seed, rows[:, None] * K + cols[None, :])

@triton.jit
def forward_kernel(x_ptr, a_ptr, h_ptr, seed_ptr, M, K, stride_xm, threshold, scale,
                   N: tl.constexpr, R: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    ranks = tl.arange(0, R)
    seed = tl.load(seed_ptr)
    acc0 = tl.zeros((BLOCK_M, R), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_M, R), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, R), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_M, R), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        inside = (rows[:, None] < M) & (cols[None, :] < K)
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + cols[None, :], mask=inside, other=0.0)
        xs = (x.to(tl.float32) * scale).to(x.dtype)
        zero = tl.zeros_like(xs)
        w0, w1, w2, w3 = keep_words(seed, rows, cols, K)
        a_cols = cols[:, None] < K  # a_i^T tile: (BLOCK_K, R)
        a0 = tl.load(a_ptr + ranks[None, :] * K + cols[:, None], mask=a_cols, other=0.0)
        acc0 = tl.dot(tl.where(w0.to(tl.int64) >= threshold, xs, zero), a0, acc0)
        if N > 1:
            a1 = tl.load(a_ptr + (R + ranks)[None, :] * K + cols[:, None], mask=a_cols, other=0.0)
            acc1 = tl.dot(tl.where(w1.to(tl.int64) >= threshold, xs, zero), a1, acc1)
        if N > 2:
            a2 = tl.load(a_ptr + (2 * R + ranks)[None, :] * K + cols[:, None], mask=a_cols, other=0.0)
            acc2 = tl.dot(tl.where(w2.to(tl.int64) >= threshold, xs, zero), a2, acc2)
        if N > 3:
            a3 = tl.load(a_ptr + (3 * R + ranks)[None, :] * K + cols[:, None], mask=a_cols, other=0.0)
            acc3 = tl.dot(tl.where(w3.to(tl.int64) >= threshold, xs, zero), a3, acc3)
    out = h_ptr + rows[:, None].to(tl.int64) * (N * R) + ranks[None, :]
    row_ok = rows[:, None] < M
    tl.store(out, acc0.to(h_ptr.dtype.element_ty), mask=row_ok)
    if N > 1:
        tl.store(out + R, acc1.to(h_ptr.dtype.element_ty), mask=row_ok)
    if N > 2:
        tl.store(out + 2 * R, acc2.to(h_ptr.dtype.element_ty), mask=row_ok)
    if N > 3:
        tl.store(out + 3 * R, acc3.to(h_ptr.dtype.element_ty), mask=row_ok)

@triton.jit
def backward_kernel(x_ptr, a_ptr, dh_ptr, dx_ptr, da_ptr, seed_ptr, M, K, stride_xm, threshold, scale,
                    N: tl.constexpr, R: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    # one program per column block of x, walking all rows: da's reduction over M stays in registers
    # (deterministic, no atomics) and each element of x is read, and of dx written, once
    cols = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    ranks = tl.arange(0, R)
    seed = tl.load(seed_ptr)
    a_cols = cols[None, :] < K  # a_i tile: (R, BLOCK_K)
    a0 = tl.load(a_ptr + ranks[:, None] * K + cols[None, :], mask=a_cols, other=0.0)
    a1 = a0
    a2 = a0
    a3 = a0
    if N > 1:
        a1 = tl.load(a_ptr + (R + ranks)[:, None] * K + cols[None, :], mask=a_cols, other=0.0)
    if N > 2:
        a2 = tl.load(a_ptr + (2 * R + ranks)[:, None] * K + cols[None, :], mask=a_cols, other=0.0)
    if N > 3:
        a3 = tl.load(a_ptr + (3 * R + ranks)[:, None] * K + cols[None, :], mask=a_cols, other=0.0)
    da0 = tl.zeros((R, BLOCK_K), dtype=tl.float32)
    da1 = tl.zeros((R, BLOCK_K), dtype=tl.float32)
    da2 = tl.zeros((R, BLOCK_K), dtype=tl.float32)
    da3 = tl.zeros((R, BLOCK_K), dtype=tl.float32)
    for m0 in range(0, M, BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        inside = (rows[:, None] < M) & (cols[None, :] < K)
        offsets = rows[:, None].to(tl.int64) * stride_xm + cols[None, :]
        x = tl.load(x_ptr + offsets, mask=inside, other=0.0)
        xs = (x.to(tl.float32) * scale).to(x.dtype)
        zero = tl.zeros_like(xs)
        w0, w1, w2, w3 = keep_words(seed, rows, cols, K)
        dh_rows = dh_ptr + rows[:, None].to(tl.int64) * (N * R) + ranks[None, :]
        row_ok = rows[:, None] < M
        keep = w0.to(tl.int64) >= threshold
        dh = tl.load(dh_rows, mask=row_ok, other=0.0)
        da0 = tl.dot(tl.trans(dh), tl.where(keep, xs, zero), da0)
        dx = tl.where(keep, tl.dot(dh, a0), 0.0)
        if N > 1:
            keep = w1.to(tl.int64) >= threshold
            dh = tl.load(dh_rows + R, mask=row_ok, other=0.0)
            da1 = tl.dot(tl.trans(dh), tl.where(keep, xs, zero), da1)
            dx += tl.where(keep, tl.dot(dh, a1), 0.0)
        if N > 2:
            keep = w2.to(tl.int64) >= threshold
            dh = tl.load(dh_rows + 2 * R, mask=row_ok, other=0.0)
            da2 = tl.dot(tl.trans(dh), tl.where(keep, xs, zero), da2)
            dx += tl.where(keep, tl.dot(dh, a2), 0.0)
        if N > 3:
            keep = w3.to(tl.int64) >= threshold
            dh = tl.load(dh_rows + 3 * R, mask=row_ok, other=0.0)
            da3 = tl.dot(tl.trans(dh), tl.where(keep, xs, zero), da3)
            dx += tl.where(keep, tl.dot(dh, a3), 0.0)
        tl.store(dx_ptr + rows[:, None].to(tl.int64) * K + cols[None, :],
                 (dx * scale).to(dx_ptr.dtype.element_ty), mask=inside)
    out = da_ptr + ranks[:, None] * K + cols[None, :]
    tl.store(out, da0.to(da_ptr.dtype.element_ty), mask=a_cols)
    if N > 1:
        tl.store(out + R * K, da1.to(da_ptr.dtype.element_ty), mask=a_cols)
    if N > 2:
        tl.store(out + 2 * R * K, da2.to(da_ptr.dtype.element_ty), mask=a_cols)
    if N > 3:
        tl.store(out + 3 * R * K, da3.to(da_ptr.dtype.element_ty), mask=a_cols)


INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
if INTERPRETED:
    BLOCKS = {"BLOCK_M": 32, "BLOCK_K": 32}
else:
    BLOCKS = {}
    forward_kernel = triton.autotune(FORWARD_CONFIGS, key=["M", "K", "N", "R"])(forward_kernel)
    backward_kernel = triton.autotune(BACKWARD_CONFIGS, key=["M", "K", "N", "R"])(backward_kernel)


def _check(x: torch.Tensor, a: torch.Tensor, n: int) -> int:
    rows, width = x.shape
    if rows * width > 2**32:
        raise ValueError(f"the fused LoRA kernel numbers elements in 32 bits; {rows} x {width} is more")
    rank = a.shape[0] // n
    if a.shape != (n * rank, width) or rank < 16 or rank & (rank - 1):
        raise ValueError(f"the fused LoRA kernel takes adapter ranks that are powers of two >= 16; got A {tuple(a.shape)} "
                         f"for {n} adapters of input width {width}")
    return rank


def forward(x, a, seed, p, n):
    rank = _check(x, a, n)
    x = x if x.stride(-1) == 1 else x.contiguous()
    h = x.new_empty(x.shape[0], n * rank)
    grid = lambda meta: (triton.cdiv(x.shape[0], meta["BLOCK_M"]),)  # noqa: E731
    forward_kernel[grid](x, a.contiguous(), h, seed, x.shape[0], x.shape[1], x.stride(0), drop_threshold(p),
                         1.0 / (1.0 - p), N=n, R=rank, **BLOCKS)
    return h


def backward(dh, x, a, seed, p, n):
    rank = _check(x, a, n)
    x = x if x.stride(-1) == 1 else x.contiguous()
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    da = torch.empty(a.shape, dtype=a.dtype, device=a.device)
    grid = lambda meta: (triton.cdiv(x.shape[1], meta["BLOCK_K"]),)  # noqa: E731
    backward_kernel[grid](x, a.contiguous(), dh.contiguous(), dx, da, seed, x.shape[0], x.shape[1], x.stride(0),
                          drop_threshold(p), 1.0 / (1.0 - p), N=n, R=rank, **BLOCKS)
    return dx, da
