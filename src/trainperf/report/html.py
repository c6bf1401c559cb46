"""The morning report, one self-contained HTML page (plots embedded as PNG data URIs, no external
assets): a headline per workload (the best time to train, where, against the published best); the
system the runs ran on; per workload a scaling table of one set (GPU count, layout, GBS, MBS) per row
with its notes and warnings, time to train against GPUs (beside the published results of the same
benchmark and GPU model, for closed-division runs only; open-division runs have their own table and
plot) and eval loss against samples with the target; MLPerf scores, each computed exactly as `trainperf
score` computes that set's; predicted against measured; every run. Another engine's imported runs
(`trainperf import`) have rows and plot series of their own, named by engine, and are never pooled,
scored or projected with this engine's runs. Tune trials are left out by the caller unless asked for.
Every figure is of every run given; only the runs table may be cut (``listed``), and says so. Names
from the store (run ids, GPUs, systems) are escaped for the page (``printable`` and HTML escaping)."""

from __future__ import annotations

import html
import json
import os
import re
import statistics
import time
from collections import defaultdict

from trainperf.core.errors import SpecError
from trainperf.core.hardware import gpu_model
from trainperf.core.results import OUR_ENGINE, engine_of
from trainperf.core.untrusted import printable
from trainperf.mlperf.published import PUBLISHED_TABLES, SOURCE
from trainperf.mlperf.score import run_set_of, score_stored_set
from trainperf.report.columns import page_cells, page_headers
from trainperf.report.labels import (
    MFU_HEADER,
    MFU_NOTE,
    mfu_text,
    precision_of,
)
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
    is_closed_result,
    is_imported,
    row_key,
    scaling_table,
)


def olympic_scores(runs: list[dict], min_runs: int = 3) -> list[dict]:
    """The MLPerf score of each set (`trainperf score`'s RunSet: engine, system, GPU model, GPU count,
    layout, GBS, MBS, precision) of each workload with at least ``min_runs`` finished runs with logs,
    computed as `trainperf score --workload W --gpus N --system S --layout L` computes it: the newest runs
    the benchmark is scored on, under the set's round's ruleset, olympic mean in minutes, RCP verdict and
    scaling for closed-division sets; ``score_min`` only for a valid set."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in sorted(runs, key=lambda r: -(r.get("created_at") or 0.0)):  # newest first, as the store lists them
        if r["status"] in ("success", "failed") and r.get("mllog_path") and os.path.isfile(r["mllog_path"]):
            groups[(r["workload"], run_set_of(r))].append(r)  # one set's runs, never a mix
    out = []
    for (w, rs), members in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1].label)):
        if len(members) < min_runs:
            continue
        base = {"engine": rs.engine, "system": rs.system, "workload": w, "layout": rs.layout, "gpus": rs.gpus,
                "gpu": rs.gpu, "set": rs.label, "run_set": rs, "of": len(members)}
        try:
            score = score_stored_set(members)
        except SpecError as exc:  # e.g. a log the checker cannot read: not one score
            out.append(base | {"runs": len(members), "score_min": None, "olympic_min": None, "valid": False,
                               "verdict": str(exc), "ruleset": "-", "rcp": "-", "scaling": None})
            continue
        rcp = score.rcp or {}
        out.append(base | {"runs": len(score.runs), "score_min": score.score_minutes,
                           "olympic_min": score.olympic_mean_minutes, "scaling": score.scaling_factor,
                           "valid": score.valid, "verdict": score.reason or "valid MLPerf score",
                           "ruleset": f"{score.ruleset} ({score.ruleset_basis})",
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




NUMBER = re.compile(r"^[-+]?[\d.,]+(%|×)?( \(.*\))?$")  # 1,234  42.0%  1.64× (time to train)  10 (10)


def _cell(c) -> str:
    text = printable(c, 4000) if isinstance(c, str) else str(c)
    # numbers right-aligned, words left
    return f"<td class='n'>{html.escape(text)}</td>" if NUMBER.match(text) or text == "-" else f"<td>{html.escape(text)}</td>"


def _table(headers: list[str], rows: list[list], classes: list[str] | None = None) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(f"<tr class='{classes[i] if classes else ''}'>" + "".join(
        _cell(c) for c in row) + "</tr>" for i, row in enumerate(rows))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _esc(value, limit: int = 400) -> str:
    """A name from the store, for the page."""
    return html.escape(printable(value, limit))


def _f(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _min(seconds) -> str:
    return "-" if seconds is None else f"{seconds / 60:.2f}"


def _img(title: str, uri: str | None) -> str:
    return "" if uri is None else f"<figure><img alt='{html.escape(title)}' src='{uri}'></figure>"


def _json(text: str | None) -> dict:
    try:
        value = json.loads(text or "{}")
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _s(value) -> str:
    """A field of a row's JSON as text ('-' when empty), whatever type the file gave it."""
    return "-" if value in (None, "", [], {}) else value if isinstance(value, str) else json.dumps(value, default=str)


