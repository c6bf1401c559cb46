"""The table of stored runs (rich on a terminal, JSON with --json)."""

from __future__ import annotations

import os

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trainperf.core.results import REPORT_COLUMNS, engine_of
from trainperf.report.labels import (
    MFU_HEADER,
    MFU_NOTE,
    division_label,
    fp8_peak_mfu,
    is_probe,
    name,
    precision_of,
    status_label,
)
from trainperf.report.scaling import gpu_model_of, is_imported, row_key

# a run's results (RunSummary's report columns) and what the planner predicted for it
COLUMNS = (*REPORT_COLUMNS, "predicted_step_time_s", "predicted_peak_gib")


def rows_for_json(runs: list[dict]) -> list[dict]:
    """Each run's report columns, with the engine that ran it (trainperf, or an imported engine such as
    nemo), its layout's degrees (DP2·TP4·SP), GBS, MBS, whether it is a trial, its precision and, for an
    fp8 run, its MFU against the fp8 peak (``mfu`` is against the bf16 peak)."""
    out = []
    for r in runs:
        _, _, degrees, gbs, mbs = row_key(r)
        precision = precision_of(r)
        out.append({k: r.get(k) for k in COLUMNS} | {"comparable": bool(r.get("comparable")), "degrees": degrees,
                                                    "gbs": gbs, "mbs": mbs, "purpose": r.get("purpose", "run"),
                                                    "engine": engine_of(r), "precision": precision,
                                                    "mfu_peak": "bf16",
                                                    "mfu_fp8_peak": fp8_peak_mfu(r.get("mfu"), gpu_model_of(r),
                                                                                 precision)})
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


def _time(r: dict) -> str:
    v = r.get("time_to_train_s")
    return "-" if v is None else f"{v / 60:.2f}"


def _mfu(r: dict) -> str:
    """'42.0%' against the bf16 peak; an fp8 run's also against the fp8 peak: '78.9% (39.4%)'."""
    mfu = r.get("mfu")
    if mfu is None:
        return "-"
    fp8 = fp8_peak_mfu(mfu, gpu_model_of(r), precision_of(r))
    return f"{100 * mfu:.1f}%" + (f" ({100 * fp8:.1f}%)" if fp8 is not None else "")


def _layout(r: dict) -> str:
    # PP8(Interleaved1F1B) as PP8(i1F1B): a 512-GPU layout then fits beside its numbers at 120 columns
    return name(row_key(r)[2]).replace("(Interleaved", "(i")


LAYOUT_NOTE = "layout: (i1F1B) is the Interleaved1F1B pipeline schedule."
TIME = "time to\ntrain (min)"
MFU = "MFU vs bf16\n(fp8) peak"  # headers on two lines: narrower columns


def _eval(r: dict) -> str:
    target = r.get("target")  # a throughput probe asks for no eval: no target to show
    return f"{_fmt(r.get('final_eval_loss'), '.4f')} / {'-' if not target else format(target, '.4f')}"


# (header, justify, cell) in the order the columns are shown
RUN_COLUMNS = (
    ("run", "left", lambda r: name(r["run_id"])),
    ("status", "left", status_label),
    ("engine", "left", lambda r: name(engine_of(r))),
    ("GPUs", "right", lambda r: _fmt(r.get("world_size"))),
    ("layout", "left", lambda r: _layout(r)),
    (TIME, "right", _time),
    ("GBS/MBS", "right", lambda r: "/".join(_fmt(x) for x in row_key(r)[3:])),
    ("tok/s/GPU", "right", lambda r: _fmt(r.get("tokens_per_s_per_gpu"), ",.0f")),
    (MFU, "right", _mfu),
    ("eval / target", "right", _eval),
    ("samples", "right", lambda r: _fmt(r.get("samples_to_target"))),
    ("step s (plan)", "right", lambda r: _fmt(r.get("step_time_s"), ".3f") + _vs(r.get("step_time_s"),
                                                                                r.get("predicted_step_time_s"))),
    ("peak GiB (plan)", "right", lambda r: _fmt(r.get("peak_mem_gib"), ".2f") + _vs(r.get("peak_mem_gib"),
                                                                                   r.get("predicted_peak_gib"))),
    ("tokens/s", "right", lambda r: _fmt(r.get("tokens_per_s"), ",.0f")),
    ("division", "left", lambda r: name(division_label(r))),
)
# the order columns are kept in when the terminal is too narrow for all of them: the measurements
# before the descriptions
KEEP_ORDER = ("run", "status", "engine", TIME, "GPUs", MFU, "tok/s/GPU", "GBS/MBS", "layout",
              "division", "eval / target", "samples", "step s (plan)", "peak GiB (plan)", "tokens/s")


PIPE_WIDTH = 120  # the width a pipe or log file gets without COLUMNS


def table_width(widths: list[int]) -> int:
    """Characters a rich Table with these column widths takes: a border and two spaces of padding each."""
    return sum(widths) + 3 * len(widths) + 1


