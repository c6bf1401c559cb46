"""LoRA training throughput, side by side: trainperf's engine vs Hugging Face transformers + PEFT.

Same GPU, same process, same shapes, random weights and tokens, LoRA r16 alpha 32 dropout 0.1 on
q/k/v/o, micro-batch 1, AdamW on the adapters, gradient clipping. Prints tokens/s, model TFLOP/s,
MFU (LoRA-aware FLOPs, trainperf.core.flops) and peak memory for every side, and the ratios.
``--attention sdpa,flash4`` runs our side once per attention kernel, each against the same HF figure;
``--lora-kernel torch,fused`` once per LoRA input-side kernel (with both: every pair, attention outer).
``--hf-sides`` picks the Hugging Face-based peers (HF_SIDES): plain, torch.compile'd per decoder layer,
compiled with torchao's float8 GEMMs for the decoder's base Linears, and with Liger kernels (fused
linear cross-entropy, RMSNorm, SwiGLU, RoPE), eager and compiled; the ``*_cudnn`` sides run SDPA with
cuDNN's attention first, as trainperf does (torch's default order picks its flash kernel). Every side
names the attention kernels one profiled step ran. Our first side is put against each of them and
against the fastest.

    python bench/lora_throughput.py --shape 7b --seq 8192 --recompute none --steps 10 [--no-hf] [--json FILE]
    python bench/lora_throughput.py --compile --hf-sides hf_peft,hf_peft_compiled,hf_peft_liger,hf_peft_liger_compiled
    python bench/lora_throughput.py --compile --fp8 tensorwise --hf-sides hf_peft,hf_peft_compiled,hf_peft_fp8_compiled
    python bench/lora_throughput.py --check-liger   # Liger's kernels against plain HF on a tiny model, seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
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
# the Hugging Face-based peers: name -> (Liger kernels, torch.compile per decoder layer, torchao float8
# base GEMMs, SDPA with cuDNN's attention first as trainperf asks for it; else torch's default order,
# which picks its flash kernel). Liger patches transformers' Llama module globally (RoPE), so its sides
# run after the plain ones (hf_sides orders them).
HF_SIDES = {"hf_peft": (False, False, False, False), "hf_peft_compiled": (False, True, False, False),
            "hf_peft_compiled_cudnn": (False, True, False, True),
            "hf_peft_fp8_compiled": (False, True, True, False),
            "hf_peft_fp8_compiled_cudnn": (False, True, True, True),
            "hf_peft_liger": (True, False, False, False), "hf_peft_liger_compiled": (True, True, False, False),
            "hf_peft_liger_compiled_cudnn": (True, True, False, True)}
ATTENTION_KERNEL = ("attention", "fmha", "flash", "cudnn", "sdpa")  # substrings of attention kernels' names


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


def logits_loss(forward):
    """The mean next-token loss of a forward that returns logits (the loss is ours, the same for all)."""
    return lambda ids, mask: train_loss_sum(forward(ids), ids, mask) / (ids.shape[1] - 1)


def measure(loss_of, trainable: list, clip, vocab: int, seq: int, steps: int, warmup: int) -> dict:
    """Median step time and peak memory of forward/backward/clip/AdamW on one random sequence;
    ``loss_of(ids, mask)`` runs the forward and returns the mean loss."""
    opt = torch.optim.AdamW(trainable, lr=1e-4, foreach=True)
    ids = torch.randint(0, vocab, (1, seq), device="cuda")
    mask = torch.ones_like(ids, dtype=torch.bool)

    def step():
        loss = loss_of(ids, mask)
        loss.backward()
        clip(trainable, 0.3)
        opt.step()
        opt.zero_grad(set_to_none=True)

    figures = step_figures(step, steps, warmup)
    return dict(figures, attention_kernels=attention_kernels_of(step))


def attention_kernels_of(step_fn) -> list[str]:
    """The GPU kernels of one more step whose names say attention: which SDPA backend a side really ran."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step_fn()
        torch.cuda.synchronize()
    names = {e.key for e in prof.key_averages() if any(k in e.key.lower() for k in ATTENTION_KERNEL)}
    return sorted(name[:120] for name in names)


