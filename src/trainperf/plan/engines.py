"""Engine profiles: how fast an engine runs the work the cost model counts, as a few named factors.

The cost model counts the work of a layout (GEMM and attention FLOPs, elementwise bytes, TP / CP /
DP / PP traffic, host launches); an engine profile says what rate the engine reaches on each. The
``trainperf`` profile is this engine's own, measured by its benches (the GPU presets' efficiencies
and host constants, unchanged). Another engine's profile is fitted to its stored runs (``trainperf
import`` of its MLPerf submissions) by least squares on the relative error of tokens/s per GPU, each
factor held near a prior value by a weak penalty, so that a handful of runs cannot drive a factor
somewhere meaningless: a fit, not a regression over layouts.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from trainperf.core.errors import SpecError
from trainperf.core.hardware import gpu_model
from trainperf.core.spec import RunSpec
from trainperf.core.untrusted import finite_number, printable
from trainperf.plan.hardware import PricedGPU, preset_for_device, scale_host_time
from trainperf.plan.profile import ENGINE_KINDS, OURS, kind_named, kind_of_engine


# factor -> (what it means, prior, lower bound, upper bound, prior's weight in the fit)
FACTORS: dict[str, tuple[str, float, float, float, float]] = {
    "gemm_eff": ("fraction of the GEMM peak (the fp8 peak for fp8 projections) the engine's GEMMs reach",
                 0.60, 0.2, 0.95, 0.5),
    "attn_eff": ("fraction of the bf16 peak its attention kernels reach, forward + backward", 0.45, 0.1, 0.9, 0.5),
    "elementwise_ns": ("non-GEMM work (norms, RoPE, activations, casts) in ns per token per layer per 1,000 of "
                       "hidden size (this engine eager: 234)", 30.0, 0.0, 300.0, 0.3),
    "tp_exposed": ("share of tensor-parallel traffic left on the critical path (TP comm overlap)", 0.3, 0.0, 1.0, 0.5),
    "comm_overlap": ("share of data- and context-parallel traffic hidden under compute", 0.85, 0.0, 1.0, 0.5),
    "step_overhead_s": ("seconds each optimizer step costs beside its compute and exposed traffic (reductions of "
                        "the gradient norm and loss, unhidden first/last buckets, synchronisation)", 0.1, 0.0, 2.0, 0.2),
}
# the factors a profile fixes without fitting: what an engine that captures CUDA graphs and fuses its
# casts into the neighbouring kernels (NeMo / Megatron with Transformer Engine) spends beside the above;
# how it shards data parallelism, rings GQA's KV heads, overlaps its pipeline sends, stores FP8
# activations and splits its stages are its kind's switches (plan/profile.py ENGINE_KINDS)
FIXED_FOR_FITTED = {"host_scale": 0.0, "fp8_cast_bytes": 0.0, "cp_attn_slowdown": 1.0,
                    # Transformer Engine's CP ring, per step per layer, forward + backward: ~25 small kernels
                    # (chunk selection, the attention pieces, softmax correction, gradient accumulation) and
                    # their stream waits at ~4 us each -- an estimate from the kernel count, not a measurement
                    "cp_ring_step_s": 100e-6,
                    # FlashAttention-style kernels reach about half their long-sequence rate near 256
                    # queries (a 128-query tile per SM, the causal diagonal, the last wave)
                    "attn_half_rate_tokens": 256.0}
# float8 GEMM rates by shape for fitted engines (Transformer Engine's float8 linears call the same
# cuBLASLt kernels the grid times), unless the GPU names its own: measured on an H200 and used for the
# H100 too -- the same GH100 die and 132 SMs, so the same tiles and waves -- as a share of the grid's
# best; gemm_eff sets the level
FP8_GEMM_GRID = "h200"
FP8_GRID_GPUS = ("H100", "H200")  # GH100 parts; a B200 (other SMs, other tiles) keeps the flat rate
# time to train beside the steps, fitted to the points' runs after the rates (their time outside their
# steps: the run's time less its samples' steps at its measured step time): name -> meaning. No fixed
# cost per eval: a few evals per calibration run cannot tell one from the run's set-up
# (fitted together they trade 1:5), and a fixed cost per eval multiplies where evals are many and short
# (70B at 1,024 GPUs: 12 evals of 2 rows per rank)
TIME_TERMS: dict[str, str] = {
    "eval_host_s_per_layer": "host seconds per layer of a stage an eval micro-batch's eager forward costs (the "
                             "slower of it and the GPU's forward sets the eval)",
    "run_setup_s": "seconds a run spends inside the clock beside its steps and evals (first steps, allocator, "
                   "the first eval's set-up)",
}
MIN_RUN_GROUPS = 3  # distinct (benchmark, GPUs, layout) points a fit needs: fewer leave the factors undetermined


@dataclass(frozen=True)
class EngineProfile:
    """An engine's kind (its switches, plan/profile.py) and its rates: fitted factors, or none for this
    engine's own (the presets' measured rates)."""

    name: str
    factors: dict[str, float] = field(default_factory=dict)  # empty: the GPU preset's own rates (trainperf)
    fitted_on: tuple[str, ...] = ()  # the points it was fitted to, "benchmark@GPUs layout"
    time_terms: dict[str, float] = field(default_factory=dict)  # TIME_TERMS fitted ({}: none, 0 s)
    kind: str = "megatron"  # ENGINE_KINDS: the only kind of fitted engine the cost model prices today

    def describe(self) -> list[str]:
        if not self.factors:
            return [f"{self.name}: this engine's own rates (the GPU presets, from its benches)"]
        return [f"{k:15s} {v:8.3f}  {FACTORS[k][0]}" for k, v in self.factors.items()] \
            + [f"{k:15s} {v:8.4g}  {TIME_TERMS[k]}" for k, v in self.time_terms.items()]

    def to_dict(self) -> dict:
        return {"name": self.name, "factors": dict(self.factors), "time_terms": dict(self.time_terms),
                "fitted_on": list(self.fitted_on)}


def apply_profile(gpu: PricedGPU, profile: EngineProfile | None) -> PricedGPU:
    """The GPU as the planner sees it when this engine runs on it: the profile's rates, its kind's switches."""
    if profile is None or not profile.factors:
        return gpu
    f = profile.factors
    out = dataclasses.replace(
        gpu, kernel_table="", gemm_eff=f["gemm_eff"], fp8_gemm_eff=f["gemm_eff"], attn_eff=f["attn_eff"],
        other_s_per_token_layer_h=f["elementwise_ns"] * 1e-12, compile_other_factor=1.0, tp_overhead_s_per_layer=0.0,
        tp_comm_exposed=f["tp_exposed"], comm_overlap=f["comm_overlap"], step_overhead_s=f["step_overhead_s"],
        fp8_cast_bytes_eager=FIXED_FOR_FITTED["fp8_cast_bytes"], fp8_cast_bytes_compiled=FIXED_FOR_FITTED["fp8_cast_bytes"],
        cp_attn_slowdown=FIXED_FOR_FITTED["cp_attn_slowdown"], cp_ring_step_s=FIXED_FOR_FITTED["cp_ring_step_s"],
        attn_half_rate_tokens=FIXED_FOR_FITTED["attn_half_rate_tokens"],
        fp8_gemm_grid=gpu.fp8_gemm_grid or default_fp8_grid(gpu),
        **dataclasses.asdict(kind_named(profile.kind).switches),
        **{k: profile.time_terms.get(k, 0.0) for k in TIME_TERMS})
    return scale_host_time(out, FIXED_FOR_FITTED["host_scale"])


def default_fp8_grid(gpu: PricedGPU) -> str:
    """The packaged float8 grid for a GH100 GPU (H100, H200; SXM or NVL), '' (flat rate) for any other."""
    return FP8_GEMM_GRID if gpu_model(gpu.name) in FP8_GRID_GPUS else ""


@dataclass
class EngineRun:
    """One stored run of an engine, as the fit sees it."""

    run_id: str
    spec: RunSpec
    gpu: PricedGPU
    gpus_per_node: int
    tokens_per_s_per_gpu: float
    time_to_train_s: float | None
    label: str
    samples_to_target: float | None = None  # the run's samples to its target (gpt3: tokens), as logged


def engine_run_from_row(row: dict) -> EngineRun | None:
    """A stored (or imported) run row as a fit point; None without a throughput or a GPU preset."""
    hw = json.loads(row.get("hardware_json") or "{}")
    gpu = preset_for_device(hw.get("gpu") or "")
    if gpu is None or not row.get("tokens_per_s_per_gpu"):
        return None
    spec = RunSpec.from_dict(json.loads(row["spec_json"]))
    # the rules are the planner's (mlperf.recipes): a run evaluated at its own round's cadence
    from trainperf.mlperf.recipes import apply_round_eval_schedule

    apply_round_eval_schedule(spec, str(json.loads(row.get("software_json") or "{}").get("round", "")))
    return EngineRun(row["run_id"], spec, gpu, int(hw.get("gpus_per_node") or 8), row["tokens_per_s_per_gpu"],
                     row.get("time_to_train_s") if row["status"] == "success" else None,
                     f"{row['workload']}@{row['world_size']} {row['layout']} {gpu.name.split()[1]}",
                     row.get("samples_to_target") if row["status"] == "success" else None)


def engine_runs(store, engine: str) -> list[EngineRun]:
    """The stored runs of ``engine`` with a throughput, on a GPU the planner has a preset for."""
    rows = [r for r in store.list_runs(limit=1_000_000) if (r.get("engine") or OURS) == engine]
    return [run for run in map(engine_run_from_row, rows) if run is not None]


def group_points(runs: list[EngineRun]) -> list[EngineRun]:
    """One point per (benchmark, GPUs, layout, GPU): the run with the median throughput of its group."""
    groups: dict[str, list[EngineRun]] = {}
    for r in runs:
        groups.setdefault(r.label, []).append(r)
    return [sorted(g, key=lambda r: r.tokens_per_s_per_gpu)[len(g) // 2] for g in groups.values()]


def fit_profile(name: str, points: list[EngineRun], kind: str = "megatron") -> EngineProfile:
    """Least squares on log(predicted / published tokens/s per GPU), plus a weak pull of each factor
    towards its prior (log ratio times its weight); SpecError naming what is needed when too few."""
    if name == OURS:
        raise SpecError(f"--engine {OURS} is this engine's own profile (the GPU presets, fitted by `plan --calibrate "
                        "GPU_YAML` to its GPU runs); name another engine to fit its imported runs")
    if len(points) < MIN_RUN_GROUPS:
        have = ", ".join(p.label for p in points) or "none"
        raise SpecError(f"engine {name!r}: {len(points)} distinct run configurations stored ({have}); a fit needs at least "
                        f"{MIN_RUN_GROUPS} (different benchmarks, GPU counts or layouts) -- import more with "
                        "`trainperf import DIR`")
    # the fit uses scipy's least squares (an optional dependency of the planner, as plan --calibrate)
    from scipy.optimize import least_squares

    # the estimate lives in the cost model, which imports this module's GPU type only
    from trainperf.plan.costs import estimate

    names = list(FACTORS)
    lo = [FACTORS[k][2] for k in names]
    hi = [FACTORS[k][3] for k in names]

    def residuals(x):
        prof = EngineProfile(name, dict(zip(names, x)), kind=kind)
        out = [math.log(estimate(p.spec, apply_profile(p.gpu, prof), p.gpus_per_node).tokens_per_s_per_gpu
                        / p.tokens_per_s_per_gpu) for p in points]
        return out + [FACTORS[k][4] * math.log(max(v, 1e-3) / max(FACTORS[k][1], 1e-3)) for k, v in zip(names, x)]

    x0 = [FACTORS[k][1] for k in names]
    fit = least_squares(residuals, x0, bounds=(lo, hi))
    rates = EngineProfile(name, {k: float(v) for k, v in zip(names, fit.x)}, tuple(p.label for p in points), kind=kind)
    return dataclasses.replace(rates, time_terms=fit_time_terms(rates, points))


def outside_steps(p: EngineRun) -> tuple[float, float] | None:
    """(seconds the run spent outside its steps, its samples in sequences) of a point's run: its time to
    train less its samples' steps at its measured step time; None without them."""
    # what the RCPs count progress in is the rules' (mlperf.recipes)
    from trainperf.mlperf.recipes import RCP_UNIT

    if not p.time_to_train_s or not p.samples_to_target:
        return None
    spec = p.spec
    samples = p.samples_to_target / (spec.data.seq_len if RCP_UNIT.get(spec.mlperf.benchmark) == "tokens" else 1)
    gpus = spec.parallel.tp * spec.parallel.cp * spec.parallel.pp * spec.parallel.dp_replicate * spec.parallel.dp_shard
    step = spec.train.global_batch_size * spec.data.seq_len / (p.tokens_per_s_per_gpu * gpus)
    return p.time_to_train_s - samples / spec.train.global_batch_size * step, samples


