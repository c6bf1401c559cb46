"""The planner's cost model: memory, communication and time per GPU for one layout, top-down.

Every term names its source. Notation: L layers, h hidden, h_kv = kv_heads·head_dim, F intermediate,
V vocab, S sequence, b micro-batch, t tp, c cp, p pp, v stages per pipeline rank, d = dp_shard·cp
(the FSDP group), R = dp_replicate, m = micro-batches per step per data-parallel rank.

The memory terms follow this engine (trainperf's FSDP2 keeps fp32 masters of the trainable
parameters -- and of a LoRA run's frozen base only with hardware.frozen_dtype=fp32; by default that
base is stored in bf16 -- and gathers bf16 copies to compute) and were checked against
torch.cuda.max_memory_allocated on 2 x H200: 1 GPU, DDP, FSDP2, TP2+SP, CP2, PP2,
full recompute, all within 5% (docs/PLANNER.md).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from trainperf.core import flops as metrics
from trainperf.core.errors import SpecError
from trainperf.core.families import family
from trainperf.core.layout import (
    OFFLOAD_PREFETCH_DEPTH,
    layer_memory_modes,
    layers_per_stage,
    stages_per_rank,
)
from trainperf.core.spec import RunSpec
from trainperf.model.lora_layout import mask_record_bytes
from trainperf.plan.hardware import GPU
from trainperf.plan.kernels import load_fp8_grid, load_table

GIB = 2**30
PINNED_HOST_SHARE = 0.5  # of a node's memory that offloaded activations may pin (train.offload_layers)
# PyTorch's pinned allocator rounds each block up to a power of two: 1.0-2.0x per storage; most of a
# Llama layer's saved storages are powers of two already (x, q, attention's output, masks), the MLP's
# are not (7B: 172 -> 256 MiB). Assumed, until the run summary's pinned_host_gib says otherwise.
PINNED_ROUNDING = 1.25
FIXED_CONTEXT_GIB = 2.0  # CUDA context + NCCL communicator buffers (Megatron estimator's "overhead")
FRAGMENTATION = 0.05  # caching-allocator slack on top of what is allocated
# train.optimizer's moments per trained parameter (fp32 masters and gradients are counted apart):
# AdamW two fp32 moments; torchao's AdamW8bit two 8-bit codes plus an fp32 scale per 256 of each
OPTIMIZER_STATE_BYTES = {"adamw": 8.0, "adamw8bit": 2.0 + 2 * 4.0 / 256}
# one step's GPU time per parameter, as bytes at HBM rate: fused AdamW is memory-bound, reading param,
# grad and both moments and writing param and moments (28 B). AdamW8bit moves 16 B but re-quantises both
# moments by a binary search over a 256-entry code book: its kernels took 0.145 s for Llama-3-8B's
# 8.03e9 parameters on one H200 (a trace, 2026-12-01, bench/data/h200_2026-12-01_trace_8b_pretrain.json), 87 B at HBM rate
OPTIMIZER_STEP_BYTES = {"adamw": 28.0, "adamw8bit": 87.0}
# ... and a fixed cost per parameter tensor: torchao issues one compiled call per tensor (0.42-0.52 ms of
# host time each, overlapping queued work) and its step returns only once the GPU's queue drains
# (bench/optimizer_sync.py, 2026-12-01). Fitted, the cause of the rest not
# established: the same runs' 0.42-0.47 s per step that does not grow with the batch (GBS 8 against 32),
# less the 0.145 s of kernels, over 291 tensors. Fused AdamW is one multi-tensor launch, taken as free.
OPTIMIZER_SECONDS_PER_TENSOR = {"adamw": 0.0, "adamw8bit": 1.0e-3}


@dataclass
class Estimate:
    memory: dict[str, float] = field(default_factory=dict)  # bytes per GPU by component (allocated)
    comm: dict[str, float] = field(default_factory=dict)  # bytes per GPU per step by dimension
    time: dict[str, float] = field(default_factory=dict)  # seconds per step by term
    step_time_s: float = 0.0
    eval_seconds_per_row: float = 0.0  # forward only, per validation sequence, on one data-parallel rank
    run_setup_s: float = 0.0  # per run beside its steps and evals (the GPU's run_setup_s)
    tokens_per_s_per_gpu: float = 0.0
    mfu: float = 0.0
    fits: bool = True
    host_offload_bytes: float = 0.0  # pinned host memory per GPU for train.offload_layers' activations

    @property
    def allocated_gib(self) -> float:
        return sum(self.memory.values()) / GIB

    @property
    def reserved_gib(self) -> float:
        """What the process needs from the device: allocated + fragmentation + fixed context."""
        return self.allocated_gib * (1 + FRAGMENTATION) + FIXED_CONTEXT_GIB


def layer_params(spec: RunSpec) -> float:
    """One decoder layer: its seven projections and two RMSNorm weights."""
    m = spec.model
    lin = metrics.linear_params(m)
    return (sum(lin.values()) - lin["lm_head"]) / m.num_layers + 2 * m.hidden_size


def fp8_cast_elements(spec: RunSpec, tokens: float, t: int) -> float:
    """Elements cast to float8 per layer per micro-batch (one TP shard) under hardware.fp8: every
    projection's input and weight for the forward, its output gradient and weight again for the input
    gradient (torchao's dynamic scaling casts each operand per GEMM), and for full training the input
    and output gradient once more for the weight-gradient GEMM."""
    per_gemm = [tokens * i + tokens * o + 2 * i * o + (0 if spec.lora.enabled else tokens * (i + o))
                for i, o, _ in _layer_projections(spec.model)]
    return sum(per_gemm) / t


# projections that split their output under tensor parallelism; o_proj and down_proj split their input
COLUMN_PARALLEL = frozenset({"q_proj", "k_proj", "v_proj", "qkv_proj", "gate_proj", "up_proj"})


def _projections(m) -> dict[str, tuple[int, int, bool]]:
    """LoRA target name -> (input width, output width, column-parallel?) of that projection."""
    return {name: (i, o, name in COLUMN_PARALLEL) for name, (i, o) in metrics.projection_shapes(m).items()}


def layer_gemms(spec: RunSpec, tokens: float) -> list[tuple[float, float, float]]:
    """(M, K, N) of one decoder layer's base-projection GEMMs per micro-batch on one TP rank: the
    forward [tokens, in] @ [in, out], the input gradient [tokens, out] @ [out, in], and for a trained
    base the weight gradient [in, tokens] @ [tokens, out]. Column-parallel projections split their
    output under TP, row-parallel ones their input; SP gathers the tokens before either."""
    m, t = spec.model, spec.parallel.tp
    names = ["qkv_proj"] if m.fused_qkv else ["q_proj", "k_proj", "v_proj"]
    proj = _projections(m)
    out = []
    for name in [n for n in names + ["o_proj", "gate_proj", "up_proj", "down_proj"] if n in proj]:  # GPT: no gate
        i, o, column = proj[name]
        i, o = (i, o / t) if column else (i / t, o)
        out += [(tokens, i, o), (tokens, o, i)] + ([] if spec.lora.enabled else [(i, tokens, o)])
    return out


def head_gemms(spec: RunSpec, tokens: float) -> list[tuple[float, float, float]]:
    """The LM head's GEMMs (vocabulary split under TP); it trains only without LoRA."""
    h, v = spec.model.hidden_size, spec.model.vocab_size / spec.parallel.tp
    return [(tokens, h, v), (tokens, v, h)] + ([] if spec.lora.enabled else [(h, tokens, v)])


def _layer_projections(m) -> list[tuple[int, int, bool]]:
    """A decoder layer's seven projections (q, k, v unfused: a fused qkv does the same GEMM work)."""
    return [dims for name, dims in _projections(m).items() if name != "qkv_proj"]


def activation_bytes_per_token_layer(spec: RunSpec, recompute: str | None = None, mask_bytes: float = 1.0,
                                     compiled: bool | None = None) -> float:
    """Bytes one decoder layer keeps for backward, per token (bf16 activations, flash/cuDNN attention:
    no S^2 term), tensor by tensor as this engine's layer saves them -- checked against the CPU
    profiler's allocations in tests/unit/test_plan.py (the Korthikanti et al. 2022 count, planner_anchors
    2.4, misses the fp32 copies our RMSNorm keeps and what a frozen base does not save).

    none: each RMSNorm keeps its fp32 input (4h; + its bf16 normalised input, 2h, when the norm weight
    trains); attention keeps q, k, v after RoPE, its output (o_proj reads it as a view) and the
    log-sum-exp (fp32 per head); the MLP keeps gate, SiLU(gate) and up (+ the down input when its
    weight trains); a projection whose weight trains keeps its input (q/k/v share one, gate/up one).
    LoRA: A's input (shared as above, or with dropout a mask -- ``mask_bytes``: 1 on GPU, 2 on CPU --
    plus the dropped copy per adapter) and A's output (r).
    selective (our policy: keep the projections' and attention's outputs, recompute the pointwise ops
    and the adapters' thin GEMMs): the layer input plus every base projection's output and attention's.
    full: the layer input.
    Tensor parallel: heads and F are split; column-parallel inputs are kept gathered (DTensor saves
    the replicated input), row-parallel outputs whole before their reduction; norms and the layer
    input are split only with sequence parallel.

    ``compiled`` (default: train.compile): AOT autograd's partitioner keeps only what backward needs
    and recomputes cheap pointwise ops. Measured on 2 x H200 (7B LoRA none 60.1 -> 50.8 GiB, selective
    40.9 -> 38.9; 8B pretraining selective 114.8 -> 112.8) and on CPU with the same partitioner
    (tests/unit/test_plan.py): each RMSNorm keeps only its bf16 input (2h, not the fp32 copy and the
    normalised output), SiLU(gate) is recomputed from gate (2f), a dropout mask is a 1-byte bool;
    under selective, down_proj's output (2h), which only the residual add reads, is not kept."""
    m, p, lo = spec.model, spec.parallel, spec.lora
    h, f, heads = m.hidden_size, m.intermediate_size, m.num_heads
    q_out, kv_out = heads * m.head_dim, m.num_kv_heads * m.head_dim
    t, sp = p.tp, p.sp and p.tp > 1
    seq_split = t if sp else 1  # what lives on the sequence-split residual stream
    mode = recompute or spec.train.recompute
    compiled = spec.train.compile if compiled is None else compiled
    if mode == "full":
        return 2.0 * h / seq_split
    if mode == "selective":
        mlp_outs = family(m.family).mlp_up_projections  # GPT: linear_fc1 alone; Llama: gate and up
        base_out = 2.0 * (q_out + 2 * kv_out + mlp_outs * f) / t + 2.0 * 2 * h  # q,k,v,gate,up split; o, down whole
        attn_out = (2.0 * q_out + 4.0 * heads) / t  # its inputs (RoPE'd q, k) are recomputed from q/k/v
        # context parallel: ring attention issues one attention kernel per ring step and the policy
        # saves each one's output, not only the merged result -- c of them (an upper bound: with load
        # balancing the later steps cover half the queries, so between (c+1)/2 and c). Inferred from
        # one run (the 70B recipe with CP2 and 69 selective layers ran out of memory >= 6 GiB above the
        # prediction without this term, 4.4 GiB with it); CP has no CPU kernels in torch 2.13 to check.
        attn_out *= p.cp
        kept = 2.0 * h / seq_split + base_out + attn_out  # adapters' GEMMs are recomputed (parallelize.py)
        return kept - (2.0 * h if compiled else 0.0)
    trains_base = not lo.enabled
    proj = _projections(m)
    targets = [name for name in lo.target_modules if name in proj] if lo.enabled else []
    norms = 2 * (2.0 if compiled else (4.0 + (2.0 if trains_base else 0.0))) * h / seq_split
    attn = (2.0 * (2 * q_out + 2 * kv_out) + 4.0 * heads) / t  # q, k, v, output (bf16) + log-sum-exp (fp32)
    adapters_a = 2.0 * lo.rank * len(targets)  # A's output, B's input (replicated: tiny)
    mlp = 2.0 * (2 if compiled else 3) * f / t  # gate, up (+ SiLU(gate) in eager)
    # the fused LoRA kernel (hardware.lora_kernel=fused) keeps A's input, not a mask and a dropped copy
    # per adapter: as without dropout
    keeps_input = lo.dropout == 0 or spec.hardware.lora_kernel == "fused"
    mlp += 2.0 * f / t if trains_base or ("down_proj" in targets and keeps_input) else 0.0
    # inputs kept for weight gradients: q/k/v's (gathered under TP) and gate/up's; o reads attention's
    # output (already kept), down reads SiLU(gate)*up (counted in mlp)
    attn_in = trains_base or (keeps_input and any(n in targets for n in ("q_proj", "k_proj", "v_proj", "qkv_proj")))
    mlp_in = trains_base or (keeps_input and any(n in targets for n in ("gate_proj", "up_proj")))
    inputs = 2.0 * h * (attn_in + mlp_in)
    dropout = 0.0
    if lo.enabled and not keeps_input:  # per adapter: its mask and the dropped copy A keeps
        mask = 1.0 if compiled else mask_bytes
        dropout = sum((mask + 2.0) * proj[n][0] / (1 if proj[n][2] else t) for n in targets)
    elif lo.enabled and lo.dropout > 0:  # the fused kernel's mask records (model/lora_kernel.py)
        dropout = sum(mask_record_bytes(proj[group[0]][0], len(group)) for group in _shared_input_groups(targets))
    return norms + attn + mlp + inputs + adapters_a + dropout


def _shared_input_groups(targets: list[str]) -> list[list[str]]:
    """The LoRA targets that read one input and share a fused-kernel call (model/lora.py: project)."""
    groups = [[n for n in ("q_proj", "k_proj", "v_proj") if n in targets],
              [n for n in ("gate_proj", "up_proj") if n in targets]]
    groups += [[n] for n in ("qkv_proj", "o_proj", "down_proj") if n in targets]
    return [g for g in groups if g]


@dataclass(slots=True)
class RankShape:
    """One GPU's share of a step in the module's notation, and the parameters it holds (worst pipeline
    rank: the first holds the embedding, the last the LM head; both are V*h, so either is the worst)."""
    t: int
    c: int
    pp: int
    R: int
    d: int  # the FSDP group: dp_shard * cp
    dp: int  # data-parallel ranks: dp_replicate * dp_shard
    v: int
    S: int
    b: int
    mb: int  # micro-batches per step per data-parallel rank
    h: int
    V: int
    L: int
    L_rank: float
    tokens_mb: float  # tokens of one micro-batch on this GPU's sequence shard
    p_layer: float
    p_edge: float
    psi: float  # parameters before TP and FSDP
    psi_train: float  # of them, the trained ones
    recomputed_share: float  # of a stage's layers (recomputed_share)
    offloaded_share: float  # of a stage's layers (offloaded_share)


def rank_shape(spec: RunSpec) -> RankShape:
    m, p, tr, lo = spec.model, spec.parallel, spec.train, spec.lora
    c, pp = p.cp, p.pp
    dp = p.dp_replicate * p.dp_shard
    S, b = spec.data.seq_len, tr.micro_batch_size
    h, V = m.hidden_size, m.vocab_size
    L_rank = m.num_layers / pp
    p_layer = layer_params(spec)
    p_edge = V * h if pp > 1 else 2 * V * h
    psi = L_rank * p_layer + p_edge
    return RankShape(t=p.tp, c=c, pp=pp, R=p.dp_replicate, d=p.dp_shard * c, dp=dp, v=stages_per_rank(p), S=S, b=b,
                     mb=tr.global_batch_size // (dp * b), h=h, V=V, L=m.num_layers, L_rank=L_rank,
                     tokens_mb=b * S / c, p_layer=p_layer, p_edge=p_edge, psi=psi,
                     psi_train=metrics.lora_params(m, lo) / pp if lo.enabled else psi,
                     recomputed_share=recomputed_share(spec), offloaded_share=offloaded_share(spec))


@dataclass
class MicroBatchSeconds:
    """One micro-batch of the slowest pipeline stage (the last: its layers plus the LM head), by term."""
    gemm: float
    attention: float
    elementwise: float
    recompute: float = 0.0
    offload: float = 0.0
    tp: float = 0.0
    cp: float = 0.0

    @property
    def total(self) -> float:
        return self.gemm + self.attention + self.elementwise + self.recompute + self.offload + self.tp + self.cp


def forward_seconds(mb: MicroBatchSeconds, lin_mult: float) -> float:
    """The forward alone of a micro-batch's compute: a third of the GEMMs of full training (half of
    LoRA's), a third of attention and of the elementwise work."""
    return mb.gemm * 2.0 / lin_mult + mb.attention / 3 + mb.elementwise / 3


def estimate(spec: RunSpec, gpu: GPU, gpus_per_node: int) -> Estimate:
    s = rank_shape(spec)
    est = Estimate()
    megatron = gpu.data_parallel == "distributed_optimizer"
    est.memory.update(distributed_optimizer_memory(spec, s) if megatron else weight_memory(spec, s))
    layer_set = activation_memory(spec, s, est, megatron_activation_bytes_per_token_layer(
        spec, fp8_mlp_outputs=gpu.fp8_activation_storage > 0) if megatron else None)
    micro = compute_seconds(spec, s, gpu)
    add_recompute_seconds(spec, s, gpu, micro)
    add_offload_seconds(spec, s, gpu, gpus_per_node, layer_set, micro, est)
    add_tp_cp_seconds(spec, s, gpu, gpus_per_node, micro, est)
    add_lm_head_recompute_seconds(spec, s, gpu, micro)
    balance_asymmetric_stages(spec, s, gpu, micro)
    est.time.update(gemm=micro.gemm * s.mb, attention=micro.attention * s.mb, elementwise=micro.elementwise * s.mb,
                    recompute=micro.recompute * s.mb, offload_exposed=micro.offload * s.mb, tp_exposed=micro.tp * s.mb,
                    cp_exposed=micro.cp * s.mb)
    est.time.update(step_seconds(spec, s, gpu, gpus_per_node, micro.total, est))
    add_host_wait(spec, s, gpu, est)
    est.step_time_s = sum(est.time.values())
    finish_rates(spec, s, gpu, gpus_per_node, micro, est)
    return est


def weight_memory(spec: RunSpec, s: RankShape) -> dict[str, float]:
    """Weights, gradients and optimizer states, bytes per GPU: the ZeRO paper's (arXiv 1910.02054)
    accounting adapted to FSDP2."""
    lo, tr, h, t, d = spec.lora, spec.train, s.h, s.t, s.d
    frozen_bytes = 4.0 if "fp32" in (spec.hardware.frozen_dtype, spec.hardware.dtype) else 2.0
    frozen = s.psi - s.psi_train
    # frozen_dtype=fp8: the decoder layers' frozen projections at a byte each (the norms, embedding
    # and LM head as auto stores them); their scales are one float each
    float8_stored = s.L_rank * (s.p_layer - 2 * h) if lo.enabled and spec.hardware.frozen_dtype == "fp8" else 0.0
    memory = {"weights_sharded": (4.0 * s.psi_train + frozen_bytes * (frozen - float8_stored) + float8_stored)
              / (t * d) if lo.enabled else 4.0 * s.psi / (t * d)}
    gathered_units = s.L_rank if s.pp > 1 else 2  # PP: no reshard after forward; else unit + prefetch
    # + the root's LM head, never resharded after forward (backward needs it first)
    memory["weights_bf16_gathered"] = 2.0 * (gathered_units * s.p_layer + s.V * h) / t
    # (one process with a bf16 LoRA base runs without FSDP2 -- parallelize.runs_without_fsdp -- but its
    # measured peak fell by only 0.2 GiB, 50.8 -> 50.6 on the 7B compiled run: the term stays)
    # Gradients in fp32. Micro-batches before the last run without gradient sync
    # (set_requires_gradient_sync(False), engine.py); FSDP2 then keeps each parameter's *unsharded*
    # gradient, up-cast to the fp32 reduce dtype (FSDPParam.to_accumulated_grad_if_needed), until the
    # last micro-batch reduce-scatters it: with more than one micro-batch the backward holds the full
    # local (TP-sharded) set, not the FSDP shard. Measured: 8B pretraining, 7B full training, FSDP2 x 2.
    # train.grad_sync=every reduce-scatters after each micro-batch: only the shard stays.
    whole = s.mb > 1 and tr.grad_sync == "last"
    memory["grads_fp32"] = 4.0 * s.psi_train / (t if whole else t * d)
    memory["grads_bf16_unsharded"] = 0.0 if lo.enabled else 2.0 * 2 * s.p_layer / t
    memory["optimizer_states"] = OPTIMIZER_STATE_BYTES[tr.optimizer] * s.psi_train / (t * d)
    return memory


def inflight_layers(spec: RunSpec, s: RankShape) -> float:
    """Decoder layers whose activations the worst (first) stage holds at once: Narayanan et al. 2021 /
    Megatron theoretical_memory_usage.py: 1F1B holds p micro-batches (of its L/p layers), GPipe all m."""
    if s.pp == 1:
        return s.L
    if spec.parallel.pp_schedule == "GPipe":
        return s.L_rank * s.mb
    return s.L_rank * min(s.pp, s.mb) * (1 + (s.pp - 1) / (s.pp * s.v) if s.v > 1 else 1)


def distributed_optimizer_memory(spec: RunSpec, s: RankShape) -> dict[str, float]:
    """Megatron's distributed optimizer (ZeRO-1): every data-parallel rank holds its TP/PP share of the
    weights (bf16, or one byte with FP8 parameters / an FP8 frozen base) and of the trained parameters'
    bf16 gradient buffer; the fp32 master copy and both AdamW moments (12 B) are split over the
    data-parallel group (context-parallel ranks included)."""
    lo, t, d = spec.lora, s.t, s.d
    fp8_weights = spec.hardware.fp8 != "none" or spec.hardware.frozen_dtype == "fp8"
    weight_bytes = 1.0 if fp8_weights else 2.0
    frozen = s.psi - s.psi_train if lo.enabled else 0.0
    edge = s.p_edge * (2.0 - weight_bytes)  # the embedding and LM head stay bf16
    return {"weights": (weight_bytes * (s.psi_train + frozen) + edge) / t,
            "grads_bf16": 2.0 * s.psi_train / t,
            "optimizer_states": (4.0 + OPTIMIZER_STATE_BYTES[spec.train.optimizer]) * s.psi_train / (t * d)}


# a LoRA target's name -> the GEMM whose input its adapter reads (plan's Megatron layer: qkv, o_proj, fc1, fc2)
LORA_TARGET_GEMM = {"qkv_proj": "qkv", "q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "o_proj": "o",
                    "gate_proj": "fc1", "up_proj": "fc1", "gate_up_proj": "fc1", "down_proj": "fc2"}


def megatron_activation_bytes_per_token_layer(spec: RunSpec, fp8_mlp_outputs: bool = False) -> float:
    """Bytes a Megatron / Transformer Engine decoder layer keeps for backward per token, with fused
    attention (no S^2 term): Korthikanti et al. 2022's 34 h (/ t with sequence parallelism), written out
    for GQA and a gated MLP. Per block: the norm's input (2 h) and the GEMM input it feeds (one byte
    per element under FP8, Transformer Engine keeps the cast copy), on the sequence shard with SP;
    attention: q, k, v, its output (bf16 for the kernel's backward, plus o_proj's GEMM input) and the
    log-sum-exp; MLP: the up-projections' outputs and the activation's output (down_proj's input).
    A frozen GEMM (LoRA) keeps no input: Transformer Engine's linear saves its input only for the weight
    gradient (``if weight.requires_grad``, transformer_engine/pytorch/module/linear.py); a LoRA adapter
    on it keeps its own bf16 copy of that input, except o_proj's, the attention output already kept.
    Under full recomputation only the layer input. ``fp8_mlp_outputs``: an FP8 run keeps the
    up-projections' outputs at one byte (FP8 activation storage)."""
    m, p = spec.model, spec.parallel
    seq_split = p.tp if p.sp else 1  # norms and GEMM inputs: split with SP, whole on every TP rank without
    h, f, q, kv = m.hidden_size, m.intermediate_size, m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    if spec.train.recompute == "full":
        return 2.0 * h / seq_split
    g = 1.0 if spec.hardware.fp8 != "none" else 2.0  # bytes per element of a saved GEMM input
    adapted = {LORA_TARGET_GEMM.get(t) for t in spec.lora.target_modules} if spec.lora.enabled else set()

    def kept_input(gemm: str, adapter_bytes: float = 2.0) -> float:  # bytes per element of a GEMM's saved input
        if not spec.lora.enabled:
            return g
        return adapter_bytes if gemm in adapted else 0.0

    mlp_outs = family(m.family).mlp_up_projections  # GPT: one up-projection; Llama: gate and up
    attention = (2.0 + kept_input("qkv")) * h / seq_split \
        + (2.0 * (q + 2 * kv) + (2.0 + kept_input("o", 0.0)) * q + 4.0 * m.num_heads) / p.tp
    up_bytes = 1.0 if fp8_mlp_outputs and spec.hardware.fp8 != "none" else 2.0
    mlp = (2.0 + kept_input("fc1")) * h / seq_split + (up_bytes * mlp_outs * f + kept_input("fc2") * f) / p.tp
    return attention + mlp


def activation_memory(spec: RunSpec, s: RankShape, est: Estimate, per_layer_override: float | None = None) -> float:
    """Adds the activations, the recompute transient, the logits and the pinned host bytes to ``est``;
    returns one layer's whole saved set (bytes per micro-batch), what an offloaded layer copies.
    ``per_layer_override``: another engine's bytes per token per layer (every layer alike)."""
    tr = spec.train
    layers = inflight_layers(spec, s)
    if per_layer_override is not None:
        est.memory["activations"] = per_layer_override * s.tokens_mb * layers
        est.memory["logits_and_loss"] = 10.0 * s.tokens_mb * s.V / s.t
        return per_layer_override * s.tokens_mb
    # train.recompute_layers: only that share of each stage's layers is recomputed, the rest keep all;
    # train.offload_layers: that share keeps nothing on the GPU between its forward and its backward
    share, off_share = s.recomputed_share, s.offloaded_share
    others_share = 1.0 - share - off_share
    others = tr.recompute_others  # what the layers recompute_layers leaves out get
    per_layer = share * activation_bytes_per_token_layer(spec) + others_share * activation_bytes_per_token_layer(spec, others)
    est.memory["activations"] = per_layer * s.tokens_mb * layers
    layer_set = activation_bytes_per_token_layer(spec, "none") * s.tokens_mb  # one layer's whole saved set
    if tr.recompute == "full" and share > 0:  # one layer's full set is live while it is recomputed
        est.memory["recompute_transient"] = layer_set
    if off_share > 0:  # pinned blocks as the allocator rounds them (GPU side: offload_in_flight)
        est.host_offload_bytes = off_share * layers * layer_set * PINNED_ROUNDING
    # logits bf16 + fp32 upcast + fp32 grad for the loss (last stage; vocab-sharded under TP)
    chunk = tr.loss_chunk_tokens
    est.memory["logits_and_loss"] = 10.0 * (min(s.tokens_mb, chunk) if chunk > 0 else s.tokens_mb) * s.V / s.t
    # the optimizer step (torch.optim.AdamW(fused=True), train/loop.py) updates in place: no
    # temporaries (foreach would allocate sqrt(exp_avg_sq), 4 B per local trainable parameter)
    return layer_set


def linear_flops_multiplier(spec: RunSpec) -> float:
    """FLOPs per base-projection weight per token: a frozen base has forward and input gradient only."""
    return 4.0 if spec.lora.enabled else 6.0


def measured_gemm_rates(gpu: GPU):
    """(the kernel table, the scale of its GEMM times to this GPU) -- (None, 1.0) without a table."""
    if not gpu.kernel_table:
        return None, 1.0
    return load_table(gpu.kernel_table), (gpu.kernel_table_gemm_eff / gpu.gemm_eff if gpu.kernel_table_gemm_eff > 0
                                          else 1.0)


def compute_seconds(spec: RunSpec, s: RankShape, gpu: GPU) -> MicroBatchSeconds:
    """GEMM, attention and elementwise seconds of one micro-batch on the slowest stage (the embedding
    is a lookup): measured rates by shape (plan/kernels.py) where the GPU has a table, else flat
    efficiencies; the adapters' thin GEMMs always flat."""
    m, lo, tr, t, c, tokens_mb = spec.model, spec.lora, spec.train, s.t, s.c, s.tokens_mb
    n_lin_layers, n_lin_head = s.L_rank * (s.p_layer - 2 * s.h) / t, s.V * s.h / t
    lin_mult = linear_flops_multiplier(spec)
    flops_layers = lin_mult * n_lin_layers * tokens_mb
    flops_lin = lin_mult * (n_lin_layers + n_lin_head) * tokens_mb + 6.0 * (metrics.lora_params(m, lo) / s.pp / t) * tokens_mb
    # flash/cuDNN kernels work on head dims padded to a multiple of 64 (a 100-wide head costs 128)
    padded_head_dim = -(-m.head_dim // 64) * 64
    flops_attn = 3.0 * 2.0 * s.S * m.num_heads * padded_head_dim * s.L_rank / t * tokens_mb
    peak = gpu.peak_flops
    table, slower = measured_gemm_rates(gpu)
    if table is not None:
        t_layers = s.L_rank * sum(table.gemm_seconds(*g) for g in layer_gemms(spec, tokens_mb)) * slower
        t_lin = t_layers + sum(table.gemm_seconds(*g) for g in head_gemms(spec, tokens_mb)) * slower \
            + 6.0 * (metrics.lora_params(m, lo) / s.pp / t) * tokens_mb / (peak * gpu.gemm_eff)
    else:
        t_layers = flops_layers / (peak * gpu.gemm_eff)
        t_lin = flops_lin / (peak * gpu.gemm_eff)
    if spec.hardware.fp8 != "none":  # the decoder layers' base GEMMs in float8 (LM head, adapters: bf16)
        t_lin += fp8_layer_gemm_seconds(spec, s, gpu, flops_layers) - t_layers
        cast_bytes = gpu.fp8_cast_bytes_compiled if tr.compile else gpu.fp8_cast_bytes_eager
        t_lin += fp8_cast_elements(spec, tokens_mb, t) * s.L_rank * cast_bytes / (gpu.hbm_tbps * 1e12)
    if table is not None:  # ring attention: each rank computes 1/c of the causal work, in chunks
        t_attn = s.L_rank * table.attention_seconds(s.b, m.num_heads / t, m.num_kv_heads / t, m.head_dim, s.S,
                                                    kernel=spec.hardware.attention) / c \
            * (gpu.cp_attn_slowdown if c > 1 else 1.0)
    else:
        attn_eff = gpu.attn_eff / (gpu.cp_attn_slowdown if c > 1 else 1.0) * attention_length_efficiency(gpu, s.S / c)
        t_attn = flops_attn / (peak * attn_eff)
    t_other = gpu.other_s_per_token_layer_h * s.h / t * tokens_mb * s.L_rank
    if tr.compile:
        t_other *= gpu.compile_other_factor
    return MicroBatchSeconds(gemm=t_lin, attention=t_attn, elementwise=t_other)


def fp8_layer_gemm_seconds(spec: RunSpec, s: RankShape, gpu: GPU, flops_layers: float) -> float:
    """The stage's decoder-layer projections in float8: at fp8_gemm_eff of the float8 peak, scaled at
    each GEMM's shape by the GPU's measured float8 grid (gpu.fp8_gemm_grid) where it has one."""
    rate = gpu.fp8_tflops * 1e12 * gpu.fp8_gemm_eff
    if not gpu.fp8_gemm_grid:
        return flops_layers / rate
    grid = load_fp8_grid(gpu.fp8_gemm_grid)
    return s.L_rank * sum(2.0 * m * k * n / (rate * grid.relative(m, k, n)) for m, k, n in layer_gemms(spec, s.tokens_mb))


def attention_length_efficiency(gpu: GPU, local_queries: float) -> float:
    """The share of its long-sequence rate the attention kernel reaches on ``local_queries`` queries
    (a CP rank's S/c): n / (n + gpu.attn_half_rate_tokens) -- fixed per-kernel costs (tile setup, the
    causal diagonal's partial tiles, the last wave) weigh more on a short sequence; 1 when unmodelled."""
    n0 = gpu.attn_half_rate_tokens
    return local_queries / (local_queries + n0) if n0 > 0 else 1.0


def cp_ring_seconds(gpu: GPU, s: RankShape, cp_bytes: float, attention_s: float, gpus_per_node: int) -> float:
    """Exposed seconds of one micro-batch's context-parallel ring: its KV traffic beyond what the
    attention hides (a ring moves each chunk rank to rank, so it runs at its slowest hop: NVLink inside
    the domain, one NIC once the TP x CP group crosses it -- no hierarchical reduction for a ring) plus
    the fixed cost of its c steps per layer."""
    hop_bw = group_busbw(gpu, gpus_per_node, s.t * s.c)
    traffic = max(0.0, cp_bytes / hop_bw - gpu.comm_overlap * attention_s)
    return traffic + gpu.cp_ring_step_s * s.c * s.L_rank


def selective_recompute_seconds(micro: MicroBatchSeconds) -> float:
    """Selective recomputation of a micro-batch: the pointwise ops again."""
    return micro.elementwise / 3


def add_recompute_seconds(spec: RunSpec, s: RankShape, gpu: GPU, micro: MicroBatchSeconds) -> None:
    """What train.recompute (on recompute_layers of each stage) and recompute_others cost."""
    lo, tr = spec.lora, spec.train
    t_recompute = 0.0
    t_selective = selective_recompute_seconds(micro)
    if tr.recompute == "full":  # the forward again: half the frozen-base GEMMs (1/3 if full training)
        t_recompute = micro.gemm * (0.5 if lo.enabled else 1 / 3) + micro.attention / 3 + micro.elementwise / 3
    elif tr.recompute == "selective":
        t_recompute = t_selective
    share = s.recomputed_share
    others_share = 1.0 - share - s.offloaded_share
    micro.recompute = share * t_recompute + others_share * (t_selective if tr.recompute_others == "selective" else 0.0)


def add_offload_seconds(spec: RunSpec, s: RankShape, gpu: GPU, gpus_per_node: int, layer_set: float,
                        micro: MicroBatchSeconds, est: Estimate) -> None:
    """train.offload_layers: PCIe copies on side streams, hidden unless they outlast the compute beside
    them; also the GPU memory of the copies out still queued at the peak."""
    if s.offloaded_share <= 0:
        return
    # one layer's set, one way, on this GPU's share of its PCIe switch's uplink (every rank of the
    # node copies at the same points of the step)
    copy_s = layer_set / (gpu.pcie_gbps * 1e9 / max(1.0, min(gpu.host_link_gpus, gpus_per_node)))
    fwd_layer = forward_seconds(micro, linear_flops_multiplier(spec)) / s.L_rank
    bwd_layer = (micro.gemm + micro.attention + micro.elementwise) / s.L_rank - fwd_layer
    # recomputation before a backward
    rec_s = {"full": fwd_layer, "selective": selective_recompute_seconds(micro) / s.L_rank}
    modes = stage_layer_modes(spec)
    stall, queued_out = offload_stall(modes, copy_s, fwd_layer,
                                      {mode: bwd_layer + rec_s.get(mode, 0.0) for mode in set(modes)})
    micro.offload = stall * s.v  # the timeline is one stage's; an interleaved rank holds v of them
    # GPU memory: the peak comes at the start of backward, before the offloaded (first) layers come
    # back (then only the one in backward and PREFETCH_DEPTH more are there, with most memory free);
    # what is counted is the copies out still queued at that point, at least one set
    est.memory["offload_in_flight"] = (queued_out + 1.0) * layer_set


def add_tp_cp_seconds(spec: RunSpec, s: RankShape, gpu: GPU, gpus_per_node: int, micro: MicroBatchSeconds,
                      est: Estimate) -> None:
    """Tensor- and context-parallel traffic of a micro-batch and what of it is exposed."""
    m, t, c, b, S, h = spec.model, s.t, s.c, s.b, s.S, s.h
    if t > 1:  # Narayanan 2021 3.3: 4 all-reduces (or 4 AG + 4 RS with SP) of b*s*h*2 B per layer
        a_bytes = b * (S / c) * h * 2.0
        tp_bytes = 8 * (t - 1) / t * a_bytes * s.L_rank
        est.comm["tp"] = tp_bytes * s.mb
        micro.tp = gpu.tp_comm_exposed * tp_bytes / (gpu.intra_busbw_gbps * 1e9) + gpu.tp_overhead_s_per_layer * s.L_rank * (s.tokens_mb / 8192)
    if c > 1:  # ring attention: 3 (c-1) KV chunks per layer (Megatron context_parallel.md)
        # K and V of this TP rank's heads (this engine expands GQA's KV heads before the ring; an
        # engine that rings the KV heads themselves sets gpu.cp_ring_expanded_kv = 0)
        heads = m.num_kv_heads * (m.num_heads // m.num_kv_heads if gpu.cp_ring_expanded_kv else 1)
        kv = 2.0 * b * (S / c) * heads * m.head_dim * 2.0 / t
        cp_bytes = 3 * (c - 1) * kv * s.L_rank
        est.comm["cp"] = cp_bytes * s.mb
        micro.cp = cp_ring_seconds(gpu, s, cp_bytes, micro.attention, gpus_per_node)


def asymmetric_stage_layers(spec: RunSpec) -> float:
    """Layers of a middle pipeline stage when the embedding and the loss count as a layer each (the
    layers alone do not split over PP x virtual stages, the layers + 2 do); 0 when that split is not used."""
    m, p = spec.model, spec.parallel
    chunks = p.pp * max(1, p.pp_stages_per_rank or 1)
    if p.pp < 2 or m.num_layers % chunks == 0 or (m.num_layers + 2) % chunks:
        return 0.0
    return (m.num_layers + 2) / p.pp


def balance_asymmetric_stages(spec: RunSpec, s: RankShape, gpu: GPU, micro: MicroBatchSeconds) -> None:
    """Under the asymmetric split (gpu.asymmetric_stages) the slowest stage is a middle one with
    (L + 2) / PP layers or the last with a layer fewer and the LM head, not L / PP layers and the head:
    every term of the micro-batch scales by the ratio."""
    middle = asymmetric_stage_layers(spec) if gpu.asymmetric_stages > 0 else 0.0
    if middle <= 0:
        return
    head = linear_flops_multiplier(spec) * s.V * s.h / s.t * s.tokens_mb / (gpu.peak_flops * gpu.gemm_eff)
    per_layer = max(0.0, micro.total - head) / s.L_rank
    scale = max(middle * per_layer, (middle - 1) * per_layer + head) / (s.L_rank * per_layer + head)
    for name in ("gemm", "attention", "elementwise", "recompute", "offload", "tp", "cp"):
        setattr(micro, name, getattr(micro, name) * scale)


def add_lm_head_recompute_seconds(spec: RunSpec, s: RankShape, gpu: GPU, micro: MicroBatchSeconds) -> None:
    """Chunked loss (train.loss_chunk_tokens): the LM head's forward runs again in backward."""
    if spec.train.loss_chunk_tokens <= 0:
        return
    table, slower = measured_gemm_rates(gpu)
    micro.recompute += table.gemm_seconds(s.tokens_mb, s.h, s.V / s.t) * slower if table is not None \
        else 2.0 * s.V * s.h * s.tokens_mb / s.t / (gpu.peak_flops * gpu.gemm_eff)


def step_seconds(spec: RunSpec, s: RankShape, gpu: GPU, gpus_per_node: int, t_micro: float,
                 est: Estimate) -> dict[str, float]:
    """Once-per-step terms: FSDP / DP traffic and what of it is exposed, the pipeline's bubble and
    point-to-point sends, the optimizer step."""
    p, tr, t, c, d, R, pp, mb = spec.parallel, spec.train, s.t, s.c, s.d, s.R, s.pp, s.mb
    t_fsdp = 0.0
    if d > 1 and gpu.data_parallel == "distributed_optimizer":
        t_fsdp = distributed_optimizer_seconds(spec, s, gpu, gpus_per_node, t_micro, est)
    elif d > 1:  # per micro-batch: all-gather forward + backward of bf16 params; fp32 grads reduce-scattered
        # after the last micro-batch (train.grad_sync=last) or after each (every)
        gather = 2 * (d - 1) / d * 2.0 * (s.L_rank * s.p_layer + s.p_edge) / t
        rs = (d - 1) / d * 4.0 * s.psi_train / t
        fsdp_bytes = gather * mb + rs * (mb if tr.grad_sync == "every" else 1)
        est.comm["fsdp"] = fsdp_bytes
        t_fsdp = max(0.0, fsdp_bytes / group_busbw(gpu, gpus_per_node, t * c * p.dp_shard, d) - gpu.comm_overlap * t_micro * mb)
    t_dp = 0.0
    if R > 1:  # HSDP replicas all-reduce the (sharded) fp32 grads once per step
        dp_bytes = 2 * (R - 1) / R * 4.0 * s.psi_train / (t * d)
        est.comm["dp"] = dp_bytes
        t_dp = max(0.0, dp_bytes / group_busbw(gpu, gpus_per_node, t * c * p.dp_shard * R, R) - gpu.comm_overlap * t_micro)
    t_pp = 0.0
    t_bubble = 0.0
    if pp > 1:  # 1F1B/GPipe bubble (p-1)/m, interleaved (p-1)/(v m): Narayanan et al. 2021 2.2
        t_bubble = (pp - 1) / (s.v * mb) * t_micro * mb
        pp_bytes = 2 * mb * s.v * s.b * (s.S / c) * s.h * 2.0 / (t if p.sp else 1)
        est.comm["pp"] = pp_bytes
        t_pp = pp_bytes / group_busbw(gpu, gpus_per_node, t * c * p.dp_shard * R * pp) \
            * (1.0 - gpu.pp_p2p_overlapped * gpu.comm_overlap)  # Megatron's overlap_p2p_comm hides a share
    t_opt = OPTIMIZER_STEP_BYTES[tr.optimizer] * s.psi_train / (t * d) / (gpu.hbm_tbps * 1e12) \
        + OPTIMIZER_SECONDS_PER_TENSOR[tr.optimizer] * trained_tensors(spec) / pp
    return {"fsdp_exposed": t_fsdp, "dp_exposed": t_dp, "pp_bubble": t_bubble, "pp_p2p": t_pp, "optimizer": t_opt,
            "step_fixed": gpu.step_overhead_s}


def distributed_optimizer_seconds(spec: RunSpec, s: RankShape, gpu: GPU, gpus_per_node: int, t_micro: float,
                                  est: Estimate) -> float:
    """Megatron's distributed optimizer (ZeRO-1; NeMo's USE_DIST_OPTIMIZER): weights stay whole on every
    data-parallel rank; once per step the bf16 gradients of the trained parameters are reduce-scattered
    and the updated ones all-gathered (one byte each with FP8 parameters), bucket by bucket under the
    last micro-batch's backward and the next step's first forward (overlap_grad_reduce,
    overlap_param_gather). The data-parallel group includes the context-parallel ranks. Under the
    interleaved schedule each of a rank's v model chunks reduces its gradients once its own last
    backward is done and gathers its weights before its own first forward: the chunks finish p
    chunk-steps apart through the cooldown (and start so through the next warm-up), which widens the
    window from one micro-batch to 1 + (v - 1) p / v of them (Narayanan et al. 2021's schedule;
    Megatron-core's per-chunk grad_sync_func / param_sync_func)."""
    p, d, t = spec.parallel, s.d, s.t
    param_bytes = 1.0 if spec.hardware.fp8 != "none" else 2.0
    dp_bytes = (d - 1) / d * (2.0 + param_bytes) * s.psi_train / t
    est.comm["dp"] = dp_bytes
    window = t_micro * (1 + (s.v - 1) * s.pp / s.v) if s.pp > 1 else t_micro
    return max(0.0, dp_bytes / group_busbw(gpu, gpus_per_node, t * s.c * p.dp_shard, d) - gpu.comm_overlap * window)


def add_host_wait(spec: RunSpec, s: RankShape, gpu: GPU, est: Estimate) -> None:
    """A step cannot be shorter than the time to issue its ops; when it is longer than the GPU's work,
    the GPU idles for the difference (the trace shows it as idle time)."""
    t_host = host_seconds_per_step(spec, gpu, s.mb, s.L_rank)
    t_gpu = sum(est.time.values())
    k = gpu.host_gpu_overlap_k
    est.time["host_wait"] = (t_gpu ** k + t_host ** k) ** (1.0 / k) - t_gpu if t_host > 0 else 0.0


def finish_rates(spec: RunSpec, s: RankShape, gpu: GPU, gpus_per_node: int, micro: MicroBatchSeconds,
                 est: Estimate) -> None:
    """Eval seconds per row, tokens/s per GPU, MFU and the fit, from the step time."""
    # eval: the forward alone per sequence, pipeline stages in sequence
    fwd_micro = forward_seconds(micro, linear_flops_multiplier(spec)) + (micro.tp + micro.cp) / 3
    # (an engine that pipelines its eval batches through the stages, as Megatron does, pays the stages once)
    # an eagerly issued eval forward costs the host a fixed time per layer of the stage: the slower sets it
    fwd_micro = max(fwd_micro, gpu.eval_host_s_per_layer * s.L_rank)
    est.eval_seconds_per_row = fwd_micro / s.b * (1 if gpu.pipelined_eval else s.pp)
    est.run_setup_s = gpu.run_setup_s
    world = s.dp * s.t * s.c * s.pp
    tokens_step = spec.train.global_batch_size * s.S
    est.tokens_per_s_per_gpu = tokens_step / est.step_time_s / world
    flops_tok = metrics.train_flops_per_token(spec.model, spec.lora, s.S)
    est.mfu = flops_tok * est.tokens_per_s_per_gpu / gpu.peak_flops
    est.fits = est.reserved_gib <= gpu.hbm_gib and est.host_offload_bytes <= offload_budget_bytes(spec, gpus_per_node)


def host_mem_gib(spec: RunSpec) -> float:
    """A node's memory: hardware.host_mem_gib, else this machine's MemTotal (0 when unknown)."""
    if spec.hardware.host_mem_gib > 0:
        return spec.hardware.host_mem_gib
    try:
        with open("/proc/meminfo") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
        return kib / 2**20
    except (OSError, StopIteration, ValueError):
        return 0.0


def offload_budget_bytes(spec: RunSpec, gpus_per_node: int) -> float:
    """Pinned host bytes one GPU's offloaded activations may take (a share of its node's memory)."""
    return PINNED_HOST_SHARE * host_mem_gib(spec) * GIB / max(gpus_per_node, 1)


def recomputed_share(spec: RunSpec) -> float:
    """The fraction of a stage's decoder layers that train.recompute applies to (recompute_layers of
    the layers after the offloaded ones)."""
    per_stage = layers_per_stage(spec)
    if spec.train.recompute == "none" or per_stage <= 0:
        return 0.0
    rest = per_stage - min(spec.train.offload_layers, per_stage)
    k = spec.train.recompute_layers
    return (rest if k < 0 else min(k, rest)) / per_stage


def stage_layer_modes(spec: RunSpec) -> list[str]:
    """What each decoder layer of a stage does with its activations (specs.layer_memory_modes)."""
    tr = spec.train
    return layer_memory_modes(layers_per_stage(spec), tr.recompute, tr.recompute_layers, tr.recompute_others,
                              tr.offload_layers)


def offload_stall(modes: list[str], copy: float, fwd_layer: float, bwd: dict[str, float]) -> tuple[float, int]:
    """One micro-batch of one stage with activation offload, as parallel/offload.py schedules it:
    (seconds the backward waits for copies back, copies out still queued when the backward starts).

    Copies out queue on the link in forward order, each from the end of its layer's forward. The
    highest offloaded layer's copy back is issued when the backward reaches the layer
    OFFLOAD_PREFETCH_DEPTH above it; each offloaded layer's first unpack issues those of the
    PREFETCH_DEPTH offloaded layers below it. A copy back starts once the link back is free, it has
    been issued and its own copy out is done; a layer's backward waits for its copy back. ``bwd`` maps
    a mode to its layer's backward, recomputation included. A link slower than the compute beside it
    shows as queued copies: the top layer's copy back waits for every copy out, the ones below queue
    behind each other."""
    offloaded = [i for i, mode in enumerate(modes) if mode == "offload"]
    if not offloaded:
        return 0.0, 0
    out_done, link = {}, 0.0
    for i in offloaded:
        link = max(link, (i + 1) * fwd_layer) + copy
        out_done[i] = link
    fwd_end = len(modes) * fwd_layer
    top = offloaded[-1]
    ahead = min(top + OFFLOAD_PREFETCH_DEPTH, len(modes) - 1)  # the layer whose hook issues top's copy
    ready, back_link, t, waited = {}, 0.0, fwd_end, 0.0

    def fetch(j: int, at: float) -> None:
        nonlocal back_link
        if j not in ready:
            back_link = max(back_link, at, out_done[j]) + copy
            ready[j] = back_link

    for i in range(len(modes) - 1, -1, -1):
        if i == ahead and ahead > top:
            fetch(top, t)
        if modes[i] == "offload":
            fetch(i, t)  # on demand unless already issued
            waited += max(0.0, ready[i] - t)
            t = max(t, ready[i])
            below = [j for j in offloaded if j < i][-OFFLOAD_PREFETCH_DEPTH:]
            for j in reversed(below):
                fetch(j, t)
        t += bwd[modes[i]]
    queued = sum(1 for i in offloaded if out_done[i] > fwd_end)
    return waited, queued  # summed waits, not t minus the ideal: a hidden copy is exactly 0


def offloaded_share(spec: RunSpec) -> float:
    """The fraction of a stage's decoder layers whose activations wait in host memory (offload_layers)."""
    per_stage = layers_per_stage(spec)
    return min(spec.train.offload_layers, per_stage) / per_stage if per_stage > 0 else 0.0


def host_seconds_per_step(spec: RunSpec, gpu: GPU, micro_batches: int, layers_per_rank: float) -> float:
    """CPU time to issue one step's layer executions (micro-batches x layers on this rank)."""
    lo, tr, p = spec.lora, spec.train, spec.parallel
    per_layer = gpu.host_s_per_layer + (gpu.host_s_per_lora_target * len(lo.target_modules) if lo.enabled else 0.0)
    share, off_share = recomputed_share(spec), offloaded_share(spec)
    per_layer += share * {"selective": gpu.host_selective_s_per_layer, "full": gpu.host_full_s_per_layer}.get(tr.recompute, 0.0)
    if tr.recompute_others == "selective":
        per_layer += (1 - share - off_share) * gpu.host_selective_s_per_layer
    per_layer += off_share * gpu.host_offload_s_per_layer
    if p.dp_shard * p.cp > 1:  # FSDP2 wraps every layer (pre/post forward and backward hooks)
        per_layer += gpu.host_fsdp_s_per_layer
    if p.cp > 1:
        per_layer += gpu.host_cp_s_per_layer
    if spec.hardware.fp8 != "none":  # torchao's float8 tensor subclass dispatches every op in Python
        gemms = 2 if spec.lora.enabled else 3  # forward, input gradient (+ weight gradient)
        per_layer += gemms * len(_layer_projections(spec.model)) * gpu.host_fp8_s_per_gemm
    if p.tp > 1:
        per_layer *= gpu.host_tp_factor
    if tr.compile:
        per_layer *= gpu.host_compile_factor
    return micro_batches * layers_per_rank * per_layer


def group_busbw(gpu: GPU, gpus_per_node: int, span: int, members: int = 0) -> float:
    """busbw (bytes/s) of a group of ``members`` ranks spread evenly over ``span`` consecutive GPUs:
    NVLink inside the NVLink domain (a node, or gpu.nvlink_domain if smaller); across domains NCCL's
    hierarchical algorithms move the data over NVLink first and only 1/k of it over the NICs, k being
    the group's GPUs per domain (each GPU on its own NIC: rail-optimized, as HGX clusters are cabled).
    ``members`` 0: one GPU per domain (a point-to-point send, or a group strided past the domain)."""
    domain = max(1, min(gpus_per_node, int(gpu.nvlink_domain)))
    intra = gpu.intra_busbw_gbps * 1e9
    if span <= domain:
        return intra
    stride = max(1, span // max(members, 1))
    k = max(1, domain // stride) if members and stride < domain else 1
    inter = gpu.inter_busbw_gbps * 1e9
    return 1.0 / (1.0 / (k * inter) + (1.0 / intra if k > 1 else 0.0))


def trained_tensors(spec: RunSpec) -> int:
    """Parameter tensors the optimizer steps: two per adapted projection per layer (LoRA's A and B), or
    every tensor of the model (per layer: two norms, q/k/v or a fused qkv, o, gate, up, down; the
    embedding, final norm and LM head)."""
    m, lo = spec.model, spec.lora
    if lo.enabled:
        return 2 * len(lo.target_modules) * m.num_layers
    return m.num_layers * (2 + (1 if m.fused_qkv else 3) + 1 + 3) + 3


def eight_bit_optimizer_hint(spec: RunSpec, gpu: GPU, gpus_per_node: int, limit_gib: float) -> str:
    """A layout over ``limit_gib`` whose AdamW moments are what stands between it and the device: the
    clause saying train.optimizer=adamw8bit would fit it (and what that gives up), else ''."""
    if spec.train.optimizer != "adamw":
        return ""
    other = copy.deepcopy(spec)
    other.train.optimizer = "adamw8bit"
    est = estimate(other, gpu, gpus_per_node)
    need = est.reserved_gib
    if need > limit_gib or not est.fits:  # est.fits: the host-offload budget too
        return ""
    return (f"train.optimizer=adamw8bit (8-bit AdamW moments, torchao; not the reference optimizer, so "
            f"mlperf.division=open) would need {need:.1f} GiB")


def check_memory(spec: RunSpec, gpu: GPU, gpus_per_node: int) -> Estimate:
    """SpecError when the predicted per-GPU memory exceeds the device: OOM is refused before launch."""
    est = estimate(spec, gpu, gpus_per_node)
    budget = offload_budget_bytes(spec, gpus_per_node)
    if est.host_offload_bytes > budget:
        per_layer = est.host_offload_bytes / max(spec.train.offload_layers, 1)
        raise SpecError(
            f"train.offload_layers={spec.train.offload_layers} would pin {est.host_offload_bytes / GIB:.1f} GiB of host "
            f"memory per GPU, over the {budget / GIB:.1f} GiB allowed ({PINNED_HOST_SHARE:.0%} of the node's "
            f"{host_mem_gib(spec):.0f} GiB over {gpus_per_node} GPUs); use train.offload_layers <= {int(budget // per_layer)} "
            "or set hardware.host_mem_gib to the node's memory")
    if not est.fits:
        parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in sorted(est.memory.items(), key=lambda kv: -kv[1])[:3])
        hint = eight_bit_optimizer_hint(spec, gpu, gpus_per_node, gpu.hbm_gib)
        raise SpecError(
            f"predicted peak memory {est.reserved_gib:.1f} GiB per GPU exceeds the {gpu.hbm_gib:.0f} GiB of {gpu.name} "
            f"({parts} GiB); try train.recompute=full, more parallel.dp_shard/tp/cp/pp or a smaller "
            "train.micro_batch_size (hardware.memory_check=false skips this check)" + (f"; {hint}" if hint else ""))
    return est
