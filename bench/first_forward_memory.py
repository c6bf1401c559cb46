"""Where memory grows in the first forward of the llama2_70b_lora recipe: allocated GiB after every
decoder layer's forward, on rank 0 (a fully recomputed layer should keep only its input, 0.125 GiB
at seq 8192 x hidden 8192 in bf16; a selective one its saved projections).

    torchrun --nproc-per-node 2 bench/first_forward_memory.py [--compile] [--fp8] [--recompute-layers 47]

Found with it (2 x H200, 2026-11-30): compiled float8 layers with their checkpoint traced inside the
graph kept 1.28 GiB each; parallelize.apply_compile now wraps the compiled forward in the checkpoint.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist

from trainperf.parallel.parallelize import build_mesh
from trainperf.core.layout import resolve_layout
from trainperf.core.resolve import resolve_spec
from trainperf.train.engine import Engine
from trainperf.parallel.distributed import init_distributed
from trainperf.mlperf.recipes import llama2_70b_lora_defaults


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--fp8", action="store_true")
    ap.add_argument("--recompute-layers", type=int, default=47, help="full recompute on these, selective on the rest")
    args = ap.parse_args()
    init_distributed("cuda")
    overrides = ["mlperf.division=open", "train.recompute=full", f"train.recompute_layers={args.recompute_layers}",
                 "train.recompute_others=selective", f"hardware.fp8={'tensorwise' if args.fp8 else 'none'}",
                 f"train.compile={'true' if args.compile else 'false'}"]
    spec = resolve_spec(llama2_70b_lora_defaults(), None, overrides)
    spec.hardware.device = "cuda"
    resolve_layout(spec, dist.get_world_size())
    engine = Engine(spec, build_mesh(spec.parallel, "cuda"), torch.device("cuda"), torch.bfloat16)
    model = engine.parts[0][1]
    gib = 2**30
    rows = []

    def after(i):
        def hook(module, inputs, output):
            torch.cuda.synchronize()
            allocated, peak = torch.cuda.memory_allocated() / gib, torch.cuda.max_memory_allocated() / gib
            rows.append((i, round(allocated, 2), round(peak, 2)))
        return hook

    for i, layer in enumerate(model.model.layers.values()):
        layer.register_forward_hook(after(i))
    base = torch.cuda.memory_allocated() / gib
    ids = torch.randint(0, spec.model.vocab_size, (1, spec.data.seq_len), device="cuda")
    error, t0 = None, time.time()
    try:
        model(ids)
    except torch.OutOfMemoryError as exc:
        error = str(exc)[:200]
    if dist.get_rank() == 0:
        print(json.dumps({"args": vars(args), "base_gib": round(base, 2), "per_layer": rows, "error": error,
                          "seconds": round(time.time() - t0, 1)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
