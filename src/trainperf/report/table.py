"""The table of stored runs (rich on a terminal, JSON with --json)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from trainperf.core.results import REPORT_COLUMNS

# a run's results (RunSummary's report columns) and what the planner predicted for it
COLUMNS = (*REPORT_COLUMNS, "predicted_step_time_s", "predicted_peak_gib")


def rows_for_json(runs: list[dict]) -> list[dict]:
    return [{k: r.get(k) for k in COLUMNS} | {"comparable": bool(r.get("comparable"))} for r in runs]


def _fmt(v, spec: str = "") -> str:
    if v is None:
        return "-"
    return format(v, spec) if spec else str(v)


def _vs(measured, predicted) -> str:
    """' (pred X, +e%)' -- the planner's prediction next to the measurement, with its error."""
    if measured is None or not predicted:
        return ""
    return f" ({predicted:.2f}, {100 * (predicted / measured - 1):+.0f}%)"


def print_table(runs: list[dict], console: Console | None = None) -> None:
    console = console or Console(width=None if Console().is_terminal else 200)
    table = Table(title=f"trainperf runs ({len(runs)})", show_lines=False)
    for col, justify in (("run", "left"), ("workload", "left"), ("status", "left"), ("layout", "left"),
                         ("procs", "right"), ("time to train", "right"), ("samples", "right"),
                         ("eval / target", "right"), ("tokens/s", "right"), ("tok/s/gpu", "right"),
                         ("MFU", "right"), ("peak GiB", "right"), ("step s (plan)", "right"),
                         ("division", "left")):
        table.add_column(col, justify=justify)
    for r in runs:
        status = r["status"]
        style = {"success": "green", "failed": "red", "running": "yellow", "hung": "magenta"}.get(status, "")
        layout = (r.get("layout") or "").replace("dp_replicate=", "R").replace(",dp_shard=", "xS").split(",tp")[0]
        division = (r.get("division") or "-") + ("" if r.get("comparable") else " (not comparable)")
        table.add_row(
            r["run_id"], r["workload"], f"[{style}]{status}[/{style}]" if style else status, layout,
            _fmt(r.get("world_size")),
            _fmt(r.get("time_to_train_s"), ".1f") + (" s" if r.get("time_to_train_s") is not None else ""),
            _fmt(r.get("samples_to_target")),
            f"{_fmt(r.get('final_eval_loss'), '.4f')} / {_fmt(r.get('target'), '.4f')}",
            _fmt(r.get("tokens_per_s"), ",.0f"), _fmt(r.get("tokens_per_s_per_gpu"), ",.0f"),
            _fmt(None if r.get("mfu") is None else 100 * r["mfu"], ".1f") + ("%" if r.get("mfu") is not None else ""),
            _fmt(r.get("peak_mem_gib"), ".2f") + _vs(r.get("peak_mem_gib"), r.get("predicted_peak_gib")),
            _fmt(r.get("step_time_s"), ".3f") + _vs(r.get("step_time_s"), r.get("predicted_step_time_s")), division,
        )
    console.print(table)
    print_projection(runs, console)
    failed = [r for r in runs if r["status"] == "failed" and r.get("status_reason")]
    for r in failed[:5]:
        console.print(f"[red]{r['run_id']}[/red]: {r['status_reason']}")


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