def fit_time_terms(rates: EngineProfile, points: list[EngineRun]) -> dict[str, float]:
    """TIME_TERMS fitted to each point's time outside its steps (outside_steps): for each eval host cost
    per layer on a grid (EVAL_HOST_GRID_S), the set-up is the median over the points of what their evals
    leave (a median: one run whose steps vary, slow blocks no eval explains, must not set it for all,
    and no run's set-up is negative); the grid value with the least squared error, as shares of each
    run's time to train, is kept. {} when fewer than MIN_RUN_GROUPS points have a time to train."""
    # the data-parallel size of a layout is the core's
    from trainperf.core.layout import data_parallel_size

    # the validation rows of each benchmark are the rules' (mlperf.recipes)
    from trainperf.mlperf.recipes import EVAL_ROWS

    # the cost model and the eval count are the planner's
    from trainperf.plan.costs import estimate
    from trainperf.plan.search import evals_to

    rows = []
    for p in points:
        found = outside_steps(p)
        if found is None:
            continue
        outside, samples = found
        spec = p.spec
        est = estimate(spec, apply_profile(p.gpu, rates), p.gpus_per_node)  # the GPU's eval forward, no host term
        per_rank = math.ceil((spec.data.eval_samples or EVAL_ROWS.get(spec.mlperf.benchmark, 0))
                             / data_parallel_size(spec.parallel))
        layers_per_row = spec.model.num_layers / spec.parallel.pp / spec.train.micro_batch_size
        rows.append((evals_to(spec, samples) * per_rank, est.eval_seconds_per_row, layers_per_row, outside,
                     p.time_to_train_s))
    if len(rows) < MIN_RUN_GROUPS:
        return {}
    best = None
    for h in EVAL_HOST_GRID_S:
        evals = [n * max(gpu_row, h * layers) for n, gpu_row, layers, _, _ in rows]
        setup = max(0.0, statistics.median(o - e for e, (_, _, _, o, _) in zip(evals, rows)))
        err = sum(((e + setup - o) / t) ** 2 for e, (_, _, _, o, t) in zip(evals, rows))
        if best is None or err < best[0]:
            best = (err, h, setup)
    return {"eval_host_s_per_layer": best[1], "run_setup_s": best[2]}


