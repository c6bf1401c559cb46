"""gpt3: GPT-3 175B from the reference's 4000-step checkpoint on C4, MLPerf Training v3.0-v4.1 (rules:
"GPT3 hyperparameter constraints"; reference: retired_benchmarks/gpt3/megatron-lm)."""

from __future__ import annotations

import math

from trainperf.core.spec import DataSpec, EvalSpec, LoRASpec, MLPerfSpec, ModelSpec, ParallelSpec, RunSpec, TrainSpec
from trainperf.mlperf.benchmark import Benchmark, GbsSchedule, checkpoint_step, decay_steps, needs_paths

GPT3_175B = ModelSpec(name="gpt3-175b", family="gpt", vocab_size=50257, hidden_size=12288, intermediate_size=49152,
                      num_layers=96, num_heads=96, num_kv_heads=96, rms_norm_eps=1e-5, max_position_embeddings=2048,
                      init_std=0.006, make_vocab_size_divisible_by=128)
GPT3_GBS_RANGE = (1536, 8192)  # the GBS the rules (and rcps_gpt3.json) give a learning rate for
GPT3_EVAL_EVERY = 24_576  # sequences of 2048 tokens: 50.33M tokens
GPT3_EVAL_TOKENS = 11_590_004  # the validation subset (24,567 documents), logged as eval_samples in tokens
GPT3_EVAL_ROWS = -(-GPT3_EVAL_TOKENS // 2048)  # 5660 sequences of 2048
GPT3_TARGET = 2.69
GPT3_CHECKPOINT_SAMPLES = 4000 * 1536  # the start checkpoint: 4000 steps at GBS 1536
GPT3_MAX_STEPS = 20_000_000 // 1536  # --train-samples 20,000,000 of the reference, at its GBS


def gpt3_lr(gbs: int) -> float:
    """2e-5 up to GBS 3072, 3e-5 from 4096 (either in between: the default takes the lower)."""
    return 3e-5 if gbs >= 4096 else 2e-5


def gpt3_schedule(gbs: int) -> tuple[int, int]:
    """(warmup steps, Megatron decay steps counted from step 0) for a GBS: ceil(265 x 1536 / GBS),
    ceil(108600 x 1536 / GBS). train.decay_steps is the cosine's length after the warmup."""
    return math.ceil(265 * 1536 / gbs), math.ceil(108_600 * 1536 / gbs)


def gpt3_defaults(gbs: int = 1536) -> RunSpec:
    warmup, decay = gpt3_schedule(gbs)
    return RunSpec(
        workload="gpt3",
        model=ModelSpec(**GPT3_175B.__dict__),
        lora=LoRASpec(rank=0),
        parallel=ParallelSpec(),
        train=TrainSpec(micro_batch_size=1, global_batch_size=gbs, lr=gpt3_lr(gbs), min_lr_ratio=0.1,
                        warmup_steps=warmup, decay_steps=decay - warmup, weight_decay=0.1, beta1=0.9, beta2=0.95,
                        eps=1e-8, grad_clip=1.0, max_steps=GPT3_MAX_STEPS, recompute="selective", log_every=10,
                        seed=-1, untimed_warmup_steps=2),
        data=DataSpec(seq_len=2048, train_samples=64, eval_samples=GPT3_EVAL_ROWS),
        eval=EvalSpec(every_samples=GPT3_EVAL_EVERY, skip_first=0, target=GPT3_TARGET, batch_size=1),
        mlperf=MLPerfSpec(benchmark="gpt3", division="closed", comparable=True),
    )


GPT3_FIXED = (
    ("lora.rank", 0, "pretraining trains every parameter"),
    ("data.seq_len", 2048, "max_sequence_length is fixed to 2048"),
    ("train.optimizer", "adamw", "the reference's optimizer is Megatron's Adam (decoupled weight decay), fp32 states"),
    ("train.beta1", 0.9, "opt_adam_beta_1 is fixed to 0.9"),
    ("train.beta2", 0.95, "opt_adam_beta_2 is fixed to 0.95"),
    ("train.eps", 1e-8, "opt_adam_epsilon is fixed to 1e-8"),
    ("train.weight_decay", 0.1, "weight decay is fixed to 0.1"),
    ("train.grad_clip", 1.0, "opt_gradient_clip_norm is fixed to 1.0"),
    ("train.min_lr_ratio", 0.1, "opt_end_learning_rate is 0.1 x the base rate"),
    ("data.eval_samples", GPT3_EVAL_ROWS, "eval covers the 11,590,004-token validation subset (5660 sequences)"),
    ("eval.every_samples", GPT3_EVAL_EVERY, "the rules evaluate every 24,576 sequences (50.33M tokens)"),
    ("eval.skip_first", 0, "no evals are skipped"),
    ("eval.target", GPT3_TARGET, "the quality target is log perplexity 2.69"),
)
GPT3_TUNABLE = "train.global_batch_size (1536..8192), train.lr (2e-5 or 3e-5 between GBS 3072 and 4096), train.max_steps"


def gpt3_rates(gbs: int) -> set[float]:
    return {2e-5, 3e-5} if 3072 < gbs < 4096 else {gpt3_lr(gbs)}


def gpt3_derived(gbs: int) -> tuple:
    warmup, decay = gpt3_schedule(gbs)
    return (("train.warmup_steps", warmup, "ceil(265 x 1536 / GBS)"),
            ("train.decay_steps", decay - warmup, "ceil(108600 x 1536 / GBS) - warmup"))


def megatron_adam_events(spec: RunSpec, events: list) -> list:
    """Megatron's Adam: the 4.1.0 checker reads opt_adam_* keys, the decay counted from step 0."""
    t = spec.train
    events = [(k.replace("opt_adamw_", "opt_adam_"), v) for k, v in events if k != "opt_adamw_weight_decay"]
    return events + [
        ("opt_name", "adam"),
        ("opt_weight_decay", t.weight_decay),
        ("opt_end_learning_rate", t.lr * t.min_lr_ratio),
        ("opt_learning_rate_decay_steps", t.warmup_steps + decay_steps(spec)),
        ("opt_learning_rate_decay_schedule", "cosine with linear warmup"),
        ("init_checkpoint_step", checkpoint_step(GPT3_CHECKPOINT_SAMPLES, t.global_batch_size)),
    ]


BENCHMARK = Benchmark(
    name="gpt3", recipe=gpt3_defaults, default_gbs=1536, fixed=GPT3_FIXED, tunable=GPT3_TUNABLE,
    eval_rows=GPT3_EVAL_ROWS, eval_every=GPT3_EVAL_EVERY, target=GPT3_TARGET,
    # gpt3 left the training rules after v4.1, and its RCPs with it
    rulesets=("3.0.0", "3.1.0", "4.0.0", "4.1.0"), rcp_ruleset="4.1.0", architecture=GPT3_175B,
    rcp_unit="tokens", eval_samples_in_tokens=True,
    schedule=GbsSchedule(rates=gpt3_rates, rate_rule="2e-5 for GBS <= 3072, 3e-5 for GBS >= 4096, either in between",
                         derived=gpt3_derived),
    gbs_span=GPT3_GBS_RANGE,
    checkpoint_samples=GPT3_CHECKPOINT_SAMPLES, checkpoint_name="the 4000-step checkpoint",
    log_events=megatron_adam_events,
    input_checks=(needs_paths("the 4000-step GPT-3 175B checkpoint (safetensors, Megatron names)"),),
)
