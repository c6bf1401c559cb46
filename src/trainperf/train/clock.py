"""Step times and step logs that never make the host wait for the GPU inside the training loop.

A ``torch.cuda.synchronize()`` (or a ``float(loss)``) after every step lets the GPU run dry at the
start of the next one while Python issues its first kernels -- the cost is the host's launch time
per step, which on a launch-bound run (a small model, short sequences) is a large share. Instead:

* ``StepClock``: on CUDA two events bracket each step on the current stream; their elapsed time is
  read later, so the interval is the GPU timeline's -- the GPU's work when the GPU is the bottleneck,
  the host's launch time when the host is. On CPU the wall clock.
* ``LaggedLog``: the values a step logs (loss, gradient norm, step time) are read one step late,
  after the next step's work is queued. A ``float()`` of a CUDA tensor synchronizes the whole stream,
  the next step's queued work included, so each value is instead copied into pinned host memory
  behind its step's work with an event after the copies; the late read waits on that event only,
  for a step the GPU has already (nearly) finished. ``flush`` reads everything now (before an eval,
  at the end).
"""

from __future__ import annotations

import time
from typing import Callable

import torch


class StepClock:
    def __init__(self, cuda: bool):
        self.cuda = cuda
        self._open = None
        self._pending: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._times: list[float] = []

    def start(self) -> None:
        if self.cuda:
            self._open = torch.cuda.Event(enable_timing=True)
            self._open.record()
        else:
            self._open = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append((self._open, end))
        else:
            self._times.append(time.perf_counter() - self._open)
        self._open = None

    def _read_oldest(self) -> None:
        start, end = self._pending.pop(0)
        end.synchronize()  # returns at once for a finished step; later steps stay queued
        self._times.append(start.elapsed_time(end) / 1e3)

    def completed(self) -> int:
        """Steps the GPU has finished, asked without waiting (event queries)."""
        while self._pending and self._pending[0][1].query():
            self._read_oldest()
        return len(self._times)

    def time_of(self, step: int) -> float:
        """Seconds of loop step ``step`` (1-based), waiting for that step only."""
        while len(self._times) < step:
            self._read_oldest()
        return self._times[step - 1]

    def times(self, upto: int | None = None) -> list[float]:
        """Seconds of every stopped step (or of the first ``upto``)."""
        need = len(self._times) + len(self._pending) if upto is None else upto
        while len(self._times) < need and self._pending:
            self._read_oldest()
        return self._times[:need]


class LaggedLog:
    """Step records whose device values are read one step late (see the module docstring)."""

    def __init__(self, emit: Callable[[dict], None]):
        self.emit = emit
        self._pending: list[tuple[dict, torch.cuda.Event | None]] = []

    def add(self, record: dict) -> None:
        """``record`` may hold device tensors; they are converted to floats when emitted."""
        staged, copied = {}, False
        for k, v in record.items():
            if isinstance(v, torch.Tensor) and v.is_cuda:
                host = torch.empty(v.shape, dtype=v.dtype, pin_memory=True)
                host.copy_(v.detach(), non_blocking=True)  # queued behind the step's work
                staged[k], copied = host, True
            else:
                staged[k] = v
        event = None
        if copied:
            event = torch.cuda.Event()
            event.record()
        self._pending.append((staged, event))

    def lag(self) -> None:
        """Emit all but the newest record (call after the next step's work is queued)."""
        while len(self._pending) > 1:
            self._emit_one()

    def flush(self) -> None:
        while self._pending:
            self._emit_one()

    def _emit_one(self) -> None:
        rec, copied_event = self._pending.pop(0)
        if copied_event is not None:
            copied_event.synchronize()  # this record's copies, not the work queued after them
        self.emit({k: (float(v) if isinstance(v, torch.Tensor) else v) for k, v in rec.items()})
