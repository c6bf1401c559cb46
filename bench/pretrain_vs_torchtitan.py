"""Pretraining side by side: trainperf's engine against torchtitan, same Llama-3 shape, same init and data.

Both sides train every parameter of the Llama-3.1-8B layer shapes (hidden 4096, 32 heads, 8 KV heads,
FFN 14336, vocab 128256, RoPE theta 500000) with ``--layers`` decoder layers, one 8192-token sequence
per optimizer step, fp32 master weights, fp32 gradients and fp32 AdamW moments (fused AdamW, lr
constant, betas 0.9/0.95, eps 1e-5, weight decay 0.1, gradient clipping at 1.0), bf16 compute, one GPU.
Each (side, precision) runs in its own process, one after the other on the same GPU, so Inductor's
global switches (torchtitan's rowwise recipe sets ``emulate_precision_casts``), compile caches and
allocator state never cross from one to the next.

- trainperf: ``Engine.train_step`` as ``trainperf run`` drives it (FSDP2 on one rank: bf16 gathers, fp32
  gradient reduction), each decoder layer ``torch.compile``d (``train.compile=true``), cuDNN attention
  first, ``hardware.fp8`` for the float8 rows (torchao's Float8Linear on the decoder projections, LM
  head in bf16), ``train.recompute`` as given (default none: no recomputation where memory allows);
- torchtitan: its own Llama-3 model (``torchtitan.models.llama3.Transformer``), ``parallelize_llama``
  (its ``apply_ac`` and per-block ``apply_compile``, fullgraph), its float8 converter
  (``Float8LinearConverter``: tensorwise, or the ``rowwise`` recipe; ``filter_fqns=["output"]`` as its
  Llama-3 8B config keeps the LM head in bf16), its compiled cross-entropy loss, ``build_optimizers``
  (AdamW, ``implementation="fused"``), its ``clip_grad_norm_`` (foreach) and its one-GPU mixed precision
  (``maybe_enable_amp``: autocast bf16, since FSDP is off on one GPU); SDPA with cuDNN first is its
  own default. Its RoPE's Llama-3.1 frequency scaling is switched off (``scaling_factor=1``) because
  trainperf's model has none; every other setting is torchtitan's default or its 8B config's.

Same init: both start from trainperf's name-seeded initial weights (trainperf.model.llama.init_full_tensor),
handed to torchtitan through its own state-dict adapter (``Llama3StateDictAdapter.from_hf``: the q/k row
permutation between the rotate-half and the interleaved RoPE layouts). Same data: a seeded token chain over
4,096 of the vocabulary's ids (each token's successor fixed with probability 0.8, else uniform), so the
loss falls and the two loss curves say whether the two sides do the same work.

Prints per row tokens/s, MFU (trainperf.core.flops: 6 x linear parameters + causal attention per token,
against 989 TFLOP/s, fp8 rows too), peak GiB, the first ``--steps`` losses of both sides and their
largest difference, the ratio trainperf / torchtitan, and the planner's prediction for trainperf's row
(trainperf.plan.costs.estimate on the H200 preset: its kernel table).

    python bench/pretrain_vs_torchtitan.py --layers 16 --precisions bf16,tensorwise,rowwise --json out.jsonl --md out.md
    python bench/pretrain_vs_torchtitan.py --device cpu --shape tiny --steps 4   # the whole path on CPU
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

PEAK_BF16 = 989e12  # H200 dense bf16, the peak every MFU here is quoted against (fp8 rows too)
PRECISIONS = ("bf16", "tensorwise", "rowwise")
SIDES = ("trainperf", "torchtitan")
# the optimizer both sides get: llama31_8b's AdamW (mlperf/recipes.py), the rate held constant
LR, BETAS, EPS, WEIGHT_DECAY, MAX_NORM = 3e-4, (0.9, 0.95), 1e-5, 0.1, 1.0
SEED = 1
# (hidden, heads, kv heads, ffn multiple_of, ffn multiplier, vocab): torchtitan's FeedForward sizing gives
# 14336 for the 8B shape and 768 for the tiny one, the intermediate sizes trainperf's spec takes
SHAPES = {"8b": dict(hidden=4096, heads=32, kv_heads=8, multiple_of=1024, ffn_multiplier=1.3, vocab=128256,
                     intermediate=14336),
          "tiny": dict(hidden=256, heads=4, kv_heads=2, multiple_of=256, ffn_multiplier=None, vocab=1024,
                       intermediate=768)}
RESULT = "RESULT "  # the line a child prints its figures on


# -- shared by both sides ---------------------------------------------------------------------------------

def model_spec(shape: str, layers: int, seq: int):
    from trainperf.core.spec import ModelSpec

    s = SHAPES[shape]
    return ModelSpec(name=f"llama3-{shape}-{layers}l", vocab_size=s["vocab"], hidden_size=s["hidden"],
                     intermediate_size=s["intermediate"], num_layers=layers, num_heads=s["heads"],
                     num_kv_heads=s["kv_heads"], rope_theta=500000.0, rms_norm_eps=1e-5,
                     max_position_embeddings=seq, init_std=0.02)


ACTIVE_TOKENS = 4096  # the chain's tokens: a learnable share of the vocabulary, so the loss falls in 20 steps


def token_batches(vocab: int, seq: int, steps: int, seed: int = SEED) -> list[list[int]]:
    """``steps`` sequences of ``seq`` tokens from one seeded chain over ACTIVE_TOKENS of the vocabulary's
    ids: each token's successor is fixed with probability 0.8, else uniform over those ids."""
    rng = random.Random(seed)
    active = rng.sample(range(vocab), min(vocab, ACTIVE_TOKENS))
    succ = dict(zip(active, rng.sample(active, len(active))))
    out = []
    for _ in range(steps):
        t = rng.choice(active)
        row = [t]
        for _ in range(seq - 1):
            t = succ[t] if rng.random() < 0.8 else rng.choice(active)
            row.append(t)
        out.append(row)
    return out


