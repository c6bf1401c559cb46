"""The MLPerf Training LLM workloads as the rules define them: ``llama2_70b_lora`` (closed division:
Llama-2-70B, fused-QKV LoRA on GovReport), ``llama31_8b`` (pretraining from scratch on C4), and the
cluster-scale pretraining benchmarks ``gpt3`` (GPT-3 175B from a 4000-step checkpoint, v3.0-v4.1) and
``llama31_405b`` (Llama 3.1 405B from its Hugging Face checkpoint, v5.0-v6.0).

Each benchmark is three things here:
  * its reference recipe as the workload's defaults (MLPerf Training rules and the mlcommons/training reference implementation),
  * the closed-division rules -- which values are fixed and which are tunable -- checked before launch
    (``check_closed_rules``); a run that breaks one must say ``mlperf.division=open``,
  * the hyperparameters its MLPerf log must carry (``hyperparameter_events``), which the
    ``mlperf_logging`` compliance checker verifies.
Shrunken runs (fewer layers, shorter sequences, fabricated data) are open division and are flagged
not comparable.
"""

from __future__ import annotations

import math

from trainperf.core.errors import SpecError
from trainperf.core.layout import grad_accum_steps
from trainperf.core.spec import (
    DataSpec,
    EvalSpec,
    LoRASpec,
    MLPerfSpec,
    ModelSpec,
    ParallelSpec,
    RunSpec,
    TrainSpec,
)

# ---------------------------------------------------------------------------------------------
# llama2_70b_lora

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


# (spec attribute, value the closed division fixes it to, why) -- rules table "llama2_70b_lora"
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

# ---------------------------------------------------------------------------------------------
# llama31_8b

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
    ("lora.rank", 0, "pretraining trains every parameter"),
    ("data.seq_len", 8192, "max_sequence_length is fixed to 8192"),
    ("train.optimizer", "adamw", "the reference's optimizer is AdamW with full-precision states"),
    ("train.beta1", 0.9, "opt_adamw_beta_1 is fixed to 0.9"),
    ("train.beta2", 0.95, "opt_adamw_beta_2 is fixed to 0.95"),
    ("train.eps", 1e-5, "opt_adamw_epsilon is fixed to 1e-05"),
    ("train.weight_decay", 0.1, "opt_adamw_weight_decay is fixed to 0.1"),
    ("train.grad_clip", 1.0, "opt_gradient_clip_norm is fixed to 1.0"),
    ("train.min_lr_ratio", 0.1, "opt_end_learning_rate is 0.1 x the base rate"),
    ("train.max_steps", PRETRAIN_MAX_STEPS, "max_steps is fixed to 1,200,000"),
    ("data.eval_samples", PRETRAIN_EVAL_ROWS, "eval uses the first 1024 validation sequences"),
    ("eval.every_samples", PRETRAIN_EVAL_EVERY, "the rules evaluate every 12,288 samples"),
    ("eval.skip_first", 0, "no evals are skipped"),
    ("eval.target", PRETRAIN_TARGET, "the quality target is log perplexity 3.3"),
)
PRETRAIN_TUNABLE = "train.global_batch_size, train.lr, train.warmup_steps"

# ---------------------------------------------------------------------------------------------
# gpt3 (rules: "GPT3 hyperparameter constraints"; reference: retired_benchmarks/gpt3/megatron-lm)

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

