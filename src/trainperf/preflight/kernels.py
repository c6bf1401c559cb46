"""GEMM and attention rates by shape: the planner's kernel table (trainperf.plan.kernels reads it).

Measures the bf16 GEMMs of every projection of the Llama shapes the planner models (forward,
input-gradient and weight-gradient orientation at several token counts) and causal attention
(forward and backward, the SDPA backend order the engine uses) for each head layout, on one device.
About 10 s on an H200. On CPU the shapes are tiny and the figures only exercise the path.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

# (hidden, intermediate, heads, kv heads): the shapes of bench/planner_accuracy.py and the 70B recipe
GPU_MODELS = {
    "1b": (2048, 5504, 16, 16),
    "1b-gqa": (2048, 5632, 32, 4),  # bench/lora_throughput.py's 1B: 64-wide heads, 8 queries per KV head
    "3b": (3200, 8640, 32, 32),
    "7b": (4096, 11008, 32, 32),
    "8b": (4096, 14336, 32, 8),
    "70b": (8192, 28672, 64, 8),
}
GPU_TOKENS = (2048, 4096, 8192, 16384)
GPU_SEQS = (2048, 4096, 8192)
CPU_MODELS = {"tiny": (128, 256, 4, 4)}
CPU_TOKENS = (64, 128)
CPU_SEQS = (64, 128)


def _timer(device: str):
    def timed(fn, iters: int) -> float:
        """Median seconds per call of fn after two warm-up calls (CUDA events on GPU)."""
        for _ in range(2):
            fn()
        times = []
        for _ in range(iters):
            if device == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        times.sort()
        return times[len(times) // 2]
    return timed


def _sig(x: float) -> float:
    return float(f"{x:.4g}")  # four significant figures: TFLOP/s on a GPU, a few GFLOP/s on CPU


def projection_shapes(hidden: int, inter: int, heads: int, kv: int) -> dict[str, tuple[int, int]]:
    """(in, out) of each projection; k and v share a shape, a fused qkv is measured as one."""
    head_dim = hidden // heads
    return {"q": (hidden, hidden), "kv": (hidden, kv * head_dim), "qkv": (hidden, (heads + 2 * kv) * head_dim),
            "o": (hidden, hidden), "gate": (hidden, inter), "down": (inter, hidden)}


def measure_kernel_table(device: str = "cuda", iters: int = 10, models: dict | None = None,
                         tokens: tuple[int, ...] | None = None, seqs: tuple[int, ...] | None = None) -> dict:
    """The table as plan/kernels.py reads it: ``gemm_tflops`` keyed MxKxN ([M,K] @ [K,N]) and
    ``attention_tflops_fwd_bwd`` keyed heads x kv_heads x head_dim x seq (batch 1, causal FLOPs counted
    once, backward = 2.5x the forward's FLOPs)."""
    from trainperf.model.llama import attention_backends

    cuda = device == "cuda"
    models = models or (GPU_MODELS if cuda else CPU_MODELS)
    tokens = tokens or (GPU_TOKENS if cuda else CPU_TOKENS)
    seqs = seqs or (GPU_SEQS if cuda else CPU_SEQS)
    dtype = torch.bfloat16
    timed = _timer(device)
    t0 = time.perf_counter()
    gemm: dict[str, float] = {}
    for hidden, inter, heads, kv in models.values():
        for k, n in projection_shapes(hidden, inter, heads, kv).values():
            for m in tokens:
                for shape in ((m, k, n), (m, n, k), (k, m, n)):  # forward, input gradient, weight gradient
                    key = "x".join(map(str, shape))
                    if key in gemm:
                        continue
                    a = torch.randn(shape[0], shape[1], device=device, dtype=dtype)
                    b = torch.randn(shape[1], shape[2], device=device, dtype=dtype)
                    gemm[key] = _sig(2 * shape[0] * shape[1] * shape[2] / timed(lambda: a @ b, iters) / 1e12)
    attention: dict[str, list[float]] = {}
    for hidden, heads, kv in {(h, n, kv) for h, _, n, kv in models.values()}:
        head_dim = hidden // heads
        for seq in seqs:
            q = torch.randn(1, heads, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
            kk = torch.randn(1, kv, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
            v = torch.randn(1, kv, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
            gqa = heads != kv
            with attention_backends(device):
                grad = torch.randn_like(F.scaled_dot_product_attention(q, kk, v, is_causal=True, enable_gqa=gqa))

                def forward():
                    return F.scaled_dot_product_attention(q, kk, v, is_causal=True, enable_gqa=gqa)

                def forward_backward():
                    torch.autograd.grad(forward(), (q, kk, v), grad)

                fwd_s = timed(forward, iters)
                both_s = timed(forward_backward, iters)
            flops = 2.0 * seq * seq * head_dim * heads  # 2 GEMMs x 2 FLOPs x s^2 d / 2 (causal)
            attention[f"{heads}x{kv}x{head_dim}x{seq}"] = [_sig(flops / fwd_s / 1e12),
                                                           _sig(2.5 * flops / max(both_s - fwd_s, 1e-9) / 1e12)]
    name = torch.cuda.get_device_name() if cuda else "cpu"
    return {"device": name, "torch": torch.__version__, "dtype": "bf16", "gemm_tflops": gemm,
            "attention_tflops_fwd_bwd": attention, "seconds": round(time.perf_counter() - t0, 1),
            "note": "gemm key MxKxN ([M,K]@[K,N]); attention key heads x kv_heads x head_dim x seq, batch 1, "
                    "causal FLOPs counted once, backward = 2.5x forward FLOPs"}
