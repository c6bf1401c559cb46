"""`trainperf score`: the MLPerf Training score of a set of runs, computed from their MLPerf logs.

Every number comes from the runs' mllog files (``:::MLLOG {json}`` lines) and every rule from the
installed ``mlperf_logging`` package, which is the source of truth:

* run time = ``run_stop.time_ms - run_start.time_ms`` (minutes); a run converged when its ``run_stop``
  carries ``metadata.status == "success"``;
* runs required per benchmark: ``mlperf_logging.benchmark_meta.get_result_file_counts``;
* olympic mean: ``result_summarizer._compute_olympic_average`` (drop fastest and slowest; one
  non-converged run counts as the slowest; more than one -> no valid score), the same call and the
  same ``max_dropped_scores`` rule as ``result_summarizer._compute_strong_score_standalone``;
* RCP check: ``rcp_checker.check_directory(..., rcp_pass='pruned_rcps', set_scaling=True)`` exactly as
  the package checker calls it, on a staging folder of ``result_*.txt`` copies; the scaling factor is
  read back from the ``scaling.json`` it writes (``result_summarizer._get_scaling_factor``), and the
  reference it compared against (RCP mean, minimum acceptable mean, interpolated or not) is found with
  the same ``RCP_Checker`` methods;
* ``--export``: a submission-package folder that ``python -m mlperf_logging.package_checker ORG_DIR
  training RULESET`` accepts; :func:`check_package` runs the same checks in-process.

Bad input (unknown run id, unreadable log, mixed benchmarks / GBS / divisions, unsupported ruleset)
raises :class:`trainperf.core.spec.SpecError` with a one-line message.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from trainperf import __version__
from trainperf.core.errors import SpecError
from trainperf.core.layout import degrees_name
from trainperf.core.results import OUR_ENGINE, engine_of
from trainperf.core.untrusted import finite_number, printable
from trainperf.mlperf.benchmarks import dropped_runs, rcp_unit
from trainperf.store.db import Store, StoreError

if TYPE_CHECKING:
    from trainperf.mlperf.log import ParsedLog

# mlperf_logging is imported inside the functions that call it: its RCP checker loads scipy (seconds),
# which `trainperf plan` and `report` need only when they read an RCP
USAGE = "training"
DEFAULT_RULESET = "6.0.0"
RCP_PASS = "pruned_rcps"  # what the package checker and the result summarizer use

# MLPerf `submission_status` values (mllog constants) -> system description `status` values the
# system_desc_checker accepts from ruleset 4.x on.
_AVAILABILITY = {
    "onprem": "Available on-premise",
    "cloud": "Available cloud",
    "research": "Research, Development, or Internal (RDI)",
    "preview": "Preview",
}


# ---------------------------------------------------------------------------------------------
# One run, read from its MLPerf log


@dataclass
class RunResult:
    """What a score needs from one run's MLPerf log (plus store metadata when it came from the store)."""

    path: str
    run_id: str | None = None
    benchmark: str | None = None
    division: str | None = None
    org: str | None = None
    platform: str | None = None
    submission_status: str | None = None
    gbs: Any = None
    seeds: list = field(default_factory=list)
    run_start_ms: float | None = None
    run_stop_ms: float | None = None
    stop_status: str | None = None  # run_stop metadata.status; None when the log has no run_stop
    # the last eval_accuracy before a successful run_stop, in the benchmark's RCP unit (convergence_unit):
    # its samples_count, or for gpt3 its epoch_num, which counts tokens
    samples_to_converge: int | None = None
    number_of_nodes: Any = None
    accelerators_per_node: Any = None
    parse_errors: int = 0
    hardware: dict = field(default_factory=dict)
    software: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.run_id or self.path

    @property
    def convergence_unit(self) -> str:
        return rcp_unit(self.benchmark)

    @property
    def has_times(self) -> bool:
        return self.run_start_ms is not None and self.run_stop_ms is not None

    @property
    def success(self) -> bool:
        return self.stop_status == "success" and self.has_times

    @property
    def minutes(self) -> float | None:
        if not self.has_times:
            return None
        return (self.run_stop_ms - self.run_start_ms) / 60 / 1000  # as result_summarizer: ms -> minutes

    @property
    def failure(self) -> str | None:
        if self.success:
            return None
        if self.run_start_ms is None:
            return "no run_start"
        if self.run_stop_ms is None:
            return "no run_stop (incomplete log)"
        return f"run_stop status {self.stop_status!r}"


def _check_ruleset(ruleset: str) -> None:
    from mlperf_logging.compliance_checker.mlp_compliance import rule_choices
    from mlperf_logging.rcp_checker import rcp_checker

    if ruleset not in rule_choices() or not os.path.isdir(os.path.join(os.path.dirname(rcp_checker.__file__),
                                                                       f"{USAGE}_{ruleset}")):
        rcp_versions = sorted(d.split("_", 1)[1] for d in os.listdir(os.path.dirname(rcp_checker.__file__))
                              if d.startswith(f"{USAGE}_"))
        raise SpecError(f"--ruleset {ruleset!r}: not a training ruleset with RCPs in the installed mlperf_logging "
                        f"(valid: {', '.join(rcp_versions)})")


def read_run(path: str | os.PathLike, ruleset: str = DEFAULT_RULESET, run_id: str | None = None) -> RunResult:
    """Parse one MLPerf log with mlperf_logging's own parser (bounded first: trainperf.mlperf.log.read_log);
    SpecError if it is no usable MLPerf log."""
    # the reader loads mlperf_logging (numpy): only when a log is read, not when report imports this
    from trainperf.mlperf.log import read_log

    path = str(path)
    label = f"run {run_id}: " if run_id else ""
    if not os.path.isfile(path):
        raise SpecError(f"{label}MLPerf log {printable(repr(path))} does not exist")
    try:
        log = read_log(path, ruleset)
    except SpecError as exc:
        raise SpecError(f"{label}{exc}") from None
    return run_from_log(log, run_id)


