"""Causal attention kernels side by side: SDPA as the model calls it (cuDNN first), SDPA in torch's
default order (what a model calling SDPA plainly gets, Hugging Face's "sdpa" among them), and
FlashAttention-4 where it is installed.

Same GPU, same process, same random bf16 q/k/v. For each kernel: forward and forward+backward time
(median of CUDA-event timings), TFLOP/s on the causal FLOPs (forward 2 GEMMs over half the score
matrix, backward 2.5x the forward), and how far its output and gradients lie from SDPA's (cuDNN).
Prints each kernel's forward+backward rate against SDPA's (cuDNN).

    python bench/attention_kernels.py --seq 8192 --heads 32 --kv-heads 32 --head-dim 128 [--json FILE]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F
from common import append_json_line, has_cuda
from layout_probes import median_ms


def causal_flops(batch: int, seq: int, heads: int, head_dim: int) -> tuple[float, float]:
    """(forward, forward+backward) FLOPs: QK^T and PV over the lower triangle; backward recomputes
    the scores and takes four more GEMMs (dV, dP, dQ, dK), 2.5x the forward's two."""
    fwd = 2 * 2 * batch * heads * seq * seq * head_dim / 2
    return fwd, fwd * 3.5


def run_kernel(attend, q, k, v, dout, iters: int, warmup: int) -> dict:
    """Forward and forward+backward median ms of ``attend`` (inputs and output in (b, s, h, d))."""
    def fwd():
        with torch.no_grad():
            attend(q, k, v)

    def fwd_bwd():
        q.grad = k.grad = v.grad = None
        attend(q, k, v).backward(dout)

    q.grad = k.grad = v.grad = None  # the previous kernel's gradients must not accumulate into these
    t0 = time.perf_counter()
    out = attend(q, k, v)
    out.backward(dout)
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0  # includes any JIT compilation
    grads = [t.grad.clone() for t in (q, k, v)]
    return {"first_call_s": first_s, "fwd_ms": median_ms(fwd, iters, warmup),
            "fwd_bwd_ms": median_ms(fwd_bwd, iters, warmup), "out": out.detach(), "grads": grads}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=32)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json", help="append the result as one JSON line to this file")
    args = ap.parse_args()
    if not has_cuda("attention_kernels.py"):
        return 2
    from trainperf.model import flash4
    from trainperf.model.llama import attention_backends

    why_not = flash4.available()
    if why_not:
        print(f"{why_not}: FlashAttention-4 left out", file=sys.stderr)
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape_q = (args.batch, args.seq, args.heads, args.head_dim)
    shape_kv = (args.batch, args.seq, args.kv_heads, args.head_dim)
    q, k, v, dout = (torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=gen)
                     for s in (shape_q, shape_kv, shape_kv, shape_q))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    gqa = args.heads != args.kv_heads

    def sdpa(q, k, v):
        with attention_backends("cuda"):
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=True, enable_gqa=gqa)
        return out.transpose(1, 2)

    def sdpa_default(q, k, v):
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=True, enable_gqa=gqa)
        return out.transpose(1, 2)

    kernels = [("sdpa", sdpa), ("sdpa_default", sdpa_default)] + ([] if why_not else [("flash4", flash4.causal_attention)])
    fwd_flops, total_flops = causal_flops(args.batch, args.seq, args.heads, args.head_dim)
    results = {}
    for name, attend in kernels:
        r = run_kernel(attend, q, k, v, dout, args.iters, args.warmup)
        r["fwd_tflops"] = fwd_flops / (r["fwd_ms"] * 1e9)
        r["fwd_bwd_tflops"] = total_flops / (r["fwd_bwd_ms"] * 1e9)
        r["bwd_tflops"] = (total_flops - fwd_flops) / ((r["fwd_bwd_ms"] - r["fwd_ms"]) * 1e9)
        results[name] = r
        print(f"{name:12s} forward {r['fwd_ms']:.2f} ms ({r['fwd_tflops']:.0f} TFLOP/s), backward "
              f"{r['fwd_bwd_ms'] - r['fwd_ms']:.2f} ms ({r['bwd_tflops']:.0f} TFLOP/s), forward+backward "
              f"{r['fwd_bwd_ms']:.2f} ms ({r['fwd_bwd_tflops']:.0f} TFLOP/s); first call {r['first_call_s']:.1f} s",
              flush=True)
    ref = results["sdpa"]

    def rel_err(a, b):  # max |a - b| over max |a|
        return ((a.float() - b.float()).abs().max() / a.float().abs().max()).item()

    errors, ratios = {}, {}
    for name, alt in results.items():
        if name == "sdpa":
            continue
        errors[name] = {"out": rel_err(ref["out"], alt["out"]),
                        **{f"d{n}": rel_err(g, h) for n, g, h in zip("qkv", ref["grads"], alt["grads"])}}
        ratios[name] = ref["fwd_bwd_ms"] / alt["fwd_bwd_ms"]
        print(f"{name} vs sdpa, max |diff| / max |sdpa|: " + ", ".join(f"{n} {e:.2e}" for n, e in errors[name].items()))
        print(f"ratio {name} / sdpa (forward+backward rate): {ratios[name]:.2f}x")
    for r in results.values():
        del r["out"], r["grads"]
    record = dict(bench="attention", args=vars(args), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                  date=time.strftime("%Y-%m-%d"), errors=errors, ratios=ratios, **results)
    append_json_line(args.json, record)
    return 0 if max(e for kernel in errors.values() for e in kernel.values()) < 2e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
