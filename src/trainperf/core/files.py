"""Atomic writes: a reader sees the old file or the new one, never half of one.

Output folders (``atomic_write_dir``, ``new_output_dir``) never replace anything: a folder is built
in a temporary sibling and renamed into place only onto a path that does not exist or is an empty
folder; a non-empty folder, a file or a link there is refused. Nothing a failed write made is left
behind (the temporary sibling, and any parent folders it had to create, are removed).
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from trainperf.core.errors import SpecError

# kernel filesystems: an output there is never a user's folder (except /dev/shm, a RAM disk)
_KERNEL_ROOTS = (Path("/proc"), Path("/sys"), Path("/dev"))


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


def _shown(path: Path) -> str:
    from trainperf.core.untrusted import printable  # names may come from the user's shell, escapes included

    return printable(str(path), 300)


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def check_output_dir(dest: str | os.PathLike, inputs: Iterable[str | os.PathLike] = (), flag: str = "--out") -> Path:
    """Refuse an output folder that would overwrite or lose anything: one that exists and is not an
    empty folder (a file, a link, a folder with contents), one that is, holds or lies inside one of
    ``inputs``, one under a file, or one on a kernel filesystem (/proc, /sys, /dev). Returns the path.
    Checks only (the nearest existing parent must be writable, not on a read-only mount); nothing is made."""
    dest = Path(dest)
    absolute = Path(os.path.abspath(dest))
    real = Path(os.path.realpath(dest))
    shown = _shown(dest)
    for root in _KERNEL_ROOTS:
        if (_inside(absolute, root) or _inside(real, root)) and not _inside(real, Path("/dev/shm")):
            raise SpecError(f"{flag} {shown} lies under {root}, a kernel filesystem; give a folder on a disk")
    for given in inputs:
        inp = Path(os.path.realpath(given))
        if real == inp:
            raise SpecError(f"{flag} {shown} is the input {_shown(Path(given))}; give a new folder for the output")
        if _inside(real, inp):
            raise SpecError(f"{flag} {shown} lies inside the input {_shown(Path(given))}; give a folder outside it")
        if _inside(inp, real):
            raise SpecError(f"{flag} {shown} holds the input {_shown(Path(given))}; give a new folder for the output")
    if os.path.islink(dest):
        raise SpecError(f"{flag} {shown} is a link; give a new folder (an existing path is never overwritten)")
    if dest.exists():
        if not dest.is_dir():
            raise SpecError(f"{flag} {shown} is an existing file; give a new folder (an existing path is never "
                            "overwritten)")
        try:
            empty = not any(dest.iterdir())
        except OSError as exc:
            raise SpecError(f"{flag} {shown}: cannot read it ({exc.strerror or exc}); give a new folder") from None
        if not empty:
            raise SpecError(f"{flag} {shown} already exists and is not empty; give a new folder (an existing "
                            "folder is never overwritten)")
    for parent in absolute.parents:
        if parent.exists() or os.path.islink(parent):
            if not parent.is_dir():
                raise SpecError(f"{flag} {shown} lies under {_shown(parent)}, which is a file, not a folder")
            try:
                read_only = bool(os.statvfs(parent).f_flag & os.ST_RDONLY)
            except OSError:
                read_only = False  # not knowable here: the temporary folder's creation decides
            if read_only:
                raise SpecError(f"{flag} {shown} lies on a read-only filesystem ({_shown(parent)}); give a "
                                "writable folder")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise SpecError(f"{flag} {shown}: {_shown(parent)} is not writable by this user; give a "
                                "writable folder")
            break
    return dest


def _os_error(flag: str, dest: Path, exc: OSError) -> SpecError:
    reason = {errno.EROFS: "a read-only filesystem", errno.EACCES: "permission denied",
              errno.EPERM: "not permitted", errno.ENOSPC: "no space left on the device",
              errno.ENOTDIR: "a parent is not a folder"}.get(exc.errno, exc.strerror or str(exc))
    return SpecError(f"{flag} {_shown(dest)}: cannot write there ({reason}); give a writable folder")


@contextmanager
def new_output_dir(dest: str | os.PathLike, inputs: Iterable[str | os.PathLike] = (),
                   flag: str = "--out") -> Iterator[Path]:
    """A temporary folder beside ``dest`` to fill; renamed to ``dest`` when the block ends without an
    error. ``dest`` is checked first (:func:`check_output_dir`) and the temporary folder is made before
    the block runs, so an unwritable place is refused before any work. On any error the temporary
    folder and the parents made for it are removed; an OSError of the filesystem (read-only, full,
    denied) comes out as a one-line SpecError."""
    dest = check_output_dir(dest, inputs, flag)
    absolute = Path(os.path.abspath(dest))
    made: list[Path] = []
    tmp = None
    try:
        for parent in reversed(absolute.parents):
            if not parent.exists():
                os.mkdir(parent)
                made.append(parent)
        tmp = Path(tempfile.mkdtemp(prefix=f".{absolute.name}.tmp-", dir=absolute.parent))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # as a plain mkdir makes it (mkdtemp's 0700 would hide a shared dataset)
    except OSError as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        _remove_made(made)
        raise _os_error(flag, dest, exc) from None
    try:
        try:
            yield tmp
        except OSError as exc:
            named = isinstance(exc.filename, str) and not _inside(Path(os.path.abspath(exc.filename)), tmp)
            if named:  # an input that could not be read, not the output
                raise SpecError(f"cannot read {_shown(Path(exc.filename))}: {exc.strerror or exc}") from None
            raise _os_error(flag, dest, exc) from None
        try:
            # rename(2) onto an empty folder replaces it; onto a non-empty one, a file or a link it fails
            os.rename(tmp, absolute)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise SpecError(f"{flag} {_shown(dest)} appeared while writing; it was left as it is and "
                                "nothing was written") from None
            raise _os_error(flag, dest, exc) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_made(made)
        raise


def _remove_made(made: list[Path]) -> None:
    for parent in reversed(made):
        try:
            os.rmdir(parent)
        except OSError:
            break


def atomic_write_dir(dest: str | os.PathLike, write_into: Callable[[Path], object],
                     inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Fill a temporary folder beside ``dest`` with ``write_into(folder)``, then rename it to ``dest``;
    ``dest`` must not exist or be an empty folder (nothing is ever replaced: a SpecError otherwise), and
    on any error nothing is left behind."""
    with new_output_dir(dest, inputs, flag="output folder") as tmp:
        write_into(tmp)
    return Path(dest)