def run_from_log(log: ParsedLog, run_id: str | None = None) -> RunResult:
    """What a score needs from a parsed log; the values it keeps are checked (a known MLPerf benchmark,
    a division of closed/open, finite numbers), else a one-line SpecError."""
    # mlperf_logging's benchmark tables: only when a log is read
    from trainperf.mlperf.log import check_log_names, known_benchmarks

    path = log.path
    label = f"run {run_id}: " if run_id else ""
    shown = f"MLPerf log {printable(path)}"
    if not log.loglines:
        raise SpecError(f"{label}{shown} has no ':::MLLOG' lines: not an MLPerf log")
    r = RunResult(path=path, run_id=run_id, parse_errors=len(log.errors))
    last_eval_samples = last_eval_epoch = None

    def number(value, what: str, ll_no: int, lo: float = 0):
        return finite_number(value, f"{label}{shown} line {ll_no}: {what}", lo=lo)

    for ll, no in zip(log.loglines, log.file_lines or [ll.lineno + 1 for ll in log.loglines]):
        v = ll.value if isinstance(ll.value, dict) else {}
        value, meta = v.get("value"), v.get("metadata") or {}
        k = ll.key
        if k == "submission_benchmark":
            r.benchmark = value
        elif k == "submission_division":
            r.division = value
        elif k == "submission_org":
            r.org = value
        elif k == "submission_platform":
            r.platform = value
        elif k == "submission_status":
            r.submission_status = value
        elif k == "global_batch_size":
            number(value, "global_batch_size", no, lo=1)
            r.gbs = value
        elif k == "seed":
            r.seeds.append(value)
        elif k == "number_of_nodes":
            r.number_of_nodes = value
        elif k == "accelerators_per_node":
            r.accelerators_per_node = value
        elif k == "run_start" and r.run_start_ms is None:
            r.run_start_ms = ll.timestamp
        elif k == "eval_accuracy" and r.run_stop_ms is None:
            if "samples_count" in meta:
                number(meta["samples_count"], "eval_accuracy samples_count", no)
                last_eval_samples = meta["samples_count"]
            if "epoch_num" in meta:
                last_eval_epoch = number(meta["epoch_num"], "eval_accuracy epoch_num", no)
        elif k == "run_stop" and r.run_stop_ms is None:
            r.run_stop_ms = ll.timestamp
            r.stop_status = meta.get("status")
            if r.stop_status == "success":
                if r.convergence_unit == "tokens":  # gpt3's RCPs count tokens: its epoch_num
                    r.samples_to_converge = None if last_eval_epoch is None else round(last_eval_epoch)
                else:
                    r.samples_to_converge = last_eval_samples
    if not r.benchmark:
        raise SpecError(f"{label}{shown} logs no submission_benchmark: cannot tell what it is a run of")
    # the names mlperf_logging's checkers build file names from: held to what the package knows
    check_log_names(log, known_benchmarks())
    for attr in ("org", "platform", "submission_status"):
        if getattr(r, attr) is not None and not isinstance(getattr(r, attr), str):
            raise SpecError(f"{label}{shown}: submission_{attr.removeprefix('submission_')} is "
                            f"{printable(repr(getattr(r, attr)), 60)}; give text")
    if r.has_times and r.run_stop_ms < r.run_start_ms:
        raise SpecError(f"{label}{shown}: run_stop ({r.run_stop_ms:.0f} ms) comes before run_start "
                        f"({r.run_start_ms:.0f} ms)")
    return r


# ---------------------------------------------------------------------------------------------
# Inputs: run ids, --workload, paths


def _logs_in_dir(d: Path) -> list[Path]:
    results = sorted(d.glob("result_*.txt"), key=lambda p: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)])
    if results:
        return results
    if (d / "mllog.txt").is_file():
        return [d / "mllog.txt"]
    return sorted(d.rglob("mllog.txt"))


def _open_store(db: str):
    if not Path(db).is_file():
        raise SpecError(f"no results store at {db!r} (give --db, or paths to result_*.txt / mllog.txt files)")
    try:
        return Store(db)
    except StoreError as exc:
        raise SpecError(str(exc)) from None


def _run_from_row(row: dict, ruleset: str) -> RunResult:
    if row["status"] == "running":
        raise SpecError(f"run {row['run_id']} is still running; score finished runs only")
    if not row.get("mllog_path"):
        raise SpecError(f"run {row['run_id']} has no MLPerf log recorded in the store")
    r = read_run(row["mllog_path"], ruleset, run_id=row["run_id"])
    for attr, col in (("hardware", "hardware_json"), ("software", "software_json")):
        try:
            setattr(r, attr, json.loads(row.get(col) or "{}") or {})
        except (TypeError, ValueError):
            pass
    return r


def _required_for(benchmark: str) -> int:
    from mlperf_logging.benchmark_meta import get_result_file_counts

    counts = get_result_file_counts(USAGE)
    if benchmark not in counts:
        raise SpecError(f"benchmark {benchmark!r} is not an MLPerf {USAGE} benchmark known to mlperf_logging")
    return counts[benchmark]


def one_engine(rows: list[dict], engine: str | None) -> list[dict]:
    """The stored runs of one engine: ``engine`` (trainperf = this one), else the newest row's; this
    engine's runs and an imported engine's (`trainperf import`) are never one set."""
    chosen = engine or (engine_of(rows[0]) if rows else OUR_ENGINE)
    kept = [r for r in rows if engine_of(r) == chosen]
    if rows and not kept:
        engines = sorted({engine_of(r) for r in rows})
        raise SpecError(f"--engine {chosen}: none of these runs is of that engine; engines with runs: {', '.join(engines)}")
    return kept


def check_one_engine(rows: list[dict]) -> None:
    """Refuse store runs of two engines named as one set, naming each engine's runs."""
    by_engine: dict[str, list[str]] = {}
    for r in rows:
        by_engine.setdefault(engine_of(r), []).append(r["run_id"])
    if len(by_engine) > 1:
        named = "; ".join(f"{e}: {', '.join(ids[:3])}{' ...' if len(ids) > 3 else ''}" for e, ids in sorted(by_engine.items()))
        raise SpecError(f"runs of different engines are not one set ({named}); score each engine's runs apart")


# ---------------------------------------------------------------------------------------------
# Which runs form one set, and which ruleset scores them

ROUND = re.compile(r"^v(\d+)\.(\d+)$")  # a round as `trainperf import` records it (software_json's round)


def _row_json(row: dict, column: str) -> dict:
    try:
        value = json.loads(row.get(column) or "{}")
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _text(value) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


def round_of_row(row: dict) -> str | None:
    """The MLPerf round an imported run was published in (v4.1), from the round folder `trainperf import`
    read it from; None for this engine's runs and for logs imported from outside a vX.Y folder."""
    if engine_of(row) == OUR_ENGINE:
        return None
    rnd = _row_json(row, "software_json").get("round")
    return rnd if isinstance(rnd, str) and ROUND.match(rnd) else None


