"""What a finished run reports: one ``RunSummary``, whose fields are, in one list, the keys of
RUN_DIR/summary.json, the keys ``run --json`` prints, the store's ``runs`` result columns and the
columns ``report`` shows. A new result is one new field here; the store, ``run --json`` and
``report`` take their lists from these fields (``dataclasses.fields``).

Each field's metadata says where else it goes:

* ``column``: the store's ``runs`` column that holds it (None: only in summary.json);
* ``result``: ``finish_run`` writes that column when the run ends (the others are written when the
  row is created);
* ``json``: ``run --json`` prints it;
* ``report``: ``report`` (its table and ``--json``) shows that column.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


def _meta(column: str | None = None, *, result: bool = False, json: bool = False, report: bool = False) -> dict:
    return {"column": column, "result": result, "json": json, "report": report}


@dataclass
class RunSummary:
    run_id: str = field(metadata=_meta("run_id", json=True, report=True))
    workload: str = field(metadata=_meta("workload", json=True, report=True))
    status: str = field(metadata=_meta("status", result=True, json=True, report=True))
    status_reason: str | None = field(metadata=_meta("status_reason", result=True, json=True, report=True))
    time_to_train_s: float | None = field(metadata=_meta("time_to_train_s", result=True, json=True, report=True))
    samples_to_target: int | None = field(metadata=_meta("samples_to_target", result=True, json=True, report=True))
    final_eval_loss: float | None = field(metadata=_meta("final_eval_loss", result=True, json=True, report=True))
    target: float = field(metadata=_meta("target", json=True, report=True))
    evals: list[dict] = field(metadata=_meta(json=True))
    steps: int = field(metadata=_meta("steps", result=True))
    step_time_s: float = field(metadata=_meta("step_time_s", result=True, json=True, report=True))
    tokens_per_s: float = field(metadata=_meta("tokens_per_s", result=True, json=True, report=True))
    tokens_per_s_per_gpu: float = field(metadata=_meta("tokens_per_s_per_gpu", result=True, json=True, report=True))
    model_flops_per_token: float = field(metadata=_meta())
    model_tflops_per_gpu: float = field(metadata=_meta("model_tflops_per_gpu", result=True, json=True))
    mfu: float | None = field(metadata=_meta("mfu", result=True, json=True, report=True))
    peak_flops: float | None = field(metadata=_meta())
    peak_mem_gib: float = field(metadata=_meta("peak_mem_gib", result=True, json=True, report=True))
    peak_mem_kind: str = field(metadata=_meta())
    peak_reserved_gib: float | None = field(metadata=_meta(json=True))
    optimizer: str = field(metadata=_meta(json=True))
    optimizer_state_gib: float = field(metadata=_meta(json=True))  # the largest rank's, after the last step
    cuda_alloc_retries: int | None = field(metadata=_meta(json=True))
    cuda_alloc_conf: str | None = field(metadata=_meta(json=True))
    # pinned host memory this rank's caching host allocator held at its peak (train.offload_layers)
    pinned_host_gib: float | None = field(metadata=_meta(json=True))
    checkpoint_load_s: float = field(metadata=_meta())
    checkpoint_load_gib: float = field(metadata=_meta())
    # train.offload_layers: saved activations this rank copied to host memory per step (and back)
    activation_offload_gib_per_step: float = field(metadata=_meta(json=True))
    # ... and what offloaded layers kept on the device because it is a tensor subclass
    activation_offload_kept_gib_per_step: float = field(metadata=_meta())
    layout: str = field(metadata=_meta("layout", json=True, report=True))
    placement: Any = field(metadata=_meta(json=True))
    world_size: int = field(metadata=_meta("world_size", json=True, report=True))
    hardware: dict = field(metadata=_meta())
    division: str = field(metadata=_meta("division", report=True))
    comparable: bool = field(metadata=_meta("comparable", report=True))
    mllog: str = field(metadata=_meta("mllog_path", result=True, json=True, report=True))
    adapter: str | None = field(metadata=_meta(json=True))
    model_dir: str | None = field(metadata=_meta())
    out_dir: str = field(metadata=_meta("out_dir", json=True))
    seed: int = field(metadata=_meta(json=True))
    # what the planner predicted for this run on this GPU ({} on CPUs and unknown GPUs)
    predicted: dict = field(default_factory=dict, metadata=_meta(json=True))

    def as_dict(self) -> dict:
        """summary.json: every field, in field order."""
        return dataclasses.asdict(self)

    def result_columns(self) -> dict:
        """{store column: value} of what ``finish_run`` records when the run ends."""
        return {f.metadata["column"]: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata["result"]}

    @classmethod
    def from_dict(cls, data: dict) -> RunSummary:
        """A summary.json read back (another process's run): its fields, typed again; keys it does not
        know are left out, fields it lacks (an older summary.json) are None."""
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{k: data.get(k) for k in names if k in data or k != "predicted"})

    @classmethod
    def ended_early(cls, run_id: str, workload: str, status: str, reason: str, target: float, layout: str,
                    world_size: int | None, run_dir: Path) -> RunSummary:
        """The summary of a run that wrote none (killed, interrupted, a rank died, a full disk): what the
        store says of it; no result is known."""
        known = {"run_id": run_id, "workload": workload, "status": status, "status_reason": reason, "target": target,
                 "layout": layout, "world_size": world_size, "mllog": str(run_dir / "mllog.txt"),
                 "out_dir": str(run_dir), "evals": [], "predicted": None}
        return cls(**{f.name: known.get(f.name) for f in dataclasses.fields(cls)})


class RunRecord(Protocol):
    """Where a run's rank 0 records it (the runner's ``RunRow``, lent through the trainer's context): the
    run's start, then its typed summary or its failure. ``finished``/``failed`` are False when the row
    was already ended by someone else (its launcher gone)."""

    folder: Path  # where the record is kept (a full disk is looked for there)

    def started(self, hardware: dict, software: dict, predicted: dict) -> None: ...

    def finished(self, summary: RunSummary, evals: list[dict], steps: list[dict], summary_path: Path) -> bool: ...

    def failed(self, status: str, reason: str, evals: list[dict], steps: list[dict]) -> bool: ...


def _names(flag: str) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(RunSummary) if f.metadata[flag])


def _columns(flag: str) -> tuple[str, ...]:
    return tuple(f.metadata["column"] for f in dataclasses.fields(RunSummary) if f.metadata[flag])


RUN_JSON_KEYS = _names("json")  # what `run --json` prints of a summary
RESULT_COLUMNS = _columns("result")  # the runs columns finish_run writes from a summary
REPORT_COLUMNS = _columns("report")  # the runs columns `report` shows


def per_gpu(tokens_per_s: float, world: int) -> float:
    """Tokens/s per GPU (or CPU process) of a job of ``world`` ranks: every rank trains an equal share
    of each global batch. What MFU and TFLOP/s per GPU are computed from."""
    return tokens_per_s / world


def steady_throughput(step_times: list[float], tokens_per_step: int, world: int) -> tuple[float, float, float]:
    """(step time s, tokens/s, tokens/s per GPU) of a run: the median step time of every step but the
    first (compilation and allocator warm-up), or of the first when it is the only one."""
    steady = step_times[1:] if len(step_times) > 1 else step_times
    step_time = statistics.median(steady)
    tokens_per_s = tokens_per_step / step_time
    return step_time, tokens_per_s, per_gpu(tokens_per_s, world)


OUR_ENGINE = "trainperf"  # a stored run whose row names no engine is this engine's own


def engine_of(row: dict) -> str:
    """The engine that ran a stored run: this one, or the imported engine its row names (`trainperf
    import`: nemo, ...). Two engines' runs are never pooled, scored or projected as one."""
    return row.get("engine") or OUR_ENGINE
