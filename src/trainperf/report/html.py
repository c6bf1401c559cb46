"""The morning report: scaling table, predicted vs measured, published MLPerf results, plots -- one
self-contained HTML page (plots embedded as PNG data URIs, no external assets)."""

from __future__ import annotations

import base64
import html
import io
import json
import os
import statistics
import time
from collections import defaultdict

from trainperf.core.errors import SpecError
from trainperf.mlperf.published import LLAMA2_70B_LORA, SOURCE
from trainperf.mlperf.score import read_run, score_runs
from trainperf.report.projection import (
    layout_columns,
    projected_scaling_rows,
    with_speedup,
)


def scaling_rows(runs: list[dict]) -> list[dict]:
    """Per workload and GPU count, the fastest successful run; speedup against the smallest GPU
    count of that workload and efficiency against ideal (linear) scaling."""
    best: dict[tuple[str, int], dict] = {}
    for r in runs:
        if r["status"] != "success" or r.get("time_to_train_s") is None:
            continue
        k = (r["workload"], r["world_size"])
        if k not in best or r["time_to_train_s"] < best[k]["time_to_train_s"]:
            best[k] = r
    rows = [{"workload": w, "gpus": n, "layout": r["layout"], **layout_columns(r), "time_to_train_s": r["time_to_train_s"],
             "run_id": r["run_id"], "tokens_per_s_per_gpu": r.get("tokens_per_s_per_gpu"), "mfu": r.get("mfu"),
             "runs": sum(1 for x in runs if x["workload"] == w and x["world_size"] == n and x["status"] == "success")}
            for (w, n), r in sorted(best.items())]
    return with_speedup(rows, "workload", "time_to_train_s")


def olympic_scores(runs: list[dict], min_runs: int = 3) -> list[dict]:
    """The MLPerf score of each (workload, layout, GPUs) group with at least ``min_runs`` finished runs,
    computed from their MLPerf logs exactly as `trainperf score` does: olympic mean in minutes (a single
    non-converged run dropped as the slowest), RCP verdict and scaling for closed-division groups, and
    whether the group is a valid MLPerf score (the benchmark's run count, at most one failure)."""
    groups = defaultdict(list)
    for r in runs:
        if r["status"] in ("success", "failed") and r.get("mllog_path") and os.path.isfile(r["mllog_path"]):
            groups[(r["workload"], r["layout"], r["world_size"])].append(r)
    out = []
    for (w, layout, n), members in sorted(groups.items()):
        if len(members) < min_runs:
            continue
        try:
            score = score_runs([read_run(r["mllog_path"], run_id=r["run_id"]) for r in members])
        except SpecError as exc:  # e.g. logs of mixed GBS: not one score
            out.append({"workload": w, "layout": layout, "gpus": n, "runs": len(members), "score_min": None,
                        "valid": False, "verdict": str(exc)})
            continue
        rcp = score.rcp or {}
        out.append({"workload": w, "layout": layout, "gpus": n, "runs": len(members), "score_min": score.score_minutes,
                    "valid": score.valid, "verdict": score.reason or "valid MLPerf score",
                    "rcp": ("pass" if rcp.get("passed") else "fail") if "passed" in rcp else rcp.get("message", "-")})
    return out


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def plots(runs: list[dict], steps_by_run: dict[str, list[dict]], scaling: list[dict]) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    if scaling:
        with_mfu = any(r["mfu"] for r in scaling)  # CPU runs have no honest MFU: no empty panel
        fig, axes = plt.subplots(1, 2 if with_mfu else 1, figsize=(11 if with_mfu else 6, 4), squeeze=False)
        ax1, ax2 = axes[0][0], (axes[0][1] if with_mfu else None)
        for w in sorted({r["workload"] for r in scaling}):
            rows = [r for r in scaling if r["workload"] == w]
            n = [r["gpus"] for r in rows]
            t = [r["time_to_train_s"] / 60 for r in rows]
            ax1.plot(n, t, "o-", label=w)
            ax1.plot(n, [t[0] * n[0] / x for x in n], ":", color="grey")
            if ax2 is not None:
                ax2.plot(n, [100 * (r["mfu"] or 0) for r in rows], "o-", label=w)
        pub = [p for p in LLAMA2_70B_LORA if p[3] == "H200"]
        ax1.scatter([p[4] for p in pub], [p[6] for p in pub], marker="x", color="black", label="published llama2_70b_lora H200")
        panels = [(ax1, "time to train vs GPUs (dotted: ideal)", "minutes")] + (
            [(ax2, "MFU vs GPUs", "MFU %")] if ax2 is not None else [])
        for ax, title, ylabel in panels:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("GPUs")
            ax.set_ylabel(ylabel)
            ax.set_title(title)
            ax.legend(fontsize=7)
        ax1.set_yscale("log")
        out.append(("Scaling", _png(fig)))
        plt.close(fig)
    curves = [r for r in runs if steps_by_run.get(r["run_id"])][:8]
    if curves:
        fig, ax = plt.subplots(figsize=(11, 4))
        for r in curves:
            s = steps_by_run[r["run_id"]]
            ax.plot([x["samples"] for x in s], [x["loss"] for x in s], label=f"{r['workload']} {r['run_id'][-6:]} ({r['world_size']})")
        ax.set_xlabel("samples")
        ax.set_ylabel("train loss")
        ax.set_title("Loss curves (newest runs)")
        ax.legend(fontsize=7)
        out.append(("Loss curves", _png(fig)))
        plt.close(fig)
    traced = trace_breakdowns(runs)
    if traced:
        fig, ax = plt.subplots(figsize=(11, 0.6 * len(traced) + 1.5))
        labels = [f"{t['workload']} {t['layout']} ({t['run_id'][-6:]}, {t['overlap_pct']:.0f}% of comm overlapped)"
                  for t in traced]
        left = [0.0] * len(traced)
        # compute + exposed communication + idle = the step (overlapped communication hides under compute)
        for key, label, color in (("compute_s", "compute", "tab:blue"), ("exposed_comm_s", "communication, exposed", "tab:red"),
                                  ("idle_s", "idle", "lightgrey")):
            widths = [1e3 * t[key] for t in traced]
            ax.barh(labels, widths, left=left, label=label, color=color)
            left = [a + b for a, b in zip(left, widths)]
        ax.set_xlabel("ms per step (mean over ranks, from `trainperf trace`)")
        ax.set_title("Where the step time goes")
        ax.legend(fontsize=7, loc="lower right")
        out.append(("Step-time breakdown", _png(fig)))
        plt.close(fig)
    return out