def ruleset_of_row(row: dict, given: str | None = None) -> tuple[str, str]:
    """(ruleset, why) a stored run is scored under: ``given`` (--ruleset) when the user named one, else the
    ruleset its import recorded, else its round's (v4.1 -> 4.1.0), else the default."""
    from trainperf.mlperf.published import ruleset_of_round  # one round -> ruleset rule, the importer's

    if given:
        return given, "--ruleset"
    recorded = _row_json(row, "software_json").get("ruleset")
    rnd = round_of_row(row)
    if isinstance(recorded, str) and re.fullmatch(r"\d+\.\d+\.\d+", recorded):
        # the round's own ruleset says where it came from; any other was chosen at import (--ruleset)
        return recorded, f"round {rnd}" if rnd and ruleset_of_round(rnd) == recorded else "as imported"
    if rnd:
        return ruleset_of_round(rnd), f"round {rnd}"
    return DEFAULT_RULESET, "default"


def ruleset_of_path(path: str | os.PathLike, given: str | None = None) -> tuple[str, str]:
    """(ruleset, why) for a log given by path: ``given``, else the round of a
    <round>/<org>/results/<system>/<benchmark>/ folder above it (v4.1 -> 4.1.0), else the default."""
    from trainperf.mlperf.published import round_name, ruleset_of_round  # the importer's own round rule

    if given:
        return given, "--ruleset"
    for folder in Path(os.path.abspath(path)).parents:
        if folder.name == "results":
            rnd = round_name(folder.parent)
            if rnd:
                return ruleset_of_round(rnd), f"round {rnd}"
            break
    return DEFAULT_RULESET, "default"


def system_of_row(row: dict) -> str:
    """The submitted system of an imported run (round, submitter, system name); '' for this engine's runs."""
    if engine_of(row) == OUR_ENGINE:
        return ""
    hw, sw = _row_json(row, "hardware_json"), _row_json(row, "software_json")
    return " ".join(_text(x) for x in (sw.get("round"), sw.get("org"), hw.get("system")) if x)


@dataclass(frozen=True)
class RunSet:
    """What the runs of one MLPerf score share: one engine, submitted system (for imported runs), GPU
    model, GPU count, layout, GBS and MBS. Runs that differ in any of them are never one score."""

    engine: str
    system: str
    gpu: str
    gpus: int
    layout: str
    gbs: Any
    mbs: Any
    precision: str = "bf16"  # fp8 when the run's GEMMs ran in float8 (hardware.fp8)

    @property
    def label(self) -> str:
        where = f"{self.gpus} × {self.gpu}" if self.gpu else f"{self.gpus} CPU processes"
        return (f"{self.engine}, {self.system + ', ' if self.system else ''}{where}, {self.layout or '-'}, "
                f"GBS {'-' if self.gbs is None else self.gbs}, MBS {'-' if self.mbs is None else self.mbs}"
                + (f", {self.precision}" if self.precision != "bf16" else ""))


def precision_of(row: dict) -> str:
    """fp8 when a stored run's GEMMs ran in float8 (its spec's hardware.fp8, as this engine runs it and as
    `trainperf import` records a submission's FP8 config), else bf16."""
    hw = _row_json(row, "spec_json").get("hardware")
    return "fp8" if isinstance(hw, dict) and hw.get("fp8") not in (None, "", "none") else "bf16"


def run_set_of(row: dict) -> RunSet:
    """The set a stored run belongs to (RunSet)."""
    spec = _row_json(row, "spec_json")
    parallel, train = spec.get("parallel"), spec.get("train")
    train = train if isinstance(train, dict) else {}
    try:
        layout = degrees_name(parallel) if isinstance(parallel, dict) else ""
    except (TypeError, ValueError):  # a stored spec whose degrees are not numbers: no layout to name
        layout = ""
    return RunSet(engine_of(row), system_of_row(row), _text(_row_json(row, "hardware_json").get("gpu")),
                  int(row.get("world_size") or 0), layout,
                  train.get("global_batch_size"), train.get("micro_batch_size"), precision_of(row))


def _matches_layout(layout: str, wanted: str) -> bool:
    # DP8.TP4.SP as typed on a keyboard is DP8·TP4·SP
    return layout.replace("·", ".").lower() == wanted.replace("·", ".").lower()


def _set_choices(sets: dict[RunSet, list[dict]]) -> str:
    return "; ".join(f"{s.label} ({len(rows)} runs)" for s, rows in sets.items())


def choose_set(rows: list[dict], system: str | None = None, gpus: int | None = None,
               layout: str | None = None, engine: str | None = None) -> tuple[RunSet, list[dict], list[str]]:
    """(the set, its rows newest first, the other sets as 'label (n runs)') of stored runs, newest first,
    narrowed by ``system`` (part of the submitted system or GPU name, any case), ``gpus``, ``layout``
    and ``engine`` (default: the newest remaining run's): the newest remaining run's set; runs of two
    sets are never pooled."""
    sets: dict[RunSet, list[dict]] = {}
    for r in rows:
        sets.setdefault(run_set_of(r), []).append(r)
    matching = [r for s, rs in sets.items() for r in rs
                if (system is None or system.lower() in f"{s.system} {s.gpu}".lower())
                and (gpus is None or s.gpus == gpus) and (layout is None or _matches_layout(s.layout, layout))]
    if not matching:
        given = ", ".join(f"{k} {v}" for k, v in (("--system", system), ("--gpus", gpus), ("--layout", layout))
                          if v is not None)
        raise SpecError(f"no set of these runs matches {given}; sets: {_set_choices(sets)}")
    matching.sort(key=lambda r: -(r.get("created_at") or 0.0))  # newest first, as the store lists them
    kept = one_engine(matching, engine)
    chosen = run_set_of(kept[0])
    return chosen, [r for r in kept if run_set_of(r) == chosen], [
        f"{s.label} ({len(rs)} runs)" for s, rs in sets.items() if s != chosen]


def check_one_set(rows: list[dict]) -> RunSet | None:
    """Refuse store runs of two sets (systems, GPU counts, layouts, batch sizes) named as one score."""
    sets: dict[RunSet, list[dict]] = {}
    for r in rows:
        sets.setdefault(run_set_of(r), []).append(r)
    if len(sets) > 1:
        named = "; ".join(f"{s.label}: {', '.join(r['run_id'] for r in rs[:3])}{' ...' if len(rs) > 3 else ''}"
                          for s, rs in sets.items())
        raise SpecError(f"runs of different sets are not one score ({named}); score each set apart")
    return next(iter(sets), None)


