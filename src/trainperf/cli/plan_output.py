"""The terminal form of a plan: the ranked table, the stored runs at this scale, the named layout, the
time to train of the best and the command that runs it."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from trainperf.cli.errors import EXIT_FAILED, EXIT_OK
from trainperf.core.layout import layers_per_stage
from trainperf.plan.nemo import nemo_lines
from trainperf.plan.output import hint, ttt_band, ttt_terms
from trainperf.plan.request import PlanRequest, Ranking
from trainperf.plan.search import explain


def figure_name(fits: list) -> str:
    """What a ranking compares layouts by: time to train where it has one, else time per sample (a step
    of another GBS is not comparable)."""
    return "time to train" if fits and fits[0].time_to_train_s else "time per sample"


def stored_lines(ranking: Ranking) -> list[str]:
    """One line per stored layout at this scale: measured against the plan's rank and prediction."""
    lines = []
    for e in ranking.stored:
        head = (f"stored at this scale: {e['layout']} GBS {e['global_batch_size']}, {e['runs']} run"
                f"{'s' if e['runs'] > 1 else ''}, {e['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU")
        if e["rank"] is None:
            lines.append(f"{head} -- not among this plan's {e['ranked']} ranked layouts (outside its search, or over "
                         "the memory it allows)")
        else:
            pred = e["predicted_tokens_per_s_per_gpu"]
            lines.append(f"{head} -- ranked {e['rank']} of {e['ranked']}"
                         + (f", its {figure_name(ranking.fits)} {100 * e['over_best']:+.1f}% over the best's"
                            if e["rank"] > 1 else "")
                         + f"; predicted {pred:,.0f} ({100 * (pred / e['tokens_per_s_per_gpu'] - 1):+.1f}%)")
    return lines


def named_line(ranking: Ranking) -> str:
    """The named layout: its prediction, and where it ranks against the best."""
    n = ranking.named
    c = n.candidate
    p = c.spec.parallel
    shape = " ".join(x for x in (f"TP{p.tp}" if p.tp > 1 else "", "SP" if p.sp and p.tp > 1 else "",
                                 f"CP{p.cp}" if p.cp > 1 else "", f"PP{p.pp}" if p.pp > 1 else "",
                                 f"VP{p.pp_stages_per_rank}" if p.pp > 1 and p.pp_stages_per_rank > 1 else "",
                                 f"DP{p.dp_replicate * p.dp_shard}", f"MBS {c.spec.train.micro_batch_size}",
                                 f"GBS {c.spec.train.global_batch_size}") if x)
    head = (f"named layout {shape}: step {c.est.step_time_s:.3f} s, {c.est.tokens_per_s_per_gpu:,.0f} tokens/s per "
            f"GPU, {c.est.reserved_gib:.1f} GiB" + (f", time to train {c.time_to_train_s / 60:.2f} min"
                                                    if c.time_to_train_s else ""))
    if not n.fits:
        return f"{head} -- over the {ranking.usable_gib:.1f} GiB this plan allows (not ranked)"
    if not n.ranked:
        return f"{head} -- the only layout that fits"
    what = "time to train" if c.time_to_train_s and ranking.fits[0].time_to_train_s else "time per sample"
    return (f"{head} -- " + (f"ranked {n.rank} of {n.ranked}" if n.searched else f"would rank {n.rank} of {n.ranked + 1}")
            + (f", its {what} {100 * n.over_best:+.1f}% against the best's ({ranking.fits[0].id})"
               if n.over_best is not None and n.rank > 1 else ""))


def options_cell(c) -> str:
    """The speed settings of a layout: compile, fp8, an fp8 frozen base, flash4, gradients reduce-scattered
    every micro-batch ('-' for none)."""
    sp = c.spec
    cells = (["compile"] if sp.train.compile else []) + ([sp.hardware.fp8] if sp.hardware.fp8 != "none" else []) \
        + (["fp8 base"] if sp.hardware.frozen_dtype == "fp8" else []) \
        + ([sp.hardware.attention] if sp.hardware.attention != "sdpa" else []) \
        + (["sync/mb"] if sp.train.grad_sync == "every" else [])
    return " ".join(cells) or "-"