def initial_weights(spec, device) -> dict:
    """trainperf's initial value of every parameter, by its Hugging Face name (name-seeded)."""
    from trainperf.model.llama import build_on_meta, init_full_tensor

    names = [(n, p.shape) for n, p in build_on_meta(spec).named_parameters()]
    return {n: init_full_tensor(n, shape, spec, SEED, device) for n, shape in names}


def timed_steps(step, batches, device) -> tuple[list[float], list[float]]:
    """Run one step per batch; (seconds per step, loss per step). A sync per step: the step is ~0.5 s."""
    import torch

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    times, losses = [], []
    for ids in batches:
        sync()
        t0 = time.perf_counter()
        loss = step(ids)
        sync()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
    return times, losses


# -- trainperf ---------------------------------------------------------------------------------------------

def run_trainperf(args, spec, batches, device) -> dict:
    import torch

    from trainperf.core.resolve import resolve_spec
    from trainperf.core.spec import DataSpec, LoRASpec, RunSpec, TrainSpec
    from trainperf.parallel.distributed import init_distributed
    from trainperf.parallel.parallelize import build_mesh
    from trainperf.train.engine import Engine
    from trainperf.train.loop import build_optimizer, clip_gradients, resolve_param_dtype

    base = RunSpec(workload="bench", model=spec, lora=LoRASpec(rank=0), data=DataSpec(seq_len=args.seq),
                   train=TrainSpec(micro_batch_size=1, global_batch_size=1, recompute=args.recompute, seed=SEED,
                                   compile=args.compile, lr=LR, min_lr_ratio=1.0, beta1=BETAS[0], beta2=BETAS[1],
                                   eps=EPS, weight_decay=WEIGHT_DECAY, grad_clip=MAX_NORM))
    base.parallel.dp_shard = 1
    overrides = list(args.overrides)
    if args.precision != "bf16":
        overrides.append(f"hardware.fp8={args.precision}")
    run = resolve_spec(base, None, overrides)
    init_distributed(device.type)
    engine = Engine(run, build_mesh(run.parallel, device.type), device, resolve_param_dtype(run, device.type))
    engine.train()
    opt = build_optimizer(engine.trainable, run.train)
    mask = torch.ones((1, args.seq), dtype=torch.bool)
    targets = float(args.seq - 1)

    def step(ids):
        loss = engine.train_step([(ids, mask)], targets)
        clip_gradients(engine.trainable, MAX_NORM)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    times, losses = timed_steps(step, batches, device)
    return dict(times=times, losses=losses, settings=run_settings(run), prediction=planner_prediction(run))


def run_settings(run) -> dict:
    t, h = run.train, run.hardware
    return dict(compile=t.compile, recompute=t.recompute, fp8=h.fp8, attention=h.attention, optimizer=t.optimizer,
                loss_chunk_tokens=t.loss_chunk_tokens, fsdp="FSDP2 on one rank (bf16 gathers, fp32 reduce)")