def bench_trainperf(model_spec: ModelSpec, lora: LoRASpec, seq: int, recompute: str, steps: int, warmup: int,
                    compile_layers=False, fp8: str = "none", attention: str = "sdpa", lora_kernel: str = "torch",
                    frozen_dtype: str = "auto") -> dict:
    from trainperf.parallel.parallelize import build_mesh
    from trainperf.train.engine import Engine
    from trainperf.train.loop import clip_gradients, resolve_param_dtype
    from trainperf.parallel.distributed import init_distributed

    spec = RunSpec(workload="bench", model=model_spec, lora=lora,
                   train=TrainSpec(micro_batch_size=1, global_batch_size=1, recompute=recompute, seed=0,
                                   compile=compile_layers))
    spec.parallel.dp_shard = 1
    spec.hardware.fp8 = fp8
    spec.hardware.frozen_dtype = frozen_dtype
    spec.hardware.attention = attention
    spec.hardware.lora_kernel = lora_kernel
    init_distributed("cuda")
    mesh = build_mesh(spec.parallel, "cuda")
    model = Engine(spec, mesh, torch.device("cuda"), resolve_param_dtype(spec, "cuda")).parts[0][1]
    trainable = [p for p in model.parameters() if p.requires_grad]
    return measure(logits_loss(model), trainable, clip_gradients, model_spec.vocab_size, seq, steps, warmup)


def hf_llama(model_spec: ModelSpec, seq: int, device: str = "cuda", attention: str = "sdpa"):
    """Hugging Face's LlamaForCausalLM of this shape, random weights, bf16, no KV cache (with HF's
    default use_cache a training forward fills a DynamicCache, and a compiled decoder layer recompiles
    per layer on the cache slot's guard until dynamo's recompile limit leaves the rest eager).
    ``attention``: "sdpa" (torch's default backend order), or "sdpa_cudnn" (register_sdpa_cudnn)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=model_spec.vocab_size, hidden_size=model_spec.hidden_size,
                      intermediate_size=model_spec.intermediate_size, num_hidden_layers=model_spec.num_layers,
                      num_attention_heads=model_spec.num_heads, num_key_value_heads=model_spec.num_kv_heads,
                      max_position_embeddings=max(seq, 4096), tie_word_embeddings=False, use_cache=False)
    if attention == "sdpa_cudnn":
        register_sdpa_cudnn()
    cfg._attn_implementation = attention
    with torch.device(device):
        return LlamaForCausalLM(cfg).to(torch.bfloat16)


def register_sdpa_cudnn() -> None:
    """transformers' own SDPA attention under SDPA's backends in trainperf's order (cuDNN's attention
    first), registered as the attention implementation "sdpa_cudnn" with SDPA's mask. The backend order
    is set inside each attention call, so a compiled decoder layer traces it (set around a compiled
    layer from outside, it is not seen and torch's default order picks its flash kernel)."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    from trainperf.model.llama import attention_backends

    def sdpa_cudnn_attention_forward(*args, **kwargs):
        with attention_backends("cuda"):
            return sdpa_attention_forward(*args, **kwargs)

    AttentionInterface.register("sdpa_cudnn", sdpa_cudnn_attention_forward)
    AttentionMaskInterface.register("sdpa_cudnn", ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


def apply_liger(model) -> None:
    """Liger's Triton kernels on a built HF Llama: RoPE, RMSNorm, SwiGLU MLP, and the fused linear
    cross-entropy (the LM head's logits are never materialised when the forward gets labels)."""
    from liger_kernel.transformers import apply_liger_kernel_to_llama  # optional: only the Liger sides need it

    apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=True, fused_linear_cross_entropy=True,
                                cross_entropy=False, model=model)


def float8_base_linears(model) -> int:
    """torchao's float8 training (tensorwise, as trainperf's hardware.fp8=tensorwise) on every Linear of
    the decoder layers but PEFT's adapters: the frozen base projections under LoRA and the MLP. torchao's
    Float8Linear computes the frozen weights' gradients too (it has no frozen-weight path). Returns how
    many Linears it swapped."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    def is_base(module, fqn: str) -> bool:
        return ".layers." in f".{fqn}" and "lora_" not in fqn and isinstance(module, torch.nn.Linear)

    before = sum(1 for n, m in model.named_modules() if is_base(m, n))
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("tensorwise"), module_filter_fn=is_base)
    return before


def compile_decoder_layers(model) -> int:
    """torch.compile each decoder layer (as train.compile=true does ours); returns how many."""
    layers = [m for m in model.modules() if type(m).__name__ == "LlamaDecoderLayer"]
    for layer in layers:
        layer.compile()
    return len(layers)


def bench_hf_peft(model_spec: ModelSpec, lora: LoRASpec, seq: int, recompute: str, steps: int, warmup: int,
                  liger: bool = False, hf_compile: bool = False, hf_fp8: bool = False, cudnn: bool = False,
                  **_) -> dict:
    """HF transformers + PEFT as users run it; with ``liger`` Liger's kernels (the loss through
    HF's labels path, the fused linear cross-entropy), with ``hf_fp8`` torchao's float8 GEMMs for the
    decoder's base Linears, with ``hf_compile`` each decoder layer compiled, with ``cudnn`` SDPA's
    backends in trainperf's order (cuDNN's attention first)."""

    from peft import LoraConfig, get_peft_model

    model = hf_llama(model_spec, seq, attention="sdpa_cudnn" if cudnn else "sdpa")
    if liger:
        apply_liger(model)
    if recompute == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                             target_modules=lora.target_modules, task_type="CAUSAL_LM"))
    if hf_fp8:
        float8_base_linears(model)
    if hf_compile:
        compile_decoder_layers(model)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    if liger:
        def loss_of(ids, mask):
            return model(input_ids=ids, labels=ids).loss
    else:
        loss_of = logits_loss(lambda ids: model(input_ids=ids).logits)
    return measure(loss_of, trainable, torch.nn.utils.clip_grad_norm_, model_spec.vocab_size, seq, steps, warmup)


def hf_sides(names: str, common: dict) -> list:
    """The (name, fn, kwargs) of the HF-based peers named (comma-separated), Liger's last."""
    picked = [n for n in names.split(",") if n]
    unknown = [n for n in picked if n not in HF_SIDES]
    if unknown:
        raise ValueError(f"--hf-sides {','.join(unknown)}: unknown; valid: {','.join(HF_SIDES)}")
    picked.sort(key=lambda n: HF_SIDES[n][0])  # stable: plain sides first, then Liger's
    return [(n, bench_hf_peft, dict(common, **dict(zip(("liger", "hf_compile", "hf_fp8", "cudnn"), HF_SIDES[n]))))
            for n in picked]


