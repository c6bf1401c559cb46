"""Path arguments checked before any work, without creating anything (a refused command leaves no
file behind): the folder a command writes its artefacts into."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from trainperf.core.errors import SpecError

MIN_FREE_BYTES = 256 * 2**20  # a run's small artefacts (logs, summaries, the store's rows) with room to spare


def nearest_existing(path: Path) -> Path:
    """``path`` itself, or the closest folder above it that exists."""
    here = path
    while not here.exists() and here != here.parent:
        here = here.parent
    return here


def check_out_folder(path: str, flag: str = "--out", min_free_bytes: int = MIN_FREE_BYTES) -> None:
    """SpecError unless ``path`` is (or can be made as) a writable folder on a file system with
    ``min_free_bytes`` free; nothing is created."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise SpecError(f"{flag} {path!r} is a file; give a folder for the runs' artefacts")
    existing = nearest_existing(target.absolute())
    if not existing.is_dir():
        raise SpecError(f"{flag} {path!r}: {str(existing)!r} is a file, so no folder can be made under it; give "
                        "another folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SpecError(f"{flag} {path!r}: {str(existing)!r} is not writable (a read-only file system, or "
                        "permissions); give a folder you can write")
    free = shutil.disk_usage(existing).free
    if free < min_free_bytes:
        raise SpecError(f"{flag} {path!r}: {free / 2**20:.0f} MiB free on its file system, less than the "
                        f"{min_free_bytes / 2**20:.0f} MiB a run's artefacts need; free space or give another folder")