# ---------------------------------------------------------------------------------------------
# llama31_405b (rules: "Llama 3.1 405b hyperparameter constraints"; reference: large_language_model_pretraining/nemo)

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
ROUND_EVAL_SCHEDULE = {("llama31_405b", "v5.0"): (46_080, 0)}
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
    ("lora.rank", 0, "pretraining trains every parameter"),
    ("data.seq_len", 8192, "max_sequence_length is fixed to 8192"),
    ("train.optimizer", "adamw", "the reference's optimizer is AdamW with full-precision states"),
    ("train.beta1", 0.9, "opt_adamw_beta_1 is fixed to 0.9"),
    ("train.beta2", 0.95, "opt_adamw_beta_2 is fixed to 0.95"),
    ("train.eps", 1e-5, "opt_adamw_epsilon is fixed to 1e-05"),
    ("train.weight_decay", 0.1, "opt_adamw_weight_decay is fixed to 0.1"),
    ("train.grad_clip", 1.0, "opt_gradient_clip_norm is fixed to 1.0"),
    ("data.eval_samples", LLAMA405_EVAL_ROWS, "eval_samples is fixed to 5760"),
    ("eval.every_samples", LLAMA405_EVAL_EVERY, "the rules evaluate every 18,432 sequences"),
    ("eval.target", LLAMA405_TARGET, "the quality target is log perplexity 5.6"),
)
LLAMA405_TUNABLE = "train.global_batch_size (up to 9216), train.max_steps"

# ---------------------------------------------------------------------------------------------
# By benchmark name

RECIPES = {"llama2_70b_lora": llama2_70b_lora_defaults, "llama31_8b": llama31_8b_defaults, "gpt3": gpt3_defaults,
           "llama31_405b": llama31_405b_defaults}
EVAL_ROWS = {"llama2_70b_lora": LORA_EVAL_ROWS, "llama31_8b": PRETRAIN_EVAL_ROWS,  # validation rows of one eval
             "gpt3": GPT3_EVAL_ROWS, "llama31_405b": LLAMA405_EVAL_ROWS}
# what the RCPs count a run's progress in (epoch_num of eval_accuracy for gpt3: tokens)
RCP_UNIT = {"gpt3": "tokens", "llama31_405b": "samples", "llama31_8b": "samples", "llama2_70b_lora": "samples"}
# the ruleset whose RCPs a benchmark is planned with, where it is not the current one: gpt3 left the
# training rules after v4.1, and its RCPs with it
RCP_RULESET = {"gpt3": "4.1.0"}


def init_checkpoint_step(spec: RunSpec) -> int:
    """The start checkpoint's step, as the log must state it: gpt3's 4000 steps of GBS 1536 in steps of
    this run's GBS (NVIDIA v4.1 at GBS 2048 logs 3000); 0 for a run from a released or no checkpoint."""
    if spec.mlperf.benchmark == "gpt3":
        return math.ceil(GPT3_CHECKPOINT_SAMPLES / spec.train.global_batch_size)
    return 0


def check_start_checkpoint(spec: RunSpec, checkpoint_config: dict) -> None:
    """gpt3's closed division starts from the reference's 4000-step checkpoint: a config.json that states
    the samples its weights have trained on (Megatron's ``consumed_train_samples``; `trainperf checkpoint
    convert --consumed-train-samples` writes it) must state 4000 x 1536."""
    consumed = checkpoint_config.get("consumed_train_samples")
    if spec.mlperf.division != "closed" or spec.mlperf.benchmark != "gpt3" or consumed is None:
        return
    if consumed != GPT3_CHECKPOINT_SAMPLES:
        raise SpecError(f"model.path {spec.model.path!r}: config.json says consumed_train_samples={consumed}; the closed "
                        f"division of gpt3 starts from the 4000-step checkpoint ({GPT3_CHECKPOINT_SAMPLES:,} samples, "
                        "logged as init_checkpoint_step); use mlperf.division=open for another start point")


def eval_samples_logged(spec: RunSpec, rows: int) -> int:
    """The log's eval_samples for ``rows`` validation sequences: gpt3 states its eval set in tokens
    (11,590,004 in the reference), the others in sequences."""
    return rows * spec.data.seq_len if spec.mlperf.benchmark == "gpt3" else rows