@dataclass
class Gathered:
    """The runs of one score, the ruleset they are scored under (and why), and the set they form."""

    runs: list[RunResult]
    ruleset: str
    ruleset_basis: str
    run_set: str | None = None  # the set's label (RunSet.label) when the runs came from the store
    other_sets: list[str] = field(default_factory=list)  # the workload's other sets, not scored here
    left_out: int = 0  # older runs of the set beyond the benchmark's run count


def _one_ruleset(found: list[tuple[str, str, str]]) -> tuple[str, str]:
    """The one ruleset of (ruleset, why, run) triples; runs of two rounds are not one set."""
    rulesets = {(rs, why) for rs, why, _ in found}
    if len(rulesets) > 1:
        named = "; ".join(f"{rs} ({why}): {', '.join(n for r, w, n in found if (r, w) == (rs, why))[:120]}"
                          for rs, why in sorted(rulesets))
        raise SpecError(f"runs of different rounds are not one set ({named}); score them apart or give --ruleset")
    rs, why = next(iter(rulesets))
    if why != "--ruleset":
        try:
            _check_ruleset(rs)
        except SpecError:
            raise SpecError(f"these runs are scored under ruleset {rs} ({why}), which the installed mlperf_logging "
                            "does not have; give --ruleset") from None
    return rs, why


def gather(inputs: list[str] | None = None, db: str = "trainperf.db", workload: str | None = None,
           last: int | None = None, ruleset: str | None = None, engine: str | None = None,
           system: str | None = None, gpus: int | None = None, layout: str | None = None) -> Gathered:
    """Resolve what the user named into the runs of one score, oldest first.

    ``inputs``: paths (``result_*.txt``/``mllog.txt`` files, or directories holding ``result_*.txt``,
    an ``mllog.txt`` or run folders with one) and run ids of the store at ``db``, in any mix.
    ``workload``: the most recent finished runs of that workload in the store, of one set (RunSet: one
    engine, system, GPU count, layout, GBS, MBS): the newest run's, narrowed by ``engine``, ``system``,
    ``gpus`` and ``layout``; ``last`` of them (default: as many as the benchmark requires). Run ids of
    two engines or two sets are refused. Each run is scored under ``ruleset`` when given, else its
    round's (an imported run's, or a log inside a <round>/<org>/results/ folder), else 6.0.0.
    """
    if ruleset is not None:
        _check_ruleset(ruleset)
    inputs = list(inputs or [])
    if workload and inputs:
        raise SpecError("give either run ids / paths or --workload, not both")
    for name, value in (("--engine", engine), ("--gpus", gpus), ("--layout", layout)):
        if value is not None and not workload:
            raise SpecError(f"{name} only goes with --workload (it picks that workload's stored runs of one set)")
    if system is not None and not workload and not inputs:
        raise SpecError("--system goes with --workload (it picks that workload's runs of one system)")
    if last is not None and not workload:
        raise SpecError("--last N only goes with --workload (it picks that workload's N newest runs)")
    if last is not None and last < 1:
        raise SpecError(f"--last {last}: must be >= 1")
    if gpus is not None and gpus < 1:
        raise SpecError(f"--gpus {gpus}: must be >= 1")
    runs: list[RunResult] = []
    found: list[tuple[str, str, str]] = []
    stored_rows: list[dict] = []
    out = Gathered([], DEFAULT_RULESET, "default")
    store = None
    try:
        if workload:
            store = _open_store(db)
            rows = [r for r in store.list_runs(workload=workload, limit=1_000_000, trials=False)
                    if r["status"] != "running"]
            if not rows:
                raise SpecError(f"no finished runs of workload {workload!r} in {db!r}")
            with_log = [r for r in rows if r.get("mllog_path")]
            if not with_log:
                raise SpecError(f"none of the {len(rows)} finished runs of workload {workload!r} has an MLPerf log "
                                f"recorded in {db!r}: nothing to score")
            chosen, rows, out.other_sets = choose_set(with_log, system, gpus, layout, engine)
            out.run_set = chosen.label
            found = [(*ruleset_of_row(row, ruleset), row["run_id"]) for row in rows]
            rs, _ = _one_ruleset(found)
            if last is None:
                bench = _row_json(rows[0], "spec_json").get("mlperf", {})
                bench = bench.get("benchmark") if isinstance(bench, dict) else None
                last = _required_for(bench or _run_from_row(rows[0], rs).benchmark)
            out.left_out = max(0, len(rows) - last)
            runs = [_run_from_row(row, rs) for row in rows[:last]]
        elif not inputs:
            raise SpecError("nothing to score: give run ids, result directories / mllog files, or --workload NAME")
        for item in inputs:
            p = Path(item)
            if p.is_dir():
                logs = _logs_in_dir(p)
                if not logs:
                    raise SpecError(f"directory {item!r} holds no result_*.txt or mllog.txt")
            elif p.exists():
                logs = [p]
            else:
                if store is None:
                    if not Path(db).is_file():
                        raise SpecError(f"{item!r} is neither a file or directory nor a run id (no results store at {db!r})")
                    store = _open_store(db)
                row = store.get_run(item)
                if row is None:
                    raise SpecError(f"{item!r} is neither a file or directory nor a run id in {db!r}")
                stored_rows.append(row)
                check_one_engine(stored_rows)
                check_one_set(stored_rows)
                found.append((*ruleset_of_row(row, ruleset), row["run_id"]))
                runs.append(_run_from_row(row, found[-1][0]))
                continue
            for log in logs:
                found.append((*ruleset_of_path(log, ruleset), str(log)))
                runs.append(read_run(log, found[-1][0]))
        if stored_rows:
            chosen = check_one_set(stored_rows)
            out.run_set = chosen.label if chosen is not None and len(stored_rows) == len(runs) else None
    finally:
        if store is not None:
            store.close()
    out.ruleset, out.ruleset_basis = _one_ruleset(found) if found else (ruleset or DEFAULT_RULESET, "default")
    seen: dict[str, str] = {}
    for r in runs:
        key = os.path.realpath(r.path)
        if key in seen:
            raise SpecError(f"the same MLPerf log {r.path!r} was given twice ({seen[key]} and {r.name})")
        seen[key] = r.name
    _check_one_system(runs)
    runs.sort(key=lambda r: (r.run_start_ms is None, r.run_start_ms or 0.0))
    out.runs = runs
    return out


def _check_one_system(runs: list[RunResult]) -> None:
    """Logs of two submitted platforms or accelerator counts are not one set (what the logs say of it)."""
    for what, value in (("submission_platform", lambda r: r.platform),
                        ("GPU count (number_of_nodes x accelerators_per_node)",
                         lambda r: (r.number_of_nodes, r.accelerators_per_node)
                         if r.number_of_nodes is not None and r.accelerators_per_node is not None else None)):
        values = {json.dumps(value(r), default=str) for r in runs if value(r) is not None}
        if len(values) > 1:
            raise SpecError(f"logs of different {what} values ({', '.join(sorted(values))}) are not one set; "
                            "score each system's runs apart")