def planner_prediction(run) -> dict | None:
    """The planner's step for this spec on the H200 preset (its own-engine kernel table); None where it
    cannot price it."""
    try:
        from trainperf.core.layout import resolve_layout
        from trainperf.plan.costs import estimate
        from trainperf.plan.hardware import PRESETS

        spec = copy.deepcopy(run)
        spec.hardware.device = "cuda"  # priced for the GPU the row ran on
        resolve_layout(spec, 1)
        est = estimate(spec, PRESETS["h200"], 1)
        return dict(step_s=est.step_time_s, tokens_per_s=est.tokens_per_s_per_gpu, gib=est.allocated_gib)
    except Exception as exc:  # a bench row is still worth printing without its prediction
        return dict(error=f"{type(exc).__name__}: {exc}"[:200])


# -- torchtitan ------------------------------------------------------------------------------------------------

def import_torchtitan():
    """torchtitan's Llama-3 package imports its trainer's data loaders, which import Hugging Face
    ``datasets``; the bench feeds its own tokens, so where ``datasets`` is not installed its one
    text-dataset module is replaced by a stand-in that refuses to be used."""
    import importlib.util
    import types

    if importlib.util.find_spec("datasets") is None and "torchtitan.hf_datasets.text_datasets" not in sys.modules:
        stub = types.ModuleType("torchtitan.hf_datasets.text_datasets")

        def unavailable(*_a, **_k):
            raise RuntimeError("torchtitan's text datasets need the 'datasets' package")

        stub.build_text_dataloader = stub.build_text_validation_dataloader = unavailable
        sys.modules[stub.__name__] = stub
    import torchtitan
    from torchtitan.models import llama3

    return torchtitan, llama3


def titan_job_config(args, device):
    from torchtitan.config import JobConfig

    jc = JobConfig()
    jc.training.seq_len = args.seq
    jc.training.local_batch_size = 1
    jc.training.mixed_precision_param = "bfloat16"
    jc.training.max_norm = MAX_NORM
    jc.compile.enable = args.compile
    jc.compile.components = ["model", "loss"]
    jc.compile.backend = args.compile_backend
    jc.activation_checkpoint.mode = args.titan_ac
    jc.activation_checkpoint.selective_ac_option = "op"
    jc.optimizer.name, jc.optimizer.implementation = "AdamW", "fused"
    jc.optimizer.lr, jc.optimizer.eps, jc.optimizer.weight_decay = LR, EPS, WEIGHT_DECAY
    jc.optimizer.beta1, jc.optimizer.beta2 = BETAS
    if args.precision != "bf16":
        jc.model.converters = ["float8"]
        f8 = jc.quantize.linear.float8
        f8.recipe_name = "rowwise" if args.precision == "rowwise" else None  # None: its tensorwise path
        f8.filter_fqns = ["output"]
        f8.emulate = device.type != "cuda"
    return jc


def run_torchtitan(args, spec, batches, device) -> dict:
    import torch

    torchtitan, llama3 = import_torchtitan()
    from torchtitan.components.loss import IGNORE_INDEX, build_cross_entropy_loss
    from torchtitan.components.optimizer import build_optimizers
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.models.llama3.model.args import RoPEScalingArgs

    s = SHAPES[args.shape]
    margs = llama3.TransformerModelArgs(dim=s["hidden"], n_layers=args.layers, n_heads=s["heads"],
                                        n_kv_heads=s["kv_heads"], vocab_size=s["vocab"],
                                        multiple_of=s["multiple_of"], ffn_dim_multiplier=s["ffn_multiplier"],
                                        norm_eps=1e-5, rope_theta=500000.0, max_seq_len=args.seq,
                                        rope_scaling_args=RoPEScalingArgs(scaling_factor=1.0))
    jc = titan_job_config(args, device)
    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1)
    with torch.device("meta"):
        model = llama3.Transformer(margs)
    if args.precision != "bf16":
        from torchtitan.components.quantization.float8 import Float8LinearConverter

        Float8LinearConverter(jc, dims).convert(model)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=device)
        hf = initial_weights(spec, device)
        state = llama3.Llama3StateDictAdapter(margs, None).from_hf(hf)
        missing, unexpected = model.load_state_dict(state, strict=False)
        assert not unexpected and not [k for k in missing if "freqs_cis" not in k], (missing, unexpected)
        del hf, state
    # its AC and per-block compile; no FSDP on one GPU (parallel_dims.fsdp_enabled is False)
    llama3.parallelize_llama(model, dims, jc)
    model.train()
    loss_fn = build_cross_entropy_loss(jc)
    optimizers = build_optimizers([model], jc.optimizer, dims)
    amp = lambda: dist_utils.maybe_enable_amp(dims, jc.training.mixed_precision_param, device.type)  # noqa: E731
    params = list(model.parameters())

    def step(ids):
        ids = ids.to(device)
        labels = torch.full_like(ids, IGNORE_INDEX)
        labels[:, :-1] = ids[:, 1:]
        with amp():
            pred = model(ids)
            loss_sum = loss_fn(pred, labels)
        loss = loss_sum / (args.seq - 1)
        del pred
        loss.backward()
        dist_utils.clip_grad_norm_(params, MAX_NORM, foreach=True)
        optimizers.step()
        optimizers.zero_grad()
        return loss.detach()

    times, losses = timed_steps(step, batches, device)
    version = getattr(torchtitan, "__version__", None)
    if version is None:
        from importlib.metadata import version as dist_version

        version = dist_version("torchtitan")
    return dict(times=times, losses=losses, version=version,
                settings=dict(compile=args.compile, compile_components=jc.compile.components, ac=args.titan_ac,
                              float8=None if args.precision == "bf16" else (args.precision, ["output"]),
                              optimizer="AdamW fused", mixed_precision="autocast bf16 (maybe_enable_amp)",
                              attention="SDPA, cuDNN first (its ScaledDotProductAttentionWrapper)"))


