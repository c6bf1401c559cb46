"""The measurements, run on every rank: process group, GEMM, HBM copy, collective sweeps, send/recv
pairs, and the plain-loop baselines. Returns the same raw result on every rank.

The harness (``timed``): warm-up calls, a barrier of the group (an all-reduce of one element, then a
device synchronise), then ``iters`` back-to-back calls between two CUDA events (``time.perf_counter``
on CPU); time per call = elapsed / iters. The baseline (``plain``) is what anyone would write: the same
barrier, then ``torch.cuda.synchronize(); t0 = time.perf_counter()``, N calls, synchronise, stop.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import time
import warnings
from typing import Callable

import torch
import torch.distributed as dist

from trainperf.parallel.distributed import init_distributed
from trainperf.preflight import checks

warnings.filterwarnings("ignore", message=r".*torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor).*")


class Ctx:
    def __init__(self, device: str):
        self.is_cuda = device == "cuda"
        self.owns_group = not dist.is_initialized()
        self.rank, self.world, self.local_rank = init_distributed(device)
        self.lone = "RANK" not in os.environ
        self.device = torch.device("cuda", self.local_rank) if self.is_cuda else torch.device("cpu")
        self.dtype = torch.bfloat16 if self.is_cuda else torch.float32
        if not self.owns_group and self.is_cuda:
            torch.cuda.set_device(self.local_rank)

    def sync(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def barrier(self, group=None) -> None:
        t = torch.zeros(1, device=self.device)
        dist.all_reduce(t, group=group)
        self.sync()

    def log(self, msg: str) -> None:
        if self.rank == 0:
            print(f"preflight: {msg}", file=sys.stderr, flush=True)


def timed(ctx: Ctx, fn: Callable[[], object] | None, warmup: int, iters: int, group=None) -> float | None:
    """The harness: seconds per call, mean over ``iters`` calls after ``warmup`` calls and a barrier.
    ``fn=None``: this rank only takes part in the barrier (it is idle in this measurement)."""
    if fn is not None:
        for _ in range(warmup):
            fn()
    ctx.barrier(group)
    if fn is None:
        return None
    if ctx.is_cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def plain(ctx: Ctx, fn: Callable[[], object], iters: int, group=None) -> float:
    """The baseline without the harness: synchronize + perf_counter around N calls (after the same
    barrier, so that no rank times its wait for the others)."""
    ctx.barrier(group)
    if ctx.is_cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    if ctx.is_cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


# -- per GPU ----------------------------------------------------------------------------------------

def gemm(ctx: Ctx, n: int, warmup: int, iters: int) -> list[dict]:
    dtype = ctx.dtype
    name = "bf16" if dtype == torch.bfloat16 else "fp32"
    a = torch.randn(n, n, device=ctx.device, dtype=dtype)
    b = torch.randn(n, n, device=ctx.device, dtype=dtype)
    fn = lambda: torch.matmul(a, b)  # noqa: E731
    t = timed(ctx, fn, warmup, iters)
    t_plain = plain(ctx, fn, iters)
    out = [{"rank": ctx.rank, "dtype": name, "n": n, "time_s": t, "tflops": 2.0 * n**3 / t / 1e12,
            "plain_time_s": t_plain}]
    out.append(_fp8_gemm(ctx, n, warmup, iters))
    return out


def _fp8_skip_reason(ctx: Ctx) -> str | None:
    if not ctx.is_cuda:
        return "fp8 GEMM needs a CUDA GPU"
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return f"torch {torch.__version__} has no torch._scaled_mm"
    cap = torch.cuda.get_device_capability(ctx.device)
    if cap < (8, 9):
        return f"compute capability {cap[0]}.{cap[1]} < 8.9 has no fp8 tensor cores"
    return None


def _fp8_gemm(ctx: Ctx, n: int, warmup: int, iters: int) -> dict:
    reason = _fp8_skip_reason(ctx)
    fn = None
    if reason is None:
        try:
            a = torch.randn(n, n, device=ctx.device).to(torch.float8_e4m3fn)
            b = torch.randn(n, n, device=ctx.device).to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
            one = torch.tensor(1.0, device=ctx.device)
            fn = lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
            fn()
        except Exception as exc:  # noqa: BLE001 -- any failure of the probe means: not supported here
            reason = f"torch._scaled_mm failed: {str(exc).splitlines()[0][:160]}"
            fn = None
    # every rank joins the barrier, measured or not
    t = timed(ctx, fn, warmup, iters)
    if fn is None:
        return {"rank": ctx.rank, "dtype": "fp8", "n": n, "skipped": reason}
    return {"rank": ctx.rank, "dtype": "fp8", "n": n, "time_s": t, "tflops": 2.0 * n**3 / t / 1e12}


def hbm_copy(ctx: Ctx, nbytes: int, warmup: int, iters: int) -> dict:
    src = torch.ones(nbytes, dtype=torch.uint8, device=ctx.device)
    dst = torch.empty_like(src)
    fn = lambda: dst.copy_(src)  # noqa: E731
    t = timed(ctx, fn, warmup, iters)
    t_plain = plain(ctx, fn, iters)
    return {"rank": ctx.rank, "bytes": nbytes, "moved_bytes": 2 * nbytes, "time_s": t, "tbps": 2.0 * nbytes / t / 1e12,
            "plain_time_s": t_plain}


def host_link(ctx: Ctx, nbytes: int, warmup: int, iters: int) -> list[dict]:
    """Pinned host <-> device copies (what activation offload moves), each direction: first each GPU
    of a node alone (the same local rank on every node at once: nodes share no PCIe), then every GPU
    at once -- GPUs behind one PCIe switch uplink show it as a drop (HGX boards put two behind each).
    CUDA only: on CPU there is no device to copy to."""
    if not ctx.is_cuda:
        return []
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=ctx.device)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world))
    rows = []
    for direction, fn in (("d2h", lambda: host.copy_(dev, non_blocking=True)),
                          ("h2d", lambda: dev.copy_(host, non_blocking=True))):
        for turn in range(local_world):
            t = timed(ctx, fn if ctx.local_rank == turn else None, warmup, iters)
            if t is not None:
                rows.append({"rank": ctx.rank, "direction": direction, "mode": "alone", "bytes": nbytes,
                             "time_s": t, "gbps": nbytes / t / 1e9})
        t = timed(ctx, fn, warmup, iters)
        rows.append({"rank": ctx.rank, "direction": direction, "mode": "together", "bytes": nbytes, "time_s": t,
                     "gbps": nbytes / t / 1e9})
    return rows


# -- collectives --------------------------------------------------------------------------------------

def _collective_fn(coll: str, inp: torch.Tensor, out: torch.Tensor, group) -> Callable[[], object]:
    if coll == "all_reduce":
        return lambda: dist.all_reduce(inp, group=group)
    if coll == "all_gather":
        return lambda: dist.all_gather_into_tensor(out, inp, group=group)
    if coll == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(out, inp, group=group)
    if coll == "all_to_all":
        return lambda: dist.all_to_all_single(out, inp, group=group)
    raise ValueError(coll)


def collective_sweep(ctx: Ctx, group, label: str, n: int, sizes: list[int], warmup: int, iters: int,
                     baseline: bool) -> list[dict]:
    """This rank's records for every collective and size in its group; with ``baseline``, the largest
    size is also timed by the plain loop."""
    elem = torch.tensor([], dtype=ctx.dtype).element_size()
    records = []
    for coll in checks.COLLECTIVES:
        for size in sizes:
            nbytes, n_in, n_out = checks.collective_elems(coll, size, n, elem)
            inp = torch.ones(n_in, dtype=ctx.dtype, device=ctx.device)
            out = inp if coll == "all_reduce" else torch.empty(n_out, dtype=ctx.dtype, device=ctx.device)
            fn = _collective_fn(coll, inp, out, group)
            rec = {"rank": ctx.rank, "group": label, "collective": coll, "size": size, "bytes": nbytes,
                   "time_s": timed(ctx, fn, warmup, iters, group)}
            if baseline and size == sizes[-1]:
                rec["plain_time_s"] = plain(ctx, fn, iters, group)
            records.append(rec)
            inp = out = fn = None  # free before the next size
        ctx.log(f"{coll} ({label}): {len(sizes)} sizes done")
    return records


def _sendrecv_fn(ctx: Ctx, peer: int, count: int) -> Callable[[], None]:
    send = torch.ones(count, dtype=ctx.dtype, device=ctx.device)
    recv = torch.empty(count, dtype=ctx.dtype, device=ctx.device)

    def fn() -> None:
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)]):
            w.wait()
    return fn


def pair_sweep(ctx: Ctx, sizes: list[int], warmup: int, iters: int) -> list[dict]:
    """send/recv between every pair of ranks, both directions at once (batch_isend_irecv), pairs of a
    round at the same time; every rank takes part in every barrier."""
    elem = torch.tensor([], dtype=ctx.dtype).element_size()
    records = []
    for rnd in checks.pair_rounds(ctx.world):
        peer = next((b if a == ctx.rank else a for a, b in rnd if ctx.rank in (a, b)), None)
        for size in sizes:
            nbytes, count, _ = checks.collective_elems("sendrecv", size, 2, elem)
            fn = _sendrecv_fn(ctx, peer, count) if peer is not None else None
            t = timed(ctx, fn, warmup, iters)  # idle ranks take part in the barrier only
            if peer is not None:
                records.append({"rank": ctx.rank, "peer": peer, "size": size, "bytes": nbytes, "time_s": t})
            fn = None
    ctx.log(f"sendrecv: {ctx.world * (ctx.world - 1) // 2} pairs x {len(sizes)} sizes done")
    return records


def _gather(obj):
    box = [None] * dist.get_world_size()
    dist.all_gather_object(box, obj)
    return box


def _device_info(ctx: Ctx) -> dict:
    info = {"rank": ctx.rank, "local_rank": ctx.local_rank, "host": socket.gethostname(), "pid": os.getpid()}
    if ctx.is_cuda:
        p = torch.cuda.get_device_properties(ctx.device)
        info.update(device_name=p.name, device_index=ctx.local_rank, memory_gib=round(p.total_memory / 2**30, 1),
                    capability=f"{p.major}.{p.minor}", uuid=str(getattr(p, "uuid", "")) or None,
                    free_bytes=torch.cuda.mem_get_info(ctx.device)[0])
    else:
        info.update(device_name="cpu", device_index=None)
    return info


def measure_all(req: dict) -> dict:
    """Every rank: measure everything and return the raw result (identical on every rank)."""
    ctx = Ctx(req["device"])
    try:
        return _measure(ctx, req)
    finally:
        if ctx.owns_group and dist.is_initialized():
            dist.destroy_process_group()


def _measure(ctx: Ctx, req: dict) -> dict:
    t_start = time.time()
    warmup, iters = req["warmup"], req["iters"]
    infos = _gather(_device_info(ctx))
    lws = os.environ.get("LOCAL_WORLD_SIZE")
    nodes = checks.node_names([i["host"] for i in infos], int(lws) if lws and lws.isdigit() else None)
    for i, info in enumerate(infos):
        info["node"] = nodes[i]
    sizes, hbm_bytes, notes = list(req["sizes"]), req["hbm_bytes"], []
    if ctx.is_cuda:  # every rank must run the same sizes: fit them to the GPU with the least free memory
        free = min(i["free_bytes"] for i in infos)
        if 2.5 * sizes[-1] > free:
            fit = [s for s in sizes if 2.5 * s <= free]
            notes.append(f"largest message {checks.fmt_bytes(sizes[-1])} does not fit in the free memory "
                         f"({free / 2**30:.1f} GiB): sweep stops at {checks.fmt_bytes(fit[-1])}")
            sizes = fit
        if 2.5 * hbm_bytes > free:
            hbm_bytes = 2 ** int(math.log2(free / 2.5))
            notes.append(f"HBM copy buffer reduced to {checks.fmt_bytes(hbm_bytes)} to fit the free memory")
    ctx.log(f"{ctx.world} ranks on {len(set(nodes))} node(s), device {req['device']}, "
            f"sizes {checks.fmt_bytes(sizes[0])}..{checks.fmt_bytes(sizes[-1])}")

    gemm_rows = gemm(ctx, req["gemm_n"], warmup, iters)
    ctx.log("gemm done")
    hbm_row = hbm_copy(ctx, hbm_bytes, warmup, iters)
    ctx.log("hbm copy done")
    host_rows = host_link(ctx, min(hbm_bytes, 2**30), warmup, iters)
    if host_rows:
        ctx.log("host link done")

    groups_out, coll_records, pair_records = [], [], []
    if ctx.world > 1:
        for part in checks.layout_groups(nodes):
            mine = None
            for g in part["groups"]:
                pg = dist.group.WORLD if g["label"] == "world" else dist.new_group(g["ranks"])
                if ctx.rank in g["ranks"]:
                    mine = (pg, g)
            groups_out.extend(part["groups"])
            if mine is not None:
                pg, g = mine
                coll_records += collective_sweep(ctx, pg, g["label"], len(g["ranks"]), sizes, warmup, iters,
                                                 baseline=g["label"] == "world")
            ctx.barrier()
        pair_records = pair_sweep(ctx, sizes, warmup, iters)
    else:
        notes.append("one process: no collectives or pairs to measure")

    all_gemm = [r for rows in _gather(gemm_rows) for r in rows]
    all_hbm = _gather(hbm_row)
    all_host = [r for rows in _gather(host_rows) for r in rows]
    all_coll = [r for rows in _gather(coll_records) for r in rows]
    all_pairs = [r for rows in _gather(pair_records) for r in rows]
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())) if ctx.is_cuda else None,
                "backend": dist.get_backend()}
    env = {k: os.environ[k] for k in sorted(os.environ) if k.startswith("NCCL_") and k in (
        "NCCL_ALGO", "NCCL_PROTO", "NCCL_NVLS_ENABLE", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE",
        "NCCL_NET", "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS")}
    return {
        "schema": "trainperf.preflight/1", "created_at": t_start, "elapsed_s": time.time() - t_start,
        "device": req["device"], "quick": req["quick"], "world_size": ctx.world,
        "hosts": list(dict.fromkeys(i["host"] for i in infos)), "nodes": list(dict.fromkeys(nodes)),
        "ranks": infos, "versions": versions, "nccl_env": env, "notes": notes,
        "settings": {"warmup": warmup, "iters": iters, "sizes": sizes, "gemm_n": req["gemm_n"], "hbm_bytes": hbm_bytes,
                     "dtype": "bf16" if ctx.is_cuda else "fp32",
                     "timing": "CUDA events around iters back-to-back calls after warm-up and a group barrier; "
                               "time = mean per call, averaged over the group's ranks" if ctx.is_cuda else
                               "time.perf_counter around iters calls after warm-up and a group barrier"},
        "groups": groups_out,
        "gemm": all_gemm, "hbm": all_hbm, "host_link": all_host,
        "collectives": checks.aggregate_collectives(all_coll, groups_out),
        "pairs": checks.aggregate_pairs(all_pairs, nodes),
    }
