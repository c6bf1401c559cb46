"""gpt_oss_20b: gpt-oss 20B (mixture of experts) pretraining from scratch on C4, MLPerf Training 6.0
(rules: mlperf_logging training_6.0.0/closed_gpt_oss_20b.yaml and rcps_gpt_oss_20b.json; the reference
evaluates 1024 validation sequences every 12,288 samples, target log perplexity 3.34).

The closed architecture comes with the MoE model family; until then ``architecture`` is None and the
recipe carries the rules alone (a model named gpt-oss-20b of no shape)."""

from __future__ import annotations

from trainperf.core.spec import DataSpec, EvalSpec, LoRASpec, MLPerfSpec, ParallelSpec, RunSpec, TrainSpec
from trainperf.mlperf.benchmark import (MOE_LAYOUT_VARIABLES, Benchmark, check_decay_to_max_steps, needs_validation_rows,
                                        pretraining_events)

GPT_OSS_MAX_STEPS = 1_200_000  # max_steps == 1200000; decay_steps == 1,200,000 - warmup
GPT_OSS_EVAL_ROWS = 1024
GPT_OSS_EVAL_EVERY = 12_288
GPT_OSS_TARGET = 3.34
GPT_OSS_GBS = 16  # the smallest RCP: lr 4e-4, 2048 warmup samples (rcps_gpt_oss_20b.json)


def gpt_oss_20b_defaults() -> RunSpec:
    warmup = 2048 // GPT_OSS_GBS
    return RunSpec(
        workload="gpt_oss_20b",
        model=BENCHMARK.model(),
        lora=LoRASpec(rank=0),
        parallel=ParallelSpec(),
        train=TrainSpec(micro_batch_size=1, global_batch_size=GPT_OSS_GBS, lr=4e-4, min_lr_ratio=0.1,
                        warmup_steps=warmup, decay_steps=GPT_OSS_MAX_STEPS - warmup, weight_decay=0.1, beta1=0.9,
                        beta2=0.95, eps=1e-5, grad_clip=1.0, max_steps=GPT_OSS_MAX_STEPS, recompute="selective",
                        log_every=10, seed=-1, untimed_warmup_steps=2),
        data=DataSpec(seq_len=8192, train_samples=64, eval_samples=GPT_OSS_EVAL_ROWS),
        eval=EvalSpec(every_samples=GPT_OSS_EVAL_EVERY, skip_first=0, target=GPT_OSS_TARGET, batch_size=1),
        mlperf=MLPerfSpec(benchmark="gpt_oss_20b", division="closed", comparable=True),
    )


GPT_OSS_FIXED = (
    ("lora.rank", 0, "pretraining trains every parameter"),
    ("data.seq_len", 8192, "max_sequence_length is fixed to 8192"),
    ("train.optimizer", "adamw", "opt_name is fixed to adamw"),
    ("train.beta1", 0.9, "opt_adamw_beta_1 is fixed to 0.9"),
    ("train.beta2", 0.95, "opt_adamw_beta_2 is fixed to 0.95"),
    ("train.eps", 1e-5, "opt_adamw_epsilon is fixed to 1e-05"),
    ("train.weight_decay", 0.1, "opt_adamw_weight_decay is fixed to 0.1"),
    ("train.grad_clip", 1.0, "opt_gradient_clip_norm is fixed to 1.0"),
    ("train.max_steps", GPT_OSS_MAX_STEPS, "max_steps is fixed to 1,200,000"),
    ("data.eval_samples", GPT_OSS_EVAL_ROWS, "eval_samples is fixed to 1024"),
    ("eval.every_samples", GPT_OSS_EVAL_EVERY, "the reference evaluates every 12,288 samples"),
    ("eval.skip_first", 0, "no evals are skipped"),
    ("eval.target", GPT_OSS_TARGET, "the quality target is log perplexity 3.34"),
)
GPT_OSS_TUNABLE = "train.global_batch_size, train.lr, train.warmup_steps, train.min_lr_ratio"

BENCHMARK = Benchmark(
    name="gpt_oss_20b", recipe=gpt_oss_20b_defaults, default_gbs=GPT_OSS_GBS, fixed=GPT_OSS_FIXED,
    tunable=GPT_OSS_TUNABLE, eval_rows=GPT_OSS_EVAL_ROWS, eval_every=GPT_OSS_EVAL_EVERY, target=GPT_OSS_TARGET,
    rulesets=("6.0.0", "6.1.0"), architecture=None, model_name="gpt-oss-20b",
    log_events=pretraining_events, closed_checks=(check_decay_to_max_steps,),
    input_checks=(needs_validation_rows(GPT_OSS_EVAL_ROWS),),
    layout_variables=MOE_LAYOUT_VARIABLES,
)
