"""Compiled tensor parallel on the 7B LoRA shape (TP2 + SP, GBS 4, seq 8192), the engine built directly:
a probe from when `trainperf run` refused train.compile with TP and LoRA dropout. Since the dropout
mask is drawn on a plain global-shape tensor, that combination runs through `trainperf run`/`trace` itself
(docs/PERFORMANCE.md); the probe stays as the engine-only timing of the same step.

    torchrun --nproc-per-node 2 bench/tp_compile_probe.py LORA_DROPOUT      # e.g. 0.1 or 0.0

2 x H200, 2026-11-30: dropout 0.0 -> 1.337 s per step (eager 3.366 s), 22.2 GiB;
dropout 0.1 -> the fake-tensor error on bernoulli_ of a DTensor, since fixed in model/lora.py.
"""
import json
import sys
import time
import traceback

import torch
import torch.distributed as dist

from trainperf.parallel.parallelize import build_mesh
from trainperf.core.layout import resolve_layout
from trainperf.core.resolve import resolve_spec
from trainperf.train.engine import Engine
from trainperf.parallel.distributed import init_distributed
from trainperf.workloads.mini import synthetic_lora_defaults


def main() -> None:
    dropout = sys.argv[1]
    init_distributed("cuda")
    rank = dist.get_rank()
    spec = resolve_spec(synthetic_lora_defaults(), None, ["parallel.tp=2", "parallel.sp=true", "parallel.dp_shard=1",
                        "train.compile=true", f"lora.dropout={dropout}", "train.seed=1"])
    spec.hardware.device = "cuda"
    resolve_layout(spec, 2)
    mesh = build_mesh(spec.parallel, "cuda")
    out = {"dropout": float(dropout)}
    try:
        engine = Engine(spec, mesh, torch.device("cuda"), torch.bfloat16)
        opt = torch.optim.AdamW(engine.trainable, lr=1e-4)
        g = torch.Generator().manual_seed(0)
        times, losses = [], []
        for _ in range(6):
            batches = [(torch.randint(0, 32000, (1, 8192), generator=g), torch.ones(1, 8192)) for _ in range(4)]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = engine.train_step(batches, global_tokens=4 * 8191)
            opt.step()
            opt.zero_grad()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            losses.append(float(loss))
        out.update(step_s=sorted(times[1:])[len(times[1:]) // 2], first_s=times[0], losses=losses,
                   peak_gib=torch.cuda.max_memory_allocated() / 2**30)
    except Exception as exc:  # noqa: BLE001 -- the probe reports what compile raised
        out["error"] = f"{type(exc).__name__}: {str(exc)[:600]}"
        traceback.print_exc()
    if rank == 0:
        print("RESULT", json.dumps(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
