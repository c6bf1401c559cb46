"""The MLPerf Training LLM workloads as the rules define them, read from each benchmark's `Benchmark`
(``mlperf/benchmarks/``: llama2_70b_lora, llama31_8b, gpt3, llama31_405b, gpt_oss_20b, deepseekv3_671b).

For every benchmark, the same three things, none of which tests a benchmark's name:
  * its reference recipe as the workload's defaults (``RECIPES``; ``apply_gbs_schedule`` where the GBS
    sets the rate and schedule),
  * the closed-division rules -- which values are fixed and which are tunable -- checked before launch
    (``check_closed_rules``); a run that breaks one must say ``mlperf.division=open``,
  * the hyperparameters its MLPerf log must carry (``hyperparameter_events``), which the
    ``mlperf_logging`` compliance checker verifies.
Shrunken runs (fewer layers, shorter sequences, fabricated data) are open division and are flagged
not comparable.
"""

from __future__ import annotations

from trainperf.core.errors import SpecError
from trainperf.core.layout import grad_accum_steps
from trainperf.core.spec import RunSpec
from trainperf.mlperf.benchmark import GBS_DERIVED, check_derived_schedule, checkpoint_step
from trainperf.mlperf.benchmark import get as _get
from trainperf.mlperf.benchmark import same as _same
from trainperf.mlperf.benchmarks import BENCHMARKS, find, of_run, runnable
from trainperf.mlperf.benchmarks.gpt3 import (GPT3_175B, GPT3_CHECKPOINT_SAMPLES, GPT3_EVAL_EVERY, GPT3_EVAL_ROWS,
                                              GPT3_EVAL_TOKENS, GPT3_FIXED, GPT3_GBS_RANGE, GPT3_MAX_STEPS,
                                              GPT3_TARGET, GPT3_TUNABLE, gpt3_defaults, gpt3_lr, gpt3_schedule)
from trainperf.mlperf.benchmarks.llama2_70b_lora import (LLAMA2_70B, LORA_EVAL_EVERY, LORA_EVAL_ROWS, LORA_FIXED,
                                                         LORA_TARGET, LORA_TRAIN_ROWS, LORA_TUNABLE,
                                                         llama2_70b_lora_defaults)
from trainperf.mlperf.benchmarks.llama31_8b import (LLAMA31_8B, PRETRAIN_EVAL_EVERY, PRETRAIN_EVAL_ROWS,
                                                    PRETRAIN_FIXED, PRETRAIN_MAX_STEPS, PRETRAIN_TARGET,
                                                    PRETRAIN_TUNABLE, llama31_8b_defaults)
from trainperf.mlperf.benchmarks.llama31_405b import (LLAMA31_405B, LLAMA405_EVAL_EVERY, LLAMA405_EVAL_ROWS,
                                                      LLAMA405_FIXED, LLAMA405_GBS_RANGE, LLAMA405_LR_TABLE,
                                                      LLAMA405_MAX_STEPS, LLAMA405_TARGET, LLAMA405_TUNABLE,
                                                      llama31_405b_defaults, llama405_eval_skips, llama405_lr,
                                                      llama405_schedule)

# ---------------------------------------------------------------------------------------------
# By benchmark name: views of the registry for the packages that look a value up

RECIPES = {name: b.defaults for name, b in runnable().items()}  # the benchmarks a workload can run
EVAL_ROWS = {name: b.eval_rows for name, b in BENCHMARKS.items()}  # validation rows of one eval
RCP_UNIT = {name: b.rcp_unit for name, b in BENCHMARKS.items()}  # what the RCPs count progress in
# the ruleset whose RCPs a benchmark is planned with, where it is not the current one
RCP_RULESET = {name: b.rcp_ruleset for name, b in BENCHMARKS.items() if b.rcp_ruleset}


def init_checkpoint_step(spec: RunSpec) -> int:
    """The start checkpoint's step, as the log must state it: gpt3's 4000 steps of GBS 1536 in steps of
    this run's GBS (NVIDIA v4.1 at GBS 2048 logs 3000); 0 for a run from a released or no checkpoint."""
    b = find(spec.mlperf.benchmark)
    return checkpoint_step(b.checkpoint_samples, spec.train.global_batch_size) if b else 0


def check_start_checkpoint(spec: RunSpec, checkpoint_config: dict) -> None:
    """A closed division that starts from a stated checkpoint (gpt3's 4000 steps): a config.json that states
    the samples its weights have trained on (Megatron's ``consumed_train_samples``; `trainperf checkpoint
    convert --consumed-train-samples` writes it) must state that checkpoint's."""
    consumed = checkpoint_config.get("consumed_train_samples")
    b = find(spec.mlperf.benchmark)
    if spec.mlperf.division != "closed" or b is None or not b.checkpoint_samples or consumed is None:
        return
    if consumed != b.checkpoint_samples:
        raise SpecError(f"model.path {spec.model.path!r}: config.json says consumed_train_samples={consumed}; the closed "
                        f"division of {b.name} starts from {b.checkpoint_name} ({b.checkpoint_samples:,} samples, "
                        "logged as init_checkpoint_step); use mlperf.division=open for another start point")


