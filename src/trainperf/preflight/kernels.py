"""GEMM and attention rates by shape: the planner's kernel table (trainperf.plan.kernels reads it).

Measures the bf16 GEMMs of every projection of the Llama shapes the planner models (forward,
input-gradient and weight-gradient orientation at several token counts) and causal attention
(forward and backward, the SDPA backend order the engine uses; FlashAttention-4's kernels too where
installed, hardware.attention=flash4) for each head layout, on one device. About 10 s on an H200 (50 s
with FA4, its JIT compilation included). On CPU the shapes are tiny and the figures only exercise the path.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from trainperf.model import flash4
from trainperf.model.llama import attention_backends

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


# GPU cycles of busy work queued ahead of each timed call with queue_ahead=True (~5 ms on an H200):
# the host issues the call's kernels while the GPU is still busy, so the events time the kernels
# alone, not the host's launch cost. The planner's constants were fitted on tables measured without
# it (the default). FlashAttention-4's Python launch path costs ~0.2 ms per forward and ~0.6 ms per
# backward (measured 2026-12-01): without queued work its seq-2048 attention reads 90-100 TFLOP/s where
# its kernels run 500, so its column is always derived from queued timings (flash4_in_sdpa_frame).
QUEUE_AHEAD_CYCLES = 10_000_000


def _timer(device: str, queue_ahead: bool = False):
    def timed(fn, iters: int) -> float:
        """Median seconds per call of fn after two warm-up calls (CUDA events on GPU; with queue_ahead,
        behind queued work)."""
        for _ in range(2):
            fn()
        times = []
        for _ in range(iters):
            if device == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                if queue_ahead:
                    torch.cuda._sleep(QUEUE_AHEAD_CYCLES)
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
                         tokens: tuple[int, ...] | None = None, seqs: tuple[int, ...] | None = None,
                         queue_ahead: bool = False) -> dict:
    """The table as plan/kernels.py reads it: ``gemm_tflops`` keyed MxKxN ([M,K] @ [K,N]) and
    ``attention_tflops_fwd_bwd`` keyed heads x kv_heads x head_dim x seq (batch 1, causal FLOPs counted
    once, backward = 2.5x the forward's FLOPs)."""
    cuda = device == "cuda"
    models = models or (GPU_MODELS if cuda else CPU_MODELS)
    tokens = tokens or (GPU_TOKENS if cuda else CPU_TOKENS)
    seqs = seqs or (GPU_SEQS if cuda else CPU_SEQS)
    dtype = torch.bfloat16
    timed = _timer(device, queue_ahead)
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
    attention = measure_attention_rates(device, iters, models, seqs, "sdpa", queue_ahead)
    table = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__, "dtype": "bf16",
             "gemm_tflops": gemm, "attention_tflops_fwd_bwd": attention}
    if cuda and flash4.available() is None:  # FlashAttention-4 importable and this GPU runs it
        fa4 = measure_attention_rates(device, iters, models, seqs, "flash4", True)
        if not queue_ahead:
            fa4 = flash4_in_sdpa_frame(attention, measure_attention_rates(device, iters, models, seqs, "sdpa", True),
                                       fa4)
        table["attention_flash4_tflops_fwd_bwd"] = fa4
    table.update(seconds=round(time.perf_counter() - t0, 1), queue_ahead=queue_ahead,
                 note="gemm key MxKxN ([M,K]@[K,N]); attention key heads x kv_heads x head_dim x seq, batch 1, "
                      "causal FLOPs counted once, backward = 2.5x forward FLOPs; attention_flash4_*: "
                      "hardware.attention=flash4's kernels, where installed (without queue_ahead: SDPA's rate "
                      "times FA4 / SDPA timed behind queued work)")
    return table


# float8 GEMM grid: every M x K x N over these sizes (tokens, model widths after a TP split, and the
# token-deep reduction of a weight gradient all fall inside it); plan/kernels.py interpolates between them
FP8_GRID_SIZES = (1024, 2048, 4096, 8192, 16384, 32768)
CPU_FP8_GRID_SIZES = (32, 64)


