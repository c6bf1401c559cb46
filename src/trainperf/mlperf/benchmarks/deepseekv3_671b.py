"""deepseekv3_671b: DeepSeek-V3 671B (mixture of experts, multi-head latent attention) from the
MLCommons checkpoint on C4, MLPerf Training 6.0 (rules: mlperf_logging training_6.0.0/
closed_deepseekv3_671b.yaml and rcps_deepseekv3_671b.json; the reference evaluates the first 1024
validation sequences after every step, target log perplexity 3.6).

GBS is at least 15,360 and sets the rate: 2.4e-5 x sqrt(GBS / 16384), rounded to the 9th decimal; the
warmup is 4 steps and the cosine ends at step 12,000 at 1e-8. The closed architecture comes with the MoE
model family; until then ``architecture`` is None and the recipe carries the rules alone."""

from __future__ import annotations

import dataclasses
import math

from trainperf.core.spec import DataSpec, EvalSpec, LoRASpec, MLPerfSpec, ParallelSpec, RunSpec, TrainSpec
from trainperf.mlperf.benchmark import (GBS_DERIVED, MOE_LAYOUT_VARIABLES, Benchmark, GbsSchedule, needs_paths,
                                        pretraining_events)

DEEPSEEK_GBS_FLOOR = 15_360  # global_batch_size >= 15360
DEEPSEEK_GBS = 16_384  # the rate's reference GBS (an RCP point)
DEEPSEEK_WARMUP = 4
DEEPSEEK_LR_STEPS = 12_000  # the schedule's length: decay_steps == 12000 - warmup
DEEPSEEK_MIN_LR = 1e-8
DEEPSEEK_EVAL_ROWS = 1024
DEEPSEEK_TARGET = 3.6
MOE_AUX_LOSS_COEFF = 0.01  # moe_aux_loss_coeff == 0.01


def deepseek_lr(gbs: int) -> float:
    """2.4e-5 x sqrt(GBS / 16384), rounded to the 9th decimal (the checker allows 1e-9 off the formula)."""
    return round(2.4e-5 * math.sqrt(gbs / DEEPSEEK_GBS), 9)


def deepseekv3_671b_defaults(gbs: int = DEEPSEEK_GBS) -> RunSpec:
    lr = deepseek_lr(gbs)
    return RunSpec(
        workload="deepseekv3_671b",
        model=dataclasses.replace(BENCHMARK.model(), moe_aux_loss_coeff=MOE_AUX_LOSS_COEFF),
        lora=LoRASpec(rank=0),
        parallel=ParallelSpec(),
        train=TrainSpec(micro_batch_size=1, global_batch_size=gbs, lr=lr, min_lr_ratio=DEEPSEEK_MIN_LR / lr,
                        warmup_steps=DEEPSEEK_WARMUP, decay_steps=DEEPSEEK_LR_STEPS - DEEPSEEK_WARMUP,
                        weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8, grad_clip=1.0, max_steps=DEEPSEEK_LR_STEPS,
                        recompute="selective", log_every=1, seed=-1, untimed_warmup_steps=2),
        data=DataSpec(seq_len=4096, train_samples=64, eval_samples=DEEPSEEK_EVAL_ROWS),
        # an eval after every step: every GBS samples
        eval=EvalSpec(every_samples=gbs, skip_first=0, target=DEEPSEEK_TARGET, batch_size=1),
        mlperf=MLPerfSpec(benchmark="deepseekv3_671b", division="closed", comparable=True),
    )


DEEPSEEK_FIXED = (
    ("lora.rank", 0, "the benchmark trains every parameter"),
    ("model.moe_aux_loss_coeff", MOE_AUX_LOSS_COEFF, "moe_aux_loss_coeff is fixed to 0.01"),
    ("data.seq_len", 4096, "max_sequence_length is fixed to 4096"),
    ("train.optimizer", "adamw", "opt_name is fixed to adamw"),
    ("train.beta1", 0.9, "opt_adamw_beta_1 is fixed to 0.9"),
    ("train.beta2", 0.95, "opt_adamw_beta_2 is fixed to 0.95"),
    ("train.eps", 1e-8, "opt_adamw_epsilon is fixed to 1e-08"),
    ("train.weight_decay", 0.1, "opt_adamw_weight_decay is fixed to 0.1"),
    ("train.grad_clip", 1.0, "opt_gradient_clip_norm is fixed to 1.0"),
    ("data.eval_samples", DEEPSEEK_EVAL_ROWS, "eval_samples is fixed to 1024"),
    ("eval.skip_first", 0, "no evals are skipped"),
    ("eval.target", DEEPSEEK_TARGET, "the quality target is log perplexity 3.6"),
)
DEEPSEEK_TUNABLE = "train.global_batch_size (15360 or more), train.max_steps"


def deepseek_derived(gbs: int) -> tuple:
    return (("train.warmup_steps", DEEPSEEK_WARMUP, "the rules' warmup steps"),
            ("train.decay_steps", DEEPSEEK_LR_STEPS - DEEPSEEK_WARMUP, "12000 - warmup"),
            ("eval.every_samples", gbs, "an eval after every step: GBS samples"))


def deepseek_events(spec: RunSpec, events: list) -> list:
    return pretraining_events(spec, events) + [("moe_aux_loss_coeff", spec.model.moe_aux_loss_coeff)]


BENCHMARK = Benchmark(
    name="deepseekv3_671b", recipe=deepseekv3_671b_defaults, default_gbs=DEEPSEEK_GBS, fixed=DEEPSEEK_FIXED,
    tunable=DEEPSEEK_TUNABLE, eval_rows=DEEPSEEK_EVAL_ROWS, eval_every=DEEPSEEK_GBS, target=DEEPSEEK_TARGET,
    rulesets=("6.0.0", "6.1.0"), architecture=None, model_name="deepseek-v3-671b",
    schedule=GbsSchedule(rates=lambda gbs: {deepseek_lr(gbs)},
                         rate_rule="2.4e-5 x sqrt(GBS / 16384), rounded to the 9th decimal",
                         derived=deepseek_derived,
                         fields=(*GBS_DERIVED, "train.min_lr_ratio", "eval.every_samples")),
    gbs_span=(DEEPSEEK_GBS_FLOOR, 2**62), gbs_rule=f"allow GBS {DEEPSEEK_GBS_FLOOR} or more only",
    log_events=deepseek_events,
    input_checks=(needs_paths("the MLCommons DeepSeek-V3 671B checkpoint (Hugging Face layout)"),),
    layout_variables=MOE_LAYOUT_VARIABLES,
)
