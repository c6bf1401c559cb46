"""Shared test setup: a repo-local cache for generated datasets and base checkpoints (built once per
machine, reused by later runs), the `gpu` marker skipped where no CUDA device is visible, and a
one-process gloo group for tests that need torch.distributed in this process."""

import os
import socket
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("TRAINPERF_CACHE", str(REPO / ".cache" / "trainperf"))
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def gloo_group():
    """A world of one gloo process (DeviceMesh, FSDP2 and the engine need an initialised group)."""
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def trainperf_cmd(*args: str) -> list[str]:
    """The CLI as a user runs it, in a fresh interpreter."""
    return [sys.executable, "-m", "trainperf", *args]