def gather_runs(inputs: list[str] | None = None, db: str = "trainperf.db", workload: str | None = None,
                last: int | None = None, ruleset: str | None = None, engine: str | None = None) -> list[RunResult]:
    """The runs of :func:`gather` alone."""
    return gather(inputs, db=db, workload=workload, last=last, ruleset=ruleset, engine=engine).runs


def score_gathered(g: Gathered) -> "Score":
    """The score of gathered runs under their ruleset, naming the set they form."""
    score = score_runs(g.runs, ruleset=g.ruleset)
    score.ruleset_basis, score.run_set, score.other_sets, score.left_out = (g.ruleset_basis, g.run_set,
                                                                           g.other_sets, g.left_out)
    return score


def score_stored_set(rows: list[dict], ruleset: str | None = None) -> "Score":
    """The score of one set's stored runs (newest first, as the store lists them), as `trainperf score
    --workload` computes it: the benchmark's run count of the newest, each under its round's ruleset."""
    chosen = check_one_set(rows)
    found = [(*ruleset_of_row(row, ruleset), row["run_id"]) for row in rows]
    rs, why = _one_ruleset(found)
    first = _run_from_row(rows[0], rs)
    last = _required_for(first.benchmark)
    runs = [first] + [_run_from_row(row, rs) for row in rows[1:last]]
    runs.sort(key=lambda r: (r.run_start_ms is None, r.run_start_ms or 0.0))
    return score_gathered(Gathered(runs, rs, why, chosen.label if chosen else None, [], max(0, len(rows) - last)))


# ---------------------------------------------------------------------------------------------
# Scoring


@dataclass
class Score:
    benchmark: str
    division: str | None
    gbs: Any
    ruleset: str
    required_runs: int
    runs: list[RunResult]
    roles: list[str]  # per run: "counted" | "dropped: fastest" | "dropped: slowest" | "dropped: not converged"
    olympic_mean_minutes: float | None
    scaling_factor: float
    score_minutes: float | None
    valid: bool
    reasons: list[str]
    rcp: dict
    export: dict | None = None
    ruleset_basis: str = "--ruleset"  # why this ruleset: --ruleset, round v4.1, as imported, default
    run_set: str | None = None  # the set the runs form (RunSet.label), when they came from the store
    other_sets: list[str] = field(default_factory=list)  # the workload's sets not scored here
    left_out: int = 0  # older runs of the set beyond the benchmark's run count

    @property
    def failed_runs(self) -> list[RunResult]:
        return [r for r in self.runs if not r.success]

    @property
    def reason(self) -> str | None:
        return "; ".join(self.reasons) if self.reasons else None

    def to_dict(self) -> dict:
        return {
            "benchmark": self.benchmark, "division": self.division, "global_batch_size": self.gbs,
            "ruleset": self.ruleset, "required_runs": self.required_runs, "runs_given": len(self.runs),
            "score_minutes": self.score_minutes, "olympic_mean_minutes": self.olympic_mean_minutes,
            "scaling_factor": self.scaling_factor,
            "run_times_minutes": [r.minutes for r in self.runs],
            "convergence_unit": rcp_unit(self.benchmark),
            "runs": [{"run_id": r.run_id, "path": r.path, "minutes": r.minutes, "success": r.success,
                      "status": r.stop_status, "samples_to_converge": r.samples_to_converge,
                      "seeds": r.seeds, "role": role} for r, role in zip(self.runs, self.roles)],
            "failed_runs": [{"run_id": r.run_id, "path": r.path, "reason": r.failure} for r in self.failed_runs],
            "valid": self.valid, "reason": self.reason, "rcp": self.rcp, "export": self.export,
            "ruleset_basis": self.ruleset_basis, "set": self.run_set, "other_sets": self.other_sets,
            "older_runs_left_out": self.left_out,
        }


def _max_dropped(benchmark: str) -> int:
    # the rule hard-coded in result_summarizer._compute_strong_score_standalone (and the package checker)
    return dropped_runs(benchmark)


def olympic_mean(minutes: list[float], n_failed: int, benchmark: str) -> float | None:
    """result_summarizer's olympic average: None with too many failures or nothing left after dropping."""
    from mlperf_logging.result_summarizer import result_summarizer as rs

    max_dropped = _max_dropped(benchmark)
    if n_failed > max_dropped:
        return None
    return rs._compute_olympic_average(list(minutes), n_failed, max_dropped)


def _roles(runs: list[RunResult], benchmark: str, counted: bool) -> list[str]:
    roles = ["dropped: not converged" if not r.success else "counted" for r in runs]
    n_failed = len(runs) - sum(r.success for r in runs)
    if not counted:
        return [role if role != "counted" else "-" for role in roles]
    k = _max_dropped(benchmark)
    order = sorted((i for i, r in enumerate(runs) if r.success), key=lambda i: runs[i].minutes)
    for i in order[:k]:
        roles[i] = "dropped: fastest"
    for i in order[len(order) - (k - n_failed):] if k - n_failed > 0 else []:
        roles[i] = "dropped: slowest"
    return roles


@contextlib.contextmanager
def captured_logging() -> Iterator[list[logging.LogRecord]]:
    """mlperf_logging reports through the root logger (and the compliance checker prints nothing to
    stdout); collect its records instead of letting them reach the terminal."""
    records: list[logging.LogRecord] = []

    class _Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    root = logging.getLogger()
    handler, level = _Keep(logging.INFO), root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield records
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _rcp_reference(checker, bs) -> tuple[str | None, dict | None, str]:
    """The reference rcp_checker.check_directory compares against, found the same way (pruned RCPs)."""
    data = checker._get_rcp_data(RCP_PASS)
    name = lambda rec: next((n for n, c in data.items() if c is rec), None)  # noqa: E731
    rec = checker._find_rcp(bs, RCP_PASS)
    if rec is not None:
        return name(rec), rec, "rcp"
    lo, hi = checker._find_top_min_rcp(bs, RCP_PASS), checker._find_bottom_max_rcp(bs, RCP_PASS)
    if lo is not None and hi is not None:
        interp_name, interp = checker._create_interp_rcp(bs, lo, hi)
        return f"{interp_name} (between {name(lo)} and {name(hi)})", interp, "interpolated"
    if lo is None and hi is not None:
        rec = checker._find_min_rcp(RCP_PASS)
        return name(rec), rec, "smallest-gbs rcp"
    return None, None, "missing"


