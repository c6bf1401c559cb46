"""The operators' scaling table: one row per workload and set (`trainperf score`'s RunSet: engine,
submitted system for imported runs, GPU model, GPU count, layout, GBS, MBS, precision), closed-division
runs apart from open ones -- never a pool of different layouts or of two engines' runs -- with speedup
and efficiency against the smallest comparable row, notes on what is normal (seed-to-seed spread of
times to train) and warnings on what a reader should not take at face value.

A row's time to train is the olympic mean of its successful runs (the fastest and the slowest
dropped) when it has at least ``OLYMPIC_MIN_RUNS``, else their mean; throughput, TFLOP/s and MFU
are the median over its runs that measured steps (throughput probes end failed and still count).
Rows are comparable when one engine trains the same workload at the same global batch size on the same
GPU model, in the same division; the base is the fastest of those at the fewest GPUs. Speedup compares
times to train when both rows have one, else throughput (samples/s of the whole job), and says which.
"""
from __future__ import annotations

import json
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from trainperf.core.hardware import gpu_model
from trainperf.core.layout import degrees_name
from trainperf.core.results import OUR_ENGINE, engine_of
from trainperf.mlperf.score import RunSet, run_set_of, system_of_row

OLYMPIC_MIN_RUNS = 3
SPREAD_WARN = 0.15  # times to train of one row further apart than this are flagged
PLANNER_WARN = 0.25  # a measured step time this far from the planner's prediction is flagged
SUPERLINEAR = 1.05  # efficiency above this: suspect the baseline (a cold cache, another layout)
POOR_SCALING = 0.5


def is_imported(run: dict) -> bool:
    """A run of another engine read from its published MLPerf logs (`trainperf import`)."""
    return bool(run.get("engine"))


def gpu_model_of(run: dict) -> str:
    """The accelerator a run's row names ('' for a CPU run)."""
    return str(_json_field(run, "hardware_json").get("gpu") or "")


def gpu_family(name: str) -> str:
    """The GPU model in a device name ('NVIDIA H200-SXM5-141GB' -> 'H200'), or the name itself."""
    return gpu_model(name) or (name or "")


def system_of(run: dict) -> str:
    """The submitted system of an imported run (its round, submitter and system name); '' for this
    engine's runs."""
    return system_of_row(run)


def is_closed_result(run: dict) -> bool:
    """A run that meets the closed division's rules: this engine's comparable runs and the published
    closed results of other engines. Open-division runs (a shrunk model, a mini workload) are never
    plotted, scaled or headlined beside them."""
    return bool(run.get("comparable")) or (is_imported(run) and run.get("division") == "closed")


def _json_field(run: dict, key: str) -> dict:
    try:
        return json.loads(run.get(key) or "{}") or {}
    except (TypeError, ValueError):
        return {}


@dataclass
class ScalingRow:
    workload: str
    gpus: int
    layout: str  # full degrees, e.g. DP2·TP4·CP2·SP
    gbs: int | None
    mbs: int | None
    runs: int  # finished runs of this row
    succeeded: int
    time_to_train_s: float | None
    time_basis: str  # 'olympic mean of 5', 'mean of 2', '1 run', '' without a time
    tokens_per_s_per_gpu: float | None
    tflops_per_gpu: float | None
    mfu: float | None
    step_time_s: float | None
    predicted_step_time_s: float | None
    run_ids: list[str] = field(default_factory=list)
    speedup: float | None = None
    efficiency: float | None = None
    speedup_basis: str = ""  # 'time to train' or 'throughput'
    anomalies: list[str] = field(default_factory=list)
    engine: str = OUR_ENGINE
    gpu_model: str = ""
    system: str = ""  # an imported row's submitter and system; '' for this engine's rows
    precision: str = "bf16"  # fp8: the runs' GEMMs in float8 (their MFU is still against the bf16 peak)
    closed: bool = False  # closed-division runs (is_closed_result), never one table or plot with open ones
    notes: list[str] = field(default_factory=list)  # what is normal but worth saying (seed-to-seed spread)
    run_set: RunSet | None = None  # the set an MLPerf score of this row is of

    @property
    def samples_per_s(self) -> float | None:
        if not self.step_time_s or not self.gbs:
            return None
        return self.gbs / self.step_time_s


def full_layout(spec: dict) -> str:
    """Every degree of a stored spec's layout that is not 1, e.g. DP2·TP4·CP2·SP (HSDP: DP2x4); '' for a
    spec whose degrees are not numbers."""
    parallel = spec.get("parallel", {}) if isinstance(spec, dict) else {}
    try:
        return degrees_name(parallel) if isinstance(parallel, dict) else ""
    except (TypeError, ValueError):
        return ""


def _spec(run: dict) -> dict:
    try:
        return json.loads(run.get("spec_json") or "{}")
    except ValueError:
        return {}


def row_key(run: dict) -> tuple:
    spec = _spec(run)
    spec = spec if isinstance(spec, dict) else {}
    t = spec.get("train") if isinstance(spec.get("train"), dict) else {}
    return run["workload"], run["world_size"], full_layout(spec), t.get("global_batch_size"), t.get("micro_batch_size")


def olympic_time(times: list[float]) -> tuple[float | None, str]:
    """(time, how it was formed) of a row's successful runs' times to train."""
    if not times:
        return None, ""
    if len(times) >= OLYMPIC_MIN_RUNS:
        kept = sorted(times)[1:-1]
        return sum(kept) / len(kept), f"olympic mean of {len(times)}"
    return sum(times) / len(times), "1 run" if len(times) == 1 else f"mean of {len(times)}"