# -- one child process: one side, one precision -------------------------------------------------------------

def child(args) -> int:
    import torch

    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(0)
    spec = model_spec(args.shape, args.layers, args.seq)
    batches = [torch.tensor([row]) for row in token_batches(spec.vocab_size, args.seq, args.steps)]
    out = dict(side=args.child, precision=args.precision, torch=torch.__version__)
    try:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        out.update((run_trainperf if args.child == "trainperf" else run_torchtitan)(args, spec, batches, device))
        if device.type == "cuda":
            out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
            out["reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    except torch.OutOfMemoryError as exc:
        out["error"] = f"out of memory: {str(exc).splitlines()[0][:160]}"
    print(RESULT + json.dumps(out), flush=True)
    return 0


# -- the parent: every row, then the table -----------------------------------------------------------------------

def run_child(args, side: str, precision: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", side, "--precision", precision,
           "--shape", args.shape, "--layers", str(args.layers), "--seq", str(args.seq), "--steps", str(args.steps),
           "--device", args.device, "--recompute", args.recompute, "--titan-ac", args.titan_ac,
           "--compile-backend", args.compile_backend] + (["--compile"] if args.compile else ["--no-compile"])
    for o in args.overrides:
        cmd += ["--set", o]
    t0 = time.perf_counter()
    try:
        # expandable segments on both sides: trainperf's 8B commands set them, torchtitan's run_train.sh too
        env = dict(os.environ)
        env.setdefault("PYTORCH_ALLOC_CONF", "expandable_segments:True")
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=args.child_timeout, env=env)
    except subprocess.TimeoutExpired:
        return dict(side=side, precision=precision, error=f"timed out after {args.child_timeout} s")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)]
    if not lines:
        return dict(side=side, precision=precision, error=f"exit {proc.returncode}, no result")
    res = json.loads(lines[-1][len(RESULT):])
    res["wall_s"] = time.perf_counter() - t0
    return res


def figures(res: dict, args, flops_tok: float) -> dict:
    if "error" in res:
        return res
    timed = res["times"][args.timed_from:] or res["times"][-1:]
    step_s = statistics.median(timed)
    tps = args.seq / step_s
    res.update(step_s=step_s, tokens_per_s=tps, mfu=flops_tok * tps / PEAK_BF16, compile_step_s=res["times"][0])
    return res


def agreement(a: list[float], b: list[float]) -> dict:
    diffs = [abs(x - y) for x, y in zip(a, b)]
    rel = [d / max(abs(y), 1e-12) for d, y in zip(diffs, b)]
    finite = all(math.isfinite(x) for x in a + b)
    return dict(max_abs=max(diffs), max_rel=max(rel), first_abs=diffs[0], fall=(b[0] - b[-1]),
                agree=finite and max(rel) <= 0.01)


