"""Atomic writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def atomic_write_bytes(target: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``target`` through a temporary file in the same folder and a rename."""
    return atomic_write(target, lambda tmp: Path(tmp).write_bytes(data))


def atomic_write_text(target: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(target, text.encode())


def atomic_write(target: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """Call ``write(tmp_path)`` for a temporary file beside ``target``, then rename it over ``target``;
    on any error the temporary file is removed and ``target`` is untouched."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def atomic_write_dir(dest: str | os.PathLike, write_into: Callable[[Path], object]) -> Path:
    """Fill a temporary folder beside ``dest`` with ``write_into(folder)``, then rename it to ``dest``
    (replacing an older one); on any error ``dest`` is untouched."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        write_into(tmp)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
