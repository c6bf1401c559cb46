"""Pretraining throughput, side by side: trainperf's engine vs a plain eager PyTorch baseline.

Same GPU, same process, same shapes, random weights and tokens, every parameter trained. Both sides
keep fp32 master weights, fp32 gradients and fp32 AdamW state (16 bytes per parameter) and compute
in bf16:

- trainperf: the engine `trainperf run` uses (Engine.train_step: FSDP2 mixed precision, its model,
  optional per-layer torch.compile and selective recompute), fused AdamW (`--set train.optimizer=adamw8bit`:
  torchao's 8-bit AdamW on this side only, so the ratio then compares optimizers too), its gradient clipping;
- baseline: Hugging Face transformers' LlamaForCausalLM in eager mode, SDPA attention, fp32
  parameters under `torch.autocast(bfloat16)`, `torch.optim.AdamW` (foreach), `clip_grad_norm_`,
  gradient checkpointing for full recompute -- the plain recipe most training scripts start from.

Prints tokens/s, model TFLOP/s, MFU (6 x linear parameters + causal attention per token,
trainperf.core.flops) and peak memory of each side, and the ratio. A side that does not fit the
GPU says so (one line) instead of a time.

    python bench/pretrain_throughput.py --shape 1b --seq 8192 --recompute none --compile [--no-baseline] [--json FILE]

Selective recompute has no Hugging Face equivalent: with --recompute selective the baseline keeps every
activation (none), and the JSON says so.
"""

from __future__ import annotations

import argparse
import sys

import torch

from common import has_cuda
from lora_throughput import SHAPES, side_by_side, step_figures
from trainperf.core.spec import LoRASpec, ModelSpec, RunSpec, TrainSpec
from trainperf.core.resolve import resolve_spec
from trainperf.core import flops as metrics
from trainperf.model.loss import train_loss_sum

MAX_GRAD_NORM = 1.0


def bench_trainperf(model_spec: ModelSpec, seq: int, recompute: str, steps: int, warmup: int,
                    compile_layers: bool, overrides: list[str]) -> dict:
    from trainperf.parallel.parallelize import build_mesh
    from trainperf.train.engine import Engine
    from trainperf.train.loop import build_optimizer, clip_gradients, resolve_param_dtype
    from trainperf.parallel.distributed import init_distributed

    base = RunSpec(workload="bench", model=model_spec, lora=LoRASpec(rank=0),
                   train=TrainSpec(micro_batch_size=1, global_batch_size=1, recompute=recompute, seed=0,
                                   compile=compile_layers))
    base.parallel.dp_shard = 1
    spec = resolve_spec(base, None, overrides)
    init_distributed("cuda")
    engine = Engine(spec, build_mesh(spec.parallel, "cuda"), torch.device("cuda"), resolve_param_dtype(spec, "cuda"))
    engine.train()
    opt = build_optimizer(engine.trainable, spec.train)  # what train/loop.py builds (train.optimizer)
    ids = torch.randint(0, model_spec.vocab_size, (1, seq), device="cuda")
    mask = torch.ones_like(ids, dtype=torch.bool)

    def step():
        engine.train_step([(ids, mask)], float(seq - 1))
        clip_gradients(engine.trainable, MAX_GRAD_NORM)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step_figures(step, steps, warmup)


def bench_eager_baseline(model_spec: ModelSpec, seq: int, recompute: str, steps: int, warmup: int, **_) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=model_spec.vocab_size, hidden_size=model_spec.hidden_size,
                      intermediate_size=model_spec.intermediate_size, num_hidden_layers=model_spec.num_layers,
                      num_attention_heads=model_spec.num_heads, num_key_value_heads=model_spec.num_kv_heads,
                      max_position_embeddings=max(seq, 4096), tie_word_embeddings=False,
                      use_cache=False)  # training: no key/value cache
    cfg._attn_implementation = "sdpa"
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)  # fp32 parameters: the masters
    if recompute == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4)
    ids = torch.randint(0, model_spec.vocab_size, (1, seq), device="cuda")
    mask = torch.ones_like(ids, dtype=torch.bool)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=ids).logits
        (train_loss_sum(logits, ids, mask) / (seq - 1)).backward()
        torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step_figures(step, steps, warmup)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--recompute", choices=["none", "selective", "full"], default="none")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="trainperf with train.compile=true (the baseline stays eager)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the eager baseline")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="a trainperf spec override for its side (e.g. train.loss_chunk_tokens=2048)")
    ap.add_argument("--json", help="append the result as one JSON line to this file")
    args = ap.parse_args()
    if not has_cuda("pretrain_throughput.py"):
        return 2
    model_spec = ModelSpec(vocab_size=32000, max_position_embeddings=max(args.seq, 4096), **SHAPES[args.shape])
    flops_tok = metrics.train_flops_per_token(model_spec, LoRASpec(rank=0), args.seq)
    common = dict(model_spec=model_spec, seq=args.seq, steps=args.steps, warmup=args.warmup,
                  compile_layers=args.compile, overrides=args.overrides)
    sides = [("trainperf", bench_trainperf, dict(common, recompute=args.recompute))]
    if not args.no_baseline:  # HF has no selective recompute: against it the baseline keeps everything
        sides.append(("eager", bench_eager_baseline, dict(common, recompute="full" if args.recompute == "full" else "none")))
    side_by_side(sides, shape=args.shape, seq=args.seq, flops_tok=flops_tok, ratio_label="trainperf / eager baseline",
                 json_path=args.json,
                 meta=dict(bench="pretrain", shape=args.shape, seq=args.seq, recompute=args.recompute, args=vars(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