def markdown(rows: list[dict], args, pairs: dict) -> str:
    head = (f"| shape | precision | side | tokens/s | MFU | peak GiB | step s (compile step) | trainperf / torchtitan "
            f"| losses: max abs diff (rel) | planner step s (tokens/s) |\n|---|---|---|---:|---:|---:|---:|---:|---|---:|")
    out = [head]
    shape = f"{args.shape} {args.layers} layers, seq {args.seq}"
    for r in rows:
        if "error" in r:
            out.append(f"| {shape} | {r['precision']} | {r['side']} | {r['error']} | | | | | | |")
            continue
        pair = pairs.get(r["precision"], {})
        ratio = f"{pair['ratio']:.3f}x" if r["side"] == "trainperf" and "ratio" in pair else ""
        agree = (f"{pair['agreement']['max_abs']:.4f} ({pair['agreement']['max_rel']:.2%})"
                 if r["side"] == "trainperf" and "agreement" in pair else "")
        pred = r.get("prediction") or {}
        pred_s = f"{pred['step_s']:.3f} ({pred['tokens_per_s']:,.0f})" if "step_s" in pred else ""
        out.append(f"| {shape} | {r['precision']} | {r['side']} | {r['tokens_per_s']:,.0f} | {r['mfu']:.1%} | "
                   f"{r.get('peak_gib', float('nan')):.1f} | {r['step_s']:.3f} ({r['compile_step_s']:.1f}) | {ratio} | "
                   f"{agree} | {pred_s} |")
    out.append("")
    for p, pair in pairs.items():
        if "losses" in pair:
            tp, tt = pair["losses"]
            out.append(f"- {p} losses, trainperf:  " + " ".join(f"{x:.4f}" for x in tp))
            out.append(f"- {p} losses, torchtitan: " + " ".join(f"{x:.4f}" for x in tt))
    return "\n".join(out) + "\n"


def parent(args) -> int:
    from trainperf.core import flops
    from trainperf.core.spec import LoRASpec

    spec = model_spec(args.shape, args.layers, args.seq)
    flops_tok = flops.train_flops_per_token(spec, LoRASpec(rank=0), args.seq)
    precisions = [p for p in args.precisions.split(",") if p]
    sides = [s for s in args.sides.split(",") if s]
    for p in precisions:
        if p not in PRECISIONS:
            print(f"--precisions: {p!r} is not one of {', '.join(PRECISIONS)}", file=sys.stderr)
            return 2
    for s in sides:
        if s not in SIDES:
            print(f"--sides: {s!r} is not one of {', '.join(SIDES)}", file=sys.stderr)
            return 2
    rows, pairs = [], {}
    for p in precisions:
        got = {}
        for side in sides:
            res = figures(run_child(args, side, p), args, flops_tok)
            res.update(shape=args.shape, layers=args.layers, seq=args.seq, flops_per_token=flops_tok)
            got[side] = res
            rows.append(res)
            brief = res.get("error") or f"{res['tokens_per_s']:,.0f} tokens/s, {res['mfu']:.1%}, {res.get('peak_gib', 0):.1f} GiB"
            print(f"[{p}] {side}: {brief}", flush=True)
            if args.json:
                with open(args.json, "a") as fh:
                    fh.write(json.dumps(dict(bench="pretrain_vs_torchtitan", **res)) + "\n")
        a, b = got.get("trainperf", {}), got.get("torchtitan", {})
        pair = {}
        if "tokens_per_s" in a and "tokens_per_s" in b:
            pair["ratio"] = a["tokens_per_s"] / b["tokens_per_s"]
        if "losses" in a and "losses" in b:
            pair["agreement"] = agreement(a["losses"], b["losses"])
            pair["losses"] = (a["losses"], b["losses"])
        pairs[p] = pair
    table = markdown(rows, args, pairs)
    print(table)
    if args.md:
        Path(args.md).write_text(table)
    if args.json:
        with open(args.json, "a") as fh:
            fh.write(json.dumps(dict(bench="pretrain_vs_torchtitan_summary", args=vars(args),
                                     pairs={p: {k: v for k, v in q.items() if k != "losses"} for p, q in pairs.items()})) + "\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    ap.add_argument("--layers", type=int, default=16, help="decoder layers of the 8B shape (32: the full 8B)")
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=20, help="steps per row; every loss is recorded")
    ap.add_argument("--timed-from", type=int, default=5, help="steps timed: from this one on (median)")
    ap.add_argument("--precisions", default="bf16,tensorwise,rowwise")
    ap.add_argument("--sides", default="trainperf,torchtitan")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--compile-backend", default="inductor")
    ap.add_argument("--recompute", default="none", choices=["none", "selective", "full"], help="trainperf's train.recompute")
    ap.add_argument("--titan-ac", default="none", choices=["none", "selective", "full"],
                    help="torchtitan's activation_checkpoint.mode (selective: its op-level policy)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="a trainperf spec override for its side")
    ap.add_argument("--child-timeout", type=int, default=400)
    ap.add_argument("--json", help="append one JSON line per row (and a summary line) to this file")
    ap.add_argument("--md", help="write the markdown table to this file")
    ap.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    ap.add_argument("--precision", choices=PRECISIONS, default="bf16", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.device == "cuda":
        from common import has_cuda

        if not has_cuda("pretrain_vs_torchtitan.py"):
            return 2
    return child(args) if args.child else parent(args)


if __name__ == "__main__":
    sys.exit(main())
