"""The columns of the runs listing, defined once: the terminal table (`report`), its JSON (`report
--json`) and the page's runs table (`report --html`) all read ``COLUMNS``.

A ``Column`` is a header, the stored or derived fields it shows (the JSON keys behind it), how its
cell is written on the terminal and on the page, how it is justified, and its width rank: on a
narrow terminal columns are dropped last-first in ``KEEP_ORDER``, never truncated. Each view lists
the columns it shows, in its order (``TERMINAL``, ``PAGE``). The JSON row is every result field the
typed ``RunSummary`` marks ``report`` (core/results.py), what the planner predicted, and the derived
fields below (``json_row``): every field a column shows is in it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainperf.core.results import REPORT_COLUMNS, engine_of
from trainperf.report.labels import (
    MFU_HEADER,
    division_label,
    fp8_peak_mfu,
    mfu_text,
    name,
    precision_of,
    status_label,
)
from trainperf.report.scaling import gpu_model_of, row_key

# a run's results (RunSummary's report columns) and what the planner predicted for it
STORED_FIELDS = (*REPORT_COLUMNS, "predicted_step_time_s", "predicted_peak_gib")
# what the listing derives from a row (row_key, labels): JSON keys beside the stored ones
DERIVED_FIELDS = ("comparable", "degrees", "gbs", "mbs", "purpose", "engine", "precision", "mfu_peak", "mfu_fp8_peak")


def json_row(r: dict) -> dict:
    """One run as `report --json` lists it: its stored fields, then the derived ones (``comparable`` a
    boolean, in its stored place)."""
    _, _, degrees, gbs, mbs = row_key(r)
    precision = precision_of(r)
    return {k: r.get(k) for k in STORED_FIELDS} | {
        "comparable": bool(r.get("comparable")), "degrees": degrees, "gbs": gbs, "mbs": mbs,
        "purpose": r.get("purpose", "run"), "engine": engine_of(r), "precision": precision, "mfu_peak": "bf16",
        "mfu_fp8_peak": fp8_peak_mfu(r.get("mfu"), gpu_model_of(r), precision)}


def fmt(v, spec: str = "") -> str:
    """A value as a cell: '-' when there is none."""
    if v is None:
        return "-"
    return format(v, spec) if spec else str(v)


def _vs(measured, predicted) -> str:
    """' (pred X, +e%)' -- the planner's prediction next to the measurement, with its error."""
    if measured is None or not predicted:
        return ""
    return f" ({predicted:.2f}, {100 * (predicted / measured - 1):+.0f}%)"


def minutes(seconds) -> str:
    return "-" if seconds is None else f"{seconds / 60:.2f}"


def terminal_mfu(r: dict) -> str:
    """'42.0%' against the bf16 peak; an fp8 run's also against the fp8 peak: '78.9% (39.4%)'."""
    mfu = r.get("mfu")
    if mfu is None:
        return "-"
    fp8 = fp8_peak_mfu(mfu, gpu_model_of(r), precision_of(r))
    return f"{100 * mfu:.1f}%" + (f" ({100 * fp8:.1f}%)" if fp8 is not None else "")


def terminal_layout(r: dict) -> str:
    # PP8(Interleaved1F1B) as PP8(i1F1B): a 512-GPU layout then fits beside its numbers at 120 columns
    return name(row_key(r)[2]).replace("(Interleaved", "(i")


def _eval(r: dict) -> str:
    target = r.get("target")  # a throughput probe asks for no eval: no target to show
    return f"{fmt(r.get('final_eval_loss'), '.4f')} / {'-' if not target else format(target, '.4f')}"


def _page_eval(r: dict) -> str:
    return f"{fmt(r.get('final_eval_loss'), '.4f')} / {fmt(r.get('target') or None, '.4f')}"


def _gbs_mbs(r: dict) -> str:
    return "/".join(fmt(x) for x in row_key(r)[3:])


@dataclass(frozen=True)
class Column:
    header: str  # the terminal's (two lines where that makes the column narrower)
    fields: tuple[str, ...]  # the JSON keys it shows
    cell: Callable[[dict], str] | None  # its terminal text; None: not on the terminal
    page: Callable[[dict], Any] | None = None  # its page text (a number stays a number); None: not on the page
    page_header: str | None = None  # the page's header, when it differs
    justify: str = "right"


