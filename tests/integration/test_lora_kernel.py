"""CPU tests of hardware.lora_kernel=fused: the Philox generator against its published answers, the
masks' distribution, the op's backward against autograd of the same math, the model's grouping of
q/k/v, recomputation and torch.compile drawing the forward's masks again, validation and the
planner's memory. The Triton kernels themselves run on a GPU (tests/gpu/test_gpu.py) or, where Triton is
installed, under its CPU interpreter (the last test here)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton not installed (CPU CI)")
def test_triton_kernels_under_the_interpreter_match_the_reference():
    """The Triton kernels, run by Triton's CPU interpreter: bit-identical masks (the packed keep bits
    equal, dx zero exactly where the reference drops), outputs and gradients to fp32 rounding, from both
    backwards (one pass; dx and dA apart); 1 to 4 adapters, ragged edges."""
    script = """
import torch
from trainperf.model import lora_kernel, lora_triton
torch.manual_seed(0)
for rows, width, n, rank in ((70, 80, 3, 16), (33, 64, 1, 32), (64, 48, 4, 16)):
    x, a = torch.randn(rows, width), torch.randn(n * rank, width) * 0.1  # fp32: the interpreter garbles bf16
    dh, seed = torch.randn(rows, n * rank), torch.tensor([2**33 + 99])
    h, bits = lora_triton.forward(x, a, seed, 0.1, n)
    rh, rbits = lora_kernel.lora_dropout_a(x, a, seed, 0.1, n)
    rdx, rda = lora_kernel.lora_dropout_a_backward(dh, x, a, rbits, 0.1, n)
    assert torch.equal(bits, rbits)
    torch.testing.assert_close(h, rh, rtol=1e-5, atol=1e-5)
    for name, backward in lora_triton.BACKWARDS.items():
        dx, da = backward(dh, x, a, bits, 0.1, n)
        torch.testing.assert_close(dx, rdx, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name} dx: {m}")
        torch.testing.assert_close(da, rda, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name} dA: {m}")
        assert torch.equal(dx == 0, rdx == 0), name
assert sorted(lora_triton.BACKWARDS) == ["one-pass", "split"]
print("ok")
"""
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
