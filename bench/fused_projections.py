"""Fused q/k/v and gate/up projections against separate ones, side by side on one GPU (the
"fused QKV and gate/up projections" lever): each side a compiled function, forward + backward over 8192
tokens, for the 7B, Llama-3-8B and 70B shapes, with frozen weights (LoRA's base: forward and input
gradient) and trained ones (pretraining: + weight gradients). Prints JSON: ms per call, ratio
(separate / fused: > 1 means fusing pays) and the GEMM rate of each side.

    python bench/fused_projections.py [7b 8b 70b] > fused.json

1 x H200, torch 2.11, 2026-12-01: fusing q/k/v 0.94-1.016x, gate/up 0.865-0.993x -- not kept
(docs/PERFORMANCE.md; bench/data/h200_2026-12-01_8b_pretrain_adamw8bit.json; measured with its own timer, 4
warm-up calls then the median of 15, before it took layout_probes' timer with 3 warm-ups).
"""
from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

from layout_probes import median_ms

SHAPES = {"7b": (4096, 11008, 32, 32, 128), "8b": (4096, 14336, 32, 8, 128), "70b": (8192, 28672, 64, 8, 128)}
TOKENS = 8192


def attn_proj_sep(x, wq, wk, wv):
    return x @ wq.t(), x @ wk.t(), x @ wv.t()


def attn_proj_fused(x, wqkv, nq, nkv):
    q, k, v = (x @ wqkv.t()).split([nq, nkv, nkv], dim=-1)
    return q, k, v


def mlp_sep(x, wg, wu, wd):
    return (F.silu(x @ wg.t()) * (x @ wu.t())) @ wd.t()


def mlp_fused(x, wgu, wd, ffn):
    g, u = (x @ wgu.t()).split([ffn, ffn], dim=-1)
    return (F.silu(g) * u) @ wd.t()


def run(shape, trained):
    d, ffn, h, kv, hd = SHAPES[shape]
    nq, nkv = h * hd, kv * hd
    bf = dict(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(TOKENS, d, **bf, requires_grad=True)
    mk = lambda *s: (torch.randn(*s, **bf) * 0.02).requires_grad_(trained)
    wq, wk, wv = mk(nq, d), mk(nkv, d), mk(nkv, d)
    wqkv = torch.cat([wq, wk, wv]).detach().requires_grad_(trained)
    wg, wu, wd = mk(ffn, d), mk(ffn, d), mk(d, ffn)
    wgu = torch.cat([wg, wu]).detach().requires_grad_(trained)
    f_as, f_af = torch.compile(attn_proj_sep), torch.compile(attn_proj_fused)
    f_ms, f_mf = torch.compile(mlp_sep), torch.compile(mlp_fused)
    gq, gk, gv = torch.randn(TOKENS, nq, **bf), torch.randn(TOKENS, nkv, **bf), torch.randn(TOKENS, nkv, **bf)
    gm = torch.randn(TOKENS, d, **bf)

    def step(outs, grads):
        torch.autograd.backward(outs, grads)
        for t in (x, wq, wk, wv, wqkv, wg, wu, wd, wgu):
            t.grad = None

    res = {}
    for name, fn in (("attn_sep", lambda: step(f_as(x, wq, wk, wv), (gq, gk, gv))),
                     ("attn_fused", lambda: step(f_af(x, wqkv, nq, nkv), (gq, gk, gv))),
                     ("mlp_sep", lambda: step([f_ms(x, wg, wu, wd)], [gm])),
                     ("mlp_fused", lambda: step([f_mf(x, wgu, wd, ffn)], [gm]))):
        res[name] = round(median_ms(fn, 15), 3)
    gemms = 3 if trained else 2
    res["attn_ratio"] = round(res["attn_sep"] / res["attn_fused"], 3)
    res["mlp_ratio"] = round(res["mlp_sep"] / res["mlp_fused"], 3)
    res["attn_tflops_sep"] = round(gemms * 2 * TOKENS * d * (nq + 2 * nkv) / res["attn_sep"] / 1e9)
    res["attn_tflops_fused"] = round(gemms * 2 * TOKENS * d * (nq + 2 * nkv) / res["attn_fused"] / 1e9)
    res["mlp_tflops_sep"] = round(gemms * 2 * TOKENS * d * 3 * ffn / res["mlp_sep"] / 1e9)
    res["mlp_tflops_fused"] = round(gemms * 2 * TOKENS * d * 3 * ffn / res["mlp_fused"] / 1e9)
    return res


if __name__ == "__main__":
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    for shape in sys.argv[1:] or SHAPES:
        for trained in (False, True):
            out[f"{shape} {'trained' if trained else 'frozen'}"] = run(shape, trained)
            print(json.dumps(out), flush=True)
            torch.cuda.empty_cache()
    print(json.dumps(out, indent=1))
