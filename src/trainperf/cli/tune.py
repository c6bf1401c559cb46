"""``trainperf tune WORKLOAD --gpus N``: measure the planner's best layouts in short trials, keep the fastest."""

from __future__ import annotations

import argparse
import json
import math
import sys

from trainperf.cli.errors import EXIT_FAILED, EXIT_OK, SpecError, bad_input
from trainperf.cli.options import HEADROOM_HELP, add_common, add_out, memory_headroom
from trainperf.cli.paths import check_out_folder

HELP = "measure the planner's best layouts in short trials, keep the fastest"
DESCRIPTION = ("Successive halving over the planner's top layouts: short real runs, the faster "
               "half continues with twice the steps, until one is left or the budget is spent.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("workload", help="workload name (see `trainperf workloads`)")
    p.add_argument("--gpus", type=int, required=True, help="GPUs (processes) on this node")
    p.add_argument("--gpu", default="h200", help="planner preset or YAML file for the initial ranking")
    p.add_argument("--top", type=int, default=8, help="how many planned layouts to try (default 8)")
    p.add_argument("--budget-minutes", type=float, default=30.0, help="stop starting trials after this (default 30)")
    p.add_argument("--steps", type=int, default=4, help="steps per trial in the first round (doubles each round)")
    p.add_argument("--abandon-factor", type=float, default=1.25,
                   help="skip a layout whose planner prediction, recalibrated on the trials so far, exceeds this "
                        "many times the best measured step (0: try every layout; default 1.25)")
    p.add_argument("--memory-headroom", type=float, default=None, metavar="FRACTION",
                   help=HEADROOM_HELP.replace("be ranked", "be tried"))
    p.add_argument("--keep-within", type=float, default=0.03,
                   help="a later round re-measures only layouts within this fraction of the round's best "
                        "(0: the faster half, as plain successive halving; default 0.03)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    add_out(p)
    add_common(p)


def _check_trial_host(base, gpus: int) -> None:
    """The trials run on this machine: enough visible GPUs, or enough host memory for CPU trials."""
    import torch

    if base.hardware.device != "cpu" and torch.cuda.is_available():  # trials run here, on these GPUs
        visible = torch.cuda.device_count()
        if gpus > visible:
            raise SpecError(f"--gpus {gpus}: tune measures its trials on this machine's GPUs and {visible} "
                            f"{'is' if visible == 1 else 'are'} visible; give --gpus <= {visible}")
    elif base.hardware.device != "cuda" and base.hardware.memory_check:  # trials on the CPU
        # the runner (torch, the model) loads only when tune runs, not for --help
        from trainperf.runner.local import check_host_memory

        check_host_memory(base)


MAX_BUDGET_MINUTES = 7 * 24 * 60  # a week: a longer tune is a mistyped number


def _check_numbers(args) -> None:
    """Finite numbers in their ranges (NaN compares false with everything, so every check says so)."""
    if not (math.isfinite(args.budget_minutes) and 0 < args.budget_minutes <= MAX_BUDGET_MINUTES):
        raise SpecError(f"--budget-minutes {args.budget_minutes}: must be > 0 and <= {MAX_BUDGET_MINUTES} (a week)")
    for flag, value in (("--abandon-factor", args.abandon_factor), ("--keep-within", args.keep_within)):
        if not (math.isfinite(value) and value >= 0):
            raise SpecError(f"{flag} {value}: must be a finite number >= 0")


def run(args) -> int:
    # the YAML/TOML readers load only when a spec is resolved, not for --help
    from trainperf.core.resolve import resolve_spec

    # the GPU presets load only when tune runs
    from trainperf.plan.hardware import load_gpu

    # the planner's search ranks the layouts to try: loaded only when tune runs
    from trainperf.plan.search import plan

    # the trial runner loads only when tune runs
    from trainperf.parallel.launcher import Interrupted

    # the layout check imports the model: only when tune runs
    from trainperf.runner.checks import validate_run

    # the trial runner loads only when tune runs
    from trainperf.runner.tune import successive_halving

    # the workload registry imports torch and the model: only when tune runs
    from trainperf.workloads import get_workload

    try:
        headroom = memory_headroom(args)
        if args.gpus < 1 or args.top < 1 or args.steps < 2:
            raise SpecError("--gpus and --top must be >= 1 and --steps >= 2 (the first step is warm-up)")
        _check_numbers(args)
        check_out_folder(args.out)
        base = resolve_spec(get_workload(args.workload).defaults(), None, args.overrides)
        # the user's --set comes last on every trial's command line: a layout it breaks is refused now
        validate_run(base, args.gpus, before_checkpoint=True)
        _check_trial_host(base, args.gpus)
        fits, _ = plan(base, load_gpu(args.gpu), args.gpus, args.gpus, objective="throughput", headroom=headroom)
    except SpecError as exc:
        return bad_input(str(exc), args.json)
    echo = (lambda line: print(line, file=sys.stderr)) if args.json else print
    _save_as_plan(args, fits[:args.top])
    echo(f"trying {len(fits[:args.top])} layouts of {args.workload} on {args.gpus} GPUs "
         f"(budget {args.budget_minutes:g} min): {', '.join(c.id for c in fits[:args.top])}")
    try:
        res = successive_halving(args.workload, args.gpus, fits[:args.top], args.db, args.out, args.overrides,
                                 args.budget_minutes * 60, args.steps, echo, abandon_factor=args.abandon_factor,
                                 keep_within=args.keep_within)
    except Interrupted as exc:  # the running trial's process group is already ended
        print(f"trainperf: tune stopped ({exc}); no winner", file=sys.stderr)
        return EXIT_FAILED
    trials = [{"id": t.candidate.id, "set": t.candidate.set_line, "steps": t.steps, "step_time_s": t.step_time_s,
               "planned_step_time_s": t.candidate.est.step_time_s, "run_id": t.run_id, "error": t.error,
               "wall_s": round(t.wall_s, 2)}
              for t in res.trials]
    command = (f"trainperf run {args.workload} --nproc-per-node {args.gpus} {res.winner.set_line} "
               + " ".join(f"--set {o}" for o in args.overrides)).strip() if res.winner else None
    if args.json:
        print(json.dumps({"winner": res.winner.id if res.winner else None, "command": command, "trials": trials,
                          "elapsed_s": res.elapsed_s, "memory_headroom": headroom}, indent=2))
    elif res.winner:
        spent = "; the budget ran out before every round finished" if res.budget_spent else ""
        print(f"winner {res.winner.id} after {len(res.ran)} trials run ({len(trials) - len(res.ran)} ruled out "
              f"by the recalibrated planner) in {res.elapsed_s:.0f} s{spent}:\n"
              f"  trainperf run {args.workload} --nproc-per-node {args.gpus} --layout-from-plan {res.winner.id}\n"
              f"  {command}")
    else:
        print("no trial finished: nothing to recommend (see the reasons above)")
    return EXIT_OK if res.winner else EXIT_FAILED


def _save_as_plan(args, candidates: list) -> None:
    """Store the layouts tried as a plan, so the winner runs again by `run --layout-from-plan ID`."""
    import secrets

    # the store (and sqlite3) loads only when tune runs, not for --help
    from trainperf.store.db import Store

    key = secrets.token_hex(3)
    for c in candidates:
        c.id = f"{key}:{c.id}"
    store = Store(args.db)
    store.save_plan([{"plan_id": c.id, "workload": args.workload, "gpus": args.gpus, "gpus_per_node": args.gpus,
                      "gpu": args.gpu, "overrides": c.overrides,
                      "predicted": {"step_time_s": c.est.step_time_s, "peak_mem_gib": c.est.allocated_gib,
                                    "tokens_per_s_per_gpu": c.est.tokens_per_s_per_gpu}} for c in candidates])
    store.close()