def system_section(runs: list[dict], preflight: dict | None) -> str:
    """What the runs ran on: device, count, hosts, software (from the runs' rows), the newest preflight."""
    seen: dict[tuple, list[str]] = defaultdict(list)
    for r in [r for r in runs if not is_imported(r)]:
        hw, sw = _json(r.get("hardware_json")), _json(r.get("software_json"))
        device = _s(hw.get("gpu")) if hw.get("gpu") else (f"CPU {hw.get('cpu') or ''} ({hw.get('cores')} cores)" if hw else "-")
        soft = ", ".join(f"{k} {v}" for k, v in sorted(sw.items()) if v)
        nodes = hw.get("nodes")  # recorded since the node count was; older rows say nothing
        seen[(device, r.get("host") or "-", soft or "-")].append(
            (int(r["world_size"]), f"{r['world_size']}" + (f" on {nodes} node{'s' * (nodes != 1)}" if nodes else "")))
    rows = [[dev, host, ", ".join(label for _, label in sorted(set(n))), soft]
            for (dev, host, soft), n in sorted(seen.items())]
    out = "<h2>System</h2>" + _table(["device", "host (rank 0)", "GPU / process counts run", "software"], rows)
    if preflight:
        try:
            listed = json.loads(preflight.get("hosts_json") or "[]")
        except (TypeError, ValueError):
            listed = []
        hosts = ", ".join(map(str, listed if isinstance(listed, list) else [])) or str(preflight.get("host") or "-")
        measured = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                             for k, v in sorted((preflight.get("overrides") or {}).items()))
        out += (f"<p>Newest preflight ({time.strftime('%Y-%m-%d %H:%M', time.localtime(preflight['created_at']))}): "
                f"{_esc(preflight.get('gpu') or '-')} × {preflight['world_size']} on {_esc(hosts)}; "
                f"{preflight['n_pass']} pass, {preflight['n_warn']} warn, {preflight['n_fail']} fail. "
                f"Measured link and device rates: {_esc(measured or '-', 4000)}.</p>")
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
            seen[(engine_of(r), _s(sw.get("round")), _s(sw.get("org")), _s(hw.get("system")), _s(hw.get("gpu")),
                  r["world_size"], _s(hw.get("nodes")), _s(hw.get("interconnect") or hw.get("network")),
                  _s(sw.get("precision")))] += 1
    if not seen:
        return ""
    rows = [[*k, n] for k, n in sorted(seen.items(), key=lambda kv: str(kv[0]))]
    return ("<p>Imported runs of other engines (read from their published MLPerf logs by `trainperf import`):</p>"
            + _table(["engine", "round", "submitter", "system", "GPU", "GPUs", "nodes", "interconnect", "precision",
                      "runs"], rows))


def scaling_section(rows: list[ScalingRow], scores: list[dict] | None = None) -> str:
    """One engine's row never serves as another's base; the engine (and an imported row's system) is
    named in each row, and its set's MLPerf score where the set is a valid one (the olympic mean times
    the RCP scaling). Notes say what is normal (seed-to-seed spread); warnings are highlighted."""
    imported = any(r.engine != OUR_ENGINE for r in rows)
    valid = {(s["workload"], s["run_set"]): s["score_min"] for s in scores or [] if s["valid"]}
    headers = ["engine", *(["system"] if imported else []), "GPU", "GPUs", "layout", "GBS", "MBS", "precision",
               "time to train (min)", "basis", "MLPerf score (min)", "runs (ok)", "tokens/s/GPU", "TFLOP/s/GPU", MFU_HEADER, "speedup",
               "efficiency", "notes"]
    cells = [[r.engine, *([r.system or "-"] if imported else []), r.gpu_model or "-", r.gpus, r.layout, _f(r.gbs, ""),
              _f(r.mbs, ""), r.precision, _min(r.time_to_train_s), r.time_basis or "-",
              _f(valid.get((r.workload, r.run_set)), ".2f"), f"{r.runs} ({r.succeeded})", _f(r.tokens_per_s_per_gpu, ",.0f"), _f(r.tflops_per_gpu, ".3g"),
              mfu_text(r.mfu, r.gpu_model, r.precision), "-" if r.speedup is None else f"{r.speedup:.2f}× ({r.speedup_basis})",
              _pct(r.efficiency), "; ".join([*("warning: " + a for a in r.anomalies), *r.notes]) or "-"] for r in rows]
    return _table(headers, cells, ["anomaly" if r.anomalies else "" for r in rows])