# the eval host costs per layer fit_time_terms tries: 0 to 20 ms in steps of 0.05 ms
EVAL_HOST_GRID_S = tuple(i * 5e-5 for i in range(401))


def profile_errors(profile: EngineProfile, points: list[EngineRun]) -> list[dict]:
    """Predicted against stored tokens/s per GPU for each point."""
    # the estimate lives in the cost model
    from trainperf.plan.costs import estimate

    out = []
    for p in points:
        est = estimate(p.spec, apply_profile(p.gpu, profile), p.gpus_per_node)
        out.append({"point": p.label, "measured_tokens_per_s_per_gpu": p.tokens_per_s_per_gpu,
                    "predicted_tokens_per_s_per_gpu": est.tokens_per_s_per_gpu,
                    "error": est.tokens_per_s_per_gpu / p.tokens_per_s_per_gpu - 1})
    return out


def median_abs(values: list[float]) -> float:
    return statistics.median(abs(v) for v in values) if values else float("nan")


def load_profile(store, name: str) -> EngineProfile:
    """``trainperf``: this engine's own; any other name: fitted now to that engine's stored runs, as the
    kind of engine its name says (nemo: megatron) -- SpecError when the planner models no such kind."""
    if name == OURS:
        return EngineProfile(OURS, kind=OURS)
    runs = engine_runs(store, name)
    kind = kind_of_engine(name)
    if runs and kind is None:
        raise SpecError(f"engine {printable(name, 40)!r}: its stored runs are of no engine kind the planner models ("
                        + "; ".join(f"{k.name}: {', '.join(k.engines)}" for k in ENGINE_KINDS.values())
                        + "); give --engine a profile file with its kind to price it as one")
    return fit_profile(name, group_points(runs), kind.name if kind else "megatron")