def rcp_reference_samples(benchmark: str, gbs: int, ruleset: str = DEFAULT_RULESET) -> tuple[float, str] | None:
    """(olympic-mean samples to converge, how it was found) of the reference a closed submission at this
    GBS is compared with -- an RCP, or one interpolated between two; below the smallest RCP pruning kept,
    the pruned RCP measured at this GBS -- or None when there is none."""
    from mlperf_logging.rcp_checker import rcp_checker

    try:
        with captured_logging():
            checker = rcp_checker.RCP_Checker(USAGE, ruleset, benchmark, False)
            name, ref, kind = _rcp_reference(checker, gbs)
            own = checker._find_rcp(gbs, "full_rcps")
    except Exception:  # no RCP file for this benchmark / ruleset
        return None
    if kind == "smallest-gbs rcp" and own is not None:  # pruned from the checker's set, yet measured at this GBS
        return float(own["RCP Mean"]), f"rcp {next(n for n, c in checker._get_rcp_data('full_rcps').items() if c is own)} (pruned)"
    if ref is None or kind == "smallest-gbs rcp":
        return None
    return float(ref["RCP Mean"]), f"{kind} {name}"


def rcp_global_batch_sizes(benchmark: str, ruleset: str = DEFAULT_RULESET) -> list[int]:
    """Every global batch size the benchmark's RCP file of this ruleset has a point at ([] without one)."""
    import mlperf_logging

    path = os.path.join(os.path.dirname(mlperf_logging.__file__), "rcp_checker", f"{USAGE}_{ruleset}",
                        f"rcps_{benchmark}.json")
    if not os.path.isfile(path):
        return []
    with open(path) as fh:
        return sorted({int(r["BS"]) for r in json.load(fh).values()})


def _stage(runs: list[RunResult], folder: Path) -> list[Path]:
    out = []
    for i, r in enumerate(runs):
        dest = folder / f"result_{i}.txt"
        shutil.copyfile(r.path, dest)
        out.append(dest)
    return out


def rcp_check(runs: list[RunResult], ruleset: str = DEFAULT_RULESET) -> dict:
    """RCP check of a closed-division set of runs, as the package checker runs it, plus the reference used."""
    import numpy as np
    from mlperf_logging.rcp_checker import rcp_checker
    from mlperf_logging.result_summarizer import result_summarizer as rs

    benchmark, gbs = runs[0].benchmark, runs[0].gbs
    for r in runs:
        if r.success and r.samples_to_converge is None:
            key = "epoch_num" if r.convergence_unit == "tokens" else "samples_count"
            raise SpecError(f"{r.name}: run_stop says success but no eval_accuracy with {key} precedes it "
                            f"(the RCP check needs the {r.convergence_unit} to converge)")
    with tempfile.TemporaryDirectory(prefix="trainperf-rcp-") as tmp, captured_logging() as records, \
            warnings.catch_warnings():
        _stage(runs, Path(tmp))
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy: mean of an empty slice when < 3 runs
        try:
            passed, msg, norm = rcp_checker.check_directory(tmp, USAGE, ruleset, False, False, rcp_file=None,
                                                            rcp_pass=RCP_PASS, rcp_bypass=False, set_scaling=True)
            scaling = float(rs._get_scaling_factor(tmp))
            checker = rcp_checker.RCP_Checker(USAGE, ruleset, benchmark, False)
        except (KeyError, ValueError, TypeError, UnboundLocalError, OSError) as exc:
            raise SpecError(f"the RCP checker could not read these logs ({type(exc).__name__}: {exc})") from None
    samples = [r.samples_to_converge if r.success else None for r in runs]
    out = {"applicable": True, "passed": bool(passed), "message": msg, "ruleset": ruleset, "rcp_pass": RCP_PASS,
           "unit": runs[0].convergence_unit,
           "global_batch_size": gbs, "reference": None, "kind": None, "rcp_mean": None, "min_acceptable_mean": None,
           "submission_mean": None, "samples_to_converge": samples, "scaling_factor": scaling,
           "normalization_factor": float(norm),
           "log": [f"{rec.levelname}: {rec.getMessage().strip()}" for rec in records if rec.levelno >= logging.WARNING]}
    if isinstance(gbs, (int, float)) and not isinstance(gbs, bool):
        ref_name, ref, kind = _rcp_reference(checker, gbs)
        out["reference"], out["kind"] = ref_name, kind
        if ref is not None:
            out["rcp_mean"] = float(ref["RCP Mean"])
            out["min_acceptable_mean"] = float(ref["RCP Mean"] / ref["Max Speedup"])
    # the submission mean as rcp_checker._eval_submission_record computes it (failed run = 1e9, dropped as slowest)
    epochs = sorted(s if s is not None else 1e9 for s in samples)
    k = _max_dropped(benchmark)
    counted = epochs[k:len(epochs) - k]
    if counted and sum(1 for s in samples if s is None) <= k:
        out["submission_mean"] = float(np.mean(counted))
    return out