def published_benchmark(runs: list[dict]) -> str | None:
    """The benchmark with a published table that comparable runs among ``runs`` are of (None: none)."""
    mlperf = [_json(r.get("spec_json")).get("mlperf") for r in runs if r.get("comparable")]
    found = sorted({m.get("benchmark") for m in mlperf if isinstance(m, dict)} & set(PUBLISHED_TABLES))
    return found[0] if found else None


def published_points_for(runs: list[dict]) -> tuple[list[tuple], str]:
    """Published points of the benchmark comparable runs are of, on their GPU model only."""
    bench = published_benchmark(runs)
    if bench is None:
        return [], ""
    gpus = {gpu_model_of(r) for r in runs if r.get("comparable")}
    models = {gpu_model(g) for g in gpus} & {"H100", "H200"}
    points, _ = split_imported([p for p in PUBLISHED_TABLES[bench] if p[3] in models], runs, bench)
    return points, f"published {bench}, {', '.join(sorted(models))} (MLCommons)"


def is_imported_point(point: tuple, runs: list[dict], workload: str) -> bool:
    """Whether a published result of ``workload`` (round, org, system, GPU, GPUs, GBS, minutes) is also
    among the imported runs: same round, submitter, GPU model, GPU count and GBS."""
    rnd, org, _system, gpu, gpus, gbs, _minutes = point
    for r in runs:
        if not is_imported(r) or r["workload"] != workload or r["world_size"] != gpus:
            continue
        sw = _json(r.get("software_json"))
        if (sw.get("round") == rnd and str(sw.get("org") or "").lower() == org.lower() and gpu in gpu_model_of(r)
                and row_key(r)[3] == gbs):
            return True
    return False


def split_imported(points: list[tuple], runs: list[dict], workload: str) -> tuple[list[tuple], list[tuple]]:
    """(published points of ``workload`` to show, those left out because their logs are imported as runs):
    one published result is shown once, as the imported runs, which carry its layout and every run."""
    kept = [p for p in points if not is_imported_point(p, runs, workload)]
    return kept, [p for p in points if p not in kept]


def plotted_imported_rows(rows: list[ScalingRow], runs: list[dict]) -> list[ScalingRow]:
    """The rows of a workload's plot: this engine's, and imported engines' on a GPU model this engine's
    comparable runs used (all of them when the workload has no comparable runs of this engine)."""
    models = {gpu_family(gpu_model_of(r)) for r in runs if not is_imported(r) and r.get("comparable") and gpu_model_of(r)}
    if not models:
        return rows
    return [r for r in rows if r.engine == OUR_ENGINE or gpu_family(r.gpu_model) in models]


def workload_section(workload: str, runs: list[dict], rows: list[ScalingRow], evals_by_run: dict[str, list[dict]],
                     scores: list[dict] | None = None) -> str:
    """A workload's scaling tables and plots: the closed-division runs (this engine's comparable runs and
    published results) and the open-division ones apart, each with its own table and time-to-train plot."""
    targets = [r["target"] for r in runs if r.get("target")]
    parts = [f"<h2>{_esc(workload)}</h2>",
             "<p>One row per set: engine, GPU model, GPU count, layout, GBS, MBS and precision (and submitted "
             "system for imported runs). Time to train is the olympic mean where a row has three or more "
             "successful runs; a valid set's MLPerf score is that times the RCP scaling (see MLPerf scores); speedup and "
             "efficiency are against the fastest row of the same engine, division and GPU model at the fewest "
             "GPUs with the same GBS.</p>" if rows else "<p>No finished runs with a measurement.</p>"]
    plots = []
    for closed, title in ((True, "closed division"), (False, "open division")):
        group = [r for r in rows if r.closed == closed]
        group_runs = [r for r in runs if is_closed_result(r) == closed]
        if not group:
            continue
        if any(r.closed != closed for r in rows):  # both kinds: a heading each
            parts.append(f"<h3>{title}</h3>")
        parts.append(scaling_section(group, scores))
        published, label = published_points_for(group_runs) if closed else ([], "")
        plots.append(_img(f"time to train vs GPUs ({title})", time_to_train_png(
            workload, plotted_imported_rows(group, group_runs), published, label, title=title)))
    plots.append(_img("eval loss vs samples", eval_curves_png(workload, runs, evals_by_run,
                                                              targets[0] if targets else None)))
    parts.append("<div class='plots'>" + "".join(plots) + "</div>")
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
                 "projected (min)", "speedup", "efficiency", "tokens/s/GPU", MFU_HEADER],
                [[r["benchmark"], r["gpus"], full_layout({"parallel": {"dp_shard": r.get("dp"), **{
                    k: r.get(k) for k in ("tp", "cp", "pp", "sp")}}}), _f(r.get("gbs"), ""), _f(r.get("mbs"), ""), _f(r["samples_per_s"], ".3f"),
                  f"{r['reference_samples']:.0f} ({r['reference']})", f"{r['eval_s']:.0f} ({r['eval_source']})",
                  _f(r["projected_s"] / 60, ".1f"), _f(r["speedup"], ".2f"), _pct(r["efficiency"]),
                  _f(r.get("tokens_per_s_per_gpu"), ",.0f"), _pct(r.get("mfu"))] for r in projected]))