def reporting_errors(fn):
    """A peer side that fails for a reason other than memory (a compiler that cannot trace a
    third-party kernel, say) reports the error's first line instead of stopping the other sides."""
    def side(**kwargs):
        try:
            return run_side(fn, **kwargs)
        except Exception as exc:  # noqa: BLE001 -- any failure of a peer is its result
            return {"error": f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"}
    return side


def check_liger(device: str = "cuda") -> dict:
    """Liger's kernels run here: a tiny HF Llama's loss and gradients with and without them, same
    weights and tokens. Returns the versions, both losses and the largest relative gradient difference."""
    import copy

    import liger_kernel  # optional: the check is about whether it imports
    import transformers
    import triton

    torch.manual_seed(0)
    spec = ModelSpec(vocab_size=1024, hidden_size=256, intermediate_size=688, num_layers=2, num_heads=4,
                     num_kv_heads=4, max_position_embeddings=512)
    plain = hf_llama(spec, 256, device).float()
    fused = copy.deepcopy(plain)
    ids = torch.randint(0, spec.vocab_size, (2, 256), device=device)
    out = {"liger_kernel": getattr(liger_kernel, "__version__", "?"), "triton": triton.__version__,
           "transformers": transformers.__version__, "torch": torch.__version__}
    for name, model in (("plain", plain), ("liger", fused)):
        if model is fused:  # after the plain side: Liger's RoPE patch reaches every HF Llama
            apply_liger(fused)
        model.train()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        out[f"{name}_loss"] = loss.item()
    grads = [(a.grad, b.grad) for a, b in zip(plain.parameters(), fused.parameters()) if a.grad is not None]
    out["max_rel_grad_diff"] = max(((a - b).abs().max() / a.abs().max().clamp_min(1e-12)).item() for a, b in grads)
    out["ok"] = abs(out["liger_loss"] / out["plain_loss"] - 1) < 1e-3 and out["max_rel_grad_diff"] < 1e-2
    return out


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
                 meta: dict, peers: int = 1) -> dict:
    """Run each (name, fn, kwargs) side in turn in this process, print its tokens/s, model TFLOP/s,
    MFU and peak memory (or that it does not fit, or its error), the ratios, and append everything as
    one JSON line to ``json_path``. The last ``peers`` sides are the baselines: each of ours is put
    against the first of them ("ratio", "ratios"), and our first side against each peer
    ("ratios_by_peer") and the fastest ("ratio_to_fastest_peer")."""
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
        if "error" in r:
            print(f"{label} did not run ({r['error']})", flush=True)
            continue
        tps = seq / r["step_s"]
        r.update(tokens_per_s=tps, model_tflops=flops_tok * tps / 1e12, mfu=metrics.mfu(flops_tok, tps, peak))
        print(f"{label} {tps:,.0f} tokens/s, {r['model_tflops']:.0f} model TFLOP/s, "
              f"MFU {100 * (r['mfu'] or 0):.1f}%, peak {r['peak_gib']:.1f} GiB", flush=True)
        if r.get("attention_kernels"):
            print(f"  attention kernels: {'; '.join(r['attention_kernels'])}", flush=True)
    names = [name for name, _, _ in sides]
    peers = min(peers, len(names) - 1) if len(names) >= 2 else 0
    ours, peer_names = names[:len(names) - peers], names[len(names) - peers:]
    put_against_peers(results, ours, peer_names, ratio_label)
    results.update(meta, gpu=torch.cuda.get_device_name(), torch=torch.__version__, flops_per_token=flops_tok,
                   date=time.strftime("%Y-%m-%d"))
    append_json_line(json_path, results)
    return results


