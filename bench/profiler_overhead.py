"""What torch.profiler costs per kernel on a launch-bound loop, with CPU + CUDA activities (what
`trainperf trace` records) and with CUDA activity alone; and what each kind of trace holds (event
categories, whether the ProfilerStep spans and the NCCL records that size collectives survive).

    python bench/profiler_overhead.py > overhead.json      # one CUDA GPU

Prints JSON: the median step (s) plain / cpu+cuda / cuda_only and, per trace kind, its event
categories, most frequent non-kernel names, NCCL records, ProfilerStep spans and synchronisations.
Results: docs/OBSERVABILITY.md ("What the profiler costs per kernel").
"""

from __future__ import annotations

import collections
import json
import socket
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

TINY_KERNELS = 1500  # matmul + GELU each: 3,000 launches per step, launch-bound


def step(x, w, big) -> None:
    y = x
    for _ in range(TINY_KERNELS):
        y = torch.nn.functional.gelu(y @ w)
    z = big @ big  # one GPU-bound GEMM
    dist.all_reduce(z)  # one NCCL collective (1-rank group): its records in the trace
    torch.cuda.synchronize()


def median_step(x, w, big, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        step(x, w, big)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def trace_contents(path: str) -> dict:
    trace = json.load(open(path))
    events = trace["traceEvents"]
    return {
        "categories": dict(collections.Counter(e.get("cat") for e in events)),
        "top_names": collections.Counter(e.get("name") for e in events if e.get("cat") != "kernel").most_common(25),
        "nccl_records": [e for e in events if "nccl" in e.get("name", "").lower()][:4],
        "profiler_steps": [e for e in events if str(e.get("name", "")).startswith("ProfilerStep")][:6],
        "synchronize": [e for e in events if "Synchronize" in str(e.get("name", ""))][:8],
    }


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    x = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    big = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        step(x, w, big)
    result = {"plain": median_step(x, w, big, 6)}
    kinds = {"cpu+cuda": [ProfilerActivity.CPU, ProfilerActivity.CUDA], "cuda_only": [ProfilerActivity.CUDA]}
    for name, activities in kinds.items():
        path = f"/tmp/profiler_overhead_{name}.json"
        walls = []
        with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=4, repeat=1),
                     on_trace_ready=lambda p, path=path: p.export_chrome_trace(path)) as prof:
            for _ in range(5):
                t0 = time.perf_counter()
                step(x, w, big)
                walls.append(time.perf_counter() - t0)
                prof.step()
        result[name] = sorted(walls[1:])[1]  # the 4 recorded steps
        result[name + "_trace"] = trace_contents(path)
    print(json.dumps(result, indent=1, default=str))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
