"""llama2_70b_lora: Llama-2-70B, fused-QKV LoRA fine-tuning on GovReport (closed division; MLPerf
Training rules table "llama2_70b_lora", reference: mlcommons/training llama2_70b_lora)."""

from __future__ import annotations

from trainperf.core.errors import SpecError
from trainperf.core.spec import DataSpec, EvalSpec, LoRASpec, MLPerfSpec, ModelSpec, ParallelSpec, RunSpec, TrainSpec
from trainperf.mlperf.benchmark import Benchmark

LLAMA2_70B = ModelSpec(name="llama2-70b", vocab_size=32000, hidden_size=8192, intermediate_size=28672, num_layers=80,
                       num_heads=64, num_kv_heads=8, rope_theta=10000.0, rms_norm_eps=1e-5,
                       max_position_embeddings=8192, fused_qkv=True)
LORA_TRAIN_ROWS, LORA_EVAL_ROWS = 3901, 173  # the preprocessed GovReport set (NVIDIA v4.1 logs)
LORA_EVAL_EVERY = 384
LORA_TARGET = 0.925


def llama2_70b_lora_defaults() -> RunSpec:
    return RunSpec(
        workload="llama2_70b_lora",
        model=ModelSpec(**LLAMA2_70B.__dict__),
        lora=LoRASpec(rank=16, alpha=32.0, dropout=0.1, target_modules=["qkv_proj", "o_proj"]),
        parallel=ParallelSpec(),
        # the reference trains with gradient checkpointing; `tune` finds whether a layout can afford less
        train=TrainSpec(micro_batch_size=1, global_batch_size=8, lr=4e-4, min_lr_ratio=0.0, warmup_steps=0,
                        weight_decay=1e-4, beta1=0.9, beta2=0.999, eps=1e-8, grad_clip=0.3, max_steps=1024,
                        recompute="full", log_every=10, seed=-1, untimed_warmup_steps=2),
        data=DataSpec(seq_len=8192, train_samples=64),  # train_samples: rows fabricated when open and no data.path
        eval=EvalSpec(every_samples=LORA_EVAL_EVERY, skip_first=-1, target=LORA_TARGET, batch_size=1),
        mlperf=MLPerfSpec(benchmark="llama2_70b_lora", division="closed", comparable=True),
    )


LORA_FIXED = (
    ("lora.rank", 16, "fixed to 16 in the closed division"),
    ("lora.alpha", 32.0, "fixed to the reference (32)"),
    ("lora.dropout", 0.1, "fixed to the reference (0.1)"),
    ("lora.target_modules", ["qkv_proj", "o_proj"], "the reference adapts the fused qkv_proj and o_proj"),
    ("model.fused_qkv", True, "the reference model has a fused qkv_proj"),
    ("train.weight_decay", 1e-4, "opt_weight_decay is fixed to 0.0001"),
    ("train.grad_clip", 0.3, "opt_gradient_clip_norm is fixed to 0.3"),
    ("train.optimizer", "adamw", "the reference's optimizer is AdamW with full-precision states"),
    ("train.beta1", 0.9, "AdamW betas are the reference's (0.9, 0.999)"),
    ("train.beta2", 0.999, "AdamW betas are the reference's (0.9, 0.999)"),
    ("train.eps", 1e-8, "AdamW epsilon is the reference's (1e-8)"),
    ("train.min_lr_ratio", 0.0, "the reference's cosine decays to 0"),
    ("data.seq_len", 8192, "sequence_length is fixed to the reference (8192)"),
    ("eval.every_samples", LORA_EVAL_EVERY, "the rules evaluate every 384 samples"),
    ("eval.skip_first", -1, "the rules skip FLOOR(0.125*GBS+2) evals (-1 applies that)"),
    ("eval.target", LORA_TARGET, "the quality target is eval loss 0.925"),
)
LORA_TUNABLE = "train.global_batch_size, train.lr, train.warmup_steps, train.max_steps, train.decay_steps"


def lora_events(spec: RunSpec, events: list) -> list:
    """The schedule as NeMo's LoRA recipe logs it: training steps and the warmup's share of them."""
    t = spec.train
    training_steps = t.decay_steps + t.warmup_steps if t.decay_steps else t.max_steps
    return events + [
        ("opt_learning_rate_training_steps", training_steps),
        ("opt_learning_rate_warmup_ratio", t.warmup_steps / max(training_steps, 1)),
    ]


def check_inputs(spec: RunSpec, data_rows: dict | None) -> None:
    if not spec.model.path:
        raise SpecError("the closed division fine-tunes the Llama-2-70B checkpoint: give model.path=DIR "
                        "(random weights are an open-division throughput run)")
    if not spec.data.path:
        raise SpecError("the closed division trains on the preprocessed GovReport data: give data.path=DIR")


BENCHMARK = Benchmark(
    name="llama2_70b_lora", recipe=llama2_70b_lora_defaults, default_gbs=8, fixed=LORA_FIXED, tunable=LORA_TUNABLE,
    eval_rows=LORA_EVAL_ROWS, eval_every=LORA_EVAL_EVERY, target=LORA_TARGET,
    rulesets=("4.0.0", "4.1.0", "5.0.0", "5.1.0", "6.0.0", "6.1.0"), architecture=LLAMA2_70B,
    log_events=lora_events, input_checks=(check_inputs,),
    data_rows={"train": LORA_TRAIN_ROWS, "validation": LORA_EVAL_ROWS},
)