def score_runs(runs: list[RunResult], ruleset: str = DEFAULT_RULESET) -> Score:
    """Olympic mean, RCP check and validity of a set of runs of one benchmark (SpecError if they do not form one)."""
    from mlperf_logging.benchmark_meta import get_allowed_benchmarks

    _check_ruleset(ruleset)
    if not runs:
        raise SpecError("no runs to score")
    benches = sorted({r.benchmark for r in runs})
    if len(benches) > 1:
        raise SpecError(f"runs of different benchmarks cannot be scored together: {', '.join(benches)}")
    benchmark = benches[0]
    required = _required_for(benchmark)
    if benchmark not in get_allowed_benchmarks(USAGE, ruleset):
        raise SpecError(f"benchmark {benchmark!r} is not part of MLPerf {USAGE} {ruleset} (see --ruleset)")
    gbss = {json.dumps(r.gbs) for r in runs}
    if len(gbss) > 1:
        raise SpecError("runs with different global_batch_size cannot be scored together: "
                        + ", ".join(sorted(gbss)))
    divisions = {r.division for r in runs}
    if len(divisions) > 1:
        raise SpecError("runs of different divisions cannot be scored together: "
                        + ", ".join(sorted(str(d) for d in divisions)))
    division, gbs = runs[0].division, runs[0].gbs

    ok = [r for r in runs if r.success]
    n_failed = len(runs) - len(ok)
    max_dropped = _max_dropped(benchmark)
    raw = olympic_mean([r.minutes for r in ok], n_failed, benchmark)

    reasons: list[str] = []
    if n_failed > max_dropped:
        reasons.append(f"{n_failed} of {len(runs)} runs did not converge; olympic scoring drops at most "
                       f"{max_dropped} ({', '.join(f'{r.name}: {r.failure}' for r in runs if not r.success)})")
    if len(runs) != required:
        reasons.append(f"not a valid MLPerf score ({len(runs)} of {required} runs)" if len(runs) < required else
                       f"not a valid MLPerf score ({len(runs)} runs; {benchmark} is scored on exactly {required})")
    if raw is None and n_failed <= max_dropped:
        reasons.append(f"too few converged runs ({len(ok)}) for an olympic mean")

    if division == "closed":
        rcp = rcp_check(runs, ruleset)
        if not rcp["passed"]:
            reasons.append(f"RCP check failed: {rcp['message']}")
    else:
        note = "RCP check not applicable (open division)" if division == "open" else \
            f"RCP check not applicable (division {division!r})"
        rcp = {"applicable": False, "passed": None, "message": note, "scaling_factor": 1.0}
    scaling = float(rcp.get("scaling_factor") or 1.0)
    # an invalid set has no score: its olympic mean and scaling factor say what these runs give
    score = raw * scaling if raw is not None and not reasons else None
    return Score(benchmark=benchmark, division=division, gbs=gbs, ruleset=ruleset, required_runs=required, runs=runs,
                 roles=_roles(runs, benchmark, counted=raw is not None), olympic_mean_minutes=raw,
                 scaling_factor=scaling, score_minutes=score, valid=not reasons, reasons=reasons, rcp=rcp)


# ---------------------------------------------------------------------------------------------
# Submission-package export and the package checker


def _safe_name(s: str) -> str:
    s = re.sub(r"[^\w.+-]+", "_", str(s)).strip("._")
    return s or "unnamed"


def _one(values: list, what: str, option: str) -> str:
    vals = sorted({v for v in values if v not in (None, "")})
    if not vals:
        raise SpecError(f"the logs carry no {what}; give {option}")
    if len(vals) > 1:
        raise SpecError(f"the logs carry different {what} values ({', '.join(map(str, vals))}); give {option}")
    return vals[0]


def system_description(score: Score, org: str, system: str) -> dict:
    """A system description with every field system_desc_checker requires; what the logs and the store do
    not say is left empty for the submitter to fill in."""
    runs = score.runs
    hw = next((r.hardware for r in runs if r.hardware), {})
    sw = next((r.software for r in runs if r.software), {})
    first = lambda attr: next((getattr(r, attr) for r in runs if getattr(r, attr) not in (None, "")), None)  # noqa: E731
    nodes = first("number_of_nodes")
    per_node = first("accelerators_per_node")
    if per_node is None and hw.get("device") == "cuda":
        per_node = hw.get("gpus")
    if nodes is None and per_node is not None and hw:
        nodes = 1  # a single-host trainperf launch
    status = _AVAILABILITY.get(str(first("submission_status") or "").lower(), _AVAILABILITY["research"])
    software = ", ".join(f"{k} {v}" for k, v in sw.items() if isinstance(v, (str, int, float))) if sw else ""
    desc = {
        "submitter": org,
        "division": score.division or "open",
        "status": status,
        "system_name": system,
        "number_of_nodes": "" if nodes is None else str(nodes),
        "host_processors_per_node": "",
        "host_processor_model_name": str(hw.get("cpu") or ""),
        "host_processor_core_count": str(hw.get("cores") or ""),
        "host_processor_vcpu_count": "",
        "host_processor_frequency": "",
        "host_processor_caches": "",
        "host_processor_interconnect": "",
        "host_memory_capacity": "",
        "host_storage_type": "",
        "host_storage_capacity": "",
        "host_networking": "",
        "host_networking_topology": "",
        "host_memory_configuration": "",
        "accelerators_per_node": "" if per_node is None else str(per_node),
        "accelerator_model_name": str(hw.get("gpu") or ""),
        "accelerator_host_interconnect": "",
        "accelerator_frequency": "",
        "accelerator_on-chip_memories": "",
        "accelerator_memory_configuration": "",
        "accelerator_memory_capacity": f"{hw['memory_gib']} GiB" if hw.get("memory_gib") else "",
        "accelerator_interconnect": "",
        "accelerator_interconnect_topology": "",
        "cooling": "",
        "hw_notes": "generated by `trainperf score --export`; fill in the empty fields before submitting",
        "framework": f"trainperf {__version__}",
        "other_software_stack": software,
        "operating_system": "",
        "sw_notes": "",
    }
    return desc


def export_package(score: Score, dest: str | os.PathLike, org: str | None = None, system: str | None = None,
                   check: bool = True) -> dict:
    """Write ``dest/<org>/{results/<system>/<benchmark>/result_N.txt, systems/<system>.json,
    benchmarks/<benchmark>/implementations/trainperf/README.md}``; with ``check``, run the package checker."""
    try:
        return _export_package(score, dest, org, system, check)
    except OSError as exc:
        raise SpecError(f"--export {str(dest)!r}: cannot write the package ({exc.strerror or exc})") from None


def _export_package(score: Score, dest, org, system, check: bool) -> dict:
    org = _safe_name(org or _one([r.org for r in score.runs], "submission_org", "--org"))
    system = _safe_name(system or _one([r.platform for r in score.runs], "submission_platform", "--system"))
    root = Path(dest) / org
    bench_dir = root / "results" / system / score.benchmark
    bench_dir.mkdir(parents=True, exist_ok=True)
    for stale in list(bench_dir.glob("result_*.txt")) + [bench_dir / "scaling.json"]:
        stale.unlink(missing_ok=True)
    results = [str(p) for p in _stage(score.runs, bench_dir)]
    if score.division == "closed" and score.scaling_factor != 1.0:
        # what rcp_checker.check_directory(set_scaling=True) writes; result_summarizer reads it
        (bench_dir / "scaling.json").write_text(json.dumps({"scaling_factor": score.scaling_factor}))
    systems = root / "systems"
    systems.mkdir(parents=True, exist_ok=True)
    sys_file = systems / f"{system}.json"
    sys_file.write_text(json.dumps(system_description(score, org, system), indent=2) + "\n")
    impl = root / "benchmarks" / score.benchmark / "implementations" / "trainperf"
    impl.mkdir(parents=True, exist_ok=True)
    lines = [f"# {score.benchmark}: trainperf", "",
             f"Runs exported by `trainperf score --export` for MLPerf {USAGE} {score.ruleset} "
             f"({score.division or 'unknown'} division, global batch size {score.gbs}).", "",
             "| result file | run | minutes | status |", "|---|---|---|---|"]
    for f, r in zip(results, score.runs):
        mins = "-" if r.minutes is None else f"{r.minutes:.3f}"
        lines.append(f"| {Path(f).name} | {r.run_id or r.path} | {mins} | {r.stop_status or r.failure} |")
    lines += ["", f"Score: {'-' if score.score_minutes is None else f'{score.score_minutes:.3f}'} minutes "
              f"({'valid' if score.valid else 'not valid: ' + str(score.reason)}).",
              "", "The training code is trainperf (`trainperf run <workload>`); see its repository.", ""]
    (impl / "README.md").write_text("\n".join(lines))
    out = {"dir": str(root), "results": results, "system_json": str(sys_file), "org": org, "system": system}
    if check:
        out["package_check"] = check_package(root, score.ruleset)
    return out


