"""What rank 0 shows while a run trains: a rich bar on a terminal, plain lines anywhere else.

An sbatch ``.out`` file, a pipe or ``> log`` is not a terminal: there the run prints one plain line
at a steady cadence (step, samples, loss, tokens/s, elapsed, ETA) and one line per eval with its loss
and the target, each flushed at once, so a multi-hour job's log says where it is. The bar's total and
the ETA are the expected end: the samples the MLPerf reference needs to converge at this global batch
size (the RCP's mean) when the run is comparable with it, else ``train.max_steps``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from trainperf.core.spec import RunSpec

MODES = ("bar", "lines", "stderr", "off")  # stderr: the plain lines on stderr (stdout carries --json)
LINE_EVERY_S = 20.0  # plain-line cadence: a line at most every 20 s (evals always get theirs)


def progress_mode(value: bool | str | None) -> str:
    """'bar', 'lines', 'stderr' or 'off' from what a caller passes (older callers pass a bool: True is the bar)."""
    if value is True:
        return "bar"
    if not value:
        return "off"
    if value not in MODES:
        raise ValueError(f"progress mode {value!r}: one of {', '.join(MODES)}")
    return value


def expected_samples(spec: RunSpec, rcp_samples: Callable[[str, int], float | None] | None = None) -> tuple[int, str]:
    """(samples at the expected end, where that comes from): the RCP's mean samples to converge for a
    comparable run of a benchmark that has one, capped by train.max_steps; else train.max_steps."""
    gbs = spec.train.global_batch_size
    cap = spec.train.max_steps * gbs
    if spec.mlperf.comparable and spec.mlperf.benchmark and rcp_samples is not None:
        ref = rcp_samples(spec.mlperf.benchmark, gbs)
        if ref:
            return min(cap, int(ref)), "RCP mean samples to converge"
    return cap, "train.max_steps"


def _hms(seconds: float) -> str:
    s = round(max(seconds, 0))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class RunProgress:
    """The progress of one run on rank 0 (every other rank and mode 'off' print nothing)."""

    def __init__(self, mode: str, spec: RunSpec, expected: tuple[int, str], stream: TextIO | None = None,
                 every_s: float = LINE_EVERY_S, clock: Callable[[], float] = time.monotonic):
        self.mode, self.spec, self.every_s, self.clock = ("lines" if mode == "stderr" else mode), spec, every_s, clock
        self.stream = stream or (sys.stderr if mode == "stderr" else sys.stdout)
        self.gbs = spec.train.global_batch_size
        self.expected_samples, self.expected_source = expected
        self.total_steps = max(1, -(-self.expected_samples // self.gbs))
        self.started = clock()
        self.last_line: float | None = None
        self.bar = None
        if mode == "bar":
            self._start_bar()
        elif mode == "lines":
            self._line(f"{spec.workload}: up to {spec.train.max_steps} steps of {self.gbs} samples; expected end "
                       f"{self.expected_samples} samples ({self.expected_source}); target eval loss {spec.eval.target}")

    def _start_bar(self) -> None:
        # rich loads only on a terminal
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("{task.fields[info]}"), transient=False)
        self.task = self.bar.add_task(self.spec.workload, total=self.total_steps, info="")
        self.bar.start()

    def _line(self, text: str) -> None:
        print(f"[trainperf] {text}", file=self.stream, flush=True)

    def start_clock(self) -> None:
        """run_start: ETA counts from here (initialisation and checkpoint loading are not training)."""
        self.started = self.clock()

    def eta_s(self, samples: int) -> float | None:
        elapsed = self.clock() - self.started
        if samples <= 0 or elapsed <= 0:
            return None
        return max(self.expected_samples - samples, 0) * elapsed / samples

    def step(self, step: int, samples: int, loss: float, tokens_per_s: float | None) -> None:
        if self.bar is not None:
            self.total_steps = max(self.total_steps, step)  # a run past the reference's mean grows the bar
            self.bar.update(self.task, completed=step, total=self.total_steps, info=f"loss {loss:.3f}")
            return
        if self.mode != "lines":
            return
        now = self.clock()
        if self.last_line is not None and now - self.last_line < self.every_s:
            return
        self.last_line = now
        eta = self.eta_s(samples)
        tps = "-" if tokens_per_s is None else f"{tokens_per_s:,.0f}"
        self._line(f"step {step}/{self.spec.train.max_steps}  samples {samples}/{self.expected_samples}  "
                   f"loss {loss:.4f}  tokens/s {tps}  elapsed {_hms(now - self.started)}  "
                   f"ETA {'-' if eta is None else _hms(eta)}")

    def eval(self, step: int, samples: int, loss: float, target: float) -> None:
        verdict = "target reached" if loss <= target else "not reached"
        if self.bar is not None:
            self.bar.update(self.task, completed=step, info=f"eval {loss:.4f} (target {target:.4f})")
        elif self.mode == "lines":
            self._line(f"eval at step {step}, {samples} samples: loss {loss:.4f}, target {target:.4f}: {verdict}")

    def loader(self, total: int) -> Callable[[str], None] | None:
        """A per-tensor callback advancing a 'load checkpoint' bar (None without a bar)."""
        if self.bar is None or not total:
            if self.mode == "lines" and total:
                self._line(f"loading the checkpoint ({total} tensors, untimed)")
            return None
        task = self.bar.add_task("load checkpoint", total=total, info="untimed")
        return lambda name: self.bar.advance(task)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
