"""Joining the process group: the one way every trainperf process does it (``run`` under its own
torchrun, under an external torchrun or srun, ``preflight`` and ``trace`` workers, benches).

What must be in place before the group exists is applied here, in this order: srun's variables
translated to torchrun's, PyTorch's Flight Recorder switched on (its buffer is sized when the group is
made), and the collective timeout handed to ``init_process_group`` (a group's timeout cannot change
afterwards).
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist


def adopt_srun_environment() -> None:
    """srun started this process as one of several tasks, with SLURM_* variables only: give them
    torchrun's names (a single task is a lone process)."""
    if "SLURM_PROCID" in os.environ and "RANK" not in os.environ and int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        os.environ["RANK"] = os.environ["SLURM_PROCID"]
        os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
        os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
        per_node = os.environ.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]  # "4(x2)": 4 tasks on each of 2 nodes
        if per_node:
            os.environ.setdefault("LOCAL_WORLD_SIZE", per_node)
        os.environ.setdefault("MASTER_ADDR", _first_step_node() or os.environ.get("SLURM_LAUNCH_NODE_IPADDR", "127.0.0.1"))
        os.environ.setdefault("MASTER_PORT", str(20000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 20000))


def _first_step_node() -> str | None:
    """The step's first node, where task 0 (rank 0, the store's host) runs; not srun's own host, which
    is a login node when srun is typed there. None where scontrol cannot expand the list."""
    nodelist = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        return None
    import subprocess  # only under srun

    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = out.stdout.split() if out.returncode == 0 else []
    return names[0] if names else None


def record_collectives() -> None:
    """PyTorch's Flight Recorder on: keep the last collectives of every rank in a ring buffer, dumped
    when a collective times out. Must be set before the group exists (the NCCL group reads these
    when it is made, the buffer is sized at the first collective)."""
    if torch.torch_version.TorchVersion(torch.__version__) < (2, 8):  # the older name, deprecated (a warning) since
        os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")


def enable_flight_recorder(dump_dir: Path) -> None:
    """PyTorch's Flight Recorder (``record_collectives``), dumped into ``dump_dir``
    (RUN_DIR/flight_recorder/) when a collective times out (read it with
    ``python -m torch.distributed.flight_recorder.fr_trace``). The dump's location is read when the
    first dump is written (torch's DebugInfoWriter::getWriter), so it may be set after the group exists."""
    dump_dir.mkdir(parents=True, exist_ok=True)
    record_collectives()
    os.environ["TORCH_FR_DUMP_TEMP_FILE"] = str(dump_dir / "rank_")


def init_distributed(device_type: str, timeout_s: float | None = None,
                     flight_recorder_dir: Path | None = None) -> tuple[int, int, int]:
    """Join the process group torchrun (or srun, or nobody) set up; a lone process gets a 1-rank group.
    ``timeout_s``: how long a collective may wait before the run is declared hung;
    ``flight_recorder_dir``: where a timed-out collective's Flight Recorder dump goes.
    Returns (rank, world size, local rank). A group that already exists is kept as it is."""
    adopt_srun_environment()
    if flight_recorder_dir is not None:
        enable_flight_recorder(flight_recorder_dir)
    lone = "RANK" not in os.environ  # nobody launched us: a 1-rank group, without touching the environment
    if lone:
        rank, world, local = 0, 1, 0
    else:
        rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    if not dist.is_initialized():
        kwargs = {}
        if timeout_s:
            kwargs["timeout"] = timedelta(seconds=timeout_s)
        if lone:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            kwargs.update(init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        if device_type == "cuda":
            torch.cuda.set_device(local)
            dist.init_process_group("nccl", device_id=torch.device("cuda", local), **kwargs)
        else:
            dist.init_process_group("gloo", **kwargs)
    return rank, world, local


def is_collective_timeout(exc: BaseException) -> bool:
    """gloo raises on a timed-out collective; the NCCL watchdog aborts the process instead (the
    launcher then finds the flight-recorder dump)."""
    text = f"{type(exc).__name__} {exc}".lower()
    return isinstance(exc, (RuntimeError, dist.DistBackendError)) and ("timed out" in text or "timeout" in text)
