"""Probe: do Inductor's CUDA graphs (cudagraph trees over each compiled decoder layer) pay on the
7B LoRA step? One process, one GPU: trainperf's compiled 7B LoRA step at seq 8192 (SDPA), with
``torch._inductor.config.triton.cudagraphs`` off, on, on with the fused LoRA kernel, and off again.

    python bench/probe_cudagraphs.py

Not a trainperf option: measured on an H200 (docs/PERFORMANCE.md, 2026-12-01), it did not pay.
"""

from __future__ import annotations

import sys
import traceback

import torch
import torch._dynamo
import torch._inductor.config as inductor_config

import lora_throughput as bench
from common import has_cuda
from trainperf.core.spec import ModelSpec
from trainperf.core import flops as metrics
from trainperf.core.hardware import peak_flops_for

SEQ = 8192


def main() -> int:
    if not has_cuda("probe_cudagraphs.py"):
        return 2
    model_spec = ModelSpec(vocab_size=32000, max_position_embeddings=SEQ, **bench.SHAPES["7b"])
    flops_tok = metrics.train_flops_per_token(model_spec, bench.LORA, SEQ)
    peak = peak_flops_for(torch.cuda.get_device_name())
    for graphs, lora_kernel in ((False, "torch"), (True, "torch"), (True, "fused"), (False, "torch")):
        inductor_config.triton.cudagraphs = graphs
        torch._dynamo.reset()  # compile afresh under the setting
        label = f"cudagraphs={graphs} lora_kernel={lora_kernel}"
        try:
            r = bench.run_side(bench.bench_trainperf, model_spec=model_spec, lora=bench.LORA, seq=SEQ, recompute="none",
                               steps=10, warmup=3, compile_layers=True, lora_kernel=lora_kernel)
        except Exception as exc:  # a probe: report the failure and go on with the next setting
            print(f"{label}: failed, {type(exc).__name__}: {str(exc)[:800]}", flush=True)
            traceback.print_exc(limit=3)
            continue
        if "oom" in r:
            print(f"{label}: out of memory ({r['oom']})", flush=True)
            continue
        tokens_s = SEQ / r["step_s"]
        print(f"{label}: {tokens_s:,.0f} tokens/s, MFU {100 * (metrics.mfu(flops_tok, tokens_s, peak) or 0):.1f}%, "
              f"peak {r['peak_gib']:.1f} GiB, step {r['step_s'] * 1e3:.1f} ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
