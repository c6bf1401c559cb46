"""Predicted against published: an engine profile fitted to MLPerf calibration points, checked on the
published runs it was not fitted to. CPU only.

    python bench/engine_profile_check.py PUBLISHED_DIR [--engine nemo] [--check ROUND_DIR ...] [--check-engines all]

PUBLISHED_DIR holds round folders of MLPerf submissions and calibration_points.csv (the points a
profile may be fitted to). Every published configuration is predicted by a profile fitted without it:
when it is not a calibration point, the profile of all calibration points; when it is, the profile of
the other calibration points (leave one out) -- never a profile that saw it. Reported per
configuration: tokens/s per GPU (the median run's), time to train (the planner's, from the RCP's
mean samples to converge under the run's round and the evals, against the published score, which
MLPerf scales to the RCP too; the median run's minutes where no score is given), and the rank of the
published layout among the planner's layouts for that engine at that GPU count and GBS.

``--check`` names more round folders of published results (the MLCommons training_results_vX.Y
repositories' layout, e.g. a checkout of each): every H100/H200 configuration there of the profile's
engine (``--check-engines all``: of any engine) that is not a calibration point is predicted by the
profile of all calibration points and reported in a second table, one row per round, submitter,
system and benchmark; its time to train is its MLPerf score (olympic mean of its runs, RCP-scaled, as
`trainperf score` computes it under the round's rules), else the median of its successful runs.
Each table is followed by one of time to train by GPU count: the published score against the planner's,
split into steps, evals and the run's set-up (the profile's fitted time terms), with one run's p10-p90
from the RCP's spread, and the median / max error at 256+ GPUs. Blackwell configurations (B200, GB200,
GB300) found by ``--check`` are predicted by the same Hopper-fitted profile in a section of their own.
``--eval-cost-probe`` then fits a fixed cost per run and per eval to the calibration points' scores and
shows what it would do to those times to train (a candidate term, not in the model).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from pathlib import Path

from trainperf.core.layout import Layout
from trainperf.mlperf.published import read_submissions, ruleset_of_round
from trainperf.plan.engines import apply_profile, engine_run_from_row, fit_profile, group_points
from trainperf.plan.costs import estimate
from trainperf.plan.search import (P10_P90_Z, evals_to, plan, rank_of, rcp_samples_at, rcp_stdev_at, time_to_train,
                                   time_to_train_terms)


def calibration_scores(csv_path: Path) -> dict[tuple[str, str], float]:
    """(system, benchmark) of each calibration point -> its published score, minutes (olympic mean,
    RCP-scaled)."""
    with open(csv_path) as fh:
        return {(row["system"], row["benchmark"]): float(row["score_min"]) for row in csv.DictReader(fh)}


def published_rank(point, gpu, megatron_ok=True, headroom: float = 0.0) -> tuple[int | None, int, float | None]:
    """The published layout's rank among the planner's fitting layouts (1 = best; None: not among them),
    how many fit, and how much longer the planner predicts its step than the best layout's (0.02: 2%);
    ``headroom``: the share of GPU memory a layout must leave free to be ranked (plan's --memory-headroom)."""
    spec = point.spec
    fits, _ = plan(spec, gpu, Layout.of(spec.parallel).world_size, point.gpus_per_node, headroom=headroom,
                   megatron=megatron_ok)
    rank = rank_of(fits, spec)
    return (rank, len(fits), fits[rank - 1].est.step_time_s / fits[0].est.step_time_s - 1) if rank \
        else (None, len(fits), None)


def ttt_fields(spec, est, ruleset: str) -> dict:
    """The planner's time to train of a configuration under ``ruleset``'s RCPs: minutes, its terms (steps /
    evals / set-up, minutes) and one run's p10-p90 band (minutes) from the RCP's spread."""
    samples = rcp_samples_at(spec, ruleset)
    if not samples:
        return {"predicted_min": None, "terms": None, "band": None, "evals": 0}
    sd = rcp_stdev_at(spec, ruleset) or 0.0
    band = [time_to_train(spec, est, max(spec.train.global_batch_size, samples + z * sd)) / 60
            for z in (-P10_P90_Z, P10_P90_Z)]
    return {"predicted_min": time_to_train(spec, est, samples) / 60, "evals": evals_to(spec, samples), "band": band,
            "terms": {k: v / 60 for k, v in time_to_train_terms(spec, est, samples).items()}}


def print_ttt_table(rows: list[dict], title: str) -> None:
    """Time to train per configuration by GPU count: published against predicted, with the predicted terms."""
    print(f"\n{title}\n")
    print("| configuration | GPUs | published score, min | predicted min (one run's p10-p90) | error | steps min | "
          "evals (n) min | set-up s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in sorted(rows, key=lambda r: (r["label"].split("@")[0], int(r["label"].split("@")[1].split()[0]), r["label"])):
        if not r.get("terms"):
            continue
        t, b = r["terms"], r["band"]
        print(f"| {r['label']} | {r['label'].split('@')[1].split()[0]} | {r['published_min']:.2f} | "
              f"{r['predicted_min']:.2f} ({b[0]:.2f}-{b[1]:.2f}) | {100 * r['ttt_error']:+.1f}% | {t['steps']:.2f} | "
              f"{t['evals']:.2f} ({r['evals']}) | {60 * t['setup']:.0f} |")
    big = [abs(r["ttt_error"]) for r in rows if r["ttt_error"] is not None
           and int(r["label"].split("@")[1].split()[0]) >= 256]
    if big:
        print(f"\nat 256+ GPUs: {len(big)} configurations, time to train median |error| {100 * statistics.median(big):.1f}%, "
              f"max {100 * max(big):.1f}%")


def rank_text(r: dict) -> str:
    """'14 of 2127 (+1.9%)': the rank, the layouts ranked, the predicted step against the best's."""
    if not r["rank"]:
        return f"not ranked (of {r['layouts']})"
    return f"{r['rank']} of {r['layouts']}" + (f" (+{100 * r['gap']:.1f}%)" if r["rank"] > 1 else "")


def published_minutes(members: list, rnd: str) -> tuple[float | None, str]:
    """(minutes, what they are) of one published configuration: its MLPerf score (olympic mean of its
    runs, RCP-scaled, as `trainperf score` computes it under the round's rules) where its runs make
    one, else the median of its successful runs."""
    from trainperf.core.errors import SpecError
    from trainperf.mlperf.score import read_run, score_runs

    ruleset = ruleset_of_round(rnd)
    try:
        score = score_runs([read_run(r.path, ruleset) for _, r in members], ruleset)
    except SpecError:
        score = None
    if score is not None and score.score_minutes:
        return score.score_minutes, "score"
    minutes = [pt.time_to_train_s / 60 for pt, _ in members if pt.time_to_train_s]
    return (statistics.median(minutes), "median run") if minutes else (None, "")


def eval_cost_probe(fitted_on: list[dict], checked: list[dict]) -> None:
    """A fixed cost per run (W step times) and per eval (E seconds) on top of the planner's time to train,
    fitted by least squares on log(predicted / published) of ``fitted_on``; prints W, E and the time-to-train
    errors over ``checked`` without and with them (a candidate term, not part of the model)."""
    from scipy.optimize import least_squares

    def errors(x, rows):
        w, e = x
        return [math.log((60 * r["predicted_min"] + w * r["step_s"] + e * r["evals"]) / (60 * r["published_min"]))
                for r in rows if r["predicted_min"] and r["published_min"]]

    w, e = least_squares(lambda x: errors(x, fitted_on), [1.0, 1.0], bounds=([0, 0], [100, 100])).x
    print(f"\neval-cost probe: fitted to {len(fitted_on)} calibration points' scores: W = {w:.2f} step times per run, "
          f"E = {e:.2f} s per eval")
    for label, x in (("without", (0.0, 0.0)), ("with", (w, e))):
        errs = [abs(math.exp(v) - 1) for v in errors(x, checked)]
        worst = max(zip(errs, [r["label"] for r in checked if r["predicted_min"] and r["published_min"]]))
        print(f"  {label}: time to train median |error| {100 * statistics.median(errs):.1f}%, max "
              f"{100 * worst[0]:.1f}% ({worst[1]})")


def check_rows(dirs: list[str], engine: str, engines: str, calib_keys: set, calib_points: list,
               headroom: float = 0.0) -> list[dict]:
    """Every H100/H200 configuration in ``dirs`` (not a calibration point) predicted by the profile of all
    calibration points: one row per (round, submitter, system, benchmark), priced at its median run."""
    runs, problems = read_submissions(dirs, "6.0.0")
    print(f"checked folders: {len(runs)} runs read, {len(problems)} logs not imported", file=sys.stderr)
    profile = fit_profile(engine, calib_points)
    groups = {}
    for r in runs:
        if engines != "all" and r.engine != engine:
            continue
        pt = engine_run_from_row(r.row)
        if pt is None:  # no planner preset for this GPU (not an H100 / H200 / B200 the planner knows)
            continue
        software = json.loads(r.row["software_json"])
        system = Path(r.path).parents[1].name
        if (system, r.row["workload"]) in calib_keys or not any(g in pt.gpu.name for g in ("H100", "H200", "B200", "GB200",
                                                                                         "GB300")):
            continue
        key = (software["round"], software["org"], system, r.row["workload"])
        groups.setdefault(key, []).append((pt, r))
    rows = []
    for (rnd, org, system, bench), members in sorted(groups.items(), key=lambda kv: (kv[0][3], kv[1][0][0].gpu.name, kv[0])):
        point = group_points([pt for pt, _ in members])[0]
        engine_of = members[0][1].engine
        gpu = apply_profile(point.gpu, profile)
        est = estimate(point.spec, gpu, point.gpus_per_node)
        tf = ttt_fields(point.spec, est, ruleset_of_round(rnd))
        ttt = tf["predicted_min"]
        published_min, basis = published_minutes(members, rnd)
        gpus = Layout.of(point.spec.parallel).world_size
        blackwell = "H100" not in point.gpu.name and "H200" not in point.gpu.name
        rank, total, gap = published_rank(point, gpu, headroom=headroom) if gpus > point.gpus_per_node \
            and not blackwell else (None, 0, None)
        rows.append({"label": f"{bench}@{gpus} {rnd} {org} {system}", "layout": point.label.split(" ", 1)[1],
                     "engine": engine_of, "published_tps": point.tokens_per_s_per_gpu,
                     "predicted_tps": est.tokens_per_s_per_gpu,
                     "tps_error": est.tokens_per_s_per_gpu / point.tokens_per_s_per_gpu - 1,
                     "published_min": published_min, "minutes_basis": basis, "predicted_min": ttt,
                     "ttt_error": (ttt / published_min - 1) if ttt and published_min else None,
                     "multi_node": gpus > point.gpus_per_node, "rank": rank, "layouts": total, "gap": gap,
                     "step_s": est.step_time_s, **{k: tf[k] for k in ("evals", "terms", "band")},
                     "blackwell": blackwell, "peak_gib": est.reserved_gib, "hbm_gib": point.gpu.hbm_gib})
    return rows


def print_blackwell(rows: list[dict]) -> None:
    """Blackwell configurations, predicted by the Hopper-fitted profile on the GPU's datasheet preset (no
    Blackwell point is fitted on): tokens/s per GPU and memory against the GPU's."""
    if not rows:
        return
    print("\nBlackwell (no Blackwell point fitted; datasheet presets)\n")
    print("| published configuration | layout | published tok/s/GPU | predicted | error | predicted GiB |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['label']} | {r['layout']} | {r['published_tps']:,.0f} | {r['predicted_tps']:,.0f} | "
              f"{100 * r['tps_error']:+.1f}% | {r['peak_gib']:.1f} of {r['hbm_gib']:.0f} |")
    tps = [abs(r["tps_error"]) for r in rows]
    print(f"\nBlackwell configurations: {len(rows)}; tokens/s per GPU median |error| {100 * statistics.median(tps):.1f}%, "
          f"max {100 * max(tps):.1f}%; predicted slow: {sum(1 for r in rows if r['tps_error'] < 0)}; predicted over "
          f"the GPU's memory: {sum(1 for r in rows if r['peak_gib'] > r['hbm_gib'])}")


def print_check_rows(rows: list[dict]) -> None:
    print("\n| published configuration | engine | layout | published tok/s/GPU | predicted | error | "
          "published score, min | predicted min | error | published layout's rank (its step against the best's) |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        pub = (f"{r['published_min']:.2f}" + ("" if r.get("minutes_basis") == "score" else " (median run)")) \
            if r["published_min"] else "-"
        ttt = f"{r['predicted_min']:.2f}" if r["predicted_min"] else "-"
        terr = f"{100 * r['ttt_error']:+.1f}%" if r["ttt_error"] is not None else "-"
        rank = rank_text(r) if r["multi_node"] else "(one node)"
        print(f"| {r['label']} | {r['engine']} | {r['layout']} | {r['published_tps']:,.0f} | {r['predicted_tps']:,.0f} | "
              f"{100 * r['tps_error']:+.1f}% | {pub} | {ttt} | {terr} | {rank} |")
    tps = [abs(r["tps_error"]) for r in rows]
    tt = [abs(r["ttt_error"]) for r in rows if r["ttt_error"] is not None]
    multi = [r for r in rows if r["multi_node"]]
    if tps:
        print(f"\nchecked configurations: {len(rows)}; tokens/s per GPU median |error| {100 * statistics.median(tps):.1f}%, "
              f"max {100 * max(tps):.1f}%; time to train median |error| "
              + (f"{100 * statistics.median(tt):.1f}%, max {100 * max(tt):.1f}%" if tt else "-")
              + f"; multi-node configurations with the published layout in the top 3: "
              f"{sum(1 for r in multi if r['rank'] and r['rank'] <= 3)} of {len(multi)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("published", help="folder of round folders and calibration_points.csv")
    ap.add_argument("--engine", default="nemo")
    ap.add_argument("--no-rank", action="store_true", help="skip the layout search (the slow part)")
    ap.add_argument("--check", nargs="*", default=[], metavar="ROUND_DIR",
                    help="more round folders of published results, predicted and never fitted on")
    ap.add_argument("--check-engines", default="profile", choices=["profile", "all"],
                    help="which engines' runs --check predicts: the profile's (default) or all")
    ap.add_argument("--eval-cost-probe", action="store_true",
                    help="fit a fixed cost per run and per eval to the calibration points' scores and show what it "
                         "does to the --check rows' time to train (a candidate term, not in the model)")
    ap.add_argument("--memory-headroom", type=float, default=0.0,
                    help="rank only layouts leaving this share of GPU memory free (plan's default: 0.08)")
    args = ap.parse_args()
    root = Path(args.published)
    calib = calibration_scores(root / "calibration_points.csv")
    runs, problems = read_submissions(sorted(str(p) for p in root.iterdir() if p.is_dir()), "6.0.0")
    for line in problems:
        print(f"not read: {line}", file=sys.stderr)
    points, minutes, keys, rounds = {}, {}, {}, {}
    for r in runs:
        if r.engine != args.engine:
            continue
        pt = engine_run_from_row(r.row)
        if pt is None:
            continue
        system = Path(r.path).parents[1].name
        points.setdefault(pt.label, []).append(pt)
        keys[pt.label] = (system, r.row["workload"])
        rounds[pt.label] = json.loads(r.row["software_json"])["round"]
    grouped = {label: group_points(pts)[0] for label, pts in points.items()}
    for label, pts in points.items():  # the published score where known, else the median run's minutes
        minutes[label] = calib.get(keys[label]) or statistics.median(p.time_to_train_s / 60 for p in pts
                                                                      if p.time_to_train_s)
    calib_labels = [lab for lab in grouped if keys[lab] in calib]
    rows = []
    for label, point in grouped.items():
        fit_on = [grouped[lab] for lab in calib_labels if lab != label]
        profile = fit_profile(args.engine, fit_on)
        gpu = apply_profile(point.gpu, profile)
        est = estimate(point.spec, gpu, point.gpus_per_node)
        tf = ttt_fields(point.spec, est, ruleset_of_round(rounds[label]))  # the run's own round's rules
        ttt = tf["predicted_min"]
        rank, total, gap = (None, 0, None) if args.no_rank else published_rank(point, gpu, headroom=args.memory_headroom)
        rows.append({"label": label, "held_out": "calibration point, left out" if label in calib_labels else "not fitted",
                     "fit_on": len(fit_on), "published_tps": point.tokens_per_s_per_gpu,
                     "predicted_tps": est.tokens_per_s_per_gpu, "tps_error": est.tokens_per_s_per_gpu / point.tokens_per_s_per_gpu - 1,
                     "published_min": minutes[label], "predicted_min": ttt,
                     "ttt_error": (ttt / minutes[label] - 1) if ttt else None, "rank": rank, "layouts": total, "gap": gap,
                     "peak_gib": est.reserved_gib, "hbm_gib": point.gpu.hbm_gib,
                     "step_s": est.step_time_s, "time_terms": profile.time_terms,
                     **{k: tf[k] for k in ("evals", "terms", "band")}})
    print("| configuration (engine " + args.engine + ") | predicted by | published tok/s/GPU | predicted | error | "
          "published score, min | predicted min | error | published layout's rank | predicted GiB |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ttt = f"{r['predicted_min']:.2f}" if r["predicted_min"] else "-"
        terr = f"{100 * r['ttt_error']:+.1f}%" if r["ttt_error"] is not None else "-"
        rank = "-" if args.no_rank else rank_text(r)
        print(f"| {r['label']} | {r['held_out']} ({r['fit_on']} points) | {r['published_tps']:,.0f} | "
              f"{r['predicted_tps']:,.0f} | {100 * r['tps_error']:+.1f}% | {r['published_min']:.2f} | {ttt} | {terr} | "
              f"{rank} | {r['peak_gib']:.1f} of {r['hbm_gib']:.0f} |")
    tps = [abs(r["tps_error"]) for r in rows]
    tt = [abs(r["ttt_error"]) for r in rows if r["ttt_error"] is not None]
    print(f"\ntokens/s per GPU: median |error| {100 * statistics.median(tps):.1f}%, max {100 * max(tps):.1f}% "
          f"({len(tps)} configurations); time to train: median |error| "
          + (f"{100 * statistics.median(tt):.1f}%, max {100 * max(tt):.1f}%" if tt else "-")
          + (f"; published layout in the top 3: {sum(1 for r in rows if r['rank'] and r['rank'] <= 3)} of {len(rows)}"
             if not args.no_rank else ""))
    print("\ntime terms fitted (leave one out): " + "; ".join(
        f"{r['label'].split(' ')[0]}: " + ", ".join(f"{k} {v:.4g}" for k, v in r["time_terms"].items()) for r in rows))
    print_ttt_table(rows, "Time to train of the calibration points, each predicted by the profile of the other five")
    if args.check:
        calib_points = [grouped[lab] for lab in calib_labels]
        checked = check_rows(args.check, args.engine, args.check_engines, set(calib.keys()), calib_points,
                             args.memory_headroom)
        hopper = [r for r in checked if not r["blackwell"]]
        print_check_rows(hopper)
        print(f"\nprofile of all calibration points: {fit_profile(args.engine, calib_points).to_dict()}")
        print_ttt_table(hopper, "Time to train of every checked H100 / H200 configuration (never fitted on), by GPU count")
        print_blackwell([r for r in checked if r["blackwell"]])
        if args.eval_cost_probe:
            eval_cost_probe([r for r in rows if r["held_out"] != "not fitted"], checked)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