TIME = "time to\ntrain (min)"
MFU = "MFU vs bf16\n(fp8) peak"  # headers on two lines: narrower columns

COLUMNS: dict[str, Column] = {
    "run": Column("run", ("run_id",), lambda r: name(r["run_id"]), lambda r: r["run_id"], justify="left"),
    "workload": Column("workload", ("workload",), None, lambda r: r["workload"], justify="left"),
    "kind": Column("kind", ("purpose",), None, lambda r: r.get("purpose") or "run", justify="left"),
    "status": Column("status", ("status", "status_reason"), status_label, status_label, justify="left"),
    "engine": Column("engine", ("engine",), lambda r: name(engine_of(r)), engine_of, justify="left"),
    "gpus": Column("GPUs", ("world_size",), lambda r: fmt(r.get("world_size")), lambda r: r["world_size"]),
    "layout": Column("layout", ("layout", "degrees"), terminal_layout, lambda r: row_key(r)[2], justify="left"),
    "time": Column(TIME, ("time_to_train_s",), lambda r: minutes(r.get("time_to_train_s")),
                   lambda r: minutes(r.get("time_to_train_s")), page_header="time to train (min)"),
    "gbs_mbs": Column("GBS/MBS", ("gbs", "mbs"), _gbs_mbs, lambda r: "/".join(fmt(x, "") for x in row_key(r)[3:])),
    "tok_gpu": Column("tok/s/GPU", ("tokens_per_s_per_gpu",), lambda r: fmt(r.get("tokens_per_s_per_gpu"), ",.0f"),
                      lambda r: fmt(r.get("tokens_per_s_per_gpu"), ",.0f"), page_header="tokens/s/GPU"),
    "mfu": Column(MFU, ("mfu", "mfu_peak", "mfu_fp8_peak", "precision"), terminal_mfu,
                  lambda r: mfu_text(r.get("mfu"), gpu_model_of(r), precision_of(r)), page_header=MFU_HEADER),
    "eval": Column("eval / target", ("final_eval_loss", "target"), _eval, _page_eval),
    "samples": Column("samples", ("samples_to_target",), lambda r: fmt(r.get("samples_to_target")),
                      lambda r: fmt(r.get("samples_to_target"), "d")),
    "step": Column("step s (plan)", ("step_time_s", "predicted_step_time_s"),
                   lambda r: fmt(r.get("step_time_s"), ".3f") + _vs(r.get("step_time_s"), r.get("predicted_step_time_s"))),
    "peak": Column("peak GiB (plan)", ("peak_mem_gib", "predicted_peak_gib"),
                   lambda r: fmt(r.get("peak_mem_gib"), ".2f") + _vs(r.get("peak_mem_gib"), r.get("predicted_peak_gib"))),
    "tokens": Column("tokens/s", ("tokens_per_s",), lambda r: fmt(r.get("tokens_per_s"), ",.0f")),
    "division": Column("division", ("division", "comparable"), lambda r: name(division_label(r)), division_label,
                       justify="left"),
}

# the terminal table's columns, in order; the order they are kept in when the terminal is too narrow
# for all of them: the measurements before the descriptions
TERMINAL = ("run", "status", "engine", "gpus", "layout", "time", "gbs_mbs", "tok_gpu", "mfu", "eval", "samples", "step",
            "peak", "tokens", "division")
KEEP_ORDER = ("run", "status", "engine", "time", "gpus", "mfu", "tok_gpu", "gbs_mbs", "layout", "division", "eval",
              "samples", "step", "peak", "tokens")
# the page's runs table
PAGE = ("run", "workload", "engine", "kind", "status", "gpus", "layout", "gbs_mbs", "time", "samples", "eval", "tok_gpu",
        "mfu", "division")


def terminal_columns() -> list[tuple[str, str, Callable[[dict], str]]]:
    """(header, justify, cell) of the terminal's columns, in the order they are shown."""
    return [(COLUMNS[c].header, COLUMNS[c].justify, COLUMNS[c].cell) for c in TERMINAL]


def keep_headers() -> tuple[str, ...]:
    """The terminal's headers in the order they are kept when the terminal is narrow."""
    return tuple(COLUMNS[c].header for c in KEEP_ORDER)


def page_headers() -> list[str]:
    return [COLUMNS[c].page_header or COLUMNS[c].header for c in PAGE]


def page_cells(r: dict) -> list:
    return [COLUMNS[c].page(r) for c in PAGE]
