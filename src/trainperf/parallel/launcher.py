"""Starting a torchrun process tree from a launcher process, passing signals on to it, and making sure
it never outlives the launcher.

torch-free (a subprocess): the launcher never creates a CUDA context or joins a group. Used by ``run``
(more than one rank on this machine), sweeps, ``tune``, ``preflight`` and ``trace``.

Ownership: every child is started in its own process group (setsid) with a parent-death signal,
so a launcher killed outright (SIGKILL: no handler runs) still takes its children with it; a rank
asks for the same signal (``die_with_parent``) when torchrun dies, whether torchrun forked it
(parallel/torchrun.py, hosts without CUDA) or started it as an interpreter of its own. A child that outlives a stop request is killed with its whole group.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys

from trainperf.core.processes import process_group_alive

PR_SET_PDEATHSIG = 1  # linux/prctl.h
RANKS_END_ENV = "TRAINPERF_RANKS_END"  # where parallel.torchrun writes its failed ranks' exit codes
STOP_GRACE_S = 60.0  # how long a child told to stop may take to record its end before it is killed


class Interrupted(RuntimeError):
    """SIGTERM or SIGINT reached the launcher; the child was told and has exited. ``signum``: which."""

    def __init__(self, message: str, signum: int = signal.SIGTERM):
        super().__init__(message)
        self.signum = signum


def _raise_interrupted(signum, frame):
    raise Interrupted(f"received {signal.Signals(signum).name}", signum)


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux prctl); False where
    it cannot (another OS, no libc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(expected_parent: int | None = None, sig: int = signal.SIGTERM) -> None:
    """This process ends (``sig``) when its parent does. ``expected_parent``: the pid the parent had
    when it started us -- if it is already gone (the signal asked for too late), end now."""
    set_parent_death_signal(sig)
    if expected_parent is not None and os.getppid() != expected_parent:
        os.kill(os.getpid(), sig)


def _owned_child_setup(parent: int):
    """What runs in the child between fork and exec: a process group of its own (setsid, also away from
    the terminal's signals), then the parent-death signal."""
    def setup() -> None:
        os.setsid()
        die_with_parent(parent)
    return setup


def start_owned(cmd: list[str], env: dict | None = None, stdout=None, stderr=None) -> subprocess.Popen:
    """Start ``cmd`` in a process group of its own (pgid = its pid) that dies with this process."""
    return subprocess.Popen(cmd, env=env, stdout=stdout, stderr=stderr,
                            preexec_fn=_owned_child_setup(os.getpid()))


def end_process_group(pgid: int, grace_s: float = 5.0) -> bool:
    """SIGTERM every process of group ``pgid``, SIGKILL what is left after ``grace_s``. True if the
    group had any process."""
    import time  # only when a group has to be ended

    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return False
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not process_group_alive(pgid):
            return True
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    return True


def _exited(proc: subprocess.Popen, block: bool) -> bool:
    """Whether ``proc`` has exited, leaving it unreaped: while its zombie exists its pid (= its group's
    id) cannot be reused, so ending the group afterwards cannot reach someone else's processes."""
    if not hasattr(os, "waitid"):  # no waitid (not Linux): reap, as Popen would
        return proc.wait() is not None if block else proc.poll() is not None
    flags = os.WEXITED | os.WNOWAIT | (0 if block else os.WNOHANG)
    try:
        return os.waitid(os.P_PID, proc.pid, flags) is not None
    except ChildProcessError:  # already reaped
        return True


def stop_owned(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S, sig: int = signal.SIGTERM) -> None:
    """Tell an owned child to stop (``sig``, SIGTERM unless a SIGINT is passed on: it records its own
    end), wait ``grace_s``, then kill its whole group; whatever of the group is still there afterwards
    is ended too."""
    import time  # only when a child has to be stopped

    if proc.returncode is None:
        proc.send_signal(sig)
        deadline = time.monotonic() + grace_s
        while not _exited(proc, block=False) and time.monotonic() < deadline:
            time.sleep(0.05)
        end_process_group(proc.pid, grace_s=1.0)
    proc.wait()


def torchrun_command(nproc_per_node: int, module: str, *args: str) -> list[str]:
    """torchrun ``--standalone`` on this machine (``parallel.torchrun``: its end in one line, not a
    traceback), ranks running ``-m module``."""
    return [sys.executable, "-m", "trainperf.parallel.torchrun", "--standalone", f"--nproc-per-node={nproc_per_node}",
            "-m", module, *args]


def run_torchrun(cmd: list[str], env: dict, stdout=None, on_start=None, pass_sigint: bool = False) -> int:
    """Run torchrun (its output to ``stdout`` if given); on SIGTERM/SIGINT pass the signal on (torchrun
    forwards it to every rank, whose handler records the failure), wait for the ranks, then re-raise.
    ``on_start(pgid)``: called with torchrun's process group once it exists. ``pass_sigint``: see
    ``run_passing_signals``."""
    return run_passing_signals(cmd, env, stdout, subprocess.STDOUT if stdout else None, on_start=on_start,
                               pass_sigint=pass_sigint)


def run_passing_signals(cmd: list[str], env: dict | None = None, stdout=None, stderr=None, on_start=None,
                        pass_sigint: bool = False) -> int:
    """Run ``cmd`` to its end as an owned child (``start_owned``); a SIGTERM/SIGINT to us goes on to it
    as SIGTERM (so it records its own end; a SIGINT as SIGINT with ``pass_sigint``, for a child that
    records which signal stopped it: a run), and once it has exited (``STOP_GRACE_S`` at most, then its
    group is killed) is raised here as Interrupted. Nothing of its group outlives the call.
    ``on_start(pid)``: called once the child exists (its pid is its process group's id)."""
    proc = start_owned(cmd, env, stdout, stderr)
    if on_start is not None:
        on_start(proc.pid)
    previous = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        _exited(proc, block=True)
        end_process_group(proc.pid, grace_s=1.0)  # anything it left in its group
        return proc.wait()
    except BaseException as exc:
        passed_on = getattr(exc, "signum", signal.SIGTERM) if pass_sigint else signal.SIGTERM
        stop_owned(proc, sig=passed_on)
        raise
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def rank_end(rank: int, exitcode: int) -> str:
    if exitcode is not None and exitcode < 0:
        return f"rank {rank} killed by {signal_name(-exitcode)}"
    if exitcode is not None and exitcode > 128 and exitcode - 128 in signal.valid_signals():
        return f"rank {rank} killed by {signal_name(exitcode - 128)}"  # a shell's way of saying it
    return f"rank {rank} exit {exitcode}"


def killed_ranks(path: str | os.PathLike) -> list[str]:
    """'rank R killed by SIG' of each rank a signal ended, from the file parallel.torchrun wrote at
    ``RANKS_END_ENV`` (nothing when there is none)."""
    import json

    try:
        with open(path) as fh:
            codes = json.load(fh)["exitcodes"]
        ends = [rank_end(int(r), int(c)) for r, c in sorted(codes.items(), key=lambda rc: int(rc[0])) if c is not None]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []
    return [e for e in ends if " killed by " in e]
