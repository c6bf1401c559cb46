"""Does an optimizer step let the host run ahead of the GPU? Side by side on one GPU: PyTorch's fused
AdamW, torchao's AdamW8bit as it builds itself (its learning rate and step counters are CPU tensors),
and AdamW8bit with those moved to the GPU. For each: the host time of a step with the GPU idle, and
with ~0.2 s of GPU work queued ahead of it -- a step that returns only after the queue drains has
synchronised with the device, and in training the next micro-batch then starts on an empty GPU.

    python bench/optimizer_sync.py [--tensors 291] [--size 1024]

Why (docs/PERFORMANCE.md): Llama-3-8B pretraining with AdamW8bit on one H200 spends
0.42-0.47 s per step outside its micro-batches, 0.57 s of GPU idle in a trace, 0.145 s of optimizer
kernels. Measured (2026-12-01, one H200, bench/data/h200_2026-12-01_optimizer_sync.json): fused AdamW's
step returns in 2 ms behind 238 ms of queued work; AdamW8bit as built takes 152 ms of host time with the
GPU idle and returns 243 ms behind 237 ms of queued work -- its host work overlaps the queue but it
returns only once the queue has drained; with its rate, or rate and step counters, on the GPU: 129 / 124 ms
idle, 241 / 264 ms behind the queue -- no better, so the engine leaves torchao's counters where they are.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def build(kind: str, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if kind == "adamw fused":
        return torch.optim.AdamW(params, lr=1e-3, fused=True)
    from torchao.optim import AdamW8bit

    opt = AdamW8bit(params, lr=1e-3)
    if kind != "adamw8bit as built":
        for group in opt.param_groups:
            group["lr"] = group["lr"].to("cuda")
    return opt


def steps_on_device(opt: torch.optim.Optimizer) -> None:
    for state in opt.state.values():
        if isinstance(state.get("step"), torch.Tensor):
            state["step"] = state["step"].to("cuda")


def measure(kind: str, tensors: int, size: int) -> dict:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(size, size, device="cuda")) for _ in range(tensors)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = build(kind, params)
    opt.step()  # state created
    if kind == "adamw8bit, lr and step on GPU":
        steps_on_device(opt)
    for _ in range(3):
        opt.step()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def queue_work():
        for _ in range(150):
            a @ a

    queue_work()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    queue_work()
    torch.cuda.synchronize()
    queued_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    opt.step()
    idle_host_s = time.perf_counter() - t0
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    queue_work()
    issued_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    opt.step()
    behind_host_s = time.perf_counter() - t1
    torch.cuda.synchronize()
    wall_s = time.perf_counter() - t0
    return {"optimizer": kind, "step_host_ms_gpu_idle": round(idle_host_s * 1e3, 1),
            "queued_gpu_ms": round(queued_s * 1e3, 1), "queue_issued_ms": round(issued_s * 1e3, 1),
            "step_host_ms_behind_queue": round(behind_host_s * 1e3, 1), "queue_plus_step_wall_ms": round(wall_s * 1e3, 1),
            # a step that lets the host run ahead returns while queued work is still running
            "returned_before_queue_drained": issued_s + behind_host_s < 0.9 * queued_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=291)
    ap.add_argument("--size", type=int, default=1024)
    args = ap.parse_args()
    for kind in ("adamw fused", "adamw8bit as built", "adamw8bit, lr on GPU", "adamw8bit, lr and step on GPU"):
        print(json.dumps(measure(kind, args.tensors, args.size)), flush=True)


if __name__ == "__main__":
    main()
