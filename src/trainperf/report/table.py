"""The table of stored runs (rich on a terminal, JSON with --json)."""

from __future__ import annotations

import os

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trainperf.core.results import REPORT_COLUMNS, engine_of
from trainperf.report.scaling import is_imported, row_key

# a run's results (RunSummary's report columns) and what the planner predicted for it
COLUMNS = (*REPORT_COLUMNS, "predicted_step_time_s", "predicted_peak_gib")


def rows_for_json(runs: list[dict]) -> list[dict]:
    """Each run's report columns, with the engine that ran it (trainperf, or an imported engine such as
    nemo), its layout's degrees (DP2·TP4·SP), GBS, MBS and whether it is a trial."""
    out = []
    for r in runs:
        _, _, degrees, gbs, mbs = row_key(r)
        out.append({k: r.get(k) for k in COLUMNS} | {"comparable": bool(r.get("comparable")), "degrees": degrees,
                                                    "gbs": gbs, "mbs": mbs, "purpose": r.get("purpose", "run"),
                                                    "engine": engine_of(r)})
    return out


def _fmt(v, spec: str = "") -> str:
    if v is None:
        return "-"
    return format(v, spec) if spec else str(v)


def _vs(measured, predicted) -> str:
    """' (pred X, +e%)' -- the planner's prediction next to the measurement, with its error."""
    if measured is None or not predicted:
        return ""
    return f" ({predicted:.2f}, {100 * (predicted / measured - 1):+.0f}%)"


def _status(r: dict) -> str:
    return r["status"] + (" (trial)" if r.get("purpose") == "trial" else "")


def _time(r: dict) -> str:
    v = r.get("time_to_train_s")
    return "-" if v is None else f"{v:.1f} s"


def _mfu(r: dict) -> str:
    return "-" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"


# (header, justify, cell) in the order columns are kept when the terminal is too narrow for all of them
RUN_COLUMNS = (
    ("run", "left", lambda r: r["run_id"]),
    ("status", "left", _status),
    ("engine", "left", engine_of),
    ("GPUs", "right", lambda r: _fmt(r.get("world_size"))),
    ("layout", "left", lambda r: row_key(r)[2]),
    ("time to train", "right", _time),
    ("GBS/MBS", "right", lambda r: "/".join(_fmt(x) for x in row_key(r)[3:])),
    ("tok/s/GPU", "right", lambda r: _fmt(r.get("tokens_per_s_per_gpu"), ",.0f")),
    ("MFU", "right", _mfu),
    ("workload", "left", lambda r: r["workload"]),
    ("eval / target", "right", lambda r: f"{_fmt(r.get('final_eval_loss'), '.4f')} / {_fmt(r.get('target'), '.4f')}"),
    ("samples", "right", lambda r: _fmt(r.get("samples_to_target"))),
    ("step s (plan)", "right", lambda r: _fmt(r.get("step_time_s"), ".3f") + _vs(r.get("step_time_s"),
                                                                                r.get("predicted_step_time_s"))),
    ("peak GiB (plan)", "right", lambda r: _fmt(r.get("peak_mem_gib"), ".2f") + _vs(r.get("peak_mem_gib"),
                                                                                   r.get("predicted_peak_gib"))),
    ("tokens/s", "right", lambda r: _fmt(r.get("tokens_per_s"), ",.0f")),
    ("division", "left", lambda r: (r.get("division") or "-") + ("" if r.get("comparable") else " (not comparable)")),
)


PIPE_WIDTH = 120  # the width a pipe or log file gets without COLUMNS


def table_width(widths: list[int]) -> int:
    """Characters a rich Table with these column widths takes: a border and two spaces of padding each."""
    return sum(widths) + 3 * len(widths) + 1


def fit_columns(headers: list[str], cells: list[list[str]], width: int | None) -> list[int]:
    """Indices of the columns kept, in order, so that every value shows whole within ``width``
    characters (None: all). Columns are dropped from the end of the list, never truncated."""
    need = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    keep = list(range(len(headers)))
    while width is not None and len(keep) > 1 and table_width([need[i] for i in keep]) > width:
        keep.pop()
    return keep


def print_table(runs: list[dict], console: Console | None = None, wide: bool = False, trials_left_out: int = 0) -> None:
    """The runs, one line each with whole values: on a narrow terminal the less important columns are
    left out (and named), ``wide`` keeps them all."""
    # the engine column only when another engine's imported runs are listed beside this engine's
    columns = RUN_COLUMNS if any(is_imported(r) for r in runs) else [c for c in RUN_COLUMNS if c[0] != "engine"]
    headers = [c[0] for c in columns]
    cells = [[c[2](r) for c in columns] for r in runs]
    console = console or Console()
    width = None if wide else (console.width if console.is_terminal else int(os.environ.get("COLUMNS", PIPE_WIDTH)))
    keep = fit_columns(headers, cells, width)
    need = table_width([max([len(headers[i])] + [len(row[i]) for row in cells]) for i in keep])
    if not console.is_terminal or wide:
        console = Console(width=max(need, width or 0, PIPE_WIDTH), file=console.file)
    left = f", {trials_left_out} tune trials left out (--trials)" if trials_left_out else ""
    table = Table(title=f"trainperf runs ({len(runs)}{left})", show_lines=False)
    for i in keep:
        table.add_column(headers[i], justify=columns[i][1], no_wrap=True)
    for r, row in zip(runs, cells):
        style = {"success": "green", "failed": "red", "running": "yellow", "hung": "magenta"}.get(r["status"], "")
        table.add_row(*[f"[{style}]{escape(row[i])}[/{style}]" if headers[i] == "status" and style else escape(row[i])
                       for i in keep])
    console.print(table)
    if len(keep) < len(headers):
        console.print(f"columns left out to fit {width}: {', '.join(headers[i] for i in range(len(headers)) if i not in keep)} "
                      "(--wide shows every column)", soft_wrap=True)
    print_projection(runs, console)
    failed = [r for r in runs if r["status"] == "failed" and r.get("status_reason")]
    for r in failed[:5]:
        console.print(f"[red]{escape(r['run_id'])}[/red]: {escape(r['status_reason'])}", soft_wrap=True)


def print_projection(runs: list[dict], console: Console) -> None:
    """The projected scaling table (report/projection.py), when throughput runs of a benchmark exist."""
    from trainperf.report.projection import projected_scaling_rows

    rows = projected_scaling_rows(runs)
    if not rows:
        return
    t = Table(title="projected time to train: throughput runs x the RCP's samples to converge (a projection, "
                    "not a result)")
    for col in ("benchmark", "GPUs", "DP", "TP", "PP", "CP", "SP", "GBS", "MBS", "samples/s", "ref. samples",
                "evals s", "projected min", "speedup", "efficiency", "MFU"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(r["benchmark"], str(r["gpus"]), _fmt(r.get("dp")), _fmt(r.get("tp")), _fmt(r.get("pp")),
                  _fmt(r.get("cp")), "y" if r.get("sp") else "-", _fmt(r.get("gbs")), _fmt(r.get("mbs")),
                  _fmt(r["samples_per_s"], ".3f"), f"{r['reference_samples']:.0f}",
                  f"{r['eval_s']:.0f} ({r['eval_source']})", _fmt(r["projected_s"] / 60, ".1f"),
                  _fmt(r["speedup"], ".2f"), _fmt(100 * r["efficiency"], ".0f") + "%",
                  _fmt(None if r.get("mfu") is None else 100 * r["mfu"], ".1f"))
    console.print(t)
