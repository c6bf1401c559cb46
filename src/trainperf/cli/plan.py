"""``trainperf plan WORKLOAD --gpus N``: rank every layout for N GPUs by predicted time (no GPU needed).

Steps: resolve the inputs, pick the GPU (the preset, or the figures the newest preflight of it
measured), search, store the ranked layouts, print them (or JSON). ``--calibrate`` instead fits the
model to the stored runs of the GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from trainperf.cli.errors import EXIT_FAILED, EXIT_OK, SpecError, bad_input
from trainperf.cli.options import HEADROOM_HELP, add_common, memory_headroom
from trainperf.core.untrusted import finite_number, printable
from trainperf.core.layout import layers_per_stage

HELP = "rank every layout for N GPUs by predicted time (no GPU needed)"
DESCRIPTION = ("Top-down estimate of memory, communication and step time for every valid "
               "layout of WORKLOAD on N GPUs; ranks those that fit.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("workload", nargs="?", default="", help="workload name (see `trainperf workloads`; not with --calibrate)")
    p.add_argument("--gpus", type=int, default=0, help="GPUs in the job (required unless --calibrate)")
    p.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node (default: min(gpus, 8))")
    p.add_argument("--gpu", default="h200", help="h100 | h200 | a100 | b200, a cluster preset (h100-sxm | h200-sxm | "
                                                 "h200-nvl | b200-sxm | gb200 | gb300: NIC and NVLink domain) or a YAML "
                                                 "file of GPU fields")
    p.add_argument("--config", help="YAML or TOML file of section: {key: value} overrides")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--top", type=int, default=10, help="how many ranked layouts to show (default 10)")
    p.add_argument("--objective", choices=["time", "throughput"], default="time",
                   help="rank by time to train (needs --samples or an MLPerf RCP) or by tokens/s")
    p.add_argument("--samples", help="samples to converge (default: the MLPerf RCP mean, if any)")
    p.add_argument("--datasheet", action="store_true",
                   help="use the GPU preset as is, not the figures the newest `trainperf preflight` of this GPU measured")
    p.add_argument("--gbs", metavar="LIST|rcp",
                   help="also search the global batch size: comma-separated values, or `rcp` for every GBS the "
                        "benchmark's RCP checker accepts (its RCPs, between two interpolated, below the smallest "
                        "against it; samples to converge as the checker computes them)")
    p.add_argument("--options", metavar="LIST|all|none", default="none",
                   help="also search this engine's speed settings, each shown in the table: compile (train.compile), "
                        "fp8 (hardware.fp8=tensorwise), frozen_dtype (LoRA's base in fp8), attention (flash4); "
                        "comma-separated, all, or none (the default: the spec's own)")
    p.add_argument("--layout", metavar="FIELDS",
                   help="also price exactly this layout and show where it ranks: comma-separated tp=N,sp,cp=N,pp=N,"
                        "vp=N (virtual stages per rank, any count the model admits),dp=N (or rep=N,shard=N),mbs=N,"
                        "gbs=N,recompute=...,schedule=...; --gpus defaults to the GPUs it names")
    p.add_argument("--layout-from-run", metavar="RUN_ID",
                   help="the same for the layout of a stored or imported run (its GPUs, layout and GBS)")
    p.add_argument("--explain", action="store_true", help="say which term makes each runner-up slower")
    p.add_argument("--memory-headroom", type=float, default=None, metavar="FRACTION", help=HEADROOM_HELP)
    p.add_argument("--calibrate", metavar="GPU_YAML", nargs="?", const="",
                   help="fit the model to the GPU runs in the store (of --gpu) and write the fitted GPU as YAML; with "
                        "--engine NAME (not trainperf): fit that engine's profile to its imported runs and print it")
    p.add_argument("--engine", default="trainperf",
                   help="whose speed to predict: trainperf (this engine, the default) or an engine whose MLPerf runs "
                        "`trainperf import` stored (e.g. nemo): its profile is fitted to them")
    add_common(p)


@dataclasses.dataclass
class Ranking:
    """What one plan found: the layouts that fit (best first) and those that do not, on one GPU."""

    gpu: object  # the planner's GPU (preset, YAML or measured)
    per_node: int
    headroom: float
    fits: list
    oom: list
    measured_note: str | None
    stored: list = dataclasses.field(default_factory=list)  # stored runs at this scale, each with its rank
    gbs_values: object = None  # the GBS values searched (None: the spec's own)
    samples: float | None = None
    named: object = None  # the --layout / --layout-from-run layout, priced (search.NamedLayout)

    @property
    def usable_gib(self) -> float:
        return round((1 - self.headroom) * self.gpu.hbm_gib, 3)

    @property
    def over_headroom(self) -> int:
        return sum(1 for c in self.oom if c.est.fits)  # would fit without the headroom


def run(args) -> int:
    # the store (and sqlite3) loads only when a command runs, not for --help
    from trainperf.store.db import StoreError

    try:
        headroom = memory_headroom(args)
    except SpecError as exc:
        return bad_input(str(exc), args.json)
    if args.calibrate is not None:
        if args.engine != "trainperf":
            return calibrate_engine(args)
        if not args.calibrate:
            return bad_input("--calibrate needs GPU_YAML (where to write the fitted GPU), or --engine NAME to fit "
                             "another engine's profile", args.json)
        return calibrate(args)
    try:
        fields = _named_layout(args)
        base = _resolve_inputs(args)
        gpu, measured_note = _pick_gpu(args)
        ranking = _search(args, base, gpu, measured_note, headroom)
        if fields is not None:
            # pricing one named layout is part of the planner, loaded only when one is named
            from trainperf.plan.search import price_layout

            ranking.named = price_layout(base, gpu, args.gpus, ranking.per_node, fields, ranking.fits, ranking.samples,
                                         args.objective, ranking.gbs_values, headroom, args.engine != "trainperf")
        ranking.stored = _stored_at_scale(args, gpu, ranking.fits)
    except SpecError as exc:
        return bad_input(str(exc), args.json)
    try:
        _save(args, ranking)
    except StoreError as exc:
        return bad_input(str(exc), args.json)
    if args.json:
        _print_json(args, ranking)
        return EXIT_OK if ranking.fits else EXIT_FAILED
    return _print_table(args, ranking)


def _named_layout(args) -> dict | None:
    """The fields of --layout (or of --layout-from-run's stored run), --gpus set to the GPUs they name when
    not given; None when neither is asked for. SpecError (one line) before any search."""
    if args.layout is not None and args.layout_from_run is not None:
        raise SpecError("--layout and --layout-from-run both name a layout; give one")
    if args.layout is None and args.layout_from_run is None:
        return None
    # the layout parser is part of the planner, loaded only when a layout is named
    from trainperf.plan.search import layout_world_size, parse_layout

    if args.layout is not None:
        fields = parse_layout(args.layout)
        named = layout_world_size(fields)
    else:
        fields, named = _stored_run_layout(args)
    if not args.gpus and named:
        args.gpus = named
    elif named and args.gpus != named:
        raise SpecError(f"the layout names {named} GPUs; --gpus is {args.gpus} (leave --gpus out to plan for {named})")
    return fields


def _stored_run_layout(args) -> tuple[dict, int]:
    """(the layout fields, GPUs) of --layout-from-run's run in the store; SpecError if there is none."""
    # the stored run's spec is read only when a run's layout is named
    from trainperf.core.spec import RunSpec

    # (the planner's reader of a spec's layout)
    from trainperf.plan.search import layout_fields_of

    # the store (and sqlite3) loads only when a command runs, not for --help
    from trainperf.store.db import Store, StoreError, require_existing_store

    try:
        require_existing_store(args.db, "`trainperf run` or `trainperf import`")
        store = Store(args.db)
        try:
            row = store.get_run(args.layout_from_run)
        finally:
            store.close()
    except StoreError as exc:
        raise SpecError(str(exc)) from None
    if row is None:
        raise SpecError(f"--layout-from-run {printable(args.layout_from_run, 40)!r}: no such run in {args.db} "
                        "(see `trainperf report`)")
    if args.workload and row["workload"] != args.workload:
        raise SpecError(f"--layout-from-run: run {printable(args.layout_from_run, 40)} trained "
                        f"{printable(row['workload'], 40)}, not {printable(args.workload, 40)}")
    args.workload = args.workload or row["workload"]
    spec = RunSpec.from_dict(json.loads(row["spec_json"]))
    return layout_fields_of(spec), int(row["world_size"])


def _resolve_inputs(args):
    """The workload's spec with the user's config and overrides; SpecError on bad input, before the GPU
    file is read or the store is opened for a preflight."""
    # the YAML/TOML readers load only when a spec is resolved, not for --help
    from trainperf.core.resolve import resolve_spec

    # the workload registry imports torch and the model: only when a plan is asked for
    from trainperf.workloads import get_workload

    if not args.workload:
        raise SpecError("give the WORKLOAD to plan (see `trainperf workloads`)")
    # the search's bounds are the planner's, loaded only when a plan is asked for
    from trainperf.plan.search import MAX_SAMPLES, check_scale

    check_scale(args.gpus, min(args.gpus, 8) if args.gpus_per_node is None else args.gpus_per_node)
    if args.top < 1:
        raise SpecError(f"--top {args.top}: give how many ranked layouts to show (>= 1)")
    if args.samples is not None:
        args.samples = finite_number(args.samples, "--samples", lo=0, lo_open=True, hi=MAX_SAMPLES)
    # gpt3 / llama31_405b derive the rate and schedule from the GBS (torch-free, as the planner)
    from trainperf.mlperf.recipes import apply_gbs_schedule

    # resolve_spec coerces each value and checks the named choices, e.g. hardware.fp8
    defaults = get_workload(args.workload).defaults()
    spec = resolve_spec(defaults, args.config, args.overrides)
    apply_gbs_schedule(spec, defaults)
    return spec


def _pick_gpu(args):
    """(the --gpu preset or YAML, a note) -- with the figures the newest preflight of it measured,
    unless --datasheet (the note names them; None when the preset is used as is)."""
    # the GPU presets load only when a plan is asked for, not for --help
    from trainperf.plan.hardware import load_gpu

    gpu = load_gpu(args.gpu)
    gpu, note = (gpu, None) if args.datasheet else _measured_gpu(gpu, args.db)  # a preflight beats the datasheet
    if args.engine == "trainperf":
        return gpu, note
    # engine profiles are part of the planner, loaded only when a plan is asked for
    from trainperf.plan.engines import apply_profile, load_profile

    # the store (and sqlite3) loads only when a command runs, not for --help
    from trainperf.store.db import Store, require_existing_store

    require_existing_store(args.db, "`trainperf import`")
    store = Store(args.db)
    try:
        profile = load_profile(store, args.engine)
    finally:
        store.close()
    fitted = ", ".join(f"{k}={v:.3g}" for k, v in (profile.factors | profile.time_terms).items())
    return apply_profile(gpu, profile), "; ".join(x for x in (note, f"engine {args.engine}: profile fitted to "
                                                              f"{len(profile.fitted_on)} stored configurations ({fitted})") if x)


def _search(args, base, gpu, measured_note: str | None, headroom: float) -> Ranking:
    """Every valid layout of the spec on --gpus GPUs, ranked."""
    # the search over layouts loads only when a plan is asked for, not for --help
    from trainperf.plan.search import plan

    per_node = min(args.gpus, 8) if args.gpus_per_node is None else args.gpus_per_node
    gbs_values = _batch_sizes(args, base)
    gbs_note = None
    if gbs_values is None and args.samples is None:
        gbs_values, gbs_note = _busy_batch_sizes(args, base)
    megatron = args.engine != "trainperf"
    if megatron:  # every published run of a Megatron engine trains in FP8 unless told otherwise
        _engine_precision(args, base)
    options = _option_sets(args, base, megatron)
    fits, oom = plan(base, gpu, args.gpus, per_node, args.samples, args.objective, gbs_values, headroom, megatron,
                     options)
    return Ranking(gpu, per_node, headroom, fits, oom, "; ".join(x for x in (measured_note, gbs_note) if x) or None,
                   gbs_values=gbs_values, samples=args.samples)


def _stored_at_scale(args, gpu, fits: list) -> list[dict]:
    """The store's successful runs of this workload and engine on --gpus GPUs of this GPU model (imported
    MLPerf results, or this engine's own), one entry per layout: the median run's tokens/s per GPU beside
    the plan's rank and prediction for that layout -- where a measured layout stands in this plan."""
    if not Path(args.db).exists():  # no store: nothing measured, and none is created by asking
        return []
    # the stored runs' specs are read only when a plan is asked for
    from trainperf.core.spec import RunSpec

    # the GPU presets are part of the planner, loaded only when a plan is asked for
    from trainperf.plan.hardware import preset_for_device

    # (the planner's ranking functions)
    from trainperf.plan.search import layout_signature, over_best, rank_of

    # the store (and sqlite3) loads only when a command runs, not for --help
    from trainperf.store.db import Store, StoreError

    try:
        store = Store(args.db)
        rows = store.list_runs(args.workload, limit=1_000_000, trials=False)
        store.close()
    except StoreError:
        return []  # an unusable --db is refused, in one line, when the plan is saved
    groups: dict[tuple, list] = {}
    for r in rows:
        hw = json.loads(r.get("hardware_json") or "{}")
        preset = preset_for_device(hw.get("gpu") or "")
        if (r["status"] != "success" or r["world_size"] != args.gpus or not r.get("tokens_per_s_per_gpu")
                or (r.get("engine") or "trainperf") != args.engine or preset is None or preset.name != gpu.name):
            continue
        spec = RunSpec.from_dict(json.loads(r["spec_json"]))
        groups.setdefault(layout_signature(spec), []).append((r, spec))
    out = []
    for members in groups.values():
        members.sort(key=lambda m: m[0]["tokens_per_s_per_gpu"])
        row, spec = members[len(members) // 2]
        rank = rank_of(fits, spec)
        cand = fits[rank - 1] if rank else None
        out.append({"layout": row["layout"], "global_batch_size": spec.train.global_batch_size, "runs": len(members),
                    "tokens_per_s_per_gpu": row["tokens_per_s_per_gpu"], "rank": rank, "ranked": len(fits),
                    "predicted_tokens_per_s_per_gpu": cand.est.tokens_per_s_per_gpu if cand else None,
                    "step_over_best": cand.est.step_time_s / fits[0].est.step_time_s - 1 if cand else None,
                    "over_best": over_best(cand, fits[0]) if cand else None})
    return sorted(out, key=lambda e: (e["rank"] is None, e["rank"] or 0))


def _figure_name(fits: list) -> str:
    """What a ranking compares layouts by: time to train where it has one, else time per sample (a step
    of another GBS is not comparable)."""
    return "time to train" if fits and fits[0].time_to_train_s else "time per sample"


def _stored_lines(ranking: Ranking) -> list[str]:
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
                         + (f", its {_figure_name(ranking.fits)} {100 * e['over_best']:+.1f}% over the best's"
                            if e["rank"] > 1 else "")
                         + f"; predicted {pred:,.0f} ({100 * (pred / e['tokens_per_s_per_gpu'] - 1):+.1f}%)")
    return lines


# a step that gives each GPU fewer tokens than this cannot keep it busy (one 8k-token sequence)
BUSY_TOKENS_PER_GPU = 8192


def _busy_batch_sizes(args, base) -> tuple[object, str | None]:
    """(the GBS values the RCP checker accepts, a note saying so) when the recipe's GBS gives each GPU less than
    BUSY_TOKENS_PER_GPU tokens per step and the benchmark has RCPs; (None, None) otherwise."""
    # the RCP tables are part of the planner, loaded only when a plan is asked for
    from trainperf.plan.search import accepted_batch_sizes

    gbs, seq = base.train.global_batch_size, base.data.seq_len
    per_gpu = gbs * seq / args.gpus
    if per_gpu >= BUSY_TOKENS_PER_GPU or not base.mlperf.comparable:
        return None, None
    accepted = accepted_batch_sizes(base)
    if accepted is None or max(accepted.points) <= gbs:
        return None, None
    return accepted, (f"the recipe's GBS {gbs} gives each of {args.gpus} GPUs {per_gpu:,.0f} tokens per step, too few "
                      f"to keep them busy: searched the GBS values the RCP checker accepts ({accepted.describe()}; time "
                      f"to train from its samples to converge); --gbs {gbs} keeps the recipe's")


def _option_sets(args, base, megatron: bool) -> list[dict] | None:
    """--options as the combinations of settings to search (None: the spec's own)."""
    # the option table is part of the planner, loaded only when a plan is asked for
    from trainperf.plan.search import ENGINE_OPTIONS, option_overrides

    if args.options == "none":
        return None
    if megatron:
        raise SpecError(f"--options searches trainperf's own settings; --engine {args.engine} is priced as it ran "
                        "(FP8, its own kernels): drop --options or --engine")
    names = list(ENGINE_OPTIONS) if args.options == "all" else [n.strip() for n in args.options.split(",") if n.strip()]
    return option_overrides(base, names)


def _engine_precision(args, base) -> None:
    """FP8 projections (and an FP8 frozen base for LoRA) for another engine, unless --set chose."""
    chosen = {o.split("=", 1)[0].strip() for o in args.overrides}
    if "hardware.fp8" not in chosen:
        base.hardware.fp8 = "tensorwise"
    if base.lora.enabled and "hardware.frozen_dtype" not in chosen and base.hardware.fp8 != "none":
        base.hardware.frozen_dtype = "fp8"


def _measured_gpu(gpu, db: str):
    """(the GPU with the newest preflight's measured figures, a note naming them), or (gpu, None)."""
    # the store (and sqlite3) loads only when a command runs, not for --help
    from trainperf.store.db import Store, StoreError

    found = None
    if Path(db).exists():  # no store: no preflight, and none is created by asking
        try:
            store = Store(db)
            found = store.latest_preflight(gpu.name)
            store.close()
        except StoreError:
            pass  # an unusable --db is refused, in one line, when the plan is saved
    overrides = dict(found["overrides"]) if found else {}
    table = overrides.get("kernel_table")
    if table and not Path(table).is_file():  # the preflight's run folder was removed
        del overrides["kernel_table"]
        print(f"trainperf: note: preflight {found['preflight_id']}'s kernel table {table} is gone; "
              "using the preset's rates", file=sys.stderr)
    if not overrides:
        return gpu, None
    return dataclasses.replace(gpu, **overrides), (
        f"using measured figures of preflight {found['preflight_id']} "
        f"({', '.join(f'{k}={v}' for k, v in overrides.items())}); --datasheet ignores them")


def _batch_sizes(args, base):
    """--gbs as the global batch sizes to search: a list, or (`rcp`) every GBS the RCP checker accepts
    (None: the spec's own)."""
    if not args.gbs:
        return None
    # the RCP interpolation is part of the planner, loaded only when a plan is asked for
    from trainperf.plan.search import accepted_batch_sizes

    if args.gbs == "rcp":
        accepted = accepted_batch_sizes(base)
        if accepted is None:
            raise SpecError(f"--gbs rcp: workload {args.workload!r} has no MLPerf RCPs to give samples to converge "
                            "at each GBS; set one with --set train.global_batch_size=N and --samples")
        return accepted
    try:
        gbs_values = [int(x) for x in args.gbs.split(",")]
    except ValueError:
        raise SpecError(f"--gbs {printable(args.gbs, 60)!r}: expected comma-separated integers or `rcp`") from None
    if not gbs_values or min(gbs_values) < 1:
        raise SpecError(f"--gbs {printable(args.gbs, 60)!r}: sizes must be >= 1")
    return gbs_values


def _save(args, ranking: Ranking) -> None:
    """Give the layouts ids of this plan and store the shown ones (for `run --layout-from-plan`)."""
    import secrets

    # the store (and sqlite3) loads only when a command runs, not for --help
    from trainperf.store.db import Store

    plan_key = secrets.token_hex(3)
    for c in ranking.fits:
        c.id = f"{plan_key}:{c.id}"
    store = Store(args.db)
    store.save_plan([{"plan_id": c.id, "workload": args.workload, "gpus": args.gpus, "gpus_per_node": ranking.per_node,
                      "gpu": ranking.gpu.name, "overrides": c.overrides,
                      "predicted": {"step_time_s": c.est.step_time_s, "peak_mem_gib": c.est.allocated_gib,
                                    "tokens_per_s_per_gpu": c.est.tokens_per_s_per_gpu}}
                     for c in ranking.fits[:args.top]])
    store.close()


def _hint(ranking: Ranking) -> str:
    """When nothing fits: what an 8-bit optimizer would save ("" if it would not help)."""
    # the memory model is part of the planner, loaded only when a plan is asked for
    from trainperf.plan.costs import eight_bit_optimizer_hint

    if not ranking.oom or ranking.fits:
        return ""
    return eight_bit_optimizer_hint(ranking.oom[0].spec, ranking.gpu, ranking.per_node, ranking.usable_gib)


def _print_json(args, ranking: Ranking) -> None:
    # explain() is part of the planner, loaded only when a plan is asked for
    from trainperf.plan.search import explain

    fits = ranking.fits
    rows = [{"id": c.id, "set": c.set_line, "layout": _layout_fields(c), "peak_gib": c.est.reserved_gib,
             "step_time_s": c.est.step_time_s,
             "tokens_per_s_per_gpu": c.est.tokens_per_s_per_gpu, "mfu": c.est.mfu,
             "memory_gib": c.est.reserved_gib, "time_to_train_s": c.time_to_train_s,
             "time_to_train_terms_s": _ttt_terms(args, c), "time_to_train_p10_p90_s": _ttt_band(args, c),
             "time": c.est.time, "memory": {k: v / 2**30 for k, v in c.est.memory.items()},
             "host_offload_gib": c.est.host_offload_bytes / 2**30,
             "comm_gib": {k: v / 2**30 for k, v in c.est.comm.items()}} for c in fits[:args.top]]
    print(json.dumps({"gpu": ranking.gpu.name, "engine": args.engine, "measured": ranking.measured_note, "gpus": args.gpus,
                      "gpus_per_node": ranking.per_node, "ranked": rows,
                      "memory_headroom": ranking.headroom, "usable_gib": ranking.usable_gib, "fitting": len(fits),
                      "not_fitting": len(ranking.oom), "over_headroom": ranking.over_headroom,
                      "hint": _hint(ranking) or None, "stored_at_scale": ranking.stored,
                      "named_layout": _named_json(ranking.named),
                      "explain": [explain(fits[0], c) for c in fits[1:args.top]] if args.explain and fits else []},
                     indent=2))


def _samples_for(args, c) -> float | None:
    """The samples to converge a ranked layout's time to train counts: --samples, else its GBS's RCP mean."""
    # the RCP lookup is the planner's, loaded only when a plan is printed
    from trainperf.plan.search import rcp_samples

    return (float(args.samples) if args.samples else rcp_samples(c.spec)) if c.time_to_train_s else None


def _ttt_terms(args, c) -> dict | None:
    """A layout's time to train by term (steps / evals / setup, seconds)."""
    # the planner's split of the time, loaded only when a plan is printed
    from trainperf.plan.search import time_to_train_terms

    n = _samples_for(args, c)
    return time_to_train_terms(c.spec, c.est, n) if n else None


def _ttt_band(args, c) -> list[float] | None:
    """One run's time to train at the 10th and 90th percentile of the RCP's samples to converge (None with
    --samples or without an RCP)."""
    # the RCP's spread is the planner's, loaded only when a plan is printed
    from trainperf.plan.search import samples_band, time_to_train

    n = None if args.samples else _samples_for(args, c)
    band = samples_band(c.spec, n) if n else None
    return [time_to_train(c.spec, c.est, b) for b in band] if band else None


def _named_json(named) -> dict | None:
    if named is None:
        return None
    c = named.candidate
    return {"set": c.set_line, "layout": _layout_fields(c), "step_time_s": c.est.step_time_s,
            "tokens_per_s_per_gpu": c.est.tokens_per_s_per_gpu, "memory_gib": c.est.reserved_gib,
            "time_to_train_s": c.time_to_train_s, "fits": named.fits, "rank": named.rank, "ranked": named.ranked,
            "searched": named.searched,
            "over_best": named.over_best, "time": c.est.time}


def _named_line(ranking: Ranking) -> str:
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


def _layout_fields(c) -> dict:
    """One ranked layout as structured fields (what --json consumers read instead of the --set line)."""
    sp, p, tr, hw = c.spec, c.spec.parallel, c.spec.train, c.spec.hardware
    return {"tp": p.tp, "sp": p.sp, "cp": p.cp, "pp": p.pp, "pp_schedule": p.pp_schedule if p.pp > 1 else None,
            "virtual_stages": p.pp_stages_per_rank or (2 if p.pp_schedule == "Interleaved1F1B" else 1) if p.pp > 1 else 1,
            "dp_replicate": p.dp_replicate, "dp_shard": p.dp_shard, "dp": p.dp_replicate * p.dp_shard,
            "global_batch_size": tr.global_batch_size, "micro_batch_size": tr.micro_batch_size,
            "recompute": tr.recompute, "recompute_layers": tr.recompute_layers, "offload_layers": tr.offload_layers,
            "fp8": hw.fp8, "compile": tr.compile, "frozen_dtype": hw.frozen_dtype, "attention": hw.attention,
            "grad_sync": tr.grad_sync, "seq_len": sp.data.seq_len}


def _options_cell(c) -> str:
    """The speed settings of a layout: compile, fp8, an fp8 frozen base, flash4, gradients reduce-scattered
    every micro-batch ('-' for none)."""
    sp = c.spec
    cells = (["compile"] if sp.train.compile else []) + ([sp.hardware.fp8] if sp.hardware.fp8 != "none" else []) \
        + (["fp8 base"] if sp.hardware.frozen_dtype == "fp8" else []) \
        + ([sp.hardware.attention] if sp.hardware.attention != "sdpa" else []) \
        + (["sync/mb"] if sp.train.grad_sync == "every" else [])
    return " ".join(cells) or "-"


def _layout_cells(args, c) -> list[str]:
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
             _options_cell(c), f"{c.est.step_time_s:.3f}", f"{c.est.tokens_per_s_per_gpu:,.0f}",
             f"{100 * c.est.mfu:.1f}%", f"{c.est.reserved_gib:.1f}"]
    if c.time_to_train_s:
        cells.append(f"{c.time_to_train_s / 60:.2f}")
        band = _ttt_band(args, c)
        cells.append(f"{band[0] / 60:.2f}-{band[1] / 60:.2f}" if band else "-")
    return cells