def trace_breakdowns(runs: list[dict]) -> list[dict]:
    """The per-step compute / communication / idle totals of every stored run that `trainperf trace`
    analysed (RUN_DIR/trace_summary.json)."""
    out = []
    for r in runs:
        path = os.path.join(r.get("out_dir") or "", "trace_summary.json")
        if not r.get("out_dir") or not os.path.isfile(path):
            continue
        try:
            tot = json.load(open(path))["totals"]
        except (ValueError, KeyError, OSError):
            continue
        out.append({"run_id": r["run_id"], "workload": r["workload"], "layout": r.get("layout") or "",
                    "compute_s": tot["compute_s"], "exposed_comm_s": tot["exposed_comm_s"], "idle_s": tot["idle_s"],
                    "step_s": tot["step_s"], "overlap_pct": tot.get("overlap_pct") or 0.0})
    return out


def _layout_cells(r: dict) -> list[str]:
    """DP, TP, PP, CP, SP, GBS, MBS cells of a scaling row (report/projection.py: layout_columns)."""
    return [_f(r.get(k), "") for k in ("dp", "tp", "pp", "cp")] + ["y" if r.get("sp") else "-", _f(r.get("gbs"), ""),
                                                                   _f(r.get("mbs"), "")]


def _table(headers: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _f(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def render(runs: list[dict], steps_by_run: dict[str, list[dict]]) -> str:
    scaling = scaling_rows(runs)
    scores = olympic_scores(runs)
    parts = [f"<h1>trainperf report</h1><p>{len(runs)} runs, generated {time.strftime('%Y-%m-%d %H:%M')}</p>"]
    parts.append("<h2>Scaling table</h2>" + (_table(
        ["workload", "GPUs", "DP", "TP", "PP", "CP", "SP", "GBS", "MBS", "time to train (s)", "speedup", "efficiency",
         "tokens/s/GPU", "MFU", "runs"],
        [[r["workload"], r["gpus"], *_layout_cells(r),
          _f(r["time_to_train_s"], ".1f"), _f(r["speedup"], ".2f"),
          _f(100 * r["efficiency"], ".0f") + "%", _f(r["tokens_per_s_per_gpu"], ",.0f"),
          _f(None if r["mfu"] is None else 100 * r["mfu"], ".1f"), r["runs"]] for r in scaling])
        if scaling else "<p>No successful runs yet.</p>"))
    projected = projected_scaling_rows(runs)
    if projected:
        parts.append("<h2>Projected time to train (throughput runs × the RCP's samples to converge)</h2>"
                     "<p>A projection, not a time to train: measured samples/s of short runs, the MLPerf reference "
                     "samples to converge at their GBS, plus the recipe's evals (measured eval pass, or planned)."
                     "</p>" + _table(
                         ["benchmark", "GPUs", "DP", "TP", "PP", "CP", "SP", "GBS", "MBS", "samples/s",
                          "reference samples", "evals (s)", "projected (min)", "speedup", "efficiency", "tokens/s/GPU",
                          "MFU"],
                         [[r["benchmark"], r["gpus"], *_layout_cells(r), _f(r["samples_per_s"], ".3f"),
                           f"{r['reference_samples']:.0f} ({html.escape(r['reference'])})",
                           f"{r['eval_s']:.0f} ({r['eval_source']})", _f(r["projected_s"] / 60, ".1f"),
                           _f(r["speedup"], ".2f"), _f(100 * r["efficiency"], ".0f") + "%",
                           _f(r.get("tokens_per_s_per_gpu"), ",.0f"),
                           _f(None if r.get("mfu") is None else 100 * r["mfu"], ".1f")] for r in projected]))
    if scores:
        parts.append("<h2>MLPerf scores (olympic mean, minutes; `trainperf score` for the full verdict)</h2>" + _table(
            ["workload", "layout", "GPUs", "runs", "score", "RCP", "verdict"],
            [[s["workload"], s["layout"], s["gpus"], s["runs"], _f(s["score_min"], ".2f"), s.get("rcp", "-"),
              s["verdict"]] for s in scores]))
    parts.append("<h2>Runs</h2>" + _table(
        ["run", "workload", "status", "GPUs", "layout", "time to train (s)", "samples", "eval / target", "tokens/s/GPU",
         "MFU", "peak GiB (predicted)", "step s (predicted)", "division"],
        [[r["run_id"], r["workload"], r["status"], r["world_size"], r["layout"], _f(r.get("time_to_train_s"), ".1f"),
          _f(r.get("samples_to_target"), "d"), f"{_f(r.get('final_eval_loss'), '.4f')} / {_f(r.get('target'), '.4f')}",
          _f(r.get("tokens_per_s_per_gpu"), ",.0f"), _f(None if r.get("mfu") is None else 100 * r["mfu"], ".1f"),
          f"{_f(r.get('peak_mem_gib'), '.2f')} ({_f(r.get('predicted_peak_gib'), '.2f')})",
          f"{_f(r.get('step_time_s'), '.3f')} ({_f(r.get('predicted_step_time_s'), '.3f')})",
          (r.get("division") or "-") + ("" if r.get("comparable") else " (not comparable)")] for r in runs]))
    errs = [abs(r["predicted_step_time_s"] / r["step_time_s"] - 1) for r in runs
            if r.get("predicted_step_time_s") and r.get("step_time_s")]
    if errs:
        parts.append(f"<p>Planner step-time error over {len(errs)} runs: median {100 * statistics.median(errs):.1f}%, "
                     f"max {100 * max(errs):.1f}%.</p>")
    parts.append("<h2>Published MLPerf llama2_70b_lora results</h2><p>" + html.escape(SOURCE) + "</p>" + _table(
        ["round", "org", "system", "GPU", "GPUs", "GBS", "minutes"], [list(p) for p in LLAMA2_70B_LORA]))
    for title, uri in plots(runs, steps_by_run, scaling):
        parts.append(f"<h2>{html.escape(title)}</h2><img alt='{html.escape(title)}' src='{uri}'>")
    style = ("body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;font-size:12px;"
             "margin-bottom:1em}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}th{background:#eee}"
             "img{max-width:100%}")
    return f"<!doctype html><html><head><meta charset='utf-8'><title>trainperf report</title><style>{style}</style></head>" \
           f"<body>{''.join(parts)}</body></html>"
