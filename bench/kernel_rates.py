"""Measured bf16 GEMM and attention rates for the shapes our models run, on one GPU.

The planner's flat efficiencies (one GEMM rate from an 8192^3 GEMM, one attention rate) miss how the
rate moves with shape: a 3200-wide projection, a 2048-token micro-batch, 100-wide heads. This sweeps
the projections of the Llama shapes we model (forward, input-gradient and weight-gradient GEMMs at
several token counts) and causal attention (forward and backward, the SDPA backend order the engine
uses) and writes one JSON table; `plan` reads it as a kernel table (src/trainperf/plan/kernels.py).

    python bench/kernel_rates.py --out kernel_rates.json [--quick]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

# (hidden, intermediate, heads, kv heads) of the shapes in bench/planner_accuracy.py and the 70B recipe
MODELS = {
    "1b": (2048, 5504, 16, 16),
    "3b": (3200, 8640, 32, 32),
    "7b": (4096, 11008, 32, 32),
    "8b": (4096, 14336, 32, 8),
    "70b": (8192, 28672, 64, 8),
}
TOKENS = (2048, 4096, 8192, 16384)


def timed(fn, iters: int) -> float:
    """Median seconds per call of fn over iters CUDA-event-timed calls after two warm-up calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    times.sort()
    return times[len(times) // 2]


def gemm_rate(m: int, k: int, n: int, iters: int) -> float:
    """TFLOP/s of [m, k] @ [k, n] in bf16."""
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    t = timed(lambda: a @ b, iters)
    return 2 * m * k * n / t / 1e12


def projection_shapes(hidden: int, inter: int, heads: int, kv: int) -> dict[str, tuple[int, int]]:
    head_dim = hidden // heads
    return {"q": (hidden, hidden), "kv": (hidden, kv * head_dim), "qkv": (hidden, (heads + 2 * kv) * head_dim),
            "o": (hidden, hidden), "gate": (hidden, inter), "down": (inter, hidden)}


def attention_rate(seq: int, heads: int, kv: int, head_dim: int, iters: int) -> tuple[float, float]:
    """(forward, backward) TFLOP/s of causal SDPA at batch 1, counting causal FLOPs once
    (forward 2 * 2 * s^2 * d * heads / 2, backward 2.5x that -- FlashAttention's convention)."""
    from trainperf.model.llama import attention_backends

    q = torch.randn(1, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, kv, seq, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, kv, seq, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    gqa = heads != kv
    with attention_backends("cuda"):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        grad = torch.randn_like(out)
        fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa), iters)

        def fwd_bwd():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
            torch.autograd.grad(o, (q, k, v), grad)

        both = timed(fwd_bwd, iters)
    flops_fwd = 2 * 2 * seq * seq * head_dim * heads / 2
    return flops_fwd / fwd / 1e12, 2.5 * flops_fwd / max(both - fwd, 1e-9) / 1e12


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="kernel_rates.json")
    ap.add_argument("--quick", action="store_true", help="fewer token counts and iterations")
    args = ap.parse_args()
    iters = 5 if args.quick else 10
    tokens = (4096, 8192) if args.quick else TOKENS
    t0 = time.time()
    gemms: dict[str, float] = {}
    for name, (hidden, inter, heads, kv) in MODELS.items():
        for proj, (k, n) in projection_shapes(hidden, inter, heads, kv).items():
            for m in tokens:
                # forward [m,k]x[k,n]; input gradient [m,n]x[n,k]; weight gradient [k,m]x[m,n]
                for key in ((m, k, n), (m, n, k), (k, m, n)):
                    tag = "x".join(map(str, key))
                    if tag not in gemms:
                        gemms[tag] = round(gemm_rate(*key, iters), 1)
        print(f"{name}: {len(gemms)} GEMM shapes so far, {time.time() - t0:.0f} s", flush=True)
    attn = {}
    for hidden, _, heads, kv in {(v[0], 0, v[2], v[3]) for v in MODELS.values()}:
        head_dim = hidden // heads
        for seq in (2048, 4096, 8192):
            fwd, bwd = attention_rate(seq, heads, kv, head_dim, iters)
            attn[f"{heads}x{kv}x{head_dim}x{seq}"] = [round(fwd, 1), round(bwd, 1)]
    table = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": "bf16",
             "gemm_tflops": gemms, "attention_tflops_fwd_bwd": attn,
             "note": "gemm key MxKxN ([M,K]@[K,N]); attention key heads x kv_heads x head_dim x seq, batch 1, "
                     "causal FLOPs counted once, backward = 2.5x forward FLOPs"}
    with open(args.out, "w") as f:
        json.dump(table, f, indent=1)
    print(json.dumps({"gemm_shapes": len(gemms), "attention": attn, "seconds": round(time.time() - t0, 1)}))


if __name__ == "__main__":
    main()