def _print_table(args, ranking: Ranking) -> int:
    from rich.console import Console
    from rich.table import Table

    gpu, fits, oom, over, usable = ranking.gpu, ranking.fits, ranking.oom, ranking.over_headroom, ranking.usable_gib
    console = Console(width=None if Console().is_terminal else 200)
    table = Table(title=f"trainperf plan: {args.workload} on {args.gpus} x {gpu.name} ({ranking.per_node} per node) -- "
                        f"{len(fits)} layouts fit, {len(oom)} do not"
                        + (f" ({over} only for the memory headroom)" if over else "")
                        + f" -- memory headroom {100 * ranking.headroom:g}% ({usable:.1f} of {gpu.hbm_gib:g} GiB usable)")
    for col in ("id", "GBS", "tp", "sp", "cp", "pp", "sched", "rep", "shard", "mbs", "recompute", "options", "step s",
                "tok/s/GPU", "MFU", "mem GiB") + (("TTT min", "p10-p90") if fits and fits[0].time_to_train_s else ()):
        table.add_column(col, justify="right")
    for c in fits[:args.top]:
        table.add_row(*_layout_cells(args, c))
    console.print(table)
    if ranking.measured_note:
        console.print(ranking.measured_note)
    for line in _stored_lines(ranking):
        console.print(line)
    if fits and fits[0].time_to_train_s:
        terms = _ttt_terms(args, fits[0])
        console.print(f"{fits[0].id} time to train: steps {terms['steps'] / 60:.2f} min + evals {terms['evals'] / 60:.2f} "
                      f"min + set-up {terms['setup']:.0f} s" + ("" if args.samples else
                                                                 "; p10-p90: one run's, from the RCP's spread of samples"),
                      highlight=False)
    if ranking.named is not None:
        console.print(_named_line(ranking), highlight=False)
    if not fits:
        hint = _hint(ranking)
        console.print(f"[red]no layout fits[/red]: the smallest needs {oom[0].est.reserved_gib:.1f} GiB of "
                      f"{usable:.1f} usable of {gpu.hbm_gib:.0f} GiB ({oom[0].set_line})"
                      + (f"; {over} fit only without the {100 * ranking.headroom:g}% memory headroom (--memory-headroom 0 "
                         "ranks them, at the risk of an OOM)" if over else "")
                      + (f"; {hint}" if hint else ""))
        return EXIT_FAILED
    _print_next_steps(console, args, ranking)
    return EXIT_OK


