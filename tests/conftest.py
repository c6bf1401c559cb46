"""Shared test setup: a repo-local cache for generated datasets and base checkpoints (built once per
machine, reused by later runs), and the `gpu` marker skipped where no CUDA device is visible."""

import os
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


def trainperf_cmd(*args: str) -> list[str]:
    """The CLI as a user runs it, in a fresh interpreter."""
    return [sys.executable, "-m", "trainperf", *args]
