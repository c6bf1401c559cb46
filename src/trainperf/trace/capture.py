"""Capture: a torch.profiler window over a few training steps on every rank.

The runner hands ``profiler_for`` to the trainer as its profiler factory (``RunHooks``), which calls it:

    prof = profiler_for(spec, ctx.out_dir, rank, device_type, mesh)   # before the step loop
    for step in ...:
        ...one training step, ending with torch.cuda.synchronize()...
        prof.step()                                                   # once per step
    prof.close()                                                      # after the loop

``profiler_for`` gives a no-op when ``train.profile_steps`` is 0, so the trainer calls it unconditionally.
With profiling on, loop step 1 .. ``profile_wait`` run unprofiled (warm-up of the run itself, and a
baseline for the overhead), the next ``profile_warmup`` steps warm the profiler up (recorded, then
discarded, as torch.profiler's schedule does), then ``profile_steps`` steps are recorded; the steps
after that run unprofiled again (more baseline). Each rank writes

    RUN_DIR/trace/rank{R}.json.gz     the Chrome trace of the active steps (ProfilerStep#k spans,
                                      k = loop step - 1)
    RUN_DIR/trace/rank{R}.steps.json  wall time of every step with its phase (wait / warmup / active /
                                      after), the export time, the layout: the overhead measurement
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import torch

from trainperf.trace import TRACE_DIR


class NullProfiler:
    """What the loop gets when profiling is off: every call is a no-op."""

    enabled = False

    def step(self) -> None:
        pass

    def close(self) -> None:
        pass


class StepProfiler:
    """torch.profiler over one window of steps; ``step()`` once per training step, ``close()`` at the end.

    ``run_dir``: the run's directory (traces go to ``run_dir/trace``). ``wait_steps`` unprofiled steps
    come first, then ``warmup_steps`` profiler warm-up steps, then ``active_steps`` recorded steps.
    ``mesh_sizes``: the layout ({dim: size}), kept with the steps file so the analysis can name the
    parallel dimension of each process group."""

    enabled = True

    def __init__(self, run_dir: str | os.PathLike, rank: int, warmup_steps: int = 1, active_steps: int = 3,
                 wait_steps: int = 1, device_type: str = "cpu", mesh_sizes: dict[str, int] | None = None,
                 record_shapes: bool = True, world_size: int | None = None):
        if active_steps < 1 or warmup_steps < 0 or wait_steps < 0:
            raise ValueError(f"profile window wait={wait_steps} warmup={warmup_steps} active={active_steps}: "
                             "need active >= 1, warmup >= 0, wait >= 0")
        from torch.profiler import ProfilerActivity, profile, schedule

        self.dir = Path(run_dir) / TRACE_DIR
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self.wait, self.warmup, self.active = wait_steps, warmup_steps, active_steps
        self.cuda = device_type == "cuda" and torch.cuda.is_available()
        self.trace_path = self.dir / f"rank{rank}.json.gz"
        self.steps_path = self.dir / f"rank{rank}.steps.json"
        self.mesh_sizes = dict(mesh_sizes or {})
        self.world = world_size if world_size is not None else (
            torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1)
        self._walls: list[float] = []  # wall time of each step, the profiler's own calls excluded
        self._calls: list[float] = []  # time inside prof.step() (bookkeeping + export)
        self.export_s = 0.0
        self.exported = False
        self._closed = False
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self.prof = profile(activities=activities, record_shapes=record_shapes,
                            schedule=schedule(wait=wait_steps, warmup=warmup_steps, active=active_steps, repeat=1),
                            on_trace_ready=self._export)
        self.prof.start()
        self._t_last = time.perf_counter()

    def phase(self, index: int) -> str:
        """Phase of the 0-based step ``index`` (= loop step - 1 = the k of ProfilerStep#k)."""
        if index < self.wait:
            return "wait"
        if index < self.wait + self.warmup:
            return "warmup"
        if index < self.wait + self.warmup + self.active:
            return "active"
        return "after"

    def _export(self, prof) -> None:
        t0 = time.perf_counter()
        prof.export_chrome_trace(str(self.trace_path))
        self.export_s += time.perf_counter() - t0
        self.exported = True

    def step(self) -> None:
        if self._closed:
            return
        if self.cuda:
            torch.cuda.synchronize()  # the step's GPU work belongs to this step's wall time
        t0 = time.perf_counter()
        self._walls.append(t0 - self._t_last)
        self.prof.step()
        self._t_last = time.perf_counter()
        self._calls.append(self._t_last - t0)

    def close(self) -> None:
        """Stop the profiler (exporting a window cut short by the end of training) and write the steps file."""
        if self._closed:
            return
        self._closed = True
        t0 = time.perf_counter()
        self.prof.stop()
        stop_s = time.perf_counter() - t0
        steps = [{"index": i, "loop_step": i + 1, "phase": self.phase(i), "wall_s": w, "profiler_call_s": c}
                 for i, (w, c) in enumerate(zip(self._walls, self._calls))]
        info = {"rank": self.rank, "world_size": self.world, "host": socket.gethostname(), "pid": os.getpid(),
                "device": "cuda" if self.cuda else "cpu", "torch": torch.__version__,
                "window": {"wait": self.wait, "warmup": self.warmup, "active": self.active},
                "trace_file": self.trace_path.name if self.exported else None,
                "export_s": self.export_s, "stop_s": stop_s, "mesh_sizes": self.mesh_sizes, "steps": steps}
        self.steps_path.write_text(json.dumps(info, indent=1))

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def mesh_sizes_of(mesh) -> dict[str, int]:
    """{dim name: size} of a DeviceMesh (empty for None)."""
    if mesh is None or not getattr(mesh, "mesh_dim_names", None):
        return {}
    return {name: int(size) for name, size in zip(mesh.mesh_dim_names, mesh.shape)}


def profiler_for(spec, run_dir, rank: int, device_type: str, mesh=None) -> StepProfiler | NullProfiler:
    """The loop's hook: a StepProfiler when ``spec.train.profile_steps`` > 0, else a NullProfiler.
    Reads ``train.profile_steps`` (active steps), ``train.profile_warmup`` (default 1) and
    ``train.profile_wait`` (default 1)."""
    t = spec.train
    active = int(getattr(t, "profile_steps", 0) or 0)
    if active <= 0:
        return NullProfiler()
    return StepProfiler(run_dir, rank, warmup_steps=int(getattr(t, "profile_warmup", 1)), active_steps=active,
                        wait_steps=int(getattr(t, "profile_wait", 1)), device_type=device_type,
                        mesh_sizes=mesh_sizes_of(mesh),
                        # on GPU the NCCL kernels carry their own sizes and groups: skip the per-op shape
                        # recording (profiler overhead); gloo on CPU needs the shapes to size collectives
                        record_shapes=device_type != "cuda")
