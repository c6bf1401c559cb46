"""The table of stored runs (rich on a terminal, JSON with --json)."""

from __future__ import annotations

import os

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trainperf.core.results import engine_of
from trainperf.report.columns import fmt, json_row, keep_headers, terminal_columns, terminal_layout
from trainperf.report.labels import MFU_HEADER, MFU_NOTE, is_probe, name, precision_of
from trainperf.report.scaling import is_imported


def rows_for_json(runs: list[dict]) -> list[dict]:
    """Each run's report columns (``report/columns.py``): its result fields, with the engine that ran it
    (trainperf, or an imported engine such as nemo), its layout's degrees (DP2·TP4·SP), GBS, MBS,
    whether it is a trial, its precision and, for an fp8 run, its MFU against the fp8 peak (``mfu`` is
    against the bf16 peak)."""
    return [json_row(r) for r in runs]


LAYOUT_NOTE = "layout: (i1F1B) is the Interleaved1F1B pipeline schedule."


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
        console.print(f"columns left out to fit {width}: {', '.join(h.replace(chr(10), ' ') for h in keep_headers() if h in dropped)} "
                      "(--wide shows every column)", soft_wrap=True, highlight=False)
    if any(precision_of(r) == "fp8" and r.get("mfu") is not None for r in runs):
        console.print(MFU_NOTE, soft_wrap=True, highlight=False)
    if "layout" not in dropped and any("(i1F1B)" in terminal_layout(r) for r in runs):
        console.print(LAYOUT_NOTE, soft_wrap=True, highlight=False)
    print_projection(all_runs, console)
    failed = [r for r in runs if r["status"] == "failed" and r.get("status_reason") and not is_probe(r)]
    for r in failed[:5]:
        console.print(f"[red]{escape(name(r['run_id']))}[/red]: {escape(name(r['status_reason'], 400))}", soft_wrap=True)


def _workload_table(runs: list[dict], workload: str, console: Console, width: int | None, wide: bool) -> set[str]:
    """One workload's table; the headers of the columns left out to fit."""
    # an engine column only when two engines' runs are listed together; else the title names it
    engines = sorted({engine_of(r) for r in runs})
    columns = [c for c in terminal_columns() if len(engines) > 1 or c[0] != "engine"]
    headers = [c[0] for c in columns]
    cells = [[c[2](r) for c in columns] for r in runs]
    keep = fit_columns(headers, cells, width, keep_headers())
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
        t.add_row(r["benchmark"], str(r["gpus"]), fmt(r.get("dp")), fmt(r.get("tp")), fmt(r.get("pp")),
                  fmt(r.get("cp")), "y" if r.get("sp") else "-", fmt(r.get("gbs")), fmt(r.get("mbs")),
                  fmt(r["samples_per_s"], ".3f"), f"{r['reference_samples']:.0f}",
                  f"{r['eval_s']:.0f} ({r['eval_source']})", fmt(r["projected_s"] / 60, ".1f"),
                  fmt(r["speedup"], ".2f"), fmt(100 * r["efficiency"], ".0f") + "%",
                  fmt(None if r.get("mfu") is None else 100 * r["mfu"], ".1f"))
    console.print(t)