def _median(values: list) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def scaling_key(run: dict) -> tuple:
    """What one scaling row holds: the runs of one workload and one set (`trainperf score`'s RunSet: one
    engine, system, GPU model, GPU count, layout, GBS, MBS, precision), closed and open apart."""
    return run["workload"], run_set_of(run), is_closed_result(run)


def _spread(ok: list[dict], row: ScalingRow) -> None:
    """Times to train further apart than SPREAD_WARN: a note when the samples to converge explain it (seeds
    converge at different evals: the olympic mean is made for that), a warning when they do not."""
    times = [r["time_to_train_s"] for r in ok]
    if len(times) < 2 or max(times) / min(times) - 1 <= SPREAD_WARN:
        return
    spread = f"{100 * (max(times) / min(times) - 1):.0f}%"
    samples = [r.get("samples_to_target") for r in ok]
    if all(isinstance(n, (int, float)) and n > 0 for n in samples) and len(set(samples)) > 1:
        per_sample = [t / n for t, n in zip(times, samples)]
        if max(per_sample) / min(per_sample) - 1 <= SPREAD_WARN:
            row.notes.append(f"times to train span {spread}: seeds converged at {min(samples):,.0f} to "
                             f"{max(samples):,.0f} samples (normal; the olympic mean drops the extremes)")
            return
    row.anomalies.append(f"times to train differ by {spread} at like samples to converge: check the slow runs")


def _row(key: tuple, members: list[dict]) -> ScalingRow:
    workload, rs, closed = key
    ok = [r for r in members if r["status"] == "success" and r.get("time_to_train_s") is not None]
    time_s, basis = olympic_time([r["time_to_train_s"] for r in ok])
    row = ScalingRow(workload, rs.gpus, rs.layout, rs.gbs, rs.mbs, len(members), len(ok), time_s, basis,
                     _median([r.get("tokens_per_s_per_gpu") for r in members]),
                     _median([r.get("model_tflops_per_gpu") for r in members]), _median([r.get("mfu") for r in members]),
                     _median([r.get("step_time_s") for r in members]),
                     _median([r.get("predicted_step_time_s") for r in members]),
                     run_ids=[r["run_id"] for r in members], engine=rs.engine, gpu_model=rs.gpu, system=rs.system,
                     precision=rs.precision, closed=closed, run_set=rs)
    _spread(ok, row)
    failed = len(members) - len(ok)
    if ok and failed:
        row.anomalies.append(f"{failed} of {len(members)} runs did not reach the target")
    if row.step_time_s and row.predicted_step_time_s:
        err = row.predicted_step_time_s / row.step_time_s - 1
        if abs(err) > PLANNER_WARN:
            row.anomalies.append(f"planner predicted a step {100 * err:+.0f}% off")
    if row.mfu is not None and row.mfu > 1:
        row.anomalies.append("MFU above 100%: check the GPU's peak")
    return row


def _add_speedup(rows: list[ScalingRow]) -> None:
    """Speedup and efficiency of each row against the fastest row at the fewest GPUs of its group."""
    groups: dict[tuple, list[ScalingRow]] = defaultdict(list)
    for r in rows:
        # never one engine's row (or one GPU model's) as the base of another's
        groups[(r.engine, gpu_family(r.gpu_model), r.workload, r.gbs, r.closed)].append(r)
    for members in groups.values():
        fewest = min(r.gpus for r in members)
        if all(r.gpus == fewest for r in members):
            continue  # one GPU count: nothing to scale against
        smallest = [r for r in members if r.gpus == fewest]
        timed = [r for r in smallest if r.time_to_train_s]
        for r in members:
            if r.time_to_train_s and timed:
                base = min(timed, key=lambda b: b.time_to_train_s)
                r.speedup, r.speedup_basis = base.time_to_train_s / r.time_to_train_s, "time to train"
            else:
                fast = [b for b in smallest if b.samples_per_s]
                if not r.samples_per_s or not fast:
                    continue
                base = max(fast, key=lambda b: b.samples_per_s)
                r.speedup, r.speedup_basis = r.samples_per_s / base.samples_per_s, "throughput"
            r.efficiency = r.speedup / (r.gpus / base.gpus)
            if r.gpus > base.gpus and r.efficiency > SUPERLINEAR:
                r.anomalies.append(f"superlinear ({100 * r.efficiency:.0f}%): check the {base.gpus}-GPU baseline "
                                   f"({base.layout})")
            elif r.gpus > base.gpus and r.efficiency < POOR_SCALING:
                r.anomalies.append(f"poor scaling ({100 * r.efficiency:.0f}% efficient)")


def scaling_table(runs: list[dict]) -> list[ScalingRow]:
    """The scaling rows of finished runs (running and hung ones are left out), sorted by workload,
    engine (this one first), GBS, GPUs, layout."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        if r["status"] in ("success", "failed") and (r.get("time_to_train_s") is not None or r.get("step_time_s")):
            groups[scaling_key(r)].append(r)
    rows = [_row(k, v) for k, v in groups.items()]
    rows.sort(key=lambda r: (r.workload, not r.closed, r.engine != OUR_ENGINE, r.engine, r.gbs or 0, r.gpus,
                             r.gpu_model, r.system, r.layout, r.mbs or 0, r.precision))
    _add_speedup(rows)
    return rows