def fit_columns(headers: list[str], cells: list[list[str]], width: int | None,
                keep_order: tuple[str, ...] | None = None) -> list[int]:
    """Indices of the columns kept, in display order, so that every value shows whole within ``width``
    characters (None: all). Columns are dropped last-first from ``keep_order`` (default: the display
    order), never truncated."""
    need = [max([len(line) for line in h.split("\n")] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    order = [headers.index(h) for h in (keep_order or headers) if h in headers]
    order += [i for i in range(len(headers)) if i not in order]
    keep = list(order)
    while width is not None and len(keep) > 1 and table_width([need[i] for i in keep]) > width:
        keep.pop()
    return sorted(keep)


def print_table(runs: list[dict], console: Console | None = None, wide: bool = False, trials_left_out: int = 0,
                all_runs: list[dict] | None = None) -> None:
    """The runs, one table per workload, one line per run with whole values: on a narrow terminal the
    less important columns are left out (and named), ``wide`` keeps them all. ``all_runs`` (default:
    ``runs``) are the runs the listing was cut from (``report --limit``): the projection is of them all,
    and the header says how many were not listed."""
    all_runs = runs if all_runs is None else all_runs
    console = console or Console()
    width = None if wide else (console.width if console.is_terminal else int(os.environ.get("COLUMNS", PIPE_WIDTH)))
    left = f"; {trials_left_out} tune trials left out (--trials shows them)" if trials_left_out else ""
    cut = (f"the newest {len(runs)} of {len(all_runs)} runs listed (--limit); {len(all_runs) - len(runs)} older "
           "runs not listed" if len(runs) < len(all_runs) else f"{len(runs)} runs, every one listed")
    console.print(f"trainperf runs: {cut}{left}", soft_wrap=True, highlight=False)
    dropped: set[str] = set()
    for workload in dict.fromkeys(r["workload"] for r in runs):  # newest workload first
        dropped |= _workload_table([r for r in runs if r["workload"] == workload], workload, console, width, wide)
    if dropped:
        console.print(f"columns left out to fit {width}: {', '.join(h.replace(chr(10), ' ') for h in KEEP_ORDER if h in dropped)} "
                      "(--wide shows every column)", soft_wrap=True, highlight=False)
    if any(precision_of(r) == "fp8" and r.get("mfu") is not None for r in runs):
        console.print(MFU_NOTE, soft_wrap=True, highlight=False)
    if "layout" not in dropped and any("(i1F1B)" in _layout(r) for r in runs):
        console.print(LAYOUT_NOTE, soft_wrap=True, highlight=False)
    print_projection(all_runs, console)
    failed = [r for r in runs if r["status"] == "failed" and r.get("status_reason") and not is_probe(r)]
    for r in failed[:5]:
        console.print(f"[red]{escape(name(r['run_id']))}[/red]: {escape(name(r['status_reason'], 400))}", soft_wrap=True)


def _workload_table(runs: list[dict], workload: str, console: Console, width: int | None, wide: bool) -> set[str]:
    """One workload's table; the headers of the columns left out to fit."""
    # an engine column only when two engines' runs are listed together; else the title names it
    engines = sorted({engine_of(r) for r in runs})
    columns = RUN_COLUMNS if len(engines) > 1 else [c for c in RUN_COLUMNS if c[0] != "engine"]
    headers = [c[0] for c in columns]
    cells = [[c[2](r) for c in columns] for r in runs]
    keep = fit_columns(headers, cells, width, KEEP_ORDER)
    whose = "" if len(engines) > 1 or not any(is_imported(r) for r in runs) else f", {engines[0]} (imported)"
    table = Table(title=escape(f"{name(workload)}: {len(runs)} run{'s' * (len(runs) != 1)}{name(whose)}"),
                  show_lines=False, title_justify="left")
    for i in keep:
        table.add_column(headers[i], justify=columns[i][1], no_wrap=True)
    for r, row in zip(runs, cells):
        style = "" if is_probe(r) else {"success": "green", "failed": "red", "running": "yellow",
                                        "hung": "magenta"}.get(r["status"], "")
        table.add_row(*[f"[{style}]{escape(row[i])}[/{style}]" if headers[i] == "status" and style else escape(row[i])
                       for i in keep])
    need = table_width([max([len(line) for line in headers[i].split("\n")] + [len(row[i]) for row in cells])
                        for i in keep])
    # a pipe, a log file or --wide: as wide as the table needs, so that rich never squeezes a value
    out = console if console.is_terminal and not wide else Console(width=max(need, width or 0, PIPE_WIDTH),
                                                                   file=console.file)
    out.print(table)
    return {headers[i] for i in range(len(headers)) if i not in keep}


def print_projection(runs: list[dict], console: Console) -> None:
    """The projected scaling table (report/projection.py), when throughput runs of a benchmark exist."""
    from trainperf.report.projection import projected_scaling_rows

    rows = projected_scaling_rows(runs)
    if not rows:
        return
    t = Table(title="projected time to train: throughput runs x the RCP's samples to converge (a projection, "
                    "not a result)")
    for col in ("benchmark", "GPUs", "DP", "TP", "PP", "CP", "SP", "GBS", "MBS", "samples/s", "ref. samples",
                "evals s", "projected min", "speedup", "efficiency", MFU_HEADER):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(r["benchmark"], str(r["gpus"]), _fmt(r.get("dp")), _fmt(r.get("tp")), _fmt(r.get("pp")),
                  _fmt(r.get("cp")), "y" if r.get("sp") else "-", _fmt(r.get("gbs")), _fmt(r.get("mbs")),
                  _fmt(r["samples_per_s"], ".3f"), f"{r['reference_samples']:.0f}",
                  f"{r['eval_s']:.0f} ({r['eval_source']})", _fmt(r["projected_s"] / 60, ".1f"),
                  _fmt(r["speedup"], ".2f"), _fmt(100 * r["efficiency"], ".0f") + "%",
                  _fmt(None if r.get("mfu") is None else 100 * r["mfu"], ".1f"))
    console.print(t)