def _scores_section(scores: list[dict]) -> str:
    if not scores:
        return ""
    return ("<h2>MLPerf scores</h2><p>Each set scored as <code>trainperf score --workload W --gpus N --system S "
            "--layout L</code> scores it: the newest runs its benchmark is scored on, under its round's ruleset "
            "(6.0.0 for this engine's runs); the score is the olympic mean (minutes) times the RCP scaling, and "
            "only a valid set has one.</p>" + _table(
                ["workload", "set", "runs", "ruleset", "olympic mean", "scaling", "score", "RCP", "verdict"],
                [[s["workload"], s["set"], f"{s['runs']} of {s['of']}" + (" (newest)" if s["of"] > s["runs"] else ""),
                  s["ruleset"], _f(s.get("olympic_min"), ".3f"), _f(s.get("scaling"), ".4f"),
                  _f(s["score_min"], ".3f") if s["valid"] else "none (not valid)", s.get("rcp", "-"),
                  s["verdict"]] for s in scores], ["" if s["valid"] else "anomaly" for s in scores]))


def _runs_section(runs: list[dict], total: int) -> str:
    cut = (f"<p>The newest {len(runs)} of {total} runs (<code>report --limit</code>); {total - len(runs)} older "
           "runs are not listed here. Every table, score and plot above is of all of them.</p>" if len(runs) < total else "")
    return "<h2>Runs</h2>" + cut + _table(page_headers(), [page_cells(r) for r in runs])  # report/columns.py


def _where(rs) -> str:
    return f"{rs.engine}, {rs.system + ', ' if rs.system else ''}{rs.gpus} × {rs.gpu or 'CPU'}, {rs.layout}"


def headline(runs: list[dict], rows: list[ScalingRow], scores: list[dict]) -> list[dict]:
    """Per workload: the best time to train (a valid MLPerf score where its set has one, else the row's
    time to train and how it was formed) of this engine's runs -- of the imported ones when the workload
    has none of ours -- where it was reached, and the fastest published result at the same GPU count and
    GPU model (imported runs' valid scores, and a benchmark's published table where it has one)."""
    valid = {(s["workload"], s["run_set"]): s for s in scores if s["valid"]}
    out = []
    for w in sorted({r.workload for r in rows}):
        timed = [r for r in rows if r.workload == w and r.time_to_train_s]
        if not timed:
            continue

        def best_time(r):
            s = valid.get((w, r.run_set))
            return (s["score_min"], "MLPerf score") if s else (r.time_to_train_s / 60, r.time_basis)

        ours = [r for r in timed if r.engine == OUR_ENGINE]
        # this engine's closed-division rows first: an open (shrunk) run's time is not a time to train
        # of the benchmark
        best = min([r for r in ours if r.closed] or ours or timed, key=lambda r: best_time(r)[0])
        minutes, basis = best_time(best)
        published = [(valid[(w, r.run_set)]["score_min"], _where(r.run_set), r.gpus, gpu_family(r.gpu_model))
                     for r in timed if r.engine != OUR_ENGINE and r.closed and (w, r.run_set) in valid]
        if w in PUBLISHED_TABLES:
            shown, _ = split_imported(PUBLISHED_TABLES[w], runs, w)
            published += [(p[6], f"{p[0]} {p[1]} {p[2]}", p[4], p[3]) for p in shown]
        same = [p for p in published if p[2] == best.gpus and p[3] == gpu_family(best.gpu_model)]
        entry = {"workload": w, "minutes": minutes, "basis": basis, "where": _where(best.run_set),
                 "closed": best.closed, "engine": best.engine, "published": None, "published_where": "", "ratio": None}
        if best.engine != OUR_ENGINE:
            entry["published_where"] = "this is a published result (no run of this engine)"
        elif not best.closed:
            entry["published_where"] = "open division: not comparable with published closed results"
        elif same:
            top = min(same)
            entry.update(published=top[0], published_where=top[1], ratio=minutes / top[0])
        else:
            entry["published_where"] = f"no published result at {best.gpus} × {gpu_family(best.gpu_model) or 'CPU'}"
        out.append(entry)
    return out


