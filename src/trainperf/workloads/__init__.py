"""The workload registry: name -> defaults, one-line description, and an untimed ``prepare`` step that
produces or checks whatever the run reads (cached base checkpoints, synthetic datasets)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from trainperf.core.errors import SpecError
from trainperf.core.spec import RunSpec, did_you_mean
from trainperf.mlperf import recipes as mlperf
from trainperf.workloads import mini_specs


def _from_mini(name: str) -> Callable:
    """A function of workloads/mini.py, imported on its first call: mini.py loads torch, which `plan`,
    `workloads` and `--help` do not need (the defaults they read are in mini_specs)."""

    def call(*args):
        from trainperf.workloads import (
            mini,  # torch loads with it, only when a mini workload is used
        )

        return getattr(mini, name)(*args)

    call.__name__ = name
    return call


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    defaults: Callable[[], RunSpec]
    prepare: Callable[[RunSpec], dict]


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("llama2_70b_lora",
                 "MLPerf Llama 2 70B LoRA, closed-division recipe: model.path=HF checkpoint (fused or unfused qkv), "
                 "data.path=GovReport parquet/npy; eval loss <= 0.925. Open division: shrunken or random-weight runs",
                 mlperf.llama2_70b_lora_defaults, _from_mini("prepare_mlperf_lora")),
        Workload("llama31_8b",
                 "MLPerf Llama 3.1 8B pretraining from scratch, closed-division recipe: data.path=pretok dir "
                 "(see `trainperf data convert`); log perplexity <= 3.3 on the first 1024 validation sequences",
                 mlperf.llama31_8b_defaults, _from_mini("prepare_mlperf_pretrain")),
        Workload("gpt3",
                 "MLPerf GPT-3 175B (v3.0-v4.1), closed-division recipe: model.path=the 4000-step checkpoint "
                 "(safetensors, Megatron names), data.path=C4 (pretok dir or Megatron .bin/.idx); log perplexity "
                 "<= 2.69; GBS 1536..8192 sets lr, warmup and decay",
                 mlperf.gpt3_defaults, _from_mini("prepare_mlperf_pretrain")),
        Workload("llama31_405b",
                 "MLPerf Llama 3.1 405B pretraining (v5.0-v6.0), closed-division recipe: model.path=HF Llama 3.1 "
                 "405B checkpoint, data.path=C4; log perplexity <= 5.6 on 5760 sequences; GBS up to 9216 sets lr, "
                 "warmup, decay and skipped evals",
                 mlperf.llama31_405b_defaults, _from_mini("prepare_mlperf_pretrain")),
        Workload("mini-pretrain",
                 "Pretrain a 2-layer Llama on Markov-chain text to its known optimal loss + 0.10 (CPU-sized, open division)",
                 mini_specs.mini_pretrain_defaults, _from_mini("prepare_mini_pretrain")),
        Workload("mini-gpt-pretrain",
                 "Pretrain a 2-layer GPT (LayerNorm, GeLU, learned positions, tied padded vocabulary) on Markov-chain "
                 "text to its known optimal loss + 0.10 (CPU-sized, open division)",
                 mini_specs.mini_gpt_pretrain_defaults, _from_mini("prepare_mini_pretrain")),
        Workload("mini-moe-pretrain",
                 "Pretrain a 2-layer gpt-oss mixture of experts (4 experts, top-2, sinks, sliding window) on "
                 "Markov-chain text to its known optimal loss + 0.10 (CPU-sized, open division)",
                 mini_specs.mini_moe_pretrain_defaults, _from_mini("prepare_mini_pretrain")),
        Workload("mini-lora",
                 "LoRA-tune a cached pretrained mini Llama to a shifted source, answer-only loss, optimum + 0.10 (CPU-sized, open division)",
                 mini_specs.mini_lora_defaults, _from_mini("prepare_mini_lora")),
        Workload("synthetic-lora",
                 "Throughput probe: LoRA r16 on a random-weight Llama (Llama-2-7B shape, seq 8192 by default), random "
                 "tokens, no reachable target (ends as failed); for tokens/s, MFU and memory per layout",
                 mini_specs.synthetic_lora_defaults, _from_mini("prepare_synthetic")),
    )
}


def get_workload(name: str) -> Workload:
    if name not in WORKLOADS:
        raise SpecError(f"unknown workload {name!r}{did_you_mean(name, WORKLOADS)}; valid workloads: "
                        f"{', '.join(sorted(WORKLOADS))}")
    return WORKLOADS[name]
