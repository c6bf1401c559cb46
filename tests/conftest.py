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


def two_adamw_steps(engine, vocab_size: int) -> list[float]:
    """Two AdamW steps (lr 1e-2) of an engine on fixed random tokens, two micro-batches of 2 x 32 each;
    the losses."""
    import torch

    opt = torch.optim.AdamW(engine.trainable, lr=1e-2)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(2):
        batches = [(torch.randint(0, vocab_size, (2, 32), generator=g), torch.ones(2, 32)) for _ in range(2)]
        losses.append(float(engine.train_step(batches, global_tokens=4 * 31)))
        opt.step()
        opt.zero_grad()
    return losses