def eval_samples_logged(spec: RunSpec, rows: int) -> int:
    """The log's eval_samples for ``rows`` validation sequences: gpt3 states its eval set in tokens
    (11,590,004 in the reference), the others in sequences."""
    b = find(spec.mlperf.benchmark)
    return rows * spec.data.seq_len if b and b.eval_samples_in_tokens else rows


def progress_count(spec: RunSpec, samples: int, train_rows: int) -> float:
    """The log's epoch_num for ``samples`` trained: a benchmark whose RCPs count tokens (gpt3) counts
    tokens, the others the fraction of the training set."""
    b = find(spec.mlperf.benchmark)
    if b and b.rcp_unit == "tokens":
        return float(samples * spec.data.seq_len)
    return samples / max(train_rows, 1)


# ---------------------------------------------------------------------------------------------
# The closed-division check

# The architecture the closed division trains: the registry's (a test stands in a tiny model by
# registering a copy of the benchmark with another architecture; the recipe itself has no stand-in).
ARCH_FIELDS = ("family", "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
               "rope_theta", "rms_norm_eps")


def check_closed_rules(spec: RunSpec, data_rows: dict[str, int] | None = None, architecture: bool = True) -> None:
    """SpecError naming the first value a closed-division run may not change. Open runs pass.
    ``architecture=False`` before the checkpoint's config.json has set the model."""
    if spec.mlperf.division != "closed":
        return
    b = of_run(spec)
    if b is None:
        raise SpecError(f"mlperf.division=closed needs the benchmark's reference workload ({', '.join(RECIPES)}); "
                        f"workload {spec.workload!r} runs open division only: use mlperf.division=open")
    for dotted, value, why in b.fixed:
        if not _same(_get(spec, dotted), value):
            raise SpecError(f"{dotted}={_get(spec, dotted)!r} is not allowed in the closed division ({why}: {value!r}); "
                            f"tunable: {b.tunable}; or set mlperf.division=open")
    if b.schedule:
        check_schedule_for_gbs(spec)
    for check in b.closed_checks:
        check(spec)
    arch = b.architecture  # None while no model family builds it: the rules alone are checked
    for name in ARCH_FIELDS if architecture and arch else ():
        if not _same(getattr(spec.model, name), getattr(arch, name)):
            raise SpecError(f"model.{name}={getattr(spec.model, name)} is not the {arch.name} architecture "
                            f"({getattr(arch, name)}) that the closed division trains; use mlperf.division=open")
    for check in b.input_checks:
        check(spec, data_rows)
    if b.data_rows and data_rows:
        for split, rows in b.data_rows.items():
            if data_rows.get(split) != rows:
                raise SpecError(f"data.path {spec.data.path!r}: {split} has {data_rows.get(split)} rows; the closed "
                                f"division's GovReport set has {rows} (use mlperf.division=open for other data)")


def apply_round_eval_schedule(spec: RunSpec, round_name: str) -> None:
    """A published run of an earlier round evaluated at that round's cadence (the benchmark's round_eval)."""
    b = find(spec.mlperf.benchmark)
    found = b.round_eval.get(round_name) if b else None
    if found:
        spec.eval.every_samples, spec.eval.skip_first = found


def gbs_rate_span(benchmark: str) -> tuple[int, int]:
    """(smallest, largest) GBS the benchmark's closed rules give a learning rate for ((1, huge): any)."""
    b = find(benchmark)
    return b.gbs_span if b else (1, 2**62)


def gbs_eval_skips(spec: RunSpec, gbs: int) -> int | None:
    """The evals a closed run at ``gbs`` skips where its benchmark's GBS sets them (llama31_405b) and
    ``spec`` skips what its own GBS derives (None: the count does not follow the GBS, or follows it by
    itself: skip_first = -1)."""
    b = find(spec.mlperf.benchmark)
    skips = b.schedule.eval_skips if b and b.schedule else None
    if skips is None or spec.eval.skip_first != skips(spec.train.global_batch_size):
        return None
    return skips(gbs)


def check_gbs_has_rate(spec: RunSpec) -> None:
    """A benchmark whose rate follows the GBS (gpt3, llama31_405b, deepseekv3_671b): a closed run at a GBS
    its rules give no rate for is refused (an open run states its own rate with train.lr)."""
    b, gbs = find(spec.mlperf.benchmark), spec.train.global_batch_size
    span = b.gbs_span if b else (1, 2**62)
    if spec.mlperf.division == "closed" and not span[0] <= gbs <= span[1]:
        raise SpecError(f"train.global_batch_size={gbs}: the {spec.mlperf.benchmark} rules {b.describe_gbs_span()}; "
                        "choose a GBS in it or set mlperf.division=open")


def check_schedule_for_gbs(spec: RunSpec) -> None:
    """A closed run of a benchmark whose rate, warmup and decay are functions of the GBS has them."""
    check_gbs_has_rate(spec)
    schedule = find(spec.mlperf.benchmark).schedule
    gbs = spec.train.global_batch_size
    check_derived_schedule(spec, schedule.rates(gbs), schedule.rate_rule, schedule.derived(gbs))


