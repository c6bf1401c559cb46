"""What this machine says about a process: alive or gone, when it started, which group it is in.

A pid alone does not name a process for long (pids are reused), so a process is recorded as (host, PID
namespace, pid, start time) and a run's tree also by its process group; these functions answer from
/proc where there is one, and from ``kill(pid, 0)`` elsewhere.
"""

from __future__ import annotations

import os


# /proc/stat's btime is whole seconds and moves when the wall clock is stepped or slewed across a
# second, so one process's start time read twice can differ by a second; a pid is not reused that fast
START_TIME_TOLERANCE_S = 1.5


def pid_namespace() -> str | None:
    """This process's PID namespace ('pid:[4026531836]'), None where /proc has none (not Linux)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (state is [0], ppid [1], pgrp [2], starttime [19])."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _boot_time() -> float | None:
    try:
        with open("/proc/stat") as fh:
            for line in fh:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


def process_start_time(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch, to the kernel's tick), None if it is gone
    or /proc cannot say."""
    fields, boot = _stat_fields(pid), _boot_time()
    if fields is None or boot is None:
        return None
    return round(boot + int(fields[19]) / os.sysconf("SC_CLK_TCK"), 2)


def process_alive(pid: int, started: float | None = None) -> bool:
    """Whether process ``pid`` exists and is not a zombie -- and, given ``started``, is the process that
    started then (not a later one that got the same pid)."""
    fields = _stat_fields(pid)
    if fields is not None:
        if fields[0] == "Z":
            return False
        now_started = process_start_time(pid)
        return started is None or now_started is None or abs(now_started - started) < START_TIME_TOLERANCE_S
    if os.path.isdir("/proc/self"):  # /proc exists and has no such pid
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_members(pgid: int) -> list[int] | None:
    """Pids of the living (not zombie) processes of process group ``pgid``; None without /proc."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    members = []
    for entry in entries:
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None and fields[0] != "Z" and int(fields[2]) == pgid:
                members.append(int(entry))
    return members


def process_group_alive(pgid: int) -> bool:
    """Whether group ``pgid`` has a living process (without /proc: whether the group exists)."""
    members = group_members(pgid)
    if members is not None:
        return bool(members)
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
