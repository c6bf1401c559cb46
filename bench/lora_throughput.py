"""LoRA training throughput, side by side: trainperf's engine vs Hugging Face transformers + PEFT.

Same GPU, same process, same shapes, random weights and tokens, LoRA r16 alpha 32 dropout 0.1 on
q/k/v/o, micro-batch 1, AdamW on the adapters, gradient clipping. Prints tokens/s, model TFLOP/s,
MFU (LoRA-aware FLOPs, trainperf.core.flops) and peak memory for both, and the ratio.
``--attention sdpa,flash4`` runs our side once per attention kernel, each against the same HF figure;
``--lora-kernel torch,fused`` once per LoRA input-side kernel (with both: every pair, attention outer).

    python bench/lora_throughput.py --shape 7b --seq 8192 --recompute none --steps 10 [--no-hf] [--json FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import sys
import time

import torch

if __package__:  # imported as bench.lora_throughput
    from .common import append_json_line, has_cuda
else:  # run as a script: python bench/lora_throughput.py
    from common import append_json_line, has_cuda
from trainperf.core.spec import LoRASpec, ModelSpec, RunSpec, TrainSpec
from trainperf.core import flops as metrics
from trainperf.core.hardware import peak_flops_for
from trainperf.model.loss import train_loss_sum

SHAPES = {  # Llama-2 shapes (vocab 32000)
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_layers=22, num_heads=32, num_kv_heads=4),
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_layers=32, num_heads=32, num_kv_heads=32),
    "13b": dict(hidden_size=5120, intermediate_size=13824, num_layers=40, num_heads=40, num_kv_heads=40),
}
LORA = LoRASpec(rank=16, alpha=32.0, dropout=0.1, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])


def time_steps(step_fn, steps: int, warmup: int) -> list[float]:
    times = []
    for i in range(warmup + steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step_fn()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def step_figures(step_fn, steps: int, warmup: int) -> dict:
    """Median step time over ``steps`` after ``warmup``, and the peak memory allocated meanwhile."""
    torch.cuda.reset_peak_memory_stats()
    times = time_steps(step_fn, steps, warmup)
    return {"step_s": statistics.median(times), "peak_gib": torch.cuda.max_memory_allocated() / 2**30}


def measure(forward, trainable: list, clip, vocab: int, seq: int, steps: int, warmup: int) -> dict:
    """Median step time and peak memory of forward/backward/clip/AdamW on one random sequence."""
    opt = torch.optim.AdamW(trainable, lr=1e-4, foreach=True)
    ids = torch.randint(0, vocab, (1, seq), device="cuda")
    mask = torch.ones_like(ids, dtype=torch.bool)

    def step():
        loss = train_loss_sum(forward(ids), ids, mask) / (seq - 1)
        loss.backward()
        clip(trainable, 0.3)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step_figures(step, steps, warmup)


def bench_trainperf(model_spec: ModelSpec, lora: LoRASpec, seq: int, recompute: str, steps: int, warmup: int,
                    compile_layers=False, fp8: str = "none", attention: str = "sdpa", lora_kernel: str = "torch") -> dict:
    from trainperf.parallel.parallelize import build_mesh
    from trainperf.train.engine import Engine
    from trainperf.train.loop import clip_gradients, resolve_param_dtype
    from trainperf.parallel.distributed import init_distributed

    spec = RunSpec(workload="bench", model=model_spec, lora=lora,
                   train=TrainSpec(micro_batch_size=1, global_batch_size=1, recompute=recompute, seed=0,
                                   compile=compile_layers))
    spec.parallel.dp_shard = 1
    spec.hardware.fp8 = fp8
    spec.hardware.attention = attention
    spec.hardware.lora_kernel = lora_kernel
    init_distributed("cuda")
    mesh = build_mesh(spec.parallel, "cuda")
    model = Engine(spec, mesh, torch.device("cuda"), resolve_param_dtype(spec, "cuda")).parts[0][1]
    trainable = [p for p in model.parameters() if p.requires_grad]
    return measure(model, trainable, clip_gradients, model_spec.vocab_size, seq, steps, warmup)


def bench_hf_peft(model_spec: ModelSpec, lora: LoRASpec, seq: int, recompute: str, steps: int, warmup: int,
                  **_) -> dict:
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=model_spec.vocab_size, hidden_size=model_spec.hidden_size,
                      intermediate_size=model_spec.intermediate_size, num_hidden_layers=model_spec.num_layers,
                      num_attention_heads=model_spec.num_heads, num_key_value_heads=model_spec.num_kv_heads,
                      max_position_embeddings=max(seq, 4096), tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    if recompute == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                             target_modules=lora.target_modules, task_type="CAUSAL_LM"))
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    return measure(lambda ids: model(input_ids=ids).logits, trainable, torch.nn.utils.clip_grad_norm_,
                   model_spec.vocab_size, seq, steps, warmup)


def run_side(fn, **kwargs) -> dict:
    """One side's figures, or {"oom": first line of the error} when it does not fit: the other side still
    runs. Out of memory also arrives wrapped (a compiler error around it, cuBLAS failing to allocate)."""
    try:
        return fn(**kwargs)
    except torch.OutOfMemoryError as exc:
        return {"oom": str(exc).splitlines()[0]}
    except RuntimeError as exc:
        text = str(exc)
        if "out of memory" not in text.lower() and "CUBLAS_STATUS_ALLOC_FAILED" not in text:
            raise
        return {"oom": next((line.strip() for line in text.splitlines() if "memory" in line.lower()
                             or "ALLOC_FAILED" in line), text.splitlines()[0])}
    finally:
        gc.collect()
        torch.cuda.empty_cache()


def side_by_side(sides: list, *, shape: str, seq: int, flops_tok: float, ratio_label: str, json_path: str | None,
                 meta: dict) -> dict:
    """Run each (name, fn, kwargs) side in turn in this process, print its tokens/s, model TFLOP/s,
    MFU and peak memory (or that it does not fit), the ratio of the first to the second, and append
    everything as one JSON line to ``json_path``."""
    peak = peak_flops_for(torch.cuda.get_device_name())
    results = {}
    for name, fn, kwargs in sides:
        r = run_side(fn, **kwargs)
        r["recompute"] = kwargs["recompute"]
        results[name] = r
        label = f"{name:10s} {shape} seq {seq} recompute {kwargs['recompute']}:"
        if "oom" in r:
            print(f"{label} does not fit this GPU ({r['oom']})", flush=True)
            continue
        tps = seq / r["step_s"]
        r.update(tokens_per_s=tps, model_tflops=flops_tok * tps / 1e12, mfu=metrics.mfu(flops_tok, tps, peak))
        print(f"{label} {tps:,.0f} tokens/s, {r['model_tflops']:.0f} model TFLOP/s, "
              f"MFU {100 * (r['mfu'] or 0):.1f}%, peak {r['peak_gib']:.1f} GiB", flush=True)
    names = [name for name, _, _ in sides]
    baseline = results[names[-1]] if len(names) >= 2 else {}
    for i, name in enumerate(names[:-1]):  # each of ours against the last side, the baseline
        if "tokens_per_s" in results[name] and "tokens_per_s" in baseline:
            ratio = results[name]["tokens_per_s"] / baseline["tokens_per_s"]
            if i == 0:
                results["ratio"] = ratio
            results.setdefault("ratios", {})[name] = ratio
            print(f"ratio {ratio_label}{'' if i == 0 else f' ({name})'}: {ratio:.2f}x")
    results.update(meta, gpu=torch.cuda.get_device_name(), torch=torch.__version__, flops_per_token=flops_tok,
                   date=time.strftime("%Y-%m-%d"))
    append_json_line(json_path, results)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="7b")
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--recompute", choices=["none", "selective", "full"], default="none")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-hf", action="store_true", help="skip the Hugging Face + PEFT baseline")
    ap.add_argument("--compile", action="store_true", help="trainperf with train.compile=true (HF stays eager)")
    ap.add_argument("--fp8", default="none", help="trainperf's hardware.fp8 (tensorwise, rowwise); HF stays bf16")
    ap.add_argument("--attention", default="sdpa",
                    help="trainperf's hardware.attention: sdpa, flash4 (FlashAttention-4's CuTe-DSL kernels), or "
                         "sdpa,flash4 for both, one after the other in this process; HF stays SDPA")
    ap.add_argument("--lora-kernel", default="torch",
                    help="trainperf's hardware.lora_kernel: torch, fused (dropout inside A's GEMM, one Triton kernel "
                         "per shared input), or torch,fused for both in this process")
    ap.add_argument("--dropout", type=float, default=LORA.dropout,
                    help="LoRA dropout of both sides (default 0.1; 0 bounds what dropout costs)")
    ap.add_argument("--json", help="append the result as one JSON line to this file")
    args = ap.parse_args()
    lora = dataclasses.replace(LORA, dropout=args.dropout)  # both sides
    if not has_cuda("lora_throughput.py"):
        return 2
    model_spec = ModelSpec(vocab_size=32000, max_position_embeddings=max(args.seq, 4096), **SHAPES[args.shape])
    flops_tok = metrics.train_flops_per_token(model_spec, lora, args.seq)
    common = dict(model_spec=model_spec, lora=lora, seq=args.seq, recompute=args.recompute, steps=args.steps,
                  warmup=args.warmup, compile_layers=args.compile, fp8=args.fp8)
    pairs = [(attention, lora_kernel) for attention in args.attention.split(",")
             for lora_kernel in args.lora_kernel.split(",")]
    sides = []
    for attention, lora_kernel in pairs:
        name = "trainperf" if not sides else f"trainperf_{attention}_{lora_kernel}"
        while name in (side[0] for side in sides):  # a pair named twice (a repeat of the first, say)
            name += "_again"
        sides.append((name, bench_trainperf, dict(common, attention=attention, lora_kernel=lora_kernel)))
    sides += [] if args.no_hf else [("hf_peft", bench_hf_peft, common)]
    side_by_side(sides, shape=args.shape, seq=args.seq, flops_tok=flops_tok,
                 ratio_label="trainperf / HF+PEFT", json_path=args.json,
                 meta=dict(bench="lora", shape=args.shape, seq=args.seq, recompute=args.recompute, args=vars(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
