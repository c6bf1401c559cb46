"""Starting a torchrun process tree from a launcher process, and passing signals on to it.

torch-free (a subprocess): the launcher never creates a CUDA context or joins a group. Used by ``run``
(more than one rank on this machine), sweeps, ``preflight`` and ``trace``.
"""

from __future__ import annotations

import signal
import subprocess
import sys


class Interrupted(RuntimeError):
    """SIGTERM or SIGINT reached the launcher; the child was told and has exited."""


def _raise_interrupted(signum, frame):
    raise Interrupted(f"received {signal.Signals(signum).name}")


def torchrun_command(nproc_per_node: int, module: str, *args: str) -> list[str]:
    """``python -m torch.distributed.run --standalone`` on this machine, ranks running ``-m module``."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc_per_node}",
            "-m", module, *args]


def run_torchrun(cmd: list[str], env: dict, stdout=None) -> int:
    """Run torchrun (its output to ``stdout`` if given); on SIGTERM/SIGINT pass the signal on (torchrun
    forwards it to every rank, whose handler records the failure), wait for the ranks, then re-raise."""
    return run_passing_signals(cmd, env, stdout, subprocess.STDOUT if stdout else None)


def run_passing_signals(cmd: list[str], env: dict | None = None, stdout=None, stderr=None) -> int:
    """Run ``cmd`` to its end; a SIGTERM/SIGINT to us goes on to it as SIGTERM (so it records its own
    end), and once it has exited (60 s at most, then killed) is raised here as Interrupted."""
    proc = subprocess.Popen(cmd, env=env, stdout=stdout, stderr=stderr)
    previous = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return proc.wait()
    except BaseException:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
