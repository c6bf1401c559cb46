"""Enumerate every valid layout for N GPUs, estimate each, drop what does not fit, rank, explain."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from trainperf.core.errors import SpecError
from trainperf.core.untrusted import printable
from trainperf.core.layout import data_parallel_size, layers_per_stage
from trainperf.core.spec import PP_SCHEDULES, RECOMPUTE_MODES, RunSpec, eval_interval_samples, eval_skip_count
from trainperf.core.validate import validate_layout
from trainperf.mlperf.recipes import EVAL_ROWS, RCP_RULESET, RCP_UNIT, gbs_eval_skips, gbs_rate_span
from trainperf.mlperf.score import DEFAULT_RULESET, captured_logging, rcp_global_batch_sizes, rcp_reference_samples
from trainperf.plan.costs import Estimate, estimate
from trainperf.plan.hardware import PricedGPU as GPU  # the cost model prices a GPU as an engine runs it

# `plan`'s and `tune`'s default --memory-headroom: a layout is ranked only if its predicted reserved
# memory is at most (1 - headroom) x the GPU's. The allocated-memory prediction was measured up to
# 8.8% low (8B LoRA TP2+SP on H200; PP2 GPipe 6.3%, FSDP2 4.7%); covering 8.8% on top of the modelled
# fragmentation and context takes (1 - 2/139) / 1.088 + 2/139 = 0.92 of an H200's 139 GiB: 0.08.
# plan() itself defaults to 0 (the fit costs.estimate decides), as `run`'s pre-launch check does.
DEFAULT_MEMORY_HEADROOM = 0.08


def check_headroom(headroom: float) -> float:
    """SpecError (one line) unless 0 <= headroom < 0.5."""
    if not 0.0 <= headroom < 0.5:  # NaN fails too
        raise SpecError(f"--memory-headroom {headroom}: must be a fraction of GPU memory in [0, 0.5), "
                        f"e.g. {DEFAULT_MEMORY_HEADROOM} (the default) or 0 (rank up to the full capacity)")
    return headroom


def fits_within(est: Estimate, gpu: GPU, headroom: float = 0.0) -> bool:
    """The layout fits with ``headroom`` (a fraction of the GPU's memory) to spare; 0: costs' own fit."""
    return est.fits and (headroom <= 0 or est.reserved_gib <= (1 - headroom) * gpu.hbm_gib)


@dataclass
class Candidate:
    overrides: dict[str, object]  # the --set values that make this layout
    spec: RunSpec
    est: Estimate
    time_to_train_s: float | None = None
    id: str = ""

    @property
    def set_line(self) -> str:
        return " ".join(f"--set {k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in self.overrides.items())


def layout_signature(spec: RunSpec) -> tuple:
    """What tells two layouts apart in a ranking: the degrees, virtual stages, GBS, MBS and recompute."""
    p, t = spec.parallel, spec.train
    return (p.tp, p.cp, p.pp, p.pp_stages_per_rank or 0, p.dp_shard * p.dp_replicate, t.global_batch_size,
            t.micro_batch_size, t.recompute)


def rank_of(fits: list[Candidate], spec: RunSpec) -> int | None:
    """The 1-based rank of ``spec``'s layout among ranked candidates (None: not among them)."""
    want = layout_signature(spec)
    return next((i for i, c in enumerate(fits, 1) if layout_signature(c.spec) == want), None)


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending (trial division to the square root: n may be a GPU count in the 100,000s)."""
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return small + [n // k for k in reversed(small) if k * k != n]


# the largest job `plan` searches: ten times the largest published MLPerf run (11,616 GPUs), a
# power of two; above it the search (and the nearest-count scan beside it) would run for minutes
MAX_GPUS = 131_072
# the most samples to converge --samples takes: far beyond any benchmark (gpt3's RCPs: ~1.5e8 sequences)
MAX_SAMPLES = 1e12
# the most GPUs one node (one NVLink domain's share of a host) holds in any system planned here
MAX_GPUS_PER_NODE = 1024


def check_scale(gpus: int, gpus_per_node: int) -> None:
    """SpecError (one line) unless 1 <= gpus <= MAX_GPUS and 1 <= gpus_per_node <= MAX_GPUS_PER_NODE, the
    job being one partial node or whole nodes."""
    if not 1 <= gpus <= MAX_GPUS:
        raise SpecError(f"--gpus {gpus}: give the number of GPUs to plan for, 1 to {MAX_GPUS:,}")
    if not 1 <= gpus_per_node <= MAX_GPUS_PER_NODE:
        raise SpecError(f"--gpus-per-node {gpus_per_node}: give the GPUs in one node, 1 to {MAX_GPUS_PER_NODE} "
                        "(default: min(--gpus, 8))")
    if gpus > gpus_per_node and gpus % gpus_per_node:
        raise SpecError(f"--gpus {gpus} is not a whole number of nodes of {gpus_per_node} GPUs")


def candidate_layouts(base: RunSpec, gpus: int, gpus_per_node: int, gbs_values=None):
    """Every (pp, dp_replicate, dp_shard, cp, tp, sp, schedule, micro-batch, recompute) the engine
    accepts for this model on ``gpus`` GPUs, TP kept inside a node; with ``gbs_values`` (a list, or
    AcceptedBatchSizes) also every global batch size among them that the layout admits (an override
    only then)."""
    for layout in _layouts(gpus, gpus_per_node):
        step = layout.pop("_step")
        for gbs in batch_sizes_for(gbs_values, base, step):
            yield ({"train.global_batch_size": gbs} if gbs_values else {}) | layout


def _layouts(gpus: int, gpus_per_node: int):
    for tp in divisors(gpus):
        if tp > gpus_per_node:
            continue
        for cp in divisors(gpus // tp):
            for pp in divisors(gpus // (tp * cp)):
                if cp > 1 and pp > 1:
                    continue
                dp = gpus // (tp * cp * pp)
                for rep in divisors(dp):
                    for sp in ([True, False] if tp > 1 else [False]):
                        for sched in (PP_SCHEDULES if pp > 1 else ("1F1B",)):
                            for mbs in (1, 2, 4, 8):
                                for rc in RECOMPUTE_MODES:
                                    yield {"parallel.tp": tp, "parallel.sp": sp, "parallel.cp": cp, "parallel.pp": pp,
                                           "parallel.pp_schedule": sched, "parallel.dp_replicate": rep,
                                           "parallel.dp_shard": dp // rep, "train.micro_batch_size": mbs,
                                           "train.recompute": rc, "_step": dp * mbs}


# between two RCP points (and below the smallest) a search tries at most this many of the GBS values a
# layout admits there, evenly spaced, both ends included: time to train is convex in the GBS inside a
# gap (samples linear in it, the step a fixed part plus one per micro-batch), so its best lies near
# the sampled ones
GBS_PER_GAP = 6


@dataclass(frozen=True)
class AcceptedBatchSizes:
    """Every global batch size a closed submission may train at with a reference to converge to, as
    the RCP checker finds one (``rcp_checker.check_directory``): an RCP's own GBS, any GBS between two
    RCPs (against the RCP it interpolates, ``_create_interp_rcp``), and any below the smallest RCP
    (against the smallest), from the rules' smallest GBS; above the largest RCP the checker finds none."""

    points: tuple[int, ...]  # the RCP file's GBS values, ascending
    least: int = 1  # the smallest GBS the rules give a learning rate for

    def values(self, step: int, least: int = 1) -> list[int]:
        """The GBS values a layout whose GBS must be a multiple of ``step`` (and at least ``least``) is
        tried at: every RCP point it admits, and GBS_PER_GAP of the multiples inside each gap."""
        lo = max(self.least, least)
        out = {g for g in self.points if g % step == 0 and g >= lo}
        edges = [lo - 1, *self.points]
        for a, b in zip(edges, edges[1:]):
            first, last = max(a + 1, lo), b - 1  # strictly inside the gap (a point is counted above)
            k0, k1 = -(-first // step), last // step
            if k1 < k0:
                continue
            n = k1 - k0 + 1
            picks = {k0 + round(i * (n - 1) / (GBS_PER_GAP - 1)) for i in range(GBS_PER_GAP)} if n > GBS_PER_GAP \
                else set(range(k0, k1 + 1))
            out |= {k * step for k in picks}
        return sorted(out)

    def describe(self) -> str:
        pts = ", ".join(map(str, self.points))
        return (f"RCPs at GBS {pts}, any GBS between two (against the RCP interpolated between them) and below "
                f"{self.points[0]} (against it)" + (f" from {self.least}" if self.least > 1 else ""))


def batch_sizes_for(gbs_values, base: RunSpec, step: int, least: int = 1) -> list[int]:
    """The global batch sizes a layout whose GBS must be a multiple of ``step`` is tried at: the spec's
    own (no ``gbs_values``), the listed ones it admits, or the accepted ones (AcceptedBatchSizes)."""
    if isinstance(gbs_values, AcceptedBatchSizes):
        return gbs_values.values(step, least)
    return [g for g in (gbs_values or [base.train.global_batch_size]) if g % step == 0 and g >= least]


def accepted_batch_sizes(spec: RunSpec) -> AcceptedBatchSizes | None:
    """The GBS values the benchmark's RCP checker accepts (None: the benchmark has no RCPs)."""
    points = rcp_batch_sizes(spec)
    if not points:
        return None
    span = gbs_rate_span(spec.mlperf.benchmark)
    return AcceptedBatchSizes(tuple(g for g in points if g <= span[1]), span[0])


# the engine's speed settings `plan --options` searches beside the layout: name -> (setting, values);
# each combination is validated like a layout (fp8 with TP, compile with CP, flash4 with CP are refused)
ENGINE_OPTIONS = {
    "compile": ("train.compile", (False, True)),
    "fp8": ("hardware.fp8", ("none", "tensorwise")),
    "frozen_dtype": ("hardware.frozen_dtype", ("auto", "fp8")),  # LoRA's frozen base in float8 (needs fp8)
    "attention": ("hardware.attention", ("sdpa", "flash4")),
}


def option_overrides(base: RunSpec, names: list[str]) -> list[dict]:
    """Every combination of the named ENGINE_OPTIONS (a setting the spec cannot use is left out: the
    frozen dtype without LoRA); SpecError for an unknown name."""
    unknown = [n for n in names if n not in ENGINE_OPTIONS]
    if unknown:
        raise SpecError(f"--options {','.join(unknown)}: unknown; valid: {', '.join(ENGINE_OPTIONS)}, all or none")
    combos: list[dict] = [{}]
    for name in names:
        if name == "frozen_dtype" and not base.lora.enabled:
            continue
        key, values = ENGINE_OPTIONS[name]
        combos = [c | {key: v} for c in combos for v in values]
    return [c for c in combos if not (c.get("hardware.frozen_dtype") == "fp8" and c.get("hardware.fp8") != "tensorwise")]


# virtual pipeline stages per rank an interleaved Megatron schedule is searched over
MEGATRON_VIRTUAL_STAGES = (1, 2, 3, 4, 6, 8)


def megatron_layouts(base: RunSpec, gpus: int, gpus_per_node: int, gbs_values=None, nvlink_domain: int = 0):
    """The layouts a Megatron-based engine (NeMo) runs: TP (with SP) inside the NVLink domain (a node,
    or ``nvlink_domain`` GPUs if fewer: TP's per-layer collectives need NVLink), CP and PP together
    allowed, PP interleaved over virtual stages, data parallelism by its distributed optimizer (no
    replicate/shard split), no activation recomputation (none of NVIDIA's published configs uses it)
    or full recomputation; each at the global batch sizes of ``gbs_values`` it admits (at least PP
    micro-batches per pipeline, a multiple of PP of them when interleaved)."""
    tp_limit = min(gpus_per_node, nvlink_domain) if nvlink_domain > 0 else gpus_per_node
    for tp in (t for t in divisors(gpus) if t <= tp_limit):
        for cp in divisors(gpus // tp):
            for pp in divisors(gpus // (tp * cp)):
                dp = gpus // (tp * cp * pp)
                for vp in (MEGATRON_VIRTUAL_STAGES if pp > 1 else (1,)):
                    for mbs in (1, 2, 4):
                        unit = dp * mbs
                        for gbs in batch_sizes_for(gbs_values, base, unit * (pp if vp > 1 else 1), unit * pp):
                            for rc in ("none", "full"):
                                yield ({"train.global_batch_size": gbs} if gbs_values else {}) | {
                                    "parallel.tp": tp, "parallel.sp": tp > 1, "parallel.cp": cp, "parallel.pp": pp,
                                    "parallel.pp_schedule": "Interleaved1F1B" if vp > 1 else "1F1B",
                                    "parallel.pp_stages_per_rank": vp if vp > 1 else 0, "parallel.dp_replicate": 1,
                                    "parallel.dp_shard": dp, "train.micro_batch_size": mbs, "train.recompute": rc}


def megatron_layout_ok(spec: RunSpec) -> bool:
    """Megatron's own constraints: heads and KV heads split over TP, the sequence into 2 x CP chunks,
    the layers (plus the embedding and loss as stages of their own, NeMo's asymmetric pipeline) over
    PP x virtual stages, at least PP micro-batches per step; LoRA fine-tuning at micro-batch 1 (NeMo
    fine-tunes on packed sequences, and its fine-tuning data module refuses a larger micro-batch)."""
    m, p, t = spec.model, spec.parallel, spec.train
    if spec.lora.enabled and t.micro_batch_size > 1:
        return False
    vp = p.pp_stages_per_rank or 1
    dp = p.dp_replicate * p.dp_shard
    micro = t.global_batch_size // (dp * t.micro_batch_size)
    layers_ok = any((m.num_layers + extra) % (p.pp * vp) == 0 for extra in (0, 2)) and m.num_layers >= p.pp * vp
    return (m.num_heads % p.tp == 0 and (m.num_kv_heads % p.tp == 0 or p.tp % m.num_kv_heads == 0)
            and spec.data.seq_len % (2 * p.cp * (p.tp if p.sp else 1)) == 0 and layers_ok
            and (p.pp == 1 or micro >= p.pp) and (p.pp == 1 or vp == 1 or micro % p.pp == 0))


def _apply(base: RunSpec, overrides: dict) -> RunSpec:
    """A shallow copy with new parallel/train/hardware sections (thousands of candidates: no deep copies)."""
    by_section: dict[str, dict] = {"hardware": {"device": "cuda"}}
    for key, value in overrides.items():
        section, name = key.split(".")
        by_section.setdefault(section, {})[name] = value
    gbs = overrides.get("train.global_batch_size")
    if gbs is not None and "eval.skip_first" not in overrides:  # the rules derive the skipped evals from the GBS
        skips = gbs_eval_skips(base, gbs)
        if skips is not None:
            by_section.setdefault("eval", {})["skip_first"] = skips
    return dataclasses.replace(base, **{sec: dataclasses.replace(getattr(base, sec), **vals)
                                        for sec, vals in by_section.items()})


def rcp_ruleset(benchmark: str) -> str:
    """The training ruleset whose RCPs a benchmark is priced with (gpt3 left the rules after 4.1.0)."""
    return RCP_RULESET.get(benchmark, DEFAULT_RULESET)


def rcp_samples(spec: RunSpec) -> float | None:
    """Samples to converge at this GBS as MLPerf's RCP checker sees them (rcp_samples_at, under the
    benchmark's rcp_ruleset); None for workloads without RCPs or open-division runs."""
    if not spec.mlperf.benchmark or not spec.mlperf.comparable:
        return None
    return rcp_samples_at(spec, rcp_ruleset(spec.mlperf.benchmark))


def rcp_samples_at(spec: RunSpec, ruleset: str) -> float | None:
    """The olympic mean of the reference convergence points of ``ruleset`` at the spec's GBS,
    interpolated between two RCPs where the GBS has none (pruned RCPs), in samples (gpt3's token counts
    in sequences); None where the ruleset has none for it."""
    bench, gbs = spec.mlperf.benchmark, spec.train.global_batch_size
    found = rcp_reference_samples(bench, gbs, ruleset)
    points = rcp_global_batch_sizes(bench, ruleset)
    if not found and points and gbs_rate_span(bench)[0] <= gbs < points[-1]:
        # below the smallest RCP the checker kept (pruning may drop smaller ones: 405B's 1008 in 5.0.0), the
        # checker compares with that smallest one
        kept = (rcp_reference_samples(bench, p, ruleset) for p in points if p > gbs)
        found = next((r for r in kept if r and r[1].startswith("rcp ") and not r[1].endswith("(pruned)")), None)
    if not found:
        return None
    return found[0] / spec.data.seq_len if RCP_UNIT.get(spec.mlperf.benchmark) == "tokens" else found[0]


# a run's samples to converge between the RCP's 10th and 90th percentiles: mean -/+ this many stdevs
# (normal, as the RCP checker's t-test takes them)
P10_P90_Z = 1.2816


def rcp_stdev_at(spec: RunSpec, ruleset: str) -> float | None:
    """The standard deviation of samples to converge (in samples; gpt3's tokens in sequences) of the
    reference the RCP checker compares this GBS with -- an RCP, the one it interpolates between two
    (``_create_interp_rcp`` interpolates the stdev as the mean), or below the smallest RCP the
    smallest; None without one. The same reference rcp_samples_at takes the mean of."""
    from mlperf_logging.rcp_checker import rcp_checker

    bench, gbs = spec.mlperf.benchmark, spec.train.global_batch_size
    if rcp_samples_at(spec, ruleset) is None:
        return None
    try:
        with captured_logging():  # the checker logs what it builds at INFO
            checker = rcp_checker.RCP_Checker("training", ruleset, bench, False)
            rec = checker._find_rcp(gbs, "pruned_rcps") or checker._find_rcp(gbs, "full_rcps")
            if rec is None:
                lo, hi = checker._find_top_min_rcp(gbs, "pruned_rcps"), checker._find_bottom_max_rcp(gbs, "pruned_rcps")
                rec = checker._create_interp_rcp(gbs, lo, hi)[1] if lo and hi else checker._find_min_rcp("pruned_rcps")
    except Exception:  # no RCP file for this benchmark / ruleset
        return None
    stdev = float(rec["RCP Stdev"])
    return stdev / spec.data.seq_len if RCP_UNIT.get(bench) == "tokens" else stdev


def samples_band(spec: RunSpec, samples: float, ruleset: str | None = None) -> tuple[float, float] | None:
    """(p10, p90) of one run's samples to converge around ``samples`` (the RCP mean) from the RCP's
    spread; None without an RCP."""
    sd = rcp_stdev_at(spec, ruleset or rcp_ruleset(spec.mlperf.benchmark))
    if sd is None:
        return None
    return max(spec.train.global_batch_size, samples - P10_P90_Z * sd), samples + P10_P90_Z * sd


def time_to_train(spec: RunSpec, est, samples: float) -> float:
    """What MLPerf times from run_start to run_stop: the training steps to ``samples``, the evals on the way
    (every interval after the skipped ones, each over the validation rows split across the data-parallel
    ranks) and the run's set-up inside the clock (time_to_train_terms)."""
    return sum(time_to_train_terms(spec, est, samples).values())


def time_to_train_terms(spec: RunSpec, est, samples: float) -> dict[str, float]:
    """time_to_train's seconds by term: steps, evals, setup (what a measured run splits into too)."""
    rows = spec.data.eval_samples or EVAL_ROWS.get(spec.mlperf.benchmark, 0)
    per_eval = math.ceil(rows / data_parallel_size(spec.parallel)) * est.eval_seconds_per_row
    return {"steps": samples / spec.train.global_batch_size * est.step_time_s,
            "evals": evals_to(spec, samples) * per_eval, "setup": getattr(est, "run_setup_s", 0.0)}


def evals_to(spec: RunSpec, samples: float) -> int:
    """The evals a run makes on the way to ``samples``: one every interval, the skipped ones left out."""
    return max(0, math.ceil(samples / eval_interval_samples(spec)) - eval_skip_count(spec))


def rcp_batch_sizes(spec: RunSpec) -> list[int]:
    """The GBS values the benchmark's RCPs cover, so a GBS search has samples to converge for."""
    return rcp_global_batch_sizes(spec.mlperf.benchmark, rcp_ruleset(spec.mlperf.benchmark))


def plan(base: RunSpec, gpu: GPU, gpus: int, gpus_per_node: int, samples: float | None = None,
         objective: str = "time", gbs_values: list[int] | None = None,
         headroom: float = 0.0, megatron: bool = False,
         options: list[dict] | None = None) -> tuple[list[Candidate], list[Candidate]]:
    """(fitting candidates ranked best first, candidates that do not fit). ``gbs_values``: search the
    global batch size too (samples to converge then come from the RCPs at each GBS). ``headroom``: a
    fraction of the GPU's memory a layout must leave free to fit (those that fit only without it land
    among the second list, their ``est.fits`` still true)."""
    check_headroom(headroom)
    check_scale(gpus, gpus_per_node)
    if gbs_values and samples:
        raise SpecError("--gbs searches the global batch size with samples to converge from the MLPerf RCPs; "
                        "drop --samples (one sample count cannot hold for every GBS)")
    if gbs_values and not isinstance(gbs_values, AcceptedBatchSizes):  # each GBS is ranked by the samples its RCP
        # says it converges in: one without RCP cannot be
        uncovered = [g for g in gbs_values if rcp_samples(_apply(base, {"train.global_batch_size": g})) is None]
        if uncovered:
            covered = rcp_batch_sizes(base)
            raise SpecError(f"--gbs {','.join(map(str, uncovered))}: no MLPerf RCP gives samples to converge at that "
                            "global batch size; " + (f"the RCPs span GBS {covered[0]} to {covered[-1]} ({', '.join(map(str, covered))}; "
                                                     "interpolated between)" if covered else
                                                     f"{base.workload} has no RCPs (give --samples and no --gbs)"))
    fixed_samples = samples or (None if gbs_values else rcp_samples(base))
    fits, oom = [], []
    rcp_cache: dict[int, float | None] = {}
    layouts = megatron_layouts(base, gpus, gpus_per_node, gbs_values, int(gpu.nvlink_domain)) if megatron \
        else candidate_layouts(base, gpus, gpus_per_node, gbs_values)
    for overrides in (layout | option for layout in layouts for option in options or [{}]):
        spec = _apply(base, overrides)
        if megatron and not megatron_layout_ok(spec):
            continue
        try:
            if not megatron:
                validate_layout(spec, cuda=True)  # layouts priced for GPUs
        except SpecError:
            continue
        est = estimate(spec, gpu, gpus_per_node)
        if not megatron and not fits_within(est, gpu, headroom):
            overrides, spec, est = _sharded_gradients(base, overrides, spec, est, gpu, gpus_per_node)
        variants = [] if megatron else _partial_recompute(base, overrides, spec, est, gpu, gpus_per_node, headroom)
        for overrides, spec, est in [(overrides, spec, est), *variants]:
            _rank_one(overrides, spec, est, fits_within(est, gpu, headroom), fits, oom, fixed_samples, gbs_values,
                      rcp_cache)
    if not fits and not oom:
        raise SpecError(f"no valid layout of {gpus} GPUs for this model (heads, layers, sequence length and "
                        "batch size admit none); " + nearest_valid_counts(base, gpus, gpus_per_node, gbs_values, megatron))
    # ties (e.g. micro-batch sizes the model cannot tell apart) go to the layout needing less memory
    key = (lambda c: (-c.est.tokens_per_s_per_gpu, c.est.reserved_gib)) \
        if objective == "throughput" or not (fixed_samples or gbs_values) \
        else (lambda c: (c.time_to_train_s, c.est.reserved_gib))
    fits.sort(key=megatron_tie_break(key) if megatron else key)
    oom.sort(key=lambda c: c.est.reserved_gib)
    for i, c in enumerate(fits, 1):
        c.id = f"P{i}"
    return fits, oom


TIE_TOLERANCE = 0.003  # predictions closer than this are not told apart by the model


def megatron_tie_break(key):
    """Rank layouts whose predictions differ by less than TIE_TOLERANCE by the smaller model-parallel
    group (tp x cp x pp: less traffic the model prices as hidden), then the smaller micro-batch count
    of virtual stages, then memory -- what an engineer picks when the model cannot tell them apart."""
    def ranked(c):
        first = key(c)
        value = abs(first[0]) if first[0] else 0.0
        bucket = round(math.log(value) / math.log1p(TIE_TOLERANCE)) if value > 0 else 0
        p = c.spec.parallel
        return (bucket if first[0] >= 0 else -bucket, p.tp * p.cp * p.pp, p.pp_stages_per_rank,
                c.spec.train.micro_batch_size, c.est.reserved_gib)
    return ranked


def valid_batch_sizes(base: RunSpec, gpus: int, gpus_per_node: int, gbs_values, megatron: bool) -> list[int]:
    """The global batch sizes (of ``gbs_values``, else the spec's) with at least one valid layout on
    ``gpus`` GPUs (validity only: nothing is estimated)."""
    found = set()
    layouts = megatron_layouts(base, gpus, gpus_per_node, gbs_values) if megatron \
        else candidate_layouts(base, gpus, gpus_per_node, gbs_values)
    for overrides in layouts:
        gbs = overrides.get("train.global_batch_size", base.train.global_batch_size)
        if gbs in found or overrides["train.recompute"] != "none" or overrides["train.micro_batch_size"] != 1:
            continue  # the most permissive variant of each layout decides
        spec = _apply(base, overrides)
        try:
            if megatron_layout_ok(spec) if megatron else validate_layout(spec, cuda=True) is None:
                found.add(gbs)
        except SpecError:
            continue
    return sorted(found)


def nearest_valid_counts(base: RunSpec, gpus: int, gpus_per_node: int, gbs_values: list[int] | None,
                         megatron: bool, max_nodes_away: int = 64) -> str:
    """The nearest whole-node GPU counts below and above ``gpus`` that have a valid layout, with the
    global batch sizes that give one, as a clause for the error."""
    step = gpus_per_node if gpus >= gpus_per_node else 1
    found = {}
    for direction in (-1, 1):
        for k in range(1, max_nodes_away + 1):
            n = gpus + direction * k * step
            if n < 1:
                break
            sizes = valid_batch_sizes(base, n, gpus_per_node, gbs_values, megatron)
            if sizes:
                found[n] = sizes
                break
    if not found:
        return "no GPU count within 64 nodes has one either"
    return "the nearest counts that have one: " + "; ".join(
        f"{n} GPUs (GBS {', '.join(map(str, sizes))})" for n, sizes in sorted(found.items()))


def _rank_one(overrides, spec, est, ok, fits, oom, fixed_samples, gbs_values, rcp_cache) -> None:
    cand = Candidate(overrides, spec, est)
    n = fixed_samples
    if gbs_values:
        g = spec.train.global_batch_size
        if g not in rcp_cache:
            rcp_cache[g] = rcp_samples(spec)
        n = rcp_cache[g]
        if n is None:
            return  # no RCP reaches this GBS: no time to train to rank it by
    if n:
        cand.time_to_train_s = time_to_train(spec, est, n)
    (fits if ok else oom).append(cand)


def _sharded_gradients(base, overrides, spec, est, gpu, gpus_per_node):
    """A layout over the memory because its micro-batches hold whole fp32 gradients (train.grad_sync=last):
    the same with a reduce-scatter after every micro-batch, when the engine allows it (pp=1) and it
    needs less memory; the layout as it is otherwise."""
    if spec.train.grad_sync != "last" or spec.parallel.pp > 1 or spec.lora.enabled:
        return overrides, spec, est
    o = overrides | {"train.grad_sync": "every"}
    every = _apply(base, o)
    every_est = estimate(every, gpu, gpus_per_node)
    return (o, every, every_est) if every_est.reserved_gib < est.reserved_gib else (overrides, spec, est)


def _partial_recompute(base, overrides, spec, est, gpu, gpus_per_node, headroom: float = 0.0) -> list:
    """For a full-recompute layout that fits: the variants that recompute the fewest layers per stage
    and still fit (train.recompute_layers), the others keeping every activation or, second variant,
    recomputing only their pointwise ops (train.recompute_others=selective) -- a variant is dropped
    when its fewest is every layer (no gain), or zero with nothing else (already a candidate) -- and
    for each, the best trade of recomputed layers for offloaded ones (train.offload_layers), if any pays."""
    if spec.train.recompute != "full" or not fits_within(est, gpu, headroom):
        return []
    per_stage = layers_per_stage(spec)
    out = []
    for others in ("none", "selective"):
        o = overrides | ({} if others == "none" else {"train.recompute_others": "selective"})
        k = _fewest_recomputed_layers(base, o, per_stage, gpu, gpus_per_node, headroom)
        if k > 0:  # activations in host memory instead of some of the recomputation
            offloaded = _best_offload(base, o | {"train.recompute_layers": k}, per_stage, gpu, gpus_per_node, headroom)
            if offloaded is not None:
                out.append((offloaded[0], _apply(base, offloaded[0]), offloaded[1]))
        if k == per_stage or (k == 0 and others == "none"):
            continue
        o = o | {"train.recompute_layers": k}
        s = _apply(base, o)
        out.append((o, s, estimate(s, gpu, gpus_per_node)))
    return out


def _best_offload(base, overrides, per_stage, gpu, gpus_per_node, headroom: float = 0.0):
    """The fastest (train.offload_layers, train.recompute_layers) pair that fits the device and the
    pinned host memory budget: for each count of offloaded layers, the fewest recomputed ones beside
    them. Every count is tried: the copies hide under the recomputation between offloaded layers
    until PCIe saturates, so the step time is not monotonic in it. None when offloading never pays."""
    best, best_time = None, estimate(_apply(base, overrides), gpu, gpus_per_node).step_time_s
    for n in range(1, per_stage + 1):
        o = overrides | {"train.offload_layers": n}
        if not fits_within(estimate(_apply(base, o | {"train.recompute_layers": per_stage - n}), gpu, gpus_per_node),
                           gpu, headroom):
            break  # not even with every other layer recomputed; more offloaded layers only pin more host memory
        o = o | {"train.recompute_layers": _fewest_recomputed_layers(base, o, per_stage - n, gpu, gpus_per_node, headroom)}
        est = estimate(_apply(base, o), gpu, gpus_per_node)
        if est.step_time_s < best_time:
            best, best_time = (o, est), est.step_time_s
    return best


def _fewest_recomputed_layers(base, overrides, per_stage, gpu, gpus_per_node, headroom: float = 0.0) -> int:
    """Binary search for the smallest train.recompute_layers that fits within the headroom (every
    layer recomputed fits)."""
    lo, hi = 0, per_stage
    while lo < hi:
        mid = (lo + hi) // 2
        if fits_within(estimate(_apply(base, overrides | {"train.recompute_layers": mid}), gpu, gpus_per_node), gpu,
                       headroom):
            hi = mid
        else:
            lo = mid + 1
    return lo


def explain(winner: Candidate, loser: Candidate) -> str:
    """Which time term costs the loser most against the winner."""
    diffs = {k: loser.est.time.get(k, 0.0) - winner.est.time.get(k, 0.0) for k in set(winner.est.time) | set(loser.est.time)}
    term, extra = max(diffs.items(), key=lambda kv: kv[1])
    return (f"{loser.id} is {loser.est.step_time_s - winner.est.step_time_s:+.3f} s/step slower, mostly {term} "
            f"({extra:+.3f} s)")


# ---------------------------------------------------------------------------------------------
# One layout the user names (plan --layout / --layout-from-run), priced and placed in the ranking

# --layout's keys: name -> (the override it sets, its type)
LAYOUT_KEYS = {"tp": ("parallel.tp", int), "sp": ("parallel.sp", bool), "cp": ("parallel.cp", int),
               "pp": ("parallel.pp", int), "vp": ("parallel.pp_stages_per_rank", int),
               "schedule": ("parallel.pp_schedule", str), "dp": (None, int), "rep": ("parallel.dp_replicate", int),
               "shard": ("parallel.dp_shard", int), "mbs": ("train.micro_batch_size", int),
               "gbs": ("train.global_batch_size", int), "recompute": ("train.recompute", str)}
LAYOUT_HELP = ("tp=N,sp,cp=N,pp=N,vp=N (virtual stages per pipeline rank),schedule=GPipe|1F1B|Interleaved1F1B,"
               "dp=N (or rep=N,shard=N),mbs=N,gbs=N,recompute=none|selective|full")
MAX_LAYOUT_DEGREE = MAX_GPUS


def parse_layout(text: str) -> dict[str, object]:
    """``tp=4,sp,cp=2,dp=96,mbs=1`` as {key: value} of LAYOUT_KEYS; SpecError (one line) naming the bad item."""
    fields: dict[str, object] = {}
    for item in (x.strip() for x in str(text).split(",")):
        if not item:
            continue
        name, eq, value = (s.strip() for s in item.partition("="))
        name = name.lower()
        if name not in LAYOUT_KEYS:
            raise SpecError(f"--layout: {printable(item, 40)!r} is not a layout field; give {LAYOUT_HELP}")
        if name in fields:
            raise SpecError(f"--layout: {name} is given twice")
        kind = LAYOUT_KEYS[name][1]
        if kind is bool:
            if eq and value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise SpecError(f"--layout: {name}={printable(value, 20)!r}: give {name} or {name}=true|false")
            fields[name] = not eq or value.lower() in ("true", "1", "yes")
        elif kind is int:
            if not value.isdigit() or not 1 <= int(value) <= MAX_LAYOUT_DEGREE:
                raise SpecError(f"--layout: {name}={printable(value, 20)!r}: give a whole number 1 to "
                                f"{MAX_LAYOUT_DEGREE:,}")
            fields[name] = int(value)
        else:
            allowed = PP_SCHEDULES if name == "schedule" else RECOMPUTE_MODES
            match = next((a for a in allowed if a.lower() == value.lower()), None)
            if match is None:
                raise SpecError(f"--layout: {name}={printable(value, 20)!r}: give one of {', '.join(allowed)}")
            fields[name] = match
    if not fields:
        raise SpecError(f"--layout is empty; give {LAYOUT_HELP}")
    return fields


def layout_fields_of(spec: RunSpec) -> dict[str, object]:
    """A stored run's layout as parse_layout's fields (what --layout-from-run prices)."""
    p, t = spec.parallel, spec.train
    return {"tp": p.tp, "sp": p.sp, "cp": p.cp, "pp": p.pp, "vp": p.pp_stages_per_rank or 1,
            "schedule": p.pp_schedule, "rep": p.dp_replicate, "shard": p.dp_shard, "mbs": t.micro_batch_size,
            "gbs": t.global_batch_size, "recompute": t.recompute}


def layout_world_size(fields: dict) -> int | None:
    """The GPUs a layout names (tp x cp x pp x dp), None when it leaves the data-parallel size open."""
    dp = fields.get("dp") or (fields["rep"] * fields["shard"] if "rep" in fields and "shard" in fields else None)
    return None if dp is None else fields.get("tp", 1) * fields.get("cp", 1) * fields.get("pp", 1) * dp


def layout_overrides(fields: dict, gpus: int, megatron: bool) -> dict[str, object]:
    """The --set values of a named layout on ``gpus`` GPUs (the data-parallel size what the others leave);
    SpecError when its degrees do not multiply to ``gpus``."""
    tp, cp, pp = fields.get("tp", 1), fields.get("cp", 1), fields.get("pp", 1)
    model = tp * cp * pp
    if gpus % model:
        raise SpecError(f"--layout: tp x cp x pp = {model} does not divide --gpus {gpus}")
    named = layout_world_size(fields)
    if named is not None and named != gpus:
        raise SpecError(f"--layout names {named} GPUs (tp x cp x pp x dp); --gpus is {gpus}")
    dp = gpus // model
    rep = fields.get("rep") or (dp // fields["shard"] if "shard" in fields and dp % fields["shard"] == 0 else 1)
    if dp % rep or ("shard" in fields and rep * fields["shard"] != dp):
        raise SpecError(f"--layout: rep x shard must be the data-parallel size {dp}")
    if megatron and rep != 1:
        raise SpecError("--layout: a Megatron engine's data parallelism is its distributed optimizer: give dp=N, "
                        "not rep=")
    vp = fields.get("vp", 1)
    schedule = fields.get("schedule") or ("Interleaved1F1B" if vp > 1 else "1F1B")
    if vp > 1 and schedule != "Interleaved1F1B":
        raise SpecError(f"--layout: vp={vp} needs schedule=Interleaved1F1B (virtual stages interleave)")
    out = {"parallel.tp": tp, "parallel.sp": fields.get("sp", tp > 1 and megatron), "parallel.cp": cp,
           "parallel.pp": pp, "parallel.pp_schedule": schedule if pp > 1 else "1F1B",
           "parallel.pp_stages_per_rank": vp if pp > 1 and vp > 1 else 0, "parallel.dp_replicate": rep,
           "parallel.dp_shard": dp // rep, "train.micro_batch_size": fields.get("mbs", 1),
           "train.recompute": fields.get("recompute", "none")}
    if "gbs" in fields:
        out["train.global_batch_size"] = fields["gbs"]
    return out


@dataclass
class NamedLayout:
    """A layout the user named, priced: where it would rank among the searched layouts."""

    candidate: Candidate
    fits: bool  # within the memory the ranking allows
    rank: int  # the place it would take among the ranked layouts (1 = best)
    ranked: int
    over_best: float | None  # its ranking figure (time to train, else step time) against the best's: 0.02 = 2%
    searched: bool = False  # the search ranked this layout itself (rank is its place there)


def price_layout(base: RunSpec, gpu: GPU, gpus: int, gpus_per_node: int, fields: dict, fits: list[Candidate],
                 samples: float | None = None, objective: str = "time", gbs_values=None, headroom: float = 0.0,
                 megatron: bool = False) -> NamedLayout:
    """Price exactly the layout ``fields`` names (any virtual-stage count the model admits, beside the
    searched ones) and place it among ``fits`` (plan()'s ranking of the same search). Without a gbs field
    it is priced at each GBS the search tried for its shape and the best is kept. SpecError (one line)
    for a layout the engine cannot run."""
    overrides = layout_overrides(fields, gpus, megatron)
    p_dp = overrides["parallel.dp_replicate"] * overrides["parallel.dp_shard"]
    step = p_dp * overrides["train.micro_batch_size"]
    if "train.global_batch_size" in overrides:
        sizes = [overrides.pop("train.global_batch_size")]
    else:
        sizes = batch_sizes_for(gbs_values, base, step)
    if not sizes or any(g % step for g in sizes):
        raise SpecError(f"--layout: its data-parallel size {p_dp} x micro-batch {overrides['train.micro_batch_size']} "
                        f"divides no global batch size searched ({base.train.global_batch_size}"
                        f"{' and the RCP-accepted ones' if gbs_values else ''}); give gbs=N, a multiple of {step}")
    priced = []
    for gbs in sizes:
        o = ({"train.global_batch_size": gbs} if gbs != base.train.global_batch_size or gbs_values else {}) | overrides
        spec = _apply(base, o)
        if megatron:
            if not megatron_layout_ok(spec):
                raise SpecError(f"--layout {describe_fields(fields)} at GBS {gbs}: not a layout the engine runs (heads "
                                "and KV heads over tp, the sequence over 2 x cp, the layers over pp x vp, at least pp "
                                "micro-batches -- a multiple of pp when interleaved -- and LoRA at mbs=1)")
        else:
            validate_layout(spec, cuda=True)  # its own one-line SpecError says what is wrong
        est = estimate(spec, gpu, gpus_per_node)
        cand = Candidate(o, spec, est, id="named")
        n = samples if samples else rcp_samples(spec)
        if n:
            cand.time_to_train_s = time_to_train(spec, est, n)
        priced.append(cand)
    timed = objective == "time" and all(c.time_to_train_s for c in priced) and all(c.time_to_train_s for c in fits)

    def figure(c: Candidate) -> float:  # what plan() ranks by: time to train, else seconds per sample
        return c.time_to_train_s if timed else c.est.step_time_s / c.spec.train.global_batch_size

    cand = min(priced, key=figure)
    found = rank_of(fits, cand.spec)
    rank = found or 1 + sum(1 for c in fits if figure(c) < figure(cand))
    return NamedLayout(cand, fits_within(cand.est, gpu, headroom), rank, len(fits),
                       figure(cand) / figure(fits[0]) - 1 if fits else None, found is not None)


def over_best(c: Candidate, best: Candidate) -> float:
    """How much longer ``c``'s ranking figure is than ``best``'s (0.02: 2%): time to train where both have
    one, else time per sample -- a step of another GBS is not comparable."""
    if c.time_to_train_s and best.time_to_train_s:
        return c.time_to_train_s / best.time_to_train_s - 1
    return (c.est.step_time_s / c.spec.train.global_batch_size) / (best.est.step_time_s / best.spec.train.global_batch_size) - 1


def describe_fields(fields: dict) -> str:
    return ",".join(k if v is True else f"{k}={v}" for k, v in fields.items() if v is not False)