def check_package(org_dir: str | os.PathLike, ruleset: str = DEFAULT_RULESET) -> dict:
    """The package checker's system-description and result-file checks, in-process.

    ``python -m mlperf_logging.package_checker`` exits 0 whatever it finds (it only logs
    "PACKAGE CHECKER FOUND [NO] ERRORS"), so the verdict comes from the two check functions it calls.
    Note that, like the package checker, this (re)writes ``scaling.json`` in closed benchmark folders.
    """
    from mlperf_logging.package_checker import package_checker as pc

    with captured_logging() as records:
        systems_ok = pc.check_systems(str(org_dir), USAGE, ruleset)
        results_ok = pc.check_training_result_files(str(org_dir), USAGE, ruleset, quiet=False, werror=False,
                                                    rcp_bypass=False, rcp_bert_train_samples=False,
                                                    seed_checker_bypass=False)
    errors = [r.getMessage().strip() for r in records if r.levelno >= logging.ERROR]
    return {"passed": bool(systems_ok and results_ok), "systems_ok": bool(systems_ok),
            "results_ok": bool(results_ok), "errors": errors,
            "warnings": [r.getMessage().strip() for r in records if r.levelno == logging.WARNING]}


# ---------------------------------------------------------------------------------------------
# Output


def _fmt_min(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


def set_label(score: Score) -> str:
    """The set a score is of: its stored set's label, else what its logs say of the system (submission
    platform, nodes x accelerators per node)."""
    if score.run_set:
        return score.run_set
    first = lambda attr: next((getattr(r, attr) for r in score.runs if getattr(r, attr) not in (None, "")), None)  # noqa: E731
    nodes, per_node = first("number_of_nodes"), first("accelerators_per_node")
    gpus = (f"{nodes * per_node} GPUs ({nodes} x {per_node})" if isinstance(nodes, int) and isinstance(per_node, int)
            else "GPU count not logged")
    return f"{first('org') or '?'} {first('platform') or '(no submission_platform)'}, {gpus} (from the logs)"


def print_score(score: Score, console=None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console(width=None if Console().is_terminal else 200)
    console.print(escape(f"trainperf score: {score.benchmark}, {score.division or '?'} division, GBS {score.gbs}, "
                         f"ruleset {score.ruleset} ({score.ruleset_basis})"), soft_wrap=True)
    console.print(escape(f"set            {printable(set_label(score), 400)}"), soft_wrap=True)
    console.print(f"runs           {len(score.runs)} of the {score.required_runs} {score.benchmark} is scored on")
    table = Table()
    for col, justify in (("#", "right"), ("run", "left"), ("seed", "right"), ("status", "left"),
                         ("minutes", "right"), (rcp_unit(score.benchmark), "right"),
                         ("olympic", "left")):
        table.add_column(col, justify=justify)
    for i, (r, role) in enumerate(zip(score.runs, score.roles)):
        status = "[green]success[/green]" if r.success else f"[red]{escape(str(r.failure))}[/red]"
        seed = ",".join(str(s) for s in r.seeds) or "-"
        table.add_row(str(i), escape(printable(r.run_id or r.path, 400)), escape(printable(seed)), status, _fmt_min(r.minutes),
                      "-" if r.samples_to_converge is None else str(r.samples_to_converge), role)
    console.print(table)
    console.print(f"olympic mean   {_fmt_min(score.olympic_mean_minutes)} min")
    rcp = score.rcp
    if not rcp.get("applicable"):
        console.print(f"RCP            {rcp['message']}")
    else:
        verdict = "[green]pass[/green]" if rcp["passed"] else "[red]FAIL[/red]"
        sub = rcp.get("submission_mean")
        console.print(f"RCP            {verdict} ({rcp['message']}; {rcp.get('reference') or 'no reference'})")
        if rcp.get("rcp_mean") is not None:
            unit = rcp.get("unit", "samples")
            console.print(f"               submission mean {'-' if sub is None else f'{sub:.1f}'} {unit}, RCP mean "
                          f"{rcp['rcp_mean']:.1f}, minimum acceptable {rcp['min_acceptable_mean']:.1f}")
    console.print(f"scaling factor {score.scaling_factor:.4f}")
    if score.valid:
        console.print(f"score          {_fmt_min(score.score_minutes)} min  ([green]valid MLPerf score[/green])")
    else:  # an invalid set has no score: the olympic mean above is only what these runs give
        console.print("score          [red]none: not a valid MLPerf score[/red]")
    if not score.valid:
        for reason in score.reasons:
            console.print(f"  - {reason}")
    if score.left_out:
        console.print(f"older runs     {score.left_out} older run(s) of this set left out (the newest "
                      f"{score.required_runs} are scored; give run ids to score others)")
    for other in score.other_sets[:8]:
        console.print(escape(f"other set      {printable(other, 400)} (--system / --gpus / --layout / --engine "
                             "pick it)"), soft_wrap=True)
    if score.export:
        console.print(f"exported       {score.export['dir']}")
        chk = score.export.get("package_check")
        if chk is not None:
            console.print("package check  " + ("[green]passed[/green]" if chk["passed"] else
                                               "[red]FAILED[/red]: " + " | ".join(chk["errors"][:5])))


__all__ = ["RunResult", "Score", "RunSet", "Gathered", "read_run", "gather", "gather_runs", "olympic_mean", "rcp_check",
           "score_runs", "score_gathered", "score_stored_set", "run_set_of", "precision_of", "ruleset_of_row", "ruleset_of_path",
           "system_description", "export_package", "check_package", "print_score", "set_label"]