PROFILE_SUFFIXES = (".yaml", ".yml", ".json")


def is_profile_file(engine: str) -> bool:
    """Whether --engine names a profile file rather than a stored engine."""
    return engine.lower().endswith(PROFILE_SUFFIXES)


def read_profile_file(path: str) -> EngineProfile:
    """A profile as ``plan --calibrate --engine NAME --json`` prints it (its "profile" object, or the whole
    output), YAML or JSON: name, factors (every one of FACTORS), time_terms (of TIME_TERMS), and kind
    (ENGINE_KINDS; default: the kind of the engine named). SpecError saying what is wrong."""
    import yaml  # (YAML is a superset of JSON: one reader for both)

    where = f"--engine {printable(path, 80)!r}"
    if not Path(path).is_file():
        raise SpecError(f"{where}: no such profile file (write one with `trainperf plan --calibrate --engine NAME "
                        "--json`)")
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise SpecError(f"{where}: not valid YAML or JSON ({str(exc).splitlines()[0]})") from None
    data = data.get("profile", data) if isinstance(data, dict) else data
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not isinstance(data.get("factors"), dict):
        raise SpecError(f"{where}: expected a mapping with name and factors ({', '.join(FACTORS)})")
    kind = data.get("kind") or getattr(kind_of_engine(data["name"]), "name", None)
    if kind not in ENGINE_KINDS or kind == OURS:
        raise SpecError(f"{where}: kind {kind!r}; give kind: one of "
                        f"{', '.join(k for k in ENGINE_KINDS if k != OURS)}")
    factors, terms = data["factors"], data.get("time_terms") or {}
    if set(factors) != set(FACTORS) or not isinstance(terms, dict) or not set(terms) <= set(TIME_TERMS):
        raise SpecError(f"{where}: factors must be exactly {', '.join(FACTORS)}; time_terms some of "
                        f"{', '.join(TIME_TERMS)}")
    fitted = {k: finite_number(factors[k], f"{where} {k}", lo=FACTORS[k][2], hi=FACTORS[k][3]) for k in FACTORS}
    timed = {k: finite_number(v, f"{where} {k}", lo=0) for k, v in terms.items()}
    return EngineProfile(printable(data["name"], 40), fitted, tuple(str(x) for x in data.get("fitted_on") or ()), timed,
                         kind)


def fit_stored_engine(db: str, name: str) -> tuple[EngineProfile, list[EngineRun], list[dict]]:
    """``plan --calibrate --engine NAME``: (NAME's profile fitted to its stored runs, the points, each
    point's stored against fitted tokens/s per GPU). SpecError / StoreError."""
    # the store (and sqlite3) loads only when a fit is asked for
    from trainperf.store.db import Store, require_existing_store

    require_existing_store(db, "`trainperf import`")
    store = Store(db)
    try:
        points = group_points(engine_runs(store, name))
    finally:
        store.close()
    profile = fit_profile(name, points)
    return profile, points, profile_errors(profile, points)
