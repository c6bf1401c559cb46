"""Two probes behind the compiled 7B LoRA step's analysis (docs/PERFORMANCE.md), one GPU:

* SDPA backends at seq 8192, 32 heads x 128 (causal), on q/k/v as strided views of a fused qkv output
  (what the model passes) and as contiguous copies: forward and backward TFLOP/s per backend;
* the engine's GEMM operand layouts at 8192 tokens of the 7B shape: forward x @ W.t() and input
  gradient g @ W, against W stored transposed.

    python bench/layout_probes.py > probes.json

1 x H200, torch 2.11, 2026-11-30 (run in its scratch form): cuDNN 489/480 TFLOP/s on views, 429/440 on
copies, flash 295/268, memory-efficient 155/122; operand layouts within +-5% of each other, no pattern.
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SEQ, HEADS, HEAD_DIM = 8192, 32, 128
TOKENS, HIDDEN = 8192, 4096
SHAPES_7B = {"qkv": (3 * HIDDEN, HIDDEN), "o": (HIDDEN, HIDDEN), "gate_up": (2 * 11008, HIDDEN),
             "down": (HIDDEN, 11008), "head": (32000, HIDDEN)}


def median_ms(fn, iters: int = 10, warmup: int = 3) -> float:
    """Median over ``iters`` CUDA-event timings of ``fn`` after ``warmup`` untimed calls, ms."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def attention_backends() -> dict:
    fwd_gflop = 2 * 2 * SEQ * SEQ * HEAD_DIM * HEADS / 2 / 1e9  # causal: half the square
    qkv = torch.randn(1, SEQ, 3 * HEADS * HEAD_DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = {}
    for backend in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"):
        for contiguous in (False, True):
            def forward(backend=backend, contiguous=contiguous):
                q, k, v = (t.view(1, SEQ, HEADS, HEAD_DIM).transpose(1, 2) for t in qkv.split(HEADS * HEAD_DIM, -1))
                if contiguous:
                    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
                with sdpa_kernel(getattr(SDPBackend, backend)):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)

            fwd = median_ms(forward)
            both = median_ms(lambda: forward().sum().backward())
            out[f"{backend} contiguous={contiguous}"] = {
                "fwd_ms": round(fwd, 3), "fwd_bwd_ms": round(both, 3), "fwd_tflops": round(fwd_gflop / fwd),
                "bwd_tflops": round(2.5 * fwd_gflop / (both - fwd))}  # backward: 2.5 forwards of matmuls
    return out


def gemm_layouts() -> dict:
    out = {}
    for name, (n_out, n_in) in SHAPES_7B.items():
        x = torch.randn(TOKENS, n_in, device="cuda", dtype=torch.bfloat16)
        g = torch.randn(TOKENS, n_out, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n_out, n_in, device="cuda", dtype=torch.bfloat16)
        w_t = w.t().contiguous()
        gflop = 2 * TOKENS * n_out * n_in / 1e9
        out[name] = {label: round(gflop / median_ms(fn, 20)) for label, fn in (
            ("forward x @ W.t()", lambda: x @ w.t()), ("forward, W stored transposed", lambda: x @ w_t),
            ("input grad g @ W", lambda: g @ w), ("input grad, W stored transposed", lambda: g @ w_t.t()))}
    return out


if __name__ == "__main__":
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                      "attention_tflops": attention_backends(), "gemm_tflops": gemm_layouts()}, indent=1))
