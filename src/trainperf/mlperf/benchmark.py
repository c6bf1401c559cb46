"""`Benchmark`: everything the MLPerf rules say of one training benchmark, in one value.

An instance (one module per benchmark under ``mlperf/benchmarks/``, listed in its registry) holds the
benchmark's reference recipe at a global batch size, the closed division's fixed values and tunables,
the eval set and cadence, the quality target, the unit and ruleset(s) of its RCPs, the hyperparameter
events its MLPerf log carries, its start-checkpoint rule and the config variables the importer reads a
published layout from. The generic machinery (``mlperf/recipes.py``: the closed check, the GBS
schedule, the log's events; ``score``, ``import``, the planner) reads these fields and never tests a
benchmark's name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from trainperf.core.errors import SpecError
from trainperf.core.spec import ModelSpec, RunSpec

# (spec attribute, the value the closed division fixes it to, why)
Fixed = tuple[str, object, str]
# (spec attribute, the value a GBS derives for it, the rule that derives it)
Derived = tuple[str, object, str]

# the config variables that name each layout field, first found wins (NeMo's LoRA and pretraining
# scripts spell them differently)
NEMO_LAYOUT_VARIABLES = {"tp": ("TENSOR_MODEL_PARALLEL", "TP"), "pp": ("PIPELINE_MODEL_PARALLEL", "PP"),
                         "cp": ("CONTEXT_PARALLEL", "CP"), "vp": ("INTERLEAVED_PIPELINE",),
                         "mbs": ("MICRO_BATCH_SIZE", "MBS"), "sp": ("SP", "SEQ_PARALLEL"), "local_batch": ("MINIBS",),
                         "nodes": ("DGXNNODES",)}
# a mixture-of-experts config adds its expert-parallel degree
MOE_LAYOUT_VARIABLES = {**NEMO_LAYOUT_VARIABLES, "ep": ("EXPERT_MODEL_PARALLEL", "EP")}
# the spec values a GBS-derived schedule sets (apply_gbs_schedule)
GBS_DERIVED = ("train.lr", "train.warmup_steps", "train.decay_steps", "eval.skip_first")
ANY_GBS = (1, 2**62)
# the closed values both Llama 3.1 pretraining benchmarks (8B, 405B) fix alike
LLAMA31_PRETRAIN_FIXED = (
    ("lora.rank", 0, "pretraining trains every parameter"),
    ("data.seq_len", 8192, "max_sequence_length is fixed to 8192"),
    ("train.optimizer", "adamw", "the reference's optimizer is AdamW with full-precision states"),
    ("train.beta1", 0.9, "opt_adamw_beta_1 is fixed to 0.9"),
    ("train.beta2", 0.95, "opt_adamw_beta_2 is fixed to 0.95"),
    ("train.eps", 1e-5, "opt_adamw_epsilon is fixed to 1e-05"),
    ("train.weight_decay", 0.1, "opt_adamw_weight_decay is fixed to 0.1"),
    ("train.grad_clip", 1.0, "opt_gradient_clip_norm is fixed to 1.0"),
)


def get(spec: RunSpec, dotted: str):
    section, key = dotted.split(".")
    return getattr(getattr(spec, section), key)


def same(a, b) -> bool:
    if isinstance(b, float) and isinstance(a, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    return a == b


@dataclass(frozen=True)
class GbsSchedule:
    """What a closed run's rate and schedule are at a GBS, for a benchmark whose rules derive them from it."""

    rates: Callable[[int], set[float]]  # the learning rates allowed at a GBS
    rate_rule: str  # the rule, as the refusal states it
    derived: Callable[[int], tuple[Derived, ...]]  # the other values the GBS fixes
    eval_skips: Callable[[int], int] | None = None  # evals skipped at a GBS, where the GBS sets them
    fields: tuple[str, ...] = GBS_DERIVED  # the spec values a GBS other than the default's brings


