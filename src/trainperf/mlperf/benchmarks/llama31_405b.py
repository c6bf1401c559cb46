"""llama31_405b: Llama 3.1 405B from its Hugging Face checkpoint on C4, MLPerf Training v5.0-v6.0 (rules:
"Llama 3.1 405b hyperparameter constraints"; reference: large_language_model_pretraining/nemo)."""

from __future__ import annotations

import math

from trainperf.core.spec import DataSpec, EvalSpec, LoRASpec, MLPerfSpec, ModelSpec, ParallelSpec, RunSpec, TrainSpec
from trainperf.mlperf.benchmark import LLAMA31_PRETRAIN_FIXED, Benchmark, GbsSchedule, needs_paths, pretraining_events

LLAMA31_405B = ModelSpec(name="llama3.1-405b", vocab_size=128256, hidden_size=16384, intermediate_size=53248,
                         num_layers=126, num_heads=128, num_kv_heads=8, rope_theta=500000.0, rms_norm_eps=1e-5,
                         max_position_embeddings=8192, init_std=0.02)
# the checker's rate rule (opt_base_learning_rate x 1152 == GBS x 8e-5) holds for any GBS, and the RCP
# checker compares a GBS below the smallest RCP (1152) with that RCP: published closed runs trained at
# GBS 576, 1008 and 1120; v5.0 caps GBS at 9216
LLAMA405_GBS_RANGE = (1, 9216)
LLAMA405_LR_TABLE = {1152: 8e-5, 2304: 1.6e-4, 4608: 3.2e-4, 9216: 6.4e-4}
LLAMA405_EVAL_EVERY = 18_432  # v5.1+ (v5.0: 46,080)
# the v5.0 round evaluated 405B every 46,080 samples and skipped none (its published logs: evals at
# 46,080 x k from the first); v5.1 moved to 18,432 with FLOOR(0.0026 x GBS + 12) skipped
LLAMA405_ROUND_EVAL = {"v5.0": (46_080, 0)}
LLAMA405_EVAL_ROWS = 5760
LLAMA405_TARGET = 5.6
LLAMA405_MAX_STEPS = 1_200_000


def llama405_lr(gbs: int) -> float:
    """The table's rate, else 8e-5 x GBS / 1152: the float (of it and its two neighbours) for which the
    5.1.0/6.0.0 checker's exact test ``lr x 1152 == GBS x 8e-5`` holds -- for about 9% of GBS values
    none does, and only a table GBS is sure to pass (the rules' "8 decimals" passes almost none)."""
    if gbs in LLAMA405_LR_TABLE:
        return LLAMA405_LR_TABLE[gbs]
    rate = 8e-5 * gbs / 1152
    return next((r for r in (rate, math.nextafter(rate, 1.0), math.nextafter(rate, 0.0))
                 if r * 1152 == gbs * 8e-5), rate)


def llama405_schedule(gbs: int) -> tuple[int, int]:
    """(warmup steps, decay steps after the warmup): ceil(8000 x 1152 / GBS), ceil(1.2M x 1152 / GBS) - warmup."""
    warmup = math.ceil(8000 * 1152 / gbs)
    return warmup, math.ceil(1_200_000 * 1152 / gbs) - warmup


def llama405_eval_skips(gbs: int) -> int:
    """Evals skipped at the start: FLOOR(0.0026 x GBS + 12)."""
    return math.floor(0.0026 * gbs + 12)


def llama31_405b_defaults(gbs: int = 1152) -> RunSpec:
    warmup, decay = llama405_schedule(gbs)
    return RunSpec(
        workload="llama31_405b",
        model=ModelSpec(**LLAMA31_405B.__dict__),
        lora=LoRASpec(rank=0),
        parallel=ParallelSpec(),
        train=TrainSpec(micro_batch_size=1, global_batch_size=gbs, lr=llama405_lr(gbs), min_lr_ratio=0.01,
                        warmup_steps=warmup, decay_steps=decay, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-5,
                        grad_clip=1.0, max_steps=LLAMA405_MAX_STEPS, recompute="selective", log_every=10, seed=-1,
                        untimed_warmup_steps=2),
        data=DataSpec(seq_len=8192, train_samples=64, eval_samples=LLAMA405_EVAL_ROWS),
        eval=EvalSpec(every_samples=LLAMA405_EVAL_EVERY, skip_first=llama405_eval_skips(gbs), target=LLAMA405_TARGET,
                      batch_size=1),
        mlperf=MLPerfSpec(benchmark="llama31_405b", division="closed", comparable=True),
    )


LLAMA405_FIXED = (
    *LLAMA31_PRETRAIN_FIXED,
    ("data.eval_samples", LLAMA405_EVAL_ROWS, "eval_samples is fixed to 5760"),
    ("eval.every_samples", LLAMA405_EVAL_EVERY, "the rules evaluate every 18,432 sequences"),
    ("eval.target", LLAMA405_TARGET, "the quality target is log perplexity 5.6"),
)
LLAMA405_TUNABLE = "train.global_batch_size (up to 9216), train.max_steps"


def llama405_derived(gbs: int) -> tuple:
    warmup, decay = llama405_schedule(gbs)
    return (("train.warmup_steps", warmup, "ceil(8000 x 1152 / GBS)"),
            ("train.decay_steps", decay, "ceil(1,200,000 x 1152 / GBS) - warmup"),
            ("eval.skip_first", llama405_eval_skips(gbs), "FLOOR(0.0026 x GBS + 12) evals are skipped"),
            ("train.min_lr_ratio", 0.01, "opt_end_learning_rate is 8e-7 at the base rate 8e-5"))


def llama405_events(spec: RunSpec, events: list) -> list:
    # from the released checkpoint: step 0
    return pretraining_events(spec, events) + [("init_checkpoint_step", 0)]


BENCHMARK = Benchmark(
    name="llama31_405b", recipe=llama31_405b_defaults, default_gbs=1152, fixed=LLAMA405_FIXED, tunable=LLAMA405_TUNABLE,
    eval_rows=LLAMA405_EVAL_ROWS, eval_every=LLAMA405_EVAL_EVERY, target=LLAMA405_TARGET,
    rulesets=("5.0.0", "5.1.0", "6.0.0"), architecture=LLAMA31_405B,
    schedule=GbsSchedule(rates=lambda gbs: {llama405_lr(gbs)},
                         rate_rule="the table 1152->8e-5, 2304->1.6e-4, 4608->3.2e-4, 9216->6.4e-4, else 8e-5 x GBS / 1152",
                         derived=llama405_derived, eval_skips=llama405_eval_skips),
    gbs_span=LLAMA405_GBS_RANGE, round_eval=LLAMA405_ROUND_EVAL,
    log_events=llama405_events, input_checks=(needs_paths("the Hugging Face Llama 3.1 405B checkpoint"),),
)
