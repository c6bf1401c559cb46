"""The report's charts (matplotlib, Agg), each returned as a PNG data URI or None when there is
nothing to draw. Published MLPerf points share axes only with comparable runs of the same benchmark
on the same GPU model: a toy workload is never drawn beside a 70B result. Every label drawn goes
through ``plot_text`` (a name with ``$`` is never mathtext); axes read in plain numbers (8, 16, 64
GPUs; 2, 5, 10, 20 minutes), not powers."""

from __future__ import annotations

import base64
import io

from trainperf.core.results import OUR_ENGINE
from trainperf.report.labels import plot_text as _t
from trainperf.report.scaling import ScalingRow

LOSS_CURVES_PER_PLOT = 6


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plain_log_axis(axis, ticks: list[float] | None = None) -> None:
    """A log axis labelled in plain numbers: at ``ticks`` when given (the GPU counts run), else at 1, 2, 5
    times the powers of ten."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator

    axis.set_major_locator(FixedLocator(ticks) if ticks else LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.4g}"))
    axis.set_minor_locator(NullLocator() if ticks else LogLocator(base=10, subs="auto"))
    axis.set_minor_formatter(NullFormatter())


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    _plt().close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def time_to_train_png(workload: str, rows: list[ScalingRow], published: list[tuple], published_label: str,
                      title: str = "") -> str | None:
    """Minutes to train against GPUs: one series per engine and GPU model (the best row per GPU count,
    this engine's first), ideal scaling from the first series' fewest GPUs (dotted), and the published
    points given (already filtered to this benchmark and GPU model)."""
    series: dict[tuple[bool, str, str], dict[int, ScalingRow]] = {}
    for r in rows:
        if not r.time_to_train_s:
            continue
        best = series.setdefault((r.engine != OUR_ENGINE, r.engine, r.gpu_model), {})
        if r.gpus not in best or r.time_to_train_s < best[r.gpus].time_to_train_s:
            best[r.gpus] = r
    if not series:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for i, ((imported, engine, gpu), best) in enumerate(sorted(series.items())):
        n = sorted(best)
        t = [best[g].time_to_train_s / 60 for g in n]
        name = f"{engine}{' (imported)' if imported else ''}{' ' + gpu if gpu else ''}"
        ax.plot(n, t, "s--" if imported else "o-", label=_t(f"{name}, best layout per GPU count"))
        for g, m in zip(n, t):
            # an imported series labels below its points, so a layout name never covers this engine's
            ax.annotate(_t(best[g].layout), (g, m), fontsize=7, xytext=(4, -10 if imported else 4),
                        textcoords="offset points")
        if i == 0 and len(n) > 1:
            ax.plot(n, [t[0] * n[0] / g for g in n], ":", color="grey", label=_t(f"ideal scaling of {name}"))
    if published:
        ax.scatter([p[4] for p in published], [p[6] for p in published], marker="x", color="black",
                   label=_t(published_label))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    counts = sorted({g for best in series.values() for g in best} | {p[4] for p in published})
    _plain_log_axis(ax.xaxis, counts)
    _plain_log_axis(ax.yaxis)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("time to train (minutes)")
    ax.set_title(_t(f"{workload}: time to train vs GPUs{' (' + title + ')' if title else ''}"))
    ax.legend(fontsize=7)
    return _png(fig)


def eval_curves_png(workload: str, runs: list[dict], evals_by_run: dict[str, list[dict]], target: float | None) -> str | None:
    """Eval loss against samples of the newest runs of a workload, with the target as a line."""
    curves = [r for r in runs if evals_by_run.get(r["run_id"])][:LOSS_CURVES_PER_PLOT]
    if not curves:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for r in curves:
        ev = evals_by_run[r["run_id"]]
        ax.plot([e["samples_count"] for e in ev], [e["eval_loss"] for e in ev], "o-", markersize=3,
                label=_t(f"{r['run_id'][-6:]} {r['world_size']} GPUs ({r['status']})"))
    if target:
        ax.axhline(target, color="red", linestyle="--", linewidth=1, label=f"target {target:.4f}")
    ax.set_xlabel("samples")
    ax.set_ylabel("eval loss")
    ax.set_title(_t(f"{workload}: eval loss vs samples"))
    ax.legend(fontsize=7)
    return _png(fig)


def predicted_vs_measured_png(pairs: list[tuple[float, float, str]]) -> str | None:
    """Measured against predicted step time (log-log), one point per run, the diagonal for 'exact'."""
    if not pairs:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 4))
    for workload in sorted({w for _, _, w in pairs}):
        pts = [(p, m) for p, m, w in pairs if w == workload]
        ax.scatter([p for p, _ in pts], [m for _, m in pts], s=14, label=_t(workload))
    lo = min(min(p, m) for p, m, _ in pairs) * 0.8
    hi = max(max(p, m) for p, m, _ in pairs) * 1.25
    ax.plot([lo, hi], [lo, hi], ":", color="grey", label="measured = predicted")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log_axis(ax.xaxis)
    _plain_log_axis(ax.yaxis)
    ax.set_xlabel("predicted step time (s)")
    ax.set_ylabel("measured step time (s)")
    ax.set_title("planner: predicted vs measured")
    ax.legend(fontsize=7)
    return _png(fig)


def step_breakdown_png(traced: list[dict]) -> str | None:
    """Compute, exposed communication and idle per step of the runs `trainperf trace` analysed."""
    if not traced:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(11, 0.6 * len(traced) + 1.5))
    labels = [_t(f"{t['workload']} {t['layout']} ({t['run_id'][-6:]}, {t['overlap_pct']:.0f}% of comm overlapped)")
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
    return _png(fig)