@dataclass(frozen=True)
class Benchmark:
    """One MLPerf Training benchmark (``name`` is its ``submission_benchmark``)."""

    name: str
    recipe: Callable[..., RunSpec]  # the reference recipe (closed division); with a schedule, of the GBS
    default_gbs: int
    fixed: tuple[Fixed, ...]
    tunable: str
    eval_rows: int  # validation sequences of one eval
    eval_every: int  # samples between evals (at the default GBS)
    target: float
    rulesets: tuple[str, ...]  # the training rulesets that have it
    # the architecture the closed division trains; None while no model family builds it (the recipe
    # then carries a ModelSpec named model_name, for the rules and the log only)
    architecture: ModelSpec | None
    model_name: str = ""
    rcp_unit: str = "samples"  # what its RCPs count progress in (epoch_num of eval_accuracy for tokens)
    rcp_ruleset: str | None = None  # the ruleset its RCPs are planned with, where not the current one
    schedule: GbsSchedule | None = None  # rate, warmup, decay follow the GBS
    gbs_span: tuple[int, int] = ANY_GBS  # the GBS the closed rules allow
    gbs_rule: str = ""  # that span in words, where "give a learning rate for GBS lo..hi" is not it
    round_eval: dict[str, tuple[int, int]] = field(default_factory=dict)  # round -> (eval every, skipped)
    eval_samples_in_tokens: bool = False  # the log states the eval set in tokens, not sequences
    checkpoint_samples: int = 0  # samples the closed start checkpoint has trained on (0: none stated)
    checkpoint_name: str = ""  # that checkpoint, as a refusal names it
    log_events: Callable[[RunSpec, list], list] | None = None  # the events its log adds to the common ones
    closed_checks: tuple[Callable[[RunSpec], None], ...] = ()  # rules beyond fixed values and the schedule
    input_checks: tuple[Callable[[RunSpec, dict | None], None], ...] = ()  # its start weights and data
    data_rows: dict[str, int] | None = None  # the closed data set's rows per split, where known
    layout_variables: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(NEMO_LAYOUT_VARIABLES))
    dropped_runs: int = 1  # the olympic mean drops this many fastest and slowest runs

    @property
    def runnable(self) -> bool:
        """Whether trainperf has the benchmark's model (a workload can run it, a published run be priced)."""
        return self.architecture is not None

    def defaults(self, gbs: int | None = None) -> RunSpec:
        """The recipe at ``gbs`` where the rules derive the schedule from it, else at the default GBS."""
        return self.recipe(gbs) if gbs and self.schedule else self.recipe()

    def model(self) -> ModelSpec:
        """A fresh copy of the closed architecture (or the named stand-in, while none is built)."""
        return ModelSpec(**self.architecture.__dict__) if self.architecture else ModelSpec(name=self.model_name)

    def describe_gbs_span(self) -> str:
        lo, hi = self.gbs_span
        return self.gbs_rule or f"give a learning rate for GBS {lo}..{hi} only"


# ---------------------------------------------------------------------------------------------
# Rules more than one benchmark shares


def check_decay_to_max_steps(spec: RunSpec) -> None:
    """The pretraining rule of llama31_8b and gpt_oss_20b: the cosine decays over max_steps - warmup."""
    t = spec.train
    if t.decay_steps != t.max_steps - t.warmup_steps:
        raise SpecError(f"train.decay_steps={t.decay_steps}: the closed division fixes it to {t.max_steps:,} - "
                        f"warmup_steps = {t.max_steps - t.warmup_steps}")


def check_derived_schedule(spec: RunSpec, rates: set[float], rate_rule: str, want: tuple[Derived, ...]) -> None:
    """SpecError naming the first of the rate and the values a GBS derives that ``spec`` does not have."""
    t = spec.train
    gbs = t.global_batch_size
    if not any(same(t.lr, r) for r in rates):
        raise SpecError(f"train.lr={t.lr} is not allowed in the closed division at GBS {gbs} ({rate_rule}: "
                        f"{' or '.join(str(r) for r in sorted(rates))}); or set mlperf.division=open")
    for dotted, value, rule in want:
        if not same(get(spec, dotted), value):
            raise SpecError(f"{dotted}={get(spec, dotted)!r} is not allowed in the closed division at GBS {gbs} "
                            f"({rule} = {value}); or set mlperf.division=open")


def checkpoint_step(samples: int, gbs: int) -> int:
    """The start checkpoint's step as a log states it: the samples it trained on, in steps of this GBS."""
    return math.ceil(samples / gbs) if samples else 0


def decay_steps(spec: RunSpec) -> int:
    t = spec.train
    return t.decay_steps or max(t.max_steps - t.warmup_steps, 1)


def pretraining_events(spec: RunSpec, events: list) -> list:
    """The AdamW pretraining benchmarks' events (llama31_8b's rules, which the later ones copy)."""
    t = spec.train
    return events + [
        ("opt_name", t.optimizer),
        ("opt_end_learning_rate", t.lr * t.min_lr_ratio),
        ("opt_learning_rate_decay_steps", decay_steps(spec)),
        ("opt_learning_rate_decay_schedule", "cosine with linear warmup"),
        ("max_steps", t.max_steps),
    ]


def needs_paths(what: str, model: bool = True, data: bool = True) -> Callable[[RunSpec, dict | None], None]:
    """A closed input check: a pretraining benchmark that starts from ``what`` needs model.path and data.path."""

    def check(spec: RunSpec, data_rows: dict | None) -> None:
        if (model and not spec.model.path) or (data and not spec.data.path):
            raise SpecError(f"the closed division of {spec.mlperf.benchmark} starts from {what} on C4: give "
                            "model.path=DIR and data.path=DIR (random weights or fabricated data are an "
                            "open-division throughput run)")

    return check


def needs_validation_rows(rows: int) -> Callable[[RunSpec, dict | None], None]:
    """A closed input check: the data's validation split holds at least the ``rows`` the eval reads."""

    def check(spec: RunSpec, data_rows: dict | None) -> None:
        if data_rows and data_rows.get("validation", 0) < rows:
            raise SpecError(f"data.path {spec.data.path!r}: validation has {data_rows.get('validation')} sequences "
                            f"of {spec.data.seq_len} tokens; the closed division evaluates on the first {rows}")

    return check