def progress_count(spec: RunSpec, samples: int, train_rows: int) -> float:
    """The log's epoch_num for ``samples`` trained: gpt3 counts tokens (its RCPs are in tokens),
    the others the fraction of the training set."""
    if spec.mlperf.benchmark == "gpt3":
        return float(samples * spec.data.seq_len)
    return samples / max(train_rows, 1)


# ---------------------------------------------------------------------------------------------
# The closed-division check

def _get(spec: RunSpec, dotted: str):
    section, key = dotted.split(".")
    return getattr(getattr(spec, section), key)


def _same(a, b) -> bool:
    if isinstance(b, float) and isinstance(a, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    return a == b


# The architecture the closed division trains. A test may stand in a tiny model for it (it cannot
# run a 70B model on a CPU); the recipe itself has no stand-in.
CLOSED_ARCHITECTURES = {"llama2_70b_lora": LLAMA2_70B, "llama31_8b": LLAMA31_8B, "gpt3": GPT3_175B,
                        "llama31_405b": LLAMA31_405B}
CLOSED_DATA_ROWS = {"llama2_70b_lora": {"train": LORA_TRAIN_ROWS, "validation": LORA_EVAL_ROWS}}
ARCH_FIELDS = ("family", "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
               "rope_theta", "rms_norm_eps")


def check_closed_rules(spec: RunSpec, data_rows: dict[str, int] | None = None, architecture: bool = True) -> None:
    """SpecError naming the first value a closed-division run may not change. Open runs pass.
    ``architecture=False`` before the checkpoint's config.json has set the model."""
    if spec.mlperf.division != "closed":
        return
    bench = spec.mlperf.benchmark
    rules = {"llama2_70b_lora": (LORA_FIXED, LORA_TUNABLE), "llama31_8b": (PRETRAIN_FIXED, PRETRAIN_TUNABLE),
             "gpt3": (GPT3_FIXED, GPT3_TUNABLE), "llama31_405b": (LLAMA405_FIXED, LLAMA405_TUNABLE)}
    if bench not in rules or spec.workload != bench:
        raise SpecError(f"mlperf.division=closed needs the benchmark's reference workload ({', '.join(rules)}); "
                        f"workload {spec.workload!r} runs open division only: use mlperf.division=open")
    fixed, tunable = rules[bench]
    for dotted, value, why in fixed:
        if not _same(_get(spec, dotted), value):
            raise SpecError(f"{dotted}={_get(spec, dotted)!r} is not allowed in the closed division ({why}: {value!r}); "
                            f"tunable: {tunable}; or set mlperf.division=open")
    if bench in ("gpt3", "llama31_405b"):
        check_schedule_for_gbs(spec)
    if bench == "llama31_8b":
        t = spec.train
        if t.decay_steps != PRETRAIN_MAX_STEPS - t.warmup_steps:
            raise SpecError(f"train.decay_steps={t.decay_steps}: the closed division fixes it to 1,200,000 - "
                            f"warmup_steps = {PRETRAIN_MAX_STEPS - t.warmup_steps}")
    arch = CLOSED_ARCHITECTURES[bench]
    for name in ARCH_FIELDS if architecture else ():
        if not _same(getattr(spec.model, name), getattr(arch, name)):
            raise SpecError(f"model.{name}={getattr(spec.model, name)} is not the {arch.name} architecture "
                            f"({getattr(arch, name)}) that the closed division trains; use mlperf.division=open")
    if bench in ("gpt3", "llama31_405b") and not (spec.model.path and spec.data.path):
        start = ("the 4000-step GPT-3 175B checkpoint (safetensors, Megatron names)" if bench == "gpt3"
                 else "the Hugging Face Llama 3.1 405B checkpoint")
        raise SpecError(f"the closed division of {bench} starts from {start} on C4: give model.path=DIR and "
                        "data.path=DIR (random weights or fabricated data are an open-division throughput run)")
    if bench == "llama2_70b_lora" and not spec.model.path:
        raise SpecError("the closed division fine-tunes the Llama-2-70B checkpoint: give model.path=DIR "
                        "(random weights are an open-division throughput run)")
    if bench == "llama2_70b_lora" and not spec.data.path:
        raise SpecError("the closed division trains on the preprocessed GovReport data: give data.path=DIR")
    if bench == "llama31_8b" and data_rows and data_rows.get("validation", 0) < PRETRAIN_EVAL_ROWS:
        raise SpecError(f"data.path {spec.data.path!r}: validation has {data_rows.get('validation')} sequences of "
                        f"{spec.data.seq_len} tokens; the closed division evaluates on the first {PRETRAIN_EVAL_ROWS}")
    want = CLOSED_DATA_ROWS.get(bench)
    if want and data_rows:
        for split, rows in want.items():
            if data_rows.get(split) != rows:
                raise SpecError(f"data.path {spec.data.path!r}: {split} has {data_rows.get(split)} rows; the closed "
                                f"division's GovReport set has {rows} (use mlperf.division=open for other data)")


def apply_round_eval_schedule(spec: RunSpec, round_name: str) -> None:
    """A published run of an earlier round evaluated at that round's cadence (ROUND_EVAL_SCHEDULE)."""
    found = ROUND_EVAL_SCHEDULE.get((spec.mlperf.benchmark, round_name))
    if found:
        spec.eval.every_samples, spec.eval.skip_first = found


def gbs_rate_span(benchmark: str) -> tuple[int, int]:
    """(smallest, largest) GBS the benchmark's closed rules give a learning rate for ((1, huge): any)."""
    return {"gpt3": GPT3_GBS_RANGE, "llama31_405b": LLAMA405_GBS_RANGE}.get(benchmark, (1, 2**62))


def gbs_eval_skips(spec: RunSpec, gbs: int) -> int | None:
    """The evals a closed llama31_405b run at ``gbs`` skips, where ``spec`` skips what its own GBS
    derives (None: the count does not follow the GBS, or follows it by itself: skip_first = -1)."""
    if spec.mlperf.benchmark != "llama31_405b" or spec.eval.skip_first != llama405_eval_skips(spec.train.global_batch_size):
        return None
    return llama405_eval_skips(gbs)


def check_gbs_has_rate(spec: RunSpec) -> None:
    """gpt3 and llama31_405b take their rate from the GBS: a GBS the rules give no rate for is refused
    in either division (an open run states its own rate with train.lr, and still needs a GBS in range)."""
    bench, gbs = spec.mlperf.benchmark, spec.train.global_batch_size
    span = gbs_rate_span(bench)
    if spec.mlperf.division == "closed" and not span[0] <= gbs <= span[1]:
        raise SpecError(f"train.global_batch_size={gbs}: the {bench} rules give a learning rate for GBS "
                        f"{span[0]}..{span[1]} only; choose a GBS in it or set mlperf.division=open")


def check_schedule_for_gbs(spec: RunSpec) -> None:
    """gpt3 / llama31_405b closed: the rate, warmup and decay are functions of the GBS."""
    check_gbs_has_rate(spec)
    t, bench = spec.train, spec.mlperf.benchmark
    gbs = t.global_batch_size
    if bench == "gpt3":
        warmup, decay = gpt3_schedule(gbs)
        rates = {2e-5, 3e-5} if 3072 < gbs < 4096 else {gpt3_lr(gbs)}
        want = (("train.warmup_steps", warmup, "ceil(265 x 1536 / GBS)"),
                ("train.decay_steps", decay - warmup, "ceil(108600 x 1536 / GBS) - warmup"))
        rate_rule = "2e-5 for GBS <= 3072, 3e-5 for GBS >= 4096, either in between"
    else:
        warmup, decay = llama405_schedule(gbs)
        rates = {llama405_lr(gbs)}
        want = (("train.warmup_steps", warmup, "ceil(8000 x 1152 / GBS)"),
                ("train.decay_steps", decay, "ceil(1,200,000 x 1152 / GBS) - warmup"),
                ("eval.skip_first", llama405_eval_skips(gbs), "FLOOR(0.0026 x GBS + 12) evals are skipped"),
                ("train.min_lr_ratio", 0.01, "opt_end_learning_rate is 8e-7 at the base rate 8e-5"))
        rate_rule = "the table 1152->8e-5, 2304->1.6e-4, 4608->3.2e-4, 9216->6.4e-4, else 8e-5 x GBS / 1152"
    if not any(_same(t.lr, r) for r in rates):
        raise SpecError(f"train.lr={t.lr} is not allowed in the closed division at GBS {gbs} ({rate_rule}: "
                        f"{' or '.join(str(r) for r in sorted(rates))}); or set mlperf.division=open")
    for dotted, value, rule in want:
        if not _same(_get(spec, dotted), value):
            raise SpecError(f"{dotted}={_get(spec, dotted)!r} is not allowed in the closed division at GBS {gbs} "
                            f"({rule} = {value}); or set mlperf.division=open")


GBS_DERIVED = ("train.lr", "train.warmup_steps", "train.decay_steps", "eval.skip_first")


def apply_gbs_schedule(spec: RunSpec, defaults: RunSpec) -> None:
    """gpt3 / llama31_405b: a GBS other than the defaults' brings the rate, warmup, decay (and 405B's
    skipped evals) the rules derive from it; a value set explicitly (differing from ``defaults``) stays
    (and the closed check judges it)."""
    bench, gbs = spec.workload, spec.train.global_batch_size
    if bench not in ("gpt3", "llama31_405b") or gbs == defaults.train.global_batch_size:
        return
    check_gbs_has_rate(spec)
    derived = gpt3_defaults(gbs) if bench == "gpt3" else llama31_405b_defaults(gbs)
    for dotted in GBS_DERIVED:
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
    t, d, p, lo = spec.train, spec.data, spec.parallel, spec.lora
    training_steps = t.decay_steps + t.warmup_steps if t.decay_steps else t.max_steps
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
    if spec.mlperf.benchmark == "gpt3":  # Megatron's Adam: the 4.1.0 checker reads opt_adam_* keys
        warmup, decay = t.warmup_steps, t.decay_steps or max(t.max_steps - t.warmup_steps, 1)
        events = [(k.replace("opt_adamw_", "opt_adam_"), v) for k, v in events if k != "opt_adamw_weight_decay"]
        events += [
            ("opt_name", "adam"),
            ("opt_weight_decay", t.weight_decay),
            ("opt_end_learning_rate", t.lr * t.min_lr_ratio),
            ("opt_learning_rate_decay_steps", warmup + decay),  # Megatron counts the decay from step 0
            ("opt_learning_rate_decay_schedule", "cosine with linear warmup"),
            ("init_checkpoint_step", init_checkpoint_step(spec)),
        ]
    elif spec.mlperf.benchmark in ("llama31_8b", "llama31_405b"):
        events += [
            ("opt_name", t.optimizer),
            ("opt_end_learning_rate", t.lr * t.min_lr_ratio),
            ("opt_learning_rate_decay_steps", t.decay_steps or max(t.max_steps - t.warmup_steps, 1)),
            ("opt_learning_rate_decay_schedule", "cosine with linear warmup"),
            ("max_steps", t.max_steps),
        ]
        if spec.mlperf.benchmark == "llama31_405b":
            events.append(("init_checkpoint_step", init_checkpoint_step(spec)))
    else:
        events += [
            ("opt_learning_rate_training_steps", training_steps),
            ("opt_learning_rate_warmup_ratio", t.warmup_steps / max(training_steps, 1)),
        ]
    if lo.enabled:
        events += [("lora_rank", lo.rank), ("lora_alpha", lo.alpha), ("lora_dropout", lo.dropout)]
    return events
