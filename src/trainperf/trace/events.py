"""Reading a Chrome trace as torch.profiler writes it: the file, its complete ("X") events, and the
``ProfilerStep#k`` spans that delimit the profiled steps."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

from trainperf.trace.intervals import Interval, to_ns

PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def load_trace(path: str | Path) -> dict:
    path = Path(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as fh:
        return json.load(fh)


def is_step_span(name: str) -> bool:
    return PROFILER_STEP.match(name) is not None


def span_of(event: dict) -> Interval:
    """An event's [start, end) in integer ns."""
    start = to_ns(event["ts"])
    return start, start + to_ns(event.get("dur", 0))


def thread_of(event: dict) -> tuple:
    return event.get("pid"), event.get("tid")


def profiled_steps(events: list[dict]) -> list[tuple[int, int, int]]:
    """(k, start ns, end ns) of every host-side ``ProfilerStep#k`` span, in order of k."""
    steps = []
    for e in events:
        m = PROFILER_STEP.match(e.get("name", ""))
        if m and e.get("cat") != "gpu_user_annotation":
            s, end = span_of(e)
            steps.append((int(m.group(1)), s, end))
    return sorted(steps)


def step_of(ts: int, steps: list[tuple[int, int, int]]) -> int | None:
    """The step whose span holds ``ts``, or None outside every profiled step."""
    for k, s, e in steps:
        if s <= ts < e:
            return k
    return None
