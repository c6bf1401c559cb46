"""The morning report, one self-contained HTML page (plots embedded as PNG data URIs, no external
assets): the system the runs ran on; per workload a scaling table of one (GPU count, layout, GBS, MBS)
per row with its anomalies, time to train against GPUs (beside the published results of the same
benchmark and GPU model, for comparable runs only) and eval loss against samples with the target;
MLPerf scores; predicted against measured; every run. Another engine's imported runs (`trainperf
import`) have rows and plot series of their own, named by engine, and are never pooled, scored or
projected with this engine's runs. Tune trials are left out by the caller unless asked for."""

from __future__ import annotations

import html
import json
import os
import statistics
import time
from collections import defaultdict

from trainperf.core.errors import SpecError
from trainperf.core.results import OUR_ENGINE, engine_of
from trainperf.mlperf.published import LLAMA2_70B_LORA, SOURCE
from trainperf.mlperf.score import read_run, score_runs
from trainperf.report.plots import (
    eval_curves_png,
    predicted_vs_measured_png,
    step_breakdown_png,
    time_to_train_png,
)
from trainperf.report.projection import projected_scaling_rows
from trainperf.report.scaling import (
    ScalingRow,
    full_layout,
    gpu_family,
    gpu_model_of,
    is_imported,
    row_key,
    scaling_key,
    scaling_table,
)


def olympic_scores(runs: list[dict], min_runs: int = 3) -> list[dict]:
    """The MLPerf score of each (engine, system, GPU model, workload, layout, GPUs) group with at least ``min_runs`` finished runs,
    computed from their MLPerf logs exactly as `trainperf score` does: olympic mean in minutes (a single
    non-converged run dropped as the slowest), RCP verdict and scaling for closed-division groups, and
    whether the group is a valid MLPerf score (the benchmark's run count, at most one failure)."""
    groups = defaultdict(list)
    for r in runs:
        if r["status"] in ("success", "failed") and r.get("mllog_path") and os.path.isfile(r["mllog_path"]):
            groups[scaling_key(r)].append(r)  # one engine's runs of one system form a set, never a mix
    out = []
    for (engine, system, _gpu, w, n, layout, _gbs, _mbs), members in sorted(groups.items(), key=lambda kv: str(kv[0])):
        if len(members) < min_runs:
            continue
        try:
            score = score_runs([read_run(r["mllog_path"], run_id=r["run_id"]) for r in members])
        except SpecError as exc:  # e.g. logs of mixed GBS: not one score
            out.append({"engine": engine, "system": system, "workload": w, "layout": layout, "gpus": n,
                        "runs": len(members), "score_min": None,
                        "valid": False, "verdict": str(exc)})
            continue
        rcp = score.rcp or {}
        out.append({"engine": engine, "system": system, "workload": w, "layout": layout, "gpus": n, "runs": len(members),
                    "score_min": score.score_minutes,
                    "olympic_min": score.olympic_mean_minutes,
                    "valid": score.valid, "verdict": score.reason or "valid MLPerf score",
                    "rcp": ("pass" if rcp.get("passed") else "fail") if "passed" in rcp else rcp.get("message", "-")})
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
            with open(path) as f:
                tot = json.load(f)["totals"]
        except (ValueError, KeyError, OSError):
            continue
        out.append({"run_id": r["run_id"], "workload": r["workload"], "layout": r.get("layout") or "",
                    "compute_s": tot["compute_s"], "exposed_comm_s": tot["exposed_comm_s"], "idle_s": tot["idle_s"],
                    "step_s": tot["step_s"], "overlap_pct": tot.get("overlap_pct") or 0.0})
    return out




