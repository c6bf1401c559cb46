"""llama31_8b: Llama 3.1 8B pretraining from scratch on C4 (MLPerf Training 5.1-6.0)."""

from __future__ import annotations

from trainperf.core.spec import DataSpec, EvalSpec, LoRASpec, MLPerfSpec, ModelSpec, ParallelSpec, RunSpec, TrainSpec
from trainperf.mlperf.benchmark import (LLAMA31_PRETRAIN_FIXED, Benchmark, check_decay_to_max_steps,
                                        needs_validation_rows, pretraining_events)

LLAMA31_8B = ModelSpec(name="llama3.1-8b", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
                       num_heads=32, num_kv_heads=8, rope_theta=500000.0, rms_norm_eps=1e-5,
                       max_position_embeddings=8192, init_std=0.02)
PRETRAIN_MAX_STEPS = 1_200_000
PRETRAIN_EVAL_ROWS = 1024
PRETRAIN_EVAL_EVERY = 12_288
PRETRAIN_TARGET = 3.3


def llama31_8b_defaults() -> RunSpec:
    """RCP point GBS 32: lr 8e-4, 4096 warmup samples (rcps_llama31_8b.json, 5.1.0-6.0.0)."""
    gbs, warmup_samples = 32, 4096
    warmup = warmup_samples // gbs
    return RunSpec(
        workload="llama31_8b",
        model=ModelSpec(**LLAMA31_8B.__dict__),
        lora=LoRASpec(rank=0),
        parallel=ParallelSpec(),
        train=TrainSpec(micro_batch_size=1, global_batch_size=gbs, lr=8e-4, min_lr_ratio=0.1, warmup_steps=warmup,
                        decay_steps=PRETRAIN_MAX_STEPS - warmup, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-5,
                        grad_clip=1.0, max_steps=PRETRAIN_MAX_STEPS, recompute="selective", log_every=10, seed=-1,
                        untimed_warmup_steps=2),
        data=DataSpec(seq_len=8192, train_samples=64, eval_samples=PRETRAIN_EVAL_ROWS),
        eval=EvalSpec(every_samples=PRETRAIN_EVAL_EVERY, skip_first=0, target=PRETRAIN_TARGET, batch_size=1),
        mlperf=MLPerfSpec(benchmark="llama31_8b", division="closed", comparable=True),
    )


PRETRAIN_FIXED = (
    *LLAMA31_PRETRAIN_FIXED,
    ("train.min_lr_ratio", 0.1, "opt_end_learning_rate is 0.1 x the base rate"),
    ("train.max_steps", PRETRAIN_MAX_STEPS, "max_steps is fixed to 1,200,000"),
    ("data.eval_samples", PRETRAIN_EVAL_ROWS, "eval uses the first 1024 validation sequences"),
    ("eval.every_samples", PRETRAIN_EVAL_EVERY, "the rules evaluate every 12,288 samples"),
    ("eval.skip_first", 0, "no evals are skipped"),
    ("eval.target", PRETRAIN_TARGET, "the quality target is log perplexity 3.3"),
)
PRETRAIN_TUNABLE = "train.global_batch_size, train.lr, train.warmup_steps"

BENCHMARK = Benchmark(
    name="llama31_8b", recipe=llama31_8b_defaults, default_gbs=32, fixed=PRETRAIN_FIXED, tunable=PRETRAIN_TUNABLE,
    eval_rows=PRETRAIN_EVAL_ROWS, eval_every=PRETRAIN_EVAL_EVERY, target=PRETRAIN_TARGET,
    rulesets=("5.1.0", "6.0.0", "6.1.0"), architecture=LLAMA31_8B, log_events=pretraining_events,
    closed_checks=(check_decay_to_max_steps,), input_checks=(needs_validation_rows(PRETRAIN_EVAL_ROWS),),
)