def _print_next_steps(console, args, ranking: Ranking) -> None:
    """The command that runs the best layout, and with --explain why each runner-up is slower."""
    # explain() is part of the planner, loaded only when a plan is asked for
    from trainperf.plan.search import explain

    fits, per_node = ranking.fits, ranking.per_node
    if args.engine != "trainperf":  # another engine's layout: trainperf cannot launch it
        console.print(f"best layout for {args.engine}: {fits[0].set_line}")
        return
    launch = (f"trainperf run {args.workload} --nproc-per-node {args.gpus}" if args.gpus <= per_node else
              f"srun -N {args.gpus // per_node} --ntasks-per-node {per_node} trainperf run {args.workload}")
    console.print(f"run the best: {launch} --layout-from-plan {fits[0].id}   (or: {fits[0].set_line})")
    if args.explain:
        best = fits[0]
        terms = ", ".join(f"{k} {v:.3f}s" for k, v in sorted(best.est.time.items(), key=lambda kv: -kv[1]) if v > 0)
        console.print(f"{best.id} step time: {terms}")
        for c in fits[1:args.top]:
            console.print("  " + explain(best, c))


def calibrate(args) -> int:
    """``plan --calibrate GPU_YAML``: fit the model to the stored runs of --gpu and write the fitted GPU."""
    # the planner's fit loads only when it is asked for, not for --help
    from trainperf.plan.calibrate import calibrate as fit_gpu

    # (the same module's report helpers)
    from trainperf.plan.calibrate import summary, write_gpu_yaml

    # the store (and sqlite3) loads only when a command runs, not for --help
    from trainperf.store.db import Store, StoreError

    try:
        store = Store(args.db)
        fitted, report = fit_gpu(store, args.gpu)
        store.close()
    except (SpecError, StoreError) as exc:
        return bad_input(str(exc), args.json)
    write_gpu_yaml(fitted, args.calibrate, args.gpu.lower())
    out = {"gpu": fitted.name, "other_s_per_token_layer_h": fitted.other_s_per_token_layer_h, "written": args.calibrate,
           "preset": summary(report, "preset"), "calibrated": summary(report, "calibrated"), "runs": report}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for which in ("preset", "calibrated"):
            s = out[which]
            print(f"{which:10s} {s['runs']} runs: median |step error| {100 * s['median_abs_step_error']:.1f}%, "
                  f"max {100 * s['max_abs_step_error']:.1f}%")
        print(f"wrote {args.calibrate}: use it with `trainperf plan ... --gpu {args.calibrate}`")
    return EXIT_OK