def measure_fp8_gemm_grid(device: str = "cuda", iters: int = 5, sizes: tuple[int, ...] | None = None,
                          rounds: int = 3) -> dict:
    """Tensorwise-scaled float8 (e4m3) GEMM rates, bf16 output, as Transformer Engine's and torchao's
    float8 linears call cuBLASLt (torch._scaled_mm: row-major A, column-major B), on the full grid of
    ``sizes`` cubed, keyed MxKxN; each shape timed behind queued work (the kernel alone, as an engine
    that captures CUDA graphs runs it) in ``rounds`` passes over the grid, the median kept, so that a
    clock or power drift over the sweep does not land on one part of the grid."""
    cuda = device == "cuda"
    sizes = sizes or (FP8_GRID_SIZES if cuda else CPU_FP8_GRID_SIZES)
    timed = _timer(device, queue_ahead=cuda)
    fp8 = torch.float8_e4m3fn
    one = torch.ones((), device=device)
    t0 = time.perf_counter()
    shapes = [(m, k, n) for m in sizes for k in sizes for n in sizes]
    runs: dict[tuple[int, int, int], list[float]] = {s: [] for s in shapes}
    for _ in range(rounds):
        for m, k, n in shapes:
            a = torch.randn(m, k, device=device).to(fp8)
            b = torch.randn(n, k, device=device).to(fp8).t()
            if cuda:
                fn = lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
            else:  # CPU has no float8 GEMM: the same product through bf16 exercises the path
                fn = lambda: a.to(torch.bfloat16) @ b.to(torch.bfloat16)  # noqa: E731
            runs[(m, k, n)].append(2 * m * k * n / timed(fn, iters) / 1e12)
            del a, b
    gemm = {"x".join(map(str, s)): _sig(sorted(r)[len(r) // 2]) for s, r in runs.items()}
    return {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
            "dtype": "float8_e4m3fn, tensorwise scales, bf16 out", "sizes": list(sizes), "gemm_fp8_tflops": gemm,
            "seconds": round(time.perf_counter() - t0, 1),
            "note": "key MxKxN ([M,K]@[K,N]); median of the rounds; each call timed behind queued work"}


def flash4_in_sdpa_frame(sdpa: dict, sdpa_queued: dict, fa4_queued: dict) -> dict:
    """FA4's rates in the frame of an SDPA column timed without queued work: SDPA's rate times FA4 /
    SDPA as both kernels run behind queued work. FA4's launch path (~0.2 ms forward, ~0.6 ms
    backward) would otherwise dominate short sequences, where a training step whose host runs ahead
    hides it; SDPA's own launch cost stays in, as the planner's constants were fitted with it."""
    return {key: [_sig(base * fast / ref) for base, fast, ref in zip(sdpa[key], fa4_queued[key], sdpa_queued[key])]
            for key in fa4_queued}


def measure_attention_rates(device: str, iters: int, models: dict, seqs: tuple[int, ...], kernel: str,
                            queue_ahead: bool = False) -> dict:
    """Causal attention's forward and backward TFLOP/s for each head layout of ``models`` at each of
    ``seqs``, keyed heads x kv_heads x head_dim x seq, through ``kernel`` as the engine calls it: SDPA
    in its backend order on (batch, heads, seq, head_dim), or FlashAttention-4's custom op on (batch,
    seq, heads, head_dim) -- skipping head dims FA4 does not take (not a multiple of 8)."""
    timed = _timer(device, queue_ahead)
    dtype = torch.bfloat16
    rates: dict[str, list[float]] = {}
    for hidden, heads, kv in sorted({(h, n, kv) for h, _, n, kv in models.values()}):
        head_dim = hidden // heads
        if kernel == "flash4" and head_dim % 8:
            continue
        for seq in seqs:
            if kernel == "flash4":
                q = torch.randn(1, seq, heads, head_dim, device=device, dtype=dtype, requires_grad=True)
                kk, v = (torch.randn(1, seq, kv, head_dim, device=device, dtype=dtype, requires_grad=True)
                         for _ in range(2))

                def attend():
                    return flash4.causal_attention(q, kk, v)
            else:
                q = torch.randn(1, heads, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
                kk, v = (torch.randn(1, kv, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
                         for _ in range(2))
                gqa = heads != kv

                def attend():
                    with attention_backends(device):
                        return F.scaled_dot_product_attention(q, kk, v, is_causal=True, enable_gqa=gqa)

            grad = torch.randn_like(attend())

            def forward_backward():
                torch.autograd.grad(attend(), (q, kk, v), grad)

            fwd_s = timed(attend, iters)
            both_s = timed(forward_backward, iters)
            flops = 2.0 * seq * seq * head_dim * heads  # 2 GEMMs x 2 FLOPs x s^2 d / 2 (causal)
            rates[f"{heads}x{kv}x{head_dim}x{seq}"] = [_sig(flops / fwd_s / 1e12),
                                                       _sig(2.5 * flops / max(both_s - fwd_s, 1e-9) / 1e12)]
    return rates