def layout_cells(req, c) -> list[str]:
    o = c.overrides
    cells = [c.id, str(c.spec.train.global_batch_size), str(o["parallel.tp"]), "y" if o["parallel.sp"] else "-", str(o["parallel.cp"]),
             str(o["parallel.pp"]), (o["parallel.pp_schedule"] + (f" v{o['parallel.pp_stages_per_rank']}"
                                                                  if o.get("parallel.pp_stages_per_rank") else ""))
             if o["parallel.pp"] > 1 else "-",
             str(o["parallel.dp_replicate"]), str(o["parallel.dp_shard"]), str(o["train.micro_batch_size"]),
             o["train.recompute"] + (f" {o['train.recompute_layers']}/{layers_per_stage(c.spec)}"
                                     if "train.recompute_layers" in o else "")
             + (" +sel" if o.get("train.recompute_others") == "selective" else "")
             + (f" +{o['train.offload_layers']} host" if o.get("train.offload_layers") else ""),
             options_cell(c), f"{c.est.step_time_s:.3f}", f"{c.est.tokens_per_s_per_gpu:,.0f}",
             f"{100 * c.est.mfu:.1f}%", f"{c.est.reserved_gib:.1f}"]
    if c.time_to_train_s:
        cells.append(f"{c.time_to_train_s / 60:.2f}")
        band = ttt_band(req, c)
        cells.append(f"{band[0] / 60:.2f}-{band[1] / 60:.2f}" if band else "-")
    return cells


def print_table(req, ranking: Ranking) -> int:
    gpu, fits, oom, over, usable = ranking.gpu, ranking.fits, ranking.oom, ranking.over_headroom, ranking.usable_gib
    console = Console(width=None if Console().is_terminal else 200)
    table = Table(title=f"trainperf plan: {req.workload} on {req.gpus} x {gpu.name} ({ranking.per_node} per node) -- "
                        f"{len(fits)} layouts fit, {len(oom)} do not"
                        + (f" ({over} only for the memory headroom)" if over else "")
                        + f" -- memory headroom {100 * ranking.headroom:g}% ({usable:.1f} of {gpu.hbm_gib:g} GiB usable)")
    for col in ("id", "GBS", "tp", "sp", "cp", "pp", "sched", "rep", "shard", "mbs", "recompute", "options", "step s",
                "tok/s/GPU", "MFU", "mem GiB") + (("TTT min", "p10-p90") if fits and fits[0].time_to_train_s else ()):
        table.add_column(col, justify="right")
    for c in fits[:req.top]:
        table.add_row(*layout_cells(req, c))
    console.print(table)
    if ranking.measured_note:
        console.print(ranking.measured_note)
    for line in stored_lines(ranking):
        console.print(line)
    if fits and fits[0].time_to_train_s:
        terms = ttt_terms(req, fits[0])
        console.print(f"{fits[0].id} time to train: steps {terms['steps'] / 60:.2f} min + evals {terms['evals'] / 60:.2f} "
                      f"min + set-up {terms['setup']:.0f} s" + ("" if req.samples else
                                                                 "; p10-p90: one run's, from the RCP's spread of samples"),
                      highlight=False)
    if ranking.named is not None:
        console.print(named_line(ranking), highlight=False)
    if not fits:
        hint = hint(ranking)
        console.print(f"[red]no layout fits[/red]: the smallest needs {oom[0].est.reserved_gib:.1f} GiB of "
                      f"{usable:.1f} usable of {gpu.hbm_gib:.0f} GiB ({oom[0].set_line})"
                      + (f"; {over} fit only without the {100 * ranking.headroom:g}% memory headroom (--memory-headroom 0 "
                         "ranks them, at the risk of an OOM)" if over else "")
                      + (f"; {hint}" if hint else ""))
        return EXIT_FAILED
    print_next_steps(console, req, ranking)
    return EXIT_OK


def print_next_steps(console, req, ranking: Ranking) -> None:
    """The command that runs the best layout, and with --explain why each runner-up is slower."""
    fits, per_node = ranking.fits, ranking.per_node
    if ranking.kind.config == "nemo":  # another engine's layout, in its own variables
        console.print(f"best layout for {ranking.engine} ({fits[0].id}), as NeMo's trainer / model config and the "
                      "submission config's variables (`trainperf import` reads them back):", highlight=False)
        for line in nemo_lines(fits[0].spec, ranking.per_node):
            console.print("  " + line, highlight=False, markup=False)
        return
    if not ranking.kind.launchable:  # another engine's layout: trainperf cannot launch it
        console.print(f"best layout for {req.engine}: {fits[0].set_line}")
        return
    launch = (f"trainperf run {req.workload} --nproc-per-node {req.gpus}" if req.gpus <= per_node else
              f"srun -N {req.gpus // per_node} --ntasks-per-node {per_node} trainperf run {req.workload}")
    console.print(f"run the best: {launch} --layout-from-plan {fits[0].id}   (or: {fits[0].set_line})")
    if req.explain:
        best = fits[0]
        terms = ", ".join(f"{k} {v:.3f}s" for k, v in sorted(best.est.time.items(), key=lambda kv: -kv[1]) if v > 0)
        console.print(f"{best.id} step time: {terms}")
        for c in fits[1:req.top]:
            console.print("  " + explain(best, c))