def put_against_peers(results: dict, ours: list, peers: list, ratio_label: str) -> None:
    """Add (and print) the tokens/s ratios of our sides to the peers' that ran; see side_by_side."""
    ran = {n: results[n]["tokens_per_s"] for n in ours + peers if "tokens_per_s" in results[n]}
    if peers and peers[0] in ran:
        for i, name in enumerate(n for n in ours if n in ran):
            ratio = ran[name] / ran[peers[0]]
            if i == 0 and name == ours[0]:
                results["ratio"] = ratio
            results.setdefault("ratios", {})[name] = ratio
            print(f"ratio {ratio_label}{'' if name == ours[0] else f' ({name})'}: {ratio:.2f}x")
    ran_peers = [n for n in peers if n in ran]
    if len(peers) < 2 or not ours or ours[0] not in ran or not ran_peers:
        return
    results["ratios_by_peer"] = {n: ran[ours[0]] / ran[n] for n in ran_peers}
    fastest = max(ran_peers, key=ran.get)
    results["fastest_peer"], results["ratio_to_fastest_peer"] = fastest, ran[ours[0]] / ran[fastest]
    for n in ran_peers:
        print(f"ratio {ours[0]} / {n}: {results['ratios_by_peer'][n]:.2f}x")
    print(f"ratio {ours[0]} / fastest peer ({fastest}): {results['ratio_to_fastest_peer']:.2f}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="7b")
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--recompute", choices=["none", "selective", "full"], default="none")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-hf", action="store_true", help="skip the Hugging Face-based baselines")
    ap.add_argument("--hf-sides", default="hf_peft",
                    help=f"the Hugging Face-based baselines, comma-separated, of {','.join(HF_SIDES)} (default "
                         "hf_peft); the Liger sides need liger-kernel")
    ap.add_argument("--check-liger", action="store_true",
                    help="only check that Liger's kernels import and match plain HF on a tiny model, then exit")
    ap.add_argument("--compile", action="store_true", help="trainperf with train.compile=true (HF is compiled only in the *_compiled sides)")
    ap.add_argument("--fp8", default="none",
                    help="trainperf's hardware.fp8 (tensorwise, rowwise); HF stays bf16 but in hf_peft_fp8_compiled")
    ap.add_argument("--frozen-dtype", default="auto",
                    help="trainperf's hardware.frozen_dtype: auto, or fp8 (with --fp8: the frozen base stored in "
                         "float8 once, where the dynamic recipe casts it every step to the same values)")
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
    unknown = sorted(set(args.hf_sides.split(",")) - set(HF_SIDES) - {""})
    if unknown:
        ap.error(f"--hf-sides {','.join(unknown)}: unknown; valid: {','.join(HF_SIDES)}")
    if not has_cuda("lora_throughput.py"):
        return 2
    if args.check_liger:
        result = check_liger()
        print(json.dumps(result), flush=True)
        append_json_line(args.json, dict(result, bench="check_liger", date=time.strftime("%Y-%m-%d")))
        return 0 if result["ok"] else 1
    model_spec = ModelSpec(vocab_size=32000, max_position_embeddings=max(args.seq, 4096), **SHAPES[args.shape])
    flops_tok = metrics.train_flops_per_token(model_spec, lora, args.seq)
    common = dict(model_spec=model_spec, lora=lora, seq=args.seq, recompute=args.recompute, steps=args.steps,
                  warmup=args.warmup, compile_layers=args.compile, fp8=args.fp8, frozen_dtype=args.frozen_dtype)
    pairs = [(attention, lora_kernel) for attention in args.attention.split(",")
             for lora_kernel in args.lora_kernel.split(",")]
    sides = []
    for attention, lora_kernel in pairs:
        name = "trainperf" if not sides else f"trainperf_{attention}_{lora_kernel}"
        while name in (side[0] for side in sides):  # a pair named twice (a repeat of the first, say)
            name += "_again"
        sides.append((name, bench_trainperf, dict(common, attention=attention, lora_kernel=lora_kernel)))
    peers = [] if args.no_hf else hf_sides(args.hf_sides, common)
    sides += [(name, reporting_errors(fn), kw) for name, fn, kw in peers]
    side_by_side(sides, shape=args.shape, seq=args.seq, flops_tok=flops_tok,
                 ratio_label="trainperf / HF+PEFT", json_path=args.json, peers=len(peers),
                 meta=dict(bench="lora", shape=args.shape, seq=args.seq, recompute=args.recompute, args=vars(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
