"""The mini and probe workloads' defaults (model shapes, schedules, targets set at prepare time), without
torch: `plan`, `workloads` and argument checking read them; workloads/mini.py builds their data and
checkpoints."""

from __future__ import annotations

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

VOCAB = 64  # the Markov chain's vocabulary
SEQ = 64


def mini_model() -> ModelSpec:
    return ModelSpec(name="mini-llama", vocab_size=VOCAB, hidden_size=64, intermediate_size=176, num_layers=2,
                     num_heads=4, num_kv_heads=2, max_position_embeddings=256, init_std=0.02)


def mini_gpt_model() -> ModelSpec:
    """A 2-layer GPT whose 64-token vocabulary pads to 96 rows under tp 1 and 2 alike (multiples of
    48 and 96), so the padded rows exist and every CPU layout shares one reference run."""
    return ModelSpec(name="mini-gpt", family="gpt", vocab_size=VOCAB, hidden_size=64, intermediate_size=256,
                     num_layers=2, num_heads=4, num_kv_heads=4, max_position_embeddings=SEQ, init_std=0.02,
                     make_vocab_size_divisible_by=48)


def mini_moe_model() -> ModelSpec:
    """A 2-layer gpt-oss: 4 experts of which each token takes 2, a 16-token window on layer 0 (shorter
    than the 64-token rows), sinks, YaRN over an original 32 positions, the load-balancing loss on."""
    return ModelSpec(name="mini-gpt-oss", family="gpt_oss", vocab_size=VOCAB, hidden_size=64, intermediate_size=64,
                     num_layers=2, num_heads=4, num_kv_heads=2, attention_head_dim=16, num_experts=4,
                     experts_per_token=2, moe_aux_loss_coeff=0.01, sliding_window=16, rope_theta=150000.0,
                     rope_factor=2.0, rope_original_max_positions=32, max_position_embeddings=SEQ, init_std=0.02)


def mini_pretrain_defaults() -> RunSpec:
    return RunSpec(
        workload="mini-pretrain",
        model=mini_model(),
        lora=LoRASpec(rank=0),
        parallel=ParallelSpec(),
        train=TrainSpec(micro_batch_size=8, global_batch_size=16, lr=3e-3, min_lr_ratio=0.1, warmup_steps=10,
                        weight_decay=0.0, beta1=0.9, beta2=0.95, eps=1e-8, grad_clip=1.0, max_steps=400,
                        log_every=10, seed=-1),
        data=DataSpec(seq_len=SEQ, train_samples=4096, eval_samples=64),
        eval=EvalSpec(every_samples=256, skip_first=1, target=-1.0, batch_size=32),
        mlperf=MLPerfSpec(benchmark="llama31_8b", division="open", comparable=False),
    )


def mini_gpt_pretrain_defaults() -> RunSpec:
    """mini-pretrain's Markov source and schedule on the GPT family."""
    spec = mini_pretrain_defaults()
    spec.workload, spec.model = "mini-gpt-pretrain", mini_gpt_model()
    spec.mlperf = MLPerfSpec(benchmark="gpt3", division="open", comparable=False)
    return spec


def mini_moe_pretrain_defaults() -> RunSpec:
    """mini-pretrain's Markov source and schedule on the gpt-oss MoE family."""
    spec = mini_pretrain_defaults()
    spec.workload, spec.model = "mini-moe-pretrain", mini_moe_model()
    spec.mlperf = MLPerfSpec(benchmark="gpt_oss_20b", division="open", comparable=False)
    return spec


def mini_lora_defaults() -> RunSpec:
    return RunSpec(
        workload="mini-lora",
        model=mini_model(),
        lora=LoRASpec(rank=8, alpha=16.0, dropout=0.1, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
        parallel=ParallelSpec(),
        train=TrainSpec(micro_batch_size=8, global_batch_size=16, lr=1e-2, min_lr_ratio=0.0, warmup_steps=0,
                        weight_decay=1e-4, beta1=0.9, beta2=0.999, eps=1e-8, grad_clip=0.3, max_steps=400,
                        log_every=10, seed=-1),
        data=DataSpec(seq_len=SEQ, train_samples=2048, eval_samples=64),
        eval=EvalSpec(every_samples=256, skip_first=1, target=-1.0, batch_size=32),
        mlperf=MLPerfSpec(benchmark="llama2_70b_lora", division="open", comparable=False),
    )


def llama2_7b_model() -> ModelSpec:
    return ModelSpec(name="llama2-7b-shape", vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                     num_layers=32, num_heads=32, num_kv_heads=32, max_position_embeddings=8192)


def synthetic_lora_defaults() -> RunSpec:
    return RunSpec(
        workload="synthetic-lora",
        model=llama2_7b_model(),
        lora=LoRASpec(rank=16, alpha=32.0, dropout=0.1, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
        train=TrainSpec(micro_batch_size=1, global_batch_size=4, lr=4e-4, weight_decay=1e-4, grad_clip=0.3,
                        max_steps=20, log_every=1, seed=-1),
        data=DataSpec(seq_len=8192, train_samples=80, eval_samples=2),
        eval=EvalSpec(every_samples=10**9, skip_first=0, target=0.0, batch_size=1),
        mlperf=MLPerfSpec(benchmark="llama2_70b_lora", division="open", comparable=False),
    )