def apply_gbs_schedule(spec: RunSpec, defaults: RunSpec) -> None:
    """A benchmark whose rules derive the rate and schedule from the GBS (gpt3, llama31_405b,
    deepseekv3_671b): a GBS other than the defaults' brings what its rules derive from it; a value set
    explicitly (differing from ``defaults``) stays (and the closed check judges it)."""
    b, gbs = find(spec.workload), spec.train.global_batch_size
    if b is None or b.schedule is None or gbs == defaults.train.global_batch_size:
        return
    check_gbs_has_rate(spec)
    derived = b.defaults(gbs)
    for dotted in b.schedule.fields:
        if _same(_get(spec, dotted), _get(defaults, dotted)):
            section, key = dotted.split(".")
            setattr(getattr(spec, section), key, _get(derived, dotted))


def mark_open_if_shrunk(spec: RunSpec) -> None:
    """An open-division run is never put beside published results."""
    if spec.mlperf.division != "closed":
        spec.mlperf.comparable = False


# ---------------------------------------------------------------------------------------------
# What the MLPerf log carries (the compliance checker reads these)

def hyperparameter_events(spec: RunSpec) -> list[tuple[str, object]]:
    """The hyperparameters every benchmark's log carries, then those its own rules add (its log_events),
    then the adapters' for a LoRA run."""
    t, d, p, lo = spec.train, spec.data, spec.parallel, spec.lora
    events: list[tuple[str, object]] = [
        ("global_batch_size", t.global_batch_size),
        ("gradient_accumulation_steps", grad_accum_steps(spec)),
        ("micro_batch_size", t.micro_batch_size),
        ("opt_base_learning_rate", t.lr),
        ("opt_adamw_beta_1", t.beta1),
        ("opt_adamw_beta_2", t.beta2),
        ("opt_adamw_epsilon", t.eps),
        ("opt_adamw_weight_decay", t.weight_decay),
        ("opt_gradient_clip_norm", t.grad_clip),
        ("opt_learning_rate_warmup_steps", t.warmup_steps),
        ("max_sequence_length", d.seq_len),
        ("tensor_parallelism", p.tp),
        ("pipeline_parallelism", p.pp),
        ("context_parallelism", p.cp),
    ]
    b = find(spec.mlperf.benchmark)
    events = b.log_events(spec, events) if b and b.log_events else _schedule_events(spec, events)
    if lo.enabled:
        events += [("lora_rank", lo.rank), ("lora_alpha", lo.alpha), ("lora_dropout", lo.dropout)]
    return events


def _schedule_events(spec: RunSpec, events: list) -> list:
    """A run of no known benchmark logs its schedule as training steps and a warmup ratio."""
    t = spec.train
    training_steps = t.decay_steps + t.warmup_steps if t.decay_steps else t.max_steps
    return events + [("opt_learning_rate_training_steps", training_steps),
                     ("opt_learning_rate_warmup_ratio", t.warmup_steps / max(training_steps, 1))]


__all__ = [
    "ARCH_FIELDS", "BENCHMARKS", "EVAL_ROWS", "GBS_DERIVED", "RCP_RULESET", "RCP_UNIT", "RECIPES",
    "apply_gbs_schedule", "apply_round_eval_schedule", "check_closed_rules", "check_gbs_has_rate",
    "check_schedule_for_gbs", "check_start_checkpoint", "eval_samples_logged", "gbs_eval_skips", "gbs_rate_span",
    "hyperparameter_events", "init_checkpoint_step", "mark_open_if_shrunk", "progress_count",
    # each benchmark's own names, where callers and tests read them
    "GPT3_175B", "GPT3_CHECKPOINT_SAMPLES", "GPT3_EVAL_EVERY", "GPT3_EVAL_ROWS", "GPT3_EVAL_TOKENS", "GPT3_FIXED",
    "GPT3_GBS_RANGE", "GPT3_MAX_STEPS", "GPT3_TARGET", "GPT3_TUNABLE", "gpt3_defaults", "gpt3_lr", "gpt3_schedule",
    "LLAMA2_70B", "LORA_EVAL_EVERY", "LORA_EVAL_ROWS", "LORA_FIXED", "LORA_TARGET", "LORA_TRAIN_ROWS",
    "LORA_TUNABLE", "llama2_70b_lora_defaults", "LLAMA31_8B", "PRETRAIN_EVAL_EVERY", "PRETRAIN_EVAL_ROWS",
    "PRETRAIN_FIXED", "PRETRAIN_MAX_STEPS", "PRETRAIN_TARGET", "PRETRAIN_TUNABLE", "llama31_8b_defaults",
    "LLAMA31_405B", "LLAMA405_EVAL_EVERY", "LLAMA405_EVAL_ROWS", "LLAMA405_FIXED", "LLAMA405_GBS_RANGE",
    "LLAMA405_LR_TABLE", "LLAMA405_MAX_STEPS", "LLAMA405_TARGET", "LLAMA405_TUNABLE", "llama31_405b_defaults",
    "llama405_eval_skips", "llama405_lr", "llama405_schedule",
]
