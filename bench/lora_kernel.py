"""LoRA's input side alone, side by side: per-adapter F.dropout + A's GEMM (what PEFT and
hardware.lora_kernel=torch run) against the fused Triton kernel (hardware.lora_kernel=fused), forward
and forward + backward, on one GPU, same shapes, one process; ratio printed.

The fused kernel's masks are checked bit for bit against the PyTorch Philox reference
(model/lora_kernel.py), and its outputs and gradients against the same math done with those masks.
The fused backward's two forms (one pass; dx and dA apart) are also timed alone.

    python bench/lora_kernel.py [--tokens 8192] [--width 4096] [--adapters 3] [--rank 16] [--json FILE]
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from common import append_json_line, has_cuda
from layout_probes import median_ms

from trainperf.model.lora_kernel import keep_masks, keep_scale, lora_dropout_a, shared_input_lora_a


def graphed(fn):
    """``fn`` captured in a CUDA graph: its replay times the GPU work alone, without the host's
    per-op dispatch, which for these sub-millisecond calls can exceed it (training's host runs ahead)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def unfused(x, weights, p):
    return torch.cat([F.linear(F.dropout(x, p, True), w) for w in weights], dim=-1)


def check(x, weights, p) -> dict:
    """The kernel against the Philox reference's masks: h, dx and each dA."""
    n, r = len(weights), weights[0].shape[0]
    a = torch.cat(weights).detach()
    seed = torch.tensor([0x123456789ABCDEF], dtype=torch.int64, device=x.device)
    xg, ag = x.detach().clone().requires_grad_(), a.clone().requires_grad_()
    h, _bits = lora_dropout_a(xg, ag, seed, p, n)
    dh = torch.randn_like(h)
    h.backward(dh)
    masks = keep_masks(int(seed.item()), x.shape[0], x.shape[1], n, p, x.device)
    xr, ar = x.detach().float().requires_grad_(), a.float().requires_grad_()
    ref = torch.cat([(xr * m * keep_scale(p)).to(x.dtype).float() @ ai.t() for m, ai in zip(masks, ar.chunk(n))], dim=-1)
    ref.backward(dh.float())

    def rel(got, want):
        return ((got.float() - want).abs().max() / want.abs().max()).item()

    return {"h_rel_err": rel(h, ref), "dx_rel_err": rel(xg.grad, xr.grad), "da_rel_err": rel(ag.grad, ar.grad),
            "keep_fraction": [round(m.float().mean().item(), 5) for m in masks], "rank": r}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--adapters", type=int, default=3, help="adapters reading the same input (q, k, v: 3)")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--json", help="append the result as one JSON line to this file")
    args = ap.parse_args()
    if not has_cuda("lora_kernel.py"):
        return 2
    torch.manual_seed(0)
    dev, p = "cuda", args.dropout
    x = torch.randn(args.tokens, args.width, device=dev, dtype=torch.bfloat16, requires_grad=True)
    weights = [(torch.randn(args.rank, args.width, device=dev, dtype=torch.bfloat16) * 0.02).requires_grad_()
               for _ in range(args.adapters)]
    result = {"bench": "lora_kernel", "args": vars(args), "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "check": check(x, weights, p)}
    dh = torch.randn(args.tokens, args.rank * args.adapters, device=dev, dtype=torch.bfloat16)

    def forward_backward(fn):
        def run():
            h = fn(x, weights, p)
            h.backward(dh)
            x.grad = None
            for w in weights:
                w.grad = None
        return run

    def forward_only(fn):
        def run():
            with torch.no_grad():
                fn(x, weights, p)
        return run

    for side, fn in (("torch", unfused), ("fused", shared_input_lora_a)):
        result[f"{side}_fwd_ms"] = median_ms(forward_only(fn), 30, 5)
        result[f"{side}_fwd_bwd_ms"] = median_ms(forward_backward(fn), 30, 5)
        try:
            result[f"{side}_fwd_graph_ms"] = median_ms(graphed(forward_only(fn)), 30, 5)
            result[f"{side}_fwd_bwd_graph_ms"] = median_ms(graphed(forward_backward(fn)), 30, 5)
        except RuntimeError as err:  # a capture that fails says so, the eager figures stand
            result[f"{side}_graph_error"] = str(err).splitlines()[0]
    # the fused backward's two forms alone (the op runs whichever timed faster on its first call)
    from trainperf.model import lora_triton

    a = torch.cat(weights).detach()
    seed = torch.tensor([1], dtype=torch.int64, device=dev)
    _h, bits = lora_dropout_a(x.detach(), a, seed, p, args.adapters)
    for name, backward in lora_triton.BACKWARDS.items():
        result[f"backward_{name}_graph_ms"] = median_ms(
            graphed(lambda b=backward: b(dh, x.detach(), a, bits, p, args.adapters)), 30, 5)
    result["backward_picks"] = [list(map(str, key)) + [pick] for key, pick in lora_triton.backward_picks.items()]
    for part in ("fwd", "fwd_bwd", "fwd_graph", "fwd_bwd_graph"):
        if f"fused_{part}_ms" in result and f"torch_{part}_ms" in result:
            result[f"ratio_{part}"] = result[f"torch_{part}_ms"] / result[f"fused_{part}_ms"]
    gib = args.tokens * args.width * 2 / 2**30
    print(f"{args.adapters} adapters of rank {args.rank} on x {args.tokens} x {args.width} bf16 ({gib:.3f} GiB), "
          f"dropout {p}, {result['gpu']}")
    for part, label in (("fwd", "forward"), ("fwd_bwd", "forward + backward"), ("fwd_graph", "forward, CUDA graph"),
                        ("fwd_bwd_graph", "forward + backward, CUDA graph")):
        if f"ratio_{part}" in result:
            print(f"  {label + ':':32s} torch {result[f'torch_{part}_ms']:.3f} ms   fused {result[f'fused_{part}_ms']:.3f} ms"
                  f"   ratio {result[f'ratio_{part}']:.2f}x")
    print("  fused backward alone, CUDA graph: " + "   ".join(
        f"{name} {result[f'backward_{name}_graph_ms']:.3f} ms" for name in lora_triton.BACKWARDS)
        + f"   (the op picked: {result['backward_picks']})")
    print(f"  check against the Philox reference: {result['check']}")
    append_json_line(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