def _table(headers: list[str], rows: list[list], classes: list[str] | None = None) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(f"<tr class='{classes[i] if classes else ''}'>" + "".join(
        f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for i, row in enumerate(rows))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _f(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _img(title: str, uri: str | None) -> str:
    return "" if uri is None else f"<figure><img alt='{html.escape(title)}' src='{uri}'></figure>"


def _json(text: str | None) -> dict:
    try:
        return json.loads(text or "{}")
    except ValueError:
        return {}


def system_section(runs: list[dict], preflight: dict | None) -> str:
    """What the runs ran on: device, count, hosts, software (from the runs' rows), the newest preflight."""
    seen: dict[tuple, list[str]] = defaultdict(list)
    for r in [r for r in runs if not is_imported(r)]:
        hw, sw = _json(r.get("hardware_json")), _json(r.get("software_json"))
        device = hw.get("gpu") or (f"CPU {hw.get('cpu') or ''} ({hw.get('cores')} cores)" if hw else "-")
        soft = ", ".join(f"{k} {v}" for k, v in sorted(sw.items()) if v)
        nodes = hw.get("nodes")  # recorded since the node count was; older rows say nothing
        seen[(device, r.get("host") or "-", soft or "-")].append(
            (int(r["world_size"]), f"{r['world_size']}" + (f" on {nodes} node{'s' * (nodes != 1)}" if nodes else "")))
    rows = [[dev, host, ", ".join(label for _, label in sorted(set(n))), soft]
            for (dev, host, soft), n in sorted(seen.items())]
    out = "<h2>System</h2>" + _table(["device", "host (rank 0)", "GPU / process counts run", "software"], rows)
    if preflight:
        hosts = ", ".join(_json(preflight.get("hosts_json")) or [preflight.get("host") or "-"])
        measured = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                             for k, v in sorted((preflight.get("overrides") or {}).items()))
        out += (f"<p>Newest preflight ({time.strftime('%Y-%m-%d %H:%M', time.localtime(preflight['created_at']))}): "
                f"{html.escape(preflight.get('gpu') or '-')} × {preflight['world_size']} on {html.escape(hosts)}; "
                f"{preflight['n_pass']} pass, {preflight['n_warn']} warn, {preflight['n_fail']} fail. "
                f"Measured link and device rates: {html.escape(measured or '-')}.</p>")
    else:
        out += "<p>No GPU preflight in this store (`trainperf preflight` measures the GPUs and links).</p>"
    return out + imported_systems_section(runs)


def imported_systems_section(runs: list[dict]) -> str:
    """The submitted systems behind the imported runs of other engines: engine, submitter, system, GPUs,
    nodes, network and precision, as their system descriptions and configs give them."""
    seen: dict[tuple, int] = defaultdict(int)
    for r in runs:
        if is_imported(r):
            hw, sw = _json(r.get("hardware_json")), _json(r.get("software_json"))
            seen[(engine_of(r), sw.get("round") or "-", sw.get("org") or "-", hw.get("system") or "-",
                  hw.get("gpu") or "-", r["world_size"], hw.get("nodes") or "-",
                  hw.get("interconnect") or hw.get("network") or "-", sw.get("precision") or "-")] += 1
    if not seen:
        return ""
    rows = [[*k, n] for k, n in sorted(seen.items(), key=lambda kv: str(kv[0]))]
    return ("<p>Imported runs of other engines (read from their published MLPerf logs by `trainperf import`):</p>"
            + _table(["engine", "round", "submitter", "system", "GPU", "GPUs", "nodes", "interconnect", "precision",
                      "runs"], rows))


def scaling_section(rows: list[ScalingRow]) -> str:
    """One engine's row never serves as another's base; the engine (and an imported row's system) is
    named in each row."""
    imported = any(r.engine != OUR_ENGINE for r in rows)
    headers = ["engine", *(["system"] if imported else []), "GPU", "GPUs", "layout", "GBS", "MBS", "time to train (min)", "basis", "runs (ok)", "tokens/s/GPU",
               "TFLOP/s/GPU", "MFU", "speedup", "efficiency", "anomalies"]
    cells = [[r.engine, *([r.system or "-"] if imported else []), r.gpu_model or "-", r.gpus, r.layout, _f(r.gbs, ""), _f(r.mbs, ""),
              _f(None if r.time_to_train_s is None else r.time_to_train_s / 60, ".2f"), r.time_basis or "-",
              f"{r.runs} ({r.succeeded})", _f(r.tokens_per_s_per_gpu, ",.0f"), _f(r.tflops_per_gpu, ".3g"),
              _pct(r.mfu), "-" if r.speedup is None else f"{r.speedup:.2f}× ({r.speedup_basis})",
              _pct(r.efficiency), "; ".join(r.anomalies) or "-"] for r in rows]
    return _table(headers, cells, ["anomaly" if r.anomalies else "" for r in rows])


def published_points_for(runs: list[dict]) -> tuple[list[tuple], str]:
    """Published llama2_70b_lora points for comparable runs of that benchmark, on their GPU model only."""
    comparable = [r for r in runs if r.get("comparable")]
    benchmarks = {_json(r.get("spec_json")).get("mlperf", {}).get("benchmark") for r in comparable}
    if "llama2_70b_lora" not in benchmarks:
        return [], ""
    gpus = {_json(r.get("hardware_json")).get("gpu") or "" for r in comparable}
    models = {m for m in ("H100", "H200") if any(m in g for g in gpus)}
    points, _ = split_imported([p for p in LLAMA2_70B_LORA if p[3] in models], runs)
    return points, f"published llama2_70b_lora, {', '.join(sorted(models))} (MLCommons)"


def is_imported_point(point: tuple, runs: list[dict]) -> bool:
    """Whether a published llama2_70b_lora result (round, org, system, GPU, GPUs, GBS, minutes) is also
    among the imported runs: same round, submitter, GPU model, GPU count and GBS."""
    rnd, org, _system, gpu, gpus, gbs, _minutes = point
    for r in runs:
        if not is_imported(r) or r["workload"] != "llama2_70b_lora" or r["world_size"] != gpus:
            continue
        sw = _json(r.get("software_json"))
        if (sw.get("round") == rnd and str(sw.get("org") or "").lower() == org.lower() and gpu in gpu_model_of(r)
                and row_key(r)[3] == gbs):
            return True
    return False


def split_imported(points: list[tuple], runs: list[dict]) -> tuple[list[tuple], list[tuple]]:
    """(published points to show, those left out because their logs are imported as runs): one
    published result is shown once, as the imported runs, which carry its layout and every run."""
    kept = [p for p in points if not is_imported_point(p, runs)]
    return kept, [p for p in points if p not in kept]


def plotted_imported_rows(rows: list[ScalingRow], runs: list[dict]) -> list[ScalingRow]:
    """The rows of a workload's plot: this engine's, and imported engines' on a GPU model this engine's
    comparable runs used (all of them when the workload has only imported runs)."""
    ours = [r for r in runs if not is_imported(r)]
    if not ours:
        return rows
    models = {gpu_family(gpu_model_of(r)) for r in ours if r.get("comparable") and gpu_model_of(r)}
    return [r for r in rows if r.engine == OUR_ENGINE or gpu_family(r.gpu_model) in models]


def workload_section(workload: str, runs: list[dict], rows: list[ScalingRow], evals_by_run: dict[str, list[dict]]) -> str:
    published, label = published_points_for(runs)
    targets = [r["target"] for r in runs if r.get("target") is not None]
    parts = [f"<h2>{html.escape(workload)}</h2>",
             "<p>One row per engine, GPU model, GPU count, layout, GBS and MBS (and submitted system for "
             "imported runs). Time to train is the olympic mean where a row has three or more successful runs; "
             "speedup and efficiency are against the fastest row of the same engine and GPU model at the fewest "
             "GPUs with the same GBS.</p>" if rows else "<p>No finished runs with a measurement.</p>"]
    if rows:
        parts.append(scaling_section(rows))
    plotted = plotted_imported_rows(rows, runs)
    parts.append("<div class='plots'>" + _img("time to train vs GPUs", time_to_train_png(workload, plotted, published, label))
                 + _img("eval loss vs samples", eval_curves_png(workload, runs, evals_by_run,
                                                                targets[0] if targets else None)) + "</div>")
    return "".join(parts)


def predicted_section(runs: list[dict]) -> str:
    pred = [r for r in runs if r.get("predicted_step_time_s") and r.get("step_time_s")]
    if not pred:
        return ""
    errs = [abs(r["predicted_step_time_s"] / r["step_time_s"] - 1) for r in pred]
    cells = [[r["run_id"], r["workload"], r["world_size"], full_layout_of(r), _f(r["step_time_s"], ".4f"),
              _f(r["predicted_step_time_s"], ".4f"), f"{100 * (r['predicted_step_time_s'] / r['step_time_s'] - 1):+.0f}%",
              _f(r.get("peak_mem_gib"), ".2f"), _f(r.get("predicted_peak_gib"), ".2f")] for r in pred]
    png = predicted_vs_measured_png([(r["predicted_step_time_s"], r["step_time_s"], r["workload"]) for r in pred])
    return ("<h2>Predicted vs measured</h2>"
            f"<p>Planner step-time error over {len(errs)} runs: median {100 * statistics.median(errs):.1f}%, "
            f"max {100 * max(errs):.1f}%.</p>" + _img("predicted vs measured", png) + _table(
                ["run", "workload", "GPUs", "layout", "step s", "predicted", "error", "peak GiB", "predicted GiB"], cells))


def full_layout_of(run: dict) -> str:
    return row_key(run)[2]


def _projected_section(runs: list[dict]) -> str:
    projected = projected_scaling_rows(runs)
    if not projected:
        return ""
    return ("<h2>Projected time to train (throughput runs × the RCP's samples to converge)</h2>"
            "<p>A projection, not a time to train: measured samples/s of short runs, the MLPerf reference "
            "samples to converge at their GBS, plus the recipe's evals (measured eval pass, or planned). "
            "This engine's runs only: imported runs of other engines have their own times to train.</p>" + _table(
                ["benchmark", "GPUs", "layout", "GBS", "MBS", "samples/s", "reference samples", "evals (s)",
                 "projected (min)", "speedup", "efficiency", "tokens/s/GPU", "MFU"],
                [[r["benchmark"], r["gpus"], full_layout({"parallel": {"dp_shard": r.get("dp"), **{
                    k: r.get(k) for k in ("tp", "cp", "pp", "sp")}}}), _f(r.get("gbs"), ""), _f(r.get("mbs"), ""), _f(r["samples_per_s"], ".3f"),
                  f"{r['reference_samples']:.0f} ({r['reference']})", f"{r['eval_s']:.0f} ({r['eval_source']})",
                  _f(r["projected_s"] / 60, ".1f"), _f(r["speedup"], ".2f"), _pct(r["efficiency"]),
                  _f(r.get("tokens_per_s_per_gpu"), ",.0f"), _pct(r.get("mfu"))] for r in projected]))


def _scores_section(runs: list[dict]) -> str:
    scores = olympic_scores(runs)
    if not scores:
        return ""
    return "<h2>MLPerf scores (olympic mean, minutes; `trainperf score` for the full verdict)</h2>" + _table(
        ["engine", "workload", "GPUs", "layout", "runs", "olympic mean", "score", "RCP", "verdict"],
        [[s["engine"] + (f" ({s['system']})" if s["system"] else ""), s["workload"], s["gpus"], s["layout"], s["runs"], _f(s.get("olympic_min"), ".2f"),
          _f(s["score_min"], ".2f") if s["valid"] else "none (not valid)", s.get("rcp", "-"),
          s["verdict"]] for s in scores], ["" if s["valid"] else "anomaly" for s in scores])


def _runs_section(runs: list[dict]) -> str:
    return "<h2>Runs</h2>" + _table(
        ["run", "workload", "engine", "kind", "status", "GPUs", "layout", "GBS/MBS", "time to train (s)", "samples",
         "eval / target", "tokens/s/GPU", "MFU", "division"],
        [[r["run_id"], r["workload"], engine_of(r), r.get("purpose") or "run", r["status"], r["world_size"], full_layout_of(r),
          "/".join(_f(x, "") for x in row_key(r)[3:]), _f(r.get("time_to_train_s"), ".1f"),
          _f(r.get("samples_to_target"), "d"), f"{_f(r.get('final_eval_loss'), '.4f')} / {_f(r.get('target'), '.4f')}",
          _f(r.get("tokens_per_s_per_gpu"), ",.0f"), _pct(r.get("mfu")),
          (r.get("division") or "-") + ("" if r.get("comparable") else " (not comparable)")] for r in runs])


STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1400px;color:#222}h2{border-bottom:1px solid #ddd;"
         "padding-bottom:4px;margin-top:1.6em}table{border-collapse:collapse;font-size:12px;margin-bottom:1em}"
         "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}th{background:#eee}td:first-child,"
         "td:nth-child(2){text-align:left}tr.anomaly td{background:#fff4e0}.plots{display:flex;flex-wrap:wrap;"
         "gap:1em}figure{margin:0}img{max-width:100%}p.note{color:#666;font-size:12px}")