def _headline_section(entries: list[dict]) -> str:
    if not entries:
        return "<p>No finished run with a time to train yet.</p>"
    return "<h2>Headline</h2>" + _table(
        ["workload", "best time to train (min)", "basis", "where", "published best (min)", "published where",
         "vs published"],
        [[e["workload"], f"{e['minutes']:.2f}", e["basis"] or "-", e["where"], _f(e["published"], ".2f"),
          e["published_where"] or "-", "-" if e["ratio"] is None else f"{e['ratio']:.2f}× the published time"]
         for e in entries])


STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1400px;color:#222}h2{border-bottom:1px solid #ddd;"
         "padding-bottom:4px;margin-top:1.6em}table{border-collapse:collapse;font-size:12px;margin-bottom:1em}"
         "td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}th{background:#eee}td.n{text-align:right}tr.anomaly td{background:#fff4e0}.plots{display:flex;flex-wrap:wrap;"
         "gap:1em}figure{margin:0}img{max-width:100%}p.note{color:#666;font-size:12px}")


def render(runs: list[dict], evals_by_run: dict[str, list[dict]] | None = None, preflight: dict | None = None,
           trials_left_out: int = 0, listed: int | None = None) -> str:
    """The whole page of these runs (the caller leaves tune trials out unless they were asked for). Every
    figure is of all ``runs``; the runs table lists the newest ``listed`` of them (default: all)."""
    evals_by_run = evals_by_run or {}
    rows = scaling_table(runs)
    scores = olympic_scores(runs)
    left = f"; {trials_left_out} tune trials left out (`report --trials` shows them)" if trials_left_out else ""
    shown = runs[:listed] if listed else runs
    cut = f" (the runs table lists the newest {len(shown)})" if len(shown) < len(runs) else ""
    parts = [f"<h1>trainperf report</h1><p>{len(runs)} runs, every figure of all of them{cut}{left}; generated "
             f"{time.strftime('%Y-%m-%d %H:%M')}</p>", _headline_section(headline(runs, rows, scores)),
             system_section(runs, preflight)]
    for workload in sorted({r["workload"] for r in runs}):
        parts.append(workload_section(workload, [r for r in runs if r["workload"] == workload],
                                      [r for r in rows if r.workload == workload], evals_by_run, scores))
    parts += [_scores_section(scores), predicted_section(runs), _projected_section(runs)]
    traced = trace_breakdowns(runs)
    if traced:
        parts.append("<h2>Step-time breakdown</h2>" + _img("step-time breakdown", step_breakdown_png(traced)))
    parts.append(_runs_section(shown, len(runs)))
    if any(precision_of(r) == "fp8" and r.get("mfu") is not None for r in runs):
        parts.append(f"<p class='note'>{html.escape(MFU_NOTE)}</p>")
    bench = published_benchmark(runs)
    if published_points_for(runs)[0]:
        shown_points, imported = split_imported(PUBLISHED_TABLES[bench], runs, bench)
        why = ("" if not imported else f"<p>{len(imported)} published result(s) ({'; '.join(f'{p[0]} {p[1]} {p[4]}x{p[3]}' for p in imported)}) "
               "are shown once, as the imported runs above, not here: those carry the same logs' layout, "
               "throughput and every run's time.</p>")
        parts.append(f"<h2>Published MLPerf {html.escape(bench)} results</h2>" + why + "<p class='note'>" + html.escape(SOURCE)
                     + "</p>" + _table(["round", "org", "system", "GPU", "GPUs", "GBS", "minutes"],
                                       [list(p) for p in shown_points]))
    else:
        parts.append("<p class='note'>Published MLPerf results are shown beside comparable (closed-division) runs "
                     "of their benchmark only; none of these runs is one.</p>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>trainperf report</title><style>{STYLE}</style>"
            f"</head><body>{''.join(parts)}</body></html>")
