"""One ``trainperf plan``: the request, the GPU it prices (the preset, the figures the newest preflight
of it measured, an imported engine's fitted profile), the search, the stored runs at this scale, and
the plan kept in the store for ``run --layout-from-plan``. The command line parses the options into a
PlanRequest, calls ``make_plan`` and prints the Ranking.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import sys
from pathlib import Path
from typing import Callable

from trainperf.core.errors import SpecError
from trainperf.core.resolve import resolve_spec
from trainperf.core.spec import RunSpec
from trainperf.core.untrusted import finite_number, printable
from trainperf.mlperf.recipes import apply_gbs_schedule
from trainperf.plan.engines import EngineProfile, apply_profile, is_profile_file, load_profile, read_profile_file
from trainperf.plan.hardware import load_gpu, preset_for_device
from trainperf.plan.nemo import MegatronLayout, megatron_violations
from trainperf.plan.profile import ENGINE_KINDS, OURS, EngineKind, kind_named
from trainperf.plan.search import (ENGINE_OPTIONS, MAX_SAMPLES, accepted_batch_sizes, check_scale, describe_fields,
                                   layout_fields_of,
                                   layout_signature, layout_world_size, option_overrides, over_best, parse_layout,
                                   plan, price_layout, rank_of)
from trainperf.store.db import Store, StoreError, require_existing_store


@dataclasses.dataclass
class PlanRequest:
    """What ``trainperf plan`` was asked (its options, by the same names)."""

    workload: str = ""
    gpus: int = 0
    gpus_per_node: int | None = None
    gpu: str = "h200"
    config: str | None = None
    overrides: list = dataclasses.field(default_factory=list)
    top: int = 10
    objective: str = "time"
    samples: object = None
    datasheet: bool = False
    gbs: str | None = None
    options: str = "none"
    layout: str | None = None
    layout_from_run: str | None = None
    engine: str = "trainperf"  # a stored engine's name, or a profile file (plan --calibrate --engine NAME --json)
    explain: bool = False
    db: str = "trainperf.db"
    headroom: float = 0.0

    @classmethod
    def from_options(cls, options, headroom: float) -> "PlanRequest":
        """From parsed options with these names (argparse's Namespace), and the memory headroom."""
        return cls(**{f.name: getattr(options, f.name) for f in dataclasses.fields(cls) if f.name != "headroom"},
                   headroom=headroom)


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
    engine: str = OURS  # whose speed it predicts (the name its runs are stored under)
    kind: EngineKind = ENGINE_KINDS[OURS]  # that engine's kind: the layouts it runs, how they are written

    @property
    def usable_gib(self) -> float:
        return round((1 - self.headroom) * self.gpu.hbm_gib, 3)

    @property
    def over_headroom(self) -> int:
        return sum(1 for c in self.oom if c.est.fits)  # would fit without the headroom


def make_plan(req: PlanRequest, workload_defaults: Callable[[str], RunSpec]) -> Ranking:
    """Search, rank and keep the plan ``req`` asks for (``workload_defaults(name)``: the workload's default
    spec, from the registry the caller holds); SpecError (one line) on bad input before any search,
    StoreError when the plan cannot be kept."""
    fields = named_layout(req)
    base = resolve_inputs(req, workload_defaults)
    gpu, measured_note, profile = pick_gpu(req)
    if fields is not None and kind_named(profile.kind).search == "megatron":
        check_megatron_fields(fields, base, req.gpus, profile.name)  # before any search
    ranking = search(req, base, gpu, measured_note, req.headroom, profile)
    if fields is not None:
        ranking.named = price_layout(base, gpu, req.gpus, ranking.per_node, fields, ranking.fits, ranking.samples,
                                     req.objective, ranking.gbs_values, req.headroom, ranking.kind.search == "megatron")
    ranking.stored = stored_at_scale(req, gpu, ranking.fits, ranking.engine)
    save(req, ranking)
    return ranking


def check_megatron_fields(fields: dict, base: RunSpec, gpus: int, engine: str) -> None:
    """SpecError naming each of Megatron's rules a --layout for a Megatron engine breaks (a layout whose
    degrees do not multiply to --gpus is refused by the search's own check)."""
    tp, cp, pp = fields.get("tp", 1), fields.get("cp", 1), fields.get("pp", 1)
    if gpus % (tp * cp * pp):
        return
    m = base.model
    lay = MegatronLayout(tp, cp, pp, fields.get("vp", 1), gpus // (tp * cp * pp), bool(fields.get("sp", tp > 1)),
                         fields.get("mbs", 1), fields.get("gbs"), m.num_layers, m.num_heads, m.num_kv_heads,
                         base.data.seq_len, base.lora.enabled)
    broken = megatron_violations(lay)
    if broken:
        raise SpecError(f"--layout {describe_fields(fields)}: not a layout {printable(engine, 40)} runs: "
                        + "; ".join(broken))


def named_layout(req) -> dict | None:
    """The fields of --layout (or of --layout-from-run's stored run), --gpus set to the GPUs they name when
    not given; None when neither is asked for. SpecError (one line) before any search."""
    if req.layout is not None and req.layout_from_run is not None:
        raise SpecError("--layout and --layout-from-run both name a layout; give one")
    if req.layout is None and req.layout_from_run is None:
        return None
    if req.layout is not None:
        fields = parse_layout(req.layout)
        named = layout_world_size(fields)
    else:
        fields, named = stored_run_layout(req)
    if not req.gpus and named:
        req.gpus = named
    elif named and req.gpus != named:
        raise SpecError(f"the layout names {named} GPUs; --gpus is {req.gpus} (leave --gpus out to plan for {named})")
    return fields


def stored_run_layout(req) -> tuple[dict, int]:
    """(the layout fields, GPUs) of --layout-from-run's run in the store; SpecError if there is none."""
    try:
        require_existing_store(req.db, "`trainperf run` or `trainperf import`")
        store = Store(req.db)
        try:
            row = store.get_run(req.layout_from_run)
        finally:
            store.close()
    except StoreError as exc:
        raise SpecError(str(exc)) from None
    if row is None:
        raise SpecError(f"--layout-from-run {printable(req.layout_from_run, 40)!r}: no such run in {req.db} "
                        "(see `trainperf report`)")
    if req.workload and row["workload"] != req.workload:
        raise SpecError(f"--layout-from-run: run {printable(req.layout_from_run, 40)} trained "
                        f"{printable(row['workload'], 40)}, not {printable(req.workload, 40)}")
    req.workload = req.workload or row["workload"]
    spec = RunSpec.from_dict(json.loads(row["spec_json"]))
    return layout_fields_of(spec), int(row["world_size"])


def resolve_inputs(req, workload_defaults):
    """The workload's spec with the user's config and overrides; SpecError on bad input, before the GPU
    file is read or the store is opened for a preflight."""
    if not req.workload:
        raise SpecError("give the WORKLOAD to plan (see `trainperf workloads`)")

    check_scale(req.gpus, min(req.gpus, 8) if req.gpus_per_node is None else req.gpus_per_node)
    if req.top < 1:
        raise SpecError(f"--top {req.top}: give how many ranked layouts to show (>= 1)")
    if req.samples is not None:
        req.samples = finite_number(req.samples, "--samples", lo=0, lo_open=True, hi=MAX_SAMPLES)

    # resolve_spec coerces each value and checks the named choices, e.g. hardware.fp8
    defaults = workload_defaults(req.workload)
    spec = resolve_spec(defaults, req.config, req.overrides)
    apply_gbs_schedule(spec, defaults)
    return spec


def pick_gpu(req) -> tuple:
    """(the --gpu preset or YAML, a note, the engine's profile) -- with the figures the newest preflight of
    it measured, unless --datasheet (the note names them; None when the preset is used as is), priced
    with the profile of --engine: this engine's own, a profile file's, or one fitted to the stored runs
    of that engine (whose name says its kind)."""
    gpu = load_gpu(req.gpu)
    gpu, note = (gpu, None) if req.datasheet else measured_gpu(gpu, req.db)  # a preflight beats the datasheet
    if req.engine == OURS:
        return gpu, note, EngineProfile(OURS, kind=OURS)
    if is_profile_file(req.engine):
        profile = read_profile_file(req.engine)
        fitted = f"engine {profile.name}: profile {printable(req.engine, 80)}"
    else:
        require_existing_store(req.db, "`trainperf import`")
        store = Store(req.db)
        try:
            profile = load_profile(store, req.engine)
        finally:
            store.close()
        fitted = f"engine {req.engine}: profile fitted to {len(profile.fitted_on)} stored configurations"
    factors = ", ".join(f"{k}={v:.3g}" for k, v in (profile.factors | profile.time_terms).items())
    return apply_profile(gpu, profile), "; ".join(x for x in (note, f"{fitted} ({factors})") if x), profile


def measured_gpu(gpu, db: str):
    """(the GPU with the newest preflight's measured figures, a note naming them), or (gpu, None)."""
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


def search(req, base, gpu, measured_note: str | None, headroom: float, profile: EngineProfile) -> Ranking:
    """Every valid layout of the spec on --gpus GPUs that the profile's kind of engine runs, ranked."""
    kind = kind_named(profile.kind)
    per_node = min(req.gpus, 8) if req.gpus_per_node is None else req.gpus_per_node
    gbs_values = batch_sizes(req, base)
    gbs_note = None
    if gbs_values is None and req.samples is None:
        gbs_values, gbs_note = busy_batch_sizes(req, base)
    if kind.fp8_by_default:  # every published run of a Megatron engine trains in FP8 unless told otherwise
        engine_precision(req, base)
    options = option_sets(req, base, kind)
    fits, oom = plan(base, gpu, req.gpus, per_node, req.samples, req.objective, gbs_values, headroom,
                     kind.search == "megatron", options)
    return Ranking(gpu, per_node, headroom, fits, oom, "; ".join(x for x in (measured_note, gbs_note) if x) or None,
                   gbs_values=gbs_values, samples=req.samples, engine=profile.name, kind=kind)


def batch_sizes(req, base):
    """--gbs as the global batch sizes to search: a list, or (`rcp`) every GBS the RCP checker accepts
    (None: the spec's own)."""
    if not req.gbs:
        return None

    if req.gbs == "rcp":
        accepted = accepted_batch_sizes(base)
        if accepted is None:
            raise SpecError(f"--gbs rcp: workload {req.workload!r} has no MLPerf RCPs to give samples to converge "
                            "at each GBS; set one with --set train.global_batch_size=N and --samples")
        return accepted
    try:
        gbs_values = [int(x) for x in req.gbs.split(",")]
    except ValueError:
        raise SpecError(f"--gbs {printable(req.gbs, 60)!r}: expected comma-separated integers or `rcp`") from None
    if not gbs_values or min(gbs_values) < 1:
        raise SpecError(f"--gbs {printable(req.gbs, 60)!r}: sizes must be >= 1")
    return gbs_values


# a step that gives each GPU fewer tokens than this cannot keep it busy (one 8k-token sequence)
BUSY_TOKENS_PER_GPU = 8192


def busy_batch_sizes(req, base) -> tuple[object, str | None]:
    """(the GBS values the RCP checker accepts, a note saying so) when the recipe's GBS gives each GPU less than
    BUSY_TOKENS_PER_GPU tokens per step and the benchmark has RCPs; (None, None) otherwise."""
    gbs, seq = base.train.global_batch_size, base.data.seq_len
    per_gpu = gbs * seq / req.gpus
    if per_gpu >= BUSY_TOKENS_PER_GPU or not base.mlperf.comparable:
        return None, None
    accepted = accepted_batch_sizes(base)
    if accepted is None or max(accepted.points) <= gbs:
        return None, None
    return accepted, (f"the recipe's GBS {gbs} gives each of {req.gpus} GPUs {per_gpu:,.0f} tokens per step, too few "
                      f"to keep them busy: searched the GBS values the RCP checker accepts ({accepted.describe()}; time "
                      f"to train from its samples to converge); --gbs {gbs} keeps the recipe's")


def option_sets(req, base, kind: EngineKind) -> list[dict] | None:
    """--options as the combinations of settings to search (None: the spec's own)."""

    if req.options == "none":
        return None
    if not kind.own_options:
        raise SpecError(f"--options searches trainperf's own settings; --engine {req.engine} is priced as it ran "
                        "(FP8, its own kernels): drop --options or --engine")
    names = list(ENGINE_OPTIONS) if req.options == "all" else [n.strip() for n in req.options.split(",") if n.strip()]
    return option_overrides(base, names)


def engine_precision(req, base) -> None:
    """FP8 projections (and an FP8 frozen base for LoRA) for another engine, unless --set chose."""
    chosen = {o.split("=", 1)[0].strip() for o in req.overrides}
    if "hardware.fp8" not in chosen:
        base.hardware.fp8 = "tensorwise"
    if base.lora.enabled and "hardware.frozen_dtype" not in chosen and base.hardware.fp8 != "none":
        base.hardware.frozen_dtype = "fp8"


def stored_at_scale(req, gpu, fits: list, ranking_engine: str) -> list[dict]:
    """The store's successful runs of this workload and engine on --gpus GPUs of this GPU model (imported
    MLPerf results, or this engine's own), one entry per layout: the median run's tokens/s per GPU beside
    the plan's rank and prediction for that layout -- where a measured layout stands in this plan."""
    if not Path(req.db).exists():  # no store: nothing measured, and none is created by asking
        return []
    try:
        store = Store(req.db)
        rows = store.list_runs(req.workload, limit=1_000_000, trials=False)
        store.close()
    except StoreError:
        return []  # an unusable --db is refused, in one line, when the plan is saved
    groups: dict[tuple, list] = {}
    for r in rows:
        hw = json.loads(r.get("hardware_json") or "{}")
        preset = preset_for_device(hw.get("gpu") or "")
        if (r["status"] != "success" or r["world_size"] != req.gpus or not r.get("tokens_per_s_per_gpu")
                or (r.get("engine") or OURS) != ranking_engine or preset is None or preset.name != gpu.name):
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


def save(req, ranking: Ranking) -> None:
    """Give the layouts ids of this plan and store the shown ones (for `run --layout-from-plan`)."""
    plan_key = secrets.token_hex(3)
    for c in ranking.fits:
        c.id = f"{plan_key}:{c.id}"
    store = Store(req.db)
    store.save_plan([{"plan_id": c.id, "workload": req.workload, "gpus": req.gpus, "gpus_per_node": ranking.per_node,
                      "gpu": ranking.gpu.name, "overrides": c.overrides,
                      "predicted": {"step_time_s": c.est.step_time_s, "peak_mem_gib": c.est.allocated_gib,
                                    "tokens_per_s_per_gpu": c.est.tokens_per_s_per_gpu}}
                     for c in ranking.fits[:req.top]])
    store.close()