def render(runs: list[dict], evals_by_run: dict[str, list[dict]] | None = None, preflight: dict | None = None,
           trials_left_out: int = 0) -> str:
    """The whole page of these runs (the caller leaves tune trials out unless they were asked for)."""
    evals_by_run = evals_by_run or {}
    rows = scaling_table(runs)
    left = f"; {trials_left_out} tune trials left out (`report --trials` shows them)" if trials_left_out else ""
    parts = [f"<h1>trainperf report</h1><p>{len(runs)} runs{left}; generated {time.strftime('%Y-%m-%d %H:%M')}</p>",
             system_section(runs, preflight)]
    for workload in sorted({r["workload"] for r in runs}):
        parts.append(workload_section(workload, [r for r in runs if r["workload"] == workload],
                                      [r for r in rows if r.workload == workload], evals_by_run))
    parts += [_scores_section(runs), predicted_section(runs), _projected_section(runs)]
    traced = trace_breakdowns(runs)
    if traced:
        parts.append("<h2>Step-time breakdown</h2>" + _img("step-time breakdown", step_breakdown_png(traced)))
    parts.append(_runs_section(runs))
    if published_points_for(runs)[0]:
        shown, imported = split_imported(LLAMA2_70B_LORA, runs)
        why = ("" if not imported else f"<p>{len(imported)} published result(s) ({'; '.join(f'{p[0]} {p[1]} {p[4]}x{p[3]}' for p in imported)}) "
               "are shown once, as the imported runs above, not here: those carry the same logs' layout, "
               "throughput and every run's time.</p>")
        parts.append("<h2>Published MLPerf llama2_70b_lora results</h2>" + why + "<p class='note'>" + html.escape(SOURCE)
                     + "</p>" + _table(["round", "org", "system", "GPU", "GPUs", "GBS", "minutes"],
                                       [list(p) for p in shown]))
    else:
        parts.append("<p class='note'>Published MLPerf results are shown beside comparable (closed-division) runs "
                     "of their benchmark only; none of these runs is one.</p>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>trainperf report</title><style>{STYLE}</style>"
            f"</head><body>{''.join(parts)}</body></html>")