def calibrate_engine(args) -> int:
    """``plan --calibrate --engine NAME``: fit NAME's profile to its stored runs and print each factor."""
    # engine profiles are part of the planner, loaded only when a fit is asked for
    from trainperf.plan.engines import FACTORS, engine_runs, fit_profile, group_points, median_abs, profile_errors

    # the store (and sqlite3) loads only when a command runs, not for --help
    from trainperf.store.db import Store, StoreError, require_existing_store

    try:
        require_existing_store(args.db, "`trainperf import`")
        store = Store(args.db)
        try:
            points = group_points(engine_runs(store, args.engine))
        finally:
            store.close()
        profile = fit_profile(args.engine, points)
    except (SpecError, StoreError) as exc:
        return bad_input(str(exc), args.json)
    errors = profile_errors(profile, points)
    if args.json:
        print(json.dumps({"profile": profile.to_dict(), "meaning": {k: v[0] for k, v in FACTORS.items()},
                          "points": errors, "median_abs_error": median_abs([e["error"] for e in errors])}, indent=2))
        return EXIT_OK
    print(f"engine {args.engine}: profile fitted to {len(points)} stored configurations (one point each: the run "
          "with the median tokens/s per GPU)")
    for line in profile.describe():
        print("  " + line)
    print(f"  {'configuration':55s} {'stored':>9s} {'fitted':>9s}  tokens/s per GPU")
    for e in errors:
        print(f"  {e['point'][:55]:55s} {e['measured_tokens_per_s_per_gpu']:9,.0f} "
              f"{e['predicted_tokens_per_s_per_gpu']:9,.0f}  {100 * e['error']:+.1f}%")
    print(f"  median |error| {100 * median_abs([e['error'] for e in errors]):.1f}% on the points it was fitted to; "
          f"`trainperf plan WORKLOAD --gpus N --engine {args.engine}` predicts with it")
    return EXIT_OK
