"""Engine profiles: how an engine runs the work the cost model counts, apart from the GPU it runs on.

A GPU (plan.hardware.GPU) is what its datasheet and a preflight say: peaks, HBM, links, and the rates
plain GEMM and attention kernels reach. An engine is a kind -- ``trainperf`` (this engine), ``megatron``
(NeMo / Megatron-LM with Transformer Engine), room for others -- which fixes its behaviour switches,
the layouts it runs and how its configuration is written, plus the rates it reaches beside the plain
kernels (EngineRates: measured for this engine, fitted to imported runs for another, plan/engines.py).
The cost model reads the two together, flat, as a PricedGPU (plan.hardware).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainperf.core.errors import SpecError


@dataclass(frozen=True)
class EngineSwitches:
    """How an engine runs the work: choices, not rates (this engine's by default)."""

    # how the data-parallel ranks share the model: fsdp2 (this engine: weights, gradients and optimizer
    # states sharded; weights gathered per micro-batch) or distributed_optimizer (Megatron's ZeRO-1:
    # weights whole, gradients reduce-scattered and weights gathered once per step)
    data_parallel: str = "fsdp2"
    # evals: 0 when the engine runs an eval batch through the pipeline stages one after another (this
    # engine), 1 when it pipelines the eval micro-batches (Megatron)
    pipelined_eval: float = 0.0
    # context parallelism's ring sends K and V expanded to every query head (1: this engine) or the
    # KV heads themselves (0: Transformer Engine)
    cp_ring_expanded_kv: float = 1.0
    # share of the pipeline's point-to-point sends the schedule overlaps with compute (times
    # comm_overlap): 0 for this engine (blocking sends), 1 for Megatron's overlap_p2p_comm
    pp_p2p_overlapped: float = 0.0
    # an FP8 engine that keeps the MLP's up-projection outputs (the gated activation's inputs, the
    # largest saved tensors) at one byte instead of two (NeMo's FP8_ACTIVATION): 1 on, 0 off
    fp8_activation_storage: float = 0.0
    # 1: when the layers do not split evenly over PP x virtual stages, the engine counts the embedding
    # and the loss as a layer each (NeMo's account_for_embedding/loss_in_pipeline_split), so the middle
    # stages hold (L + 2) / PP layers and the last one a layer fewer beside the LM head; 0: this engine
    asymmetric_stages: float = 0.0


@dataclass(frozen=True)
class EngineRates:
    """What an engine reaches beside the GPU's plain kernels: this engine's measured defaults (fitted on
    H200 runs, 2026-11-30; docs/PERFORMANCE.md, docs/PLANNER.md), which other GPUs inherit until a
    measurement says otherwise."""

    # hardware.fp8 casts: effective HBM bytes per element cast (fp8_cast_elements). Eager is fitted to the
    # 7B-shape LoRA on one H200 (seq 8192, GBS 4: 2.72 s bf16 -> 4.12 s fp8, measured 2026-11-30): far
    # above the ~25 B of abs, amax, fp32 scale-multiply, clamp and cast as separate kernels, so more than
    # the casts is slow there (a profile would say what). Compiled: one fused read for the amax, one read
    # and a 1-byte write for the cast (not fitted); with the measured GEMM rate it predicts the compiled
    # 7B step at 1.84 s, measured 1.78 s (2.20 s bf16; 2026-11-30).
    fp8_cast_bytes_eager: float = 56.0
    fp8_cast_bytes_compiled: float = 5.0
    # Eager non-GEMM work (norms, RoPE, SiLU, casts, dropout, residuals), seconds per token per layer
    # per unit of hidden size; fitted to the 7B-shape LoRA step on one H200 (0.708 s at seq 8192).
    other_s_per_token_layer_h: float = 2.34e-10
    # Eager DTensor tensor parallel: extra GPU-side seconds per layer per 8192-token micro-batch beyond
    # its ideal collectives (the trace shows extra full-activation all-reduces from the LoRA path, and
    # waits); fitted with host_tp_factor below.
    tp_overhead_s_per_layer: float = 0.015
    # Ring attention (context parallel) runs its chunked kernels this much slower than one
    # whole-sequence kernel; fitted to the CP2 run on 2 x H200 with the flat attention rate (the H200
    # preset's kernel table gives 2.12, set there).
    cp_attn_slowdown: float = 2.3
    comm_overlap: float = 0.8  # fraction of FSDP/DP/CP traffic hidden under compute
    # share of the tensor-parallel collectives on the critical path: 1 for this engine's eager DTensor
    # (nothing overlaps them); an engine that overlaps them with the GEMMs (Transformer Engine's
    # userbuffers) exposes less -- its profile says how much (plan/engines.py)
    tp_comm_exposed: float = 1.0
    # seconds every optimizer step costs whatever its size (gradient-norm and loss reductions, the
    # first and last gradient buckets no compute hides, the step's synchronisation): 0 for this engine,
    # whose host constants carry it; fitted in another engine's profile
    step_overhead_s: float = 0.0
    # time to train beside the steps (0 for this engine: not measured; fitted in another engine's profile
    # to its runs' time outside their steps, plan/engines.py): an eval's forward is issued eagerly (no CUDA
    # graph), so each micro-batch costs the host this per layer of its stage -- the slower of that and the
    # GPU's forward sets the eval; and a fixed time per run (set-up inside the clock: the first steps,
    # the allocator, the first eval's)
    eval_host_s_per_layer: float = 0.0
    run_setup_s: float = 0.0
    # seconds each step of the context-parallel ring costs per layer beside its attention FLOPs and its
    # traffic (forward + backward: a chunk's kernels, the softmax correction, the send/receive waits):
    # c steps per layer, so it grows with CP; 0 for this engine (cp_attn_slowdown and its host constants
    # carry its ring); Transformer Engine's ring in FIXED_FOR_FITTED (plan/engines.py)
    cp_ring_step_s: float = 0.0
    # query length (tokens) at which the attention kernel reaches half its long-sequence rate: each of a
    # CP rank's kernels sees only its S/c local queries, so a wider ring runs shorter, less efficient
    # kernels (rate x n / (n + this)); 0: no length dependence (this engine: its kernel tables)
    attn_half_rate_tokens: float = 0.0
    # train.compile (per-layer torch.compile) fuses the eager non-GEMM work: the fraction of it that
    # remains; fitted to the 7B-shape LoRA step on one H200 (2.80 s eager -> 2.17 s compiled) with the
    # flat rates (0.46 with the H200's kernel table, set in its preset).
    compile_other_factor: float = 0.33
    # Host (CPU) time of eager PyTorch: every op is issued from Python, so a layer whose kernels are
    # short (small hidden size, short sequence) leaves the GPU waiting on the host. Seconds per layer
    # execution (one micro-batch through one layer, forward + backward): a plain layer, each LoRA
    # target, and what FSDP2's per-layer hooks, ring attention's chunked kernels, selective
    # recompute's per-op Python policy and full recompute's second forward add. Fitted to 17 layouts
    # of a 1B-shape LoRA on 2 x H200 (GBS 2, seq 4096: MFU 3-19%, host-bound), docs/PLANNER.md.
    host_s_per_layer: float = 5.0e-3
    host_s_per_lora_target: float = 0.5e-3
    host_fsdp_s_per_layer: float = 1.8e-3
    host_cp_s_per_layer: float = 5.0e-3
    host_selective_s_per_layer: float = 9.8e-3
    host_full_s_per_layer: float = 5.0e-3
    # eager DTensor tensor parallel: every op dispatches through DTensor (sharding propagation,
    # redistributes), multiplying the host time of a layer; fitted with tp_overhead_s_per_layer to the
    # 12 TP layouts of that grid and the 7B TP2+SP run (with or without SP alike)
    host_tp_factor: float = 2.2
    # GPU and host work overlap imperfectly near balance (sync points: loss/grad-norm reads, the
    # optimizer step); the step is the k-norm of the two, k -> infinity being the plain max. Fitted with
    # the host constants above.
    host_gpu_overlap_k: float = 6.0
    # eager float8: host seconds per float8 GEMM (its casts and torchao's tensor-subclass dispatch);
    # fitted to a host-bound small shape (hidden 1024, 8 layers, seq 2048) on one H200: 0.222 s bf16
    # -> 0.453 s fp8, measured 2026-11-30 (tests/gpu/test_gpu.py's fp8 test)
    host_fp8_s_per_gemm: float = 0.52e-3
    # train.offload_layers: the saved-tensor hooks' Python (a storage check, stream waits and a copy
    # per saved tensor, ~20 per layer) -- assumed, not fitted
    host_offload_s_per_layer: float = 0.5e-3
    host_compile_factor: float = 0.3  # assumed: compiled layers launch a few fused kernels (not fitted)


@dataclass(frozen=True)
class EngineKind:
    """A kind of engine: its switches, the layouts it runs and how the planner speaks of them."""

    name: str
    switches: EngineSwitches
    engines: tuple[str, ...] = ()  # the engine names (as `trainperf import` stores them) of this kind
    search: str = "own"  # the layouts searched: "own" (core.validate's) or "megatron" (plan.search's)
    fp8_by_default: bool = False  # its published runs train in FP8 unless --set says otherwise
    own_options: bool = True  # --options (this engine's speed settings) applies
    launchable: bool = True  # `trainperf run` starts its best layout
    config: str = "trainperf"  # how its best layout is written: trainperf --set lines, or "nemo" variables
    rates: EngineRates = field(default_factory=EngineRates)


OURS = "trainperf"
ENGINE_KINDS: dict[str, EngineKind] = {
    OURS: EngineKind(OURS, EngineSwitches(), engines=(OURS,)),
    # NeMo / Megatron-LM with Transformer Engine: ZeRO-1, pipelined evals, GQA's KV heads ringed as
    # they are, overlap_p2p_comm, FP8 activations, the embedding and loss as pipeline stages
    "megatron": EngineKind("megatron", EngineSwitches(data_parallel="distributed_optimizer", pipelined_eval=1.0,
                                                      cp_ring_expanded_kv=0.0, pp_p2p_overlapped=1.0,
                                                      fp8_activation_storage=1.0, asymmetric_stages=1.0),
                           engines=("nemo", "megatron"), search="megatron", fp8_by_default=True, own_options=False,
                           launchable=False, config="nemo"),
}


def kind_named(kind: str) -> EngineKind:
    """The kind called ``kind``; SpecError naming the kinds there are."""
    if kind not in ENGINE_KINDS:
        raise SpecError(f"engine kind {kind!r}: the planner models {', '.join(ENGINE_KINDS)}")
    return ENGINE_KINDS[kind]


def kind_of_engine(engine: str) -> EngineKind | None:
    """The kind of an engine by the name its runs are stored under (nemo: megatron); None when the
    planner models no engine of that name."""
    return next((k for k in ENGINE_KINDS.values() if engine.lower() in k.engines), None)
