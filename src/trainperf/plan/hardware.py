"""GPU presets for the planner, and the YAML form that overrides them.

Datasheet peaks are dense (no 2:4 sparsity). Bus bandwidths are nccl-tests busbw per GPU: what a
collective actually sustains, not the link's marketing figure. Efficiencies are the fraction of peak
the engine reaches on each kind of work; the H200 values are fitted to runs measured on 2026-11-30
(plain timing loops on 2 x H200; docs/PERFORMANCE.md) and the other GPUs inherit them until a
measurement says otherwise.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from trainperf.core.errors import SpecError
from trainperf.core.hardware import DATASHEETS, Datasheet, parse_gpu_name
from trainperf.plan.kernels import load_fp8_grid, load_table


DATA_PARALLEL_MODES = ("fsdp2", "distributed_optimizer")


@dataclass(frozen=True)
class GPU(Datasheet):
    """A datasheet plus what the engine reaches on it."""

    # pinned host <-> device copy rate, GB/s each way (train.offload_layers): PCIe Gen5 x16 is 64 GB/s
    # on paper; 1 GiB pinned copies on 2 x H200 at once measured 55 device-to-host, 51-55 back
    # (2026-11-30)
    pcie_gbps: float = 50.0
    # GPUs behind one PCIe switch uplink to the host: when they copy at once each gets its share.
    # HGX/DGX H100 and H200 boards put two GPUs (and two NICs) behind each switch: 2 in those presets,
    # from the board's topology. `trainperf preflight` measures it (host link alone vs together) and
    # the planner then uses the measured figure: on a 2 x H200 host each GPU kept its
    # 55 GB/s with both copying at once (1; 2026-11-30) -- a VM's pair need not share a switch
    host_link_gpus: float = 1.0
    gemm_eff: float = 0.80  # H200: 790 of 989 TFLOP/s on 8192^3 bf16 (measured)
    # hardware.fp8 (torchao float8, dynamic scales): fraction of the fp8 peak the float8 GEMMs reach:
    # the plain fp8 GEMM's measured 0.73 (1,437 of 1,979 TFLOP/s, preflight on H200).
    fp8_gemm_eff: float = 0.73
    # ... and what the casts cost: effective HBM bytes per element cast (fp8_cast_elements). Eager is
    # fitted to the 7B-shape LoRA on one H200 (seq 8192, GBS 4: 2.72 s bf16 -> 4.12 s fp8, measured
    # 2026-11-30; docs/PERFORMANCE.md): far above the ~25 B of abs, amax, fp32 scale-multiply, clamp
    # and cast as separate kernels, so more than the casts is slow there (a profile would say what).
    # Compiled: one fused read for the amax, one read and a 1-byte write for the cast (not fitted);
    # with the measured GEMM rate above it predicts the compiled 7B step at 1.84 s, measured 1.78 s
    # (2.20 s bf16; 2026-11-30).
    fp8_cast_bytes_eager: float = 56.0
    fp8_cast_bytes_compiled: float = 5.0
    attn_eff: float = 0.29  # H200: SDPA flash fwd+bwd 286 of 989 at seq 8192 (measured)
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
    # GPUs one NVLink domain joins (HGX boards: the node's 8; H200 NVL: bridges of 4; GB200 NVL72: 72);
    # collectives inside it run at intra_busbw_gbps, across it hierarchically over the NICs
    nvlink_domain: float = 8.0
    # the NIC per GPU (GB/s each way: NDR InfiniBand / 400G Ethernet = 50) and the fraction of it a
    # collective across nodes sustains (nccl-tests busbw / line rate: ~0.8 on InfiniBand, lower on RoCE);
    # 0 leaves the datasheet's measured inter_busbw_gbps in charge
    nic_gbps: float = 0.0
    nic_efficiency: float = 0.8
    # seconds every optimizer step costs whatever its size (gradient-norm and loss reductions, the
    # first and last gradient buckets no compute hides, the step's synchronisation): 0 for this engine,
    # whose host constants carry it; fitted in another engine's profile
    step_overhead_s: float = 0.0
    # evals: 0 when the engine runs an eval batch through the pipeline stages one after another (this
    # engine), 1 when it pipelines the eval micro-batches (Megatron)
    pipelined_eval: float = 0.0
    # time to train beside the steps (0 for this engine: not measured; fitted in another engine's profile
    # to its runs' time outside their steps, plan/engines.py): an eval's forward is issued eagerly (no CUDA
    # graph), so each micro-batch costs the host this per layer of its stage -- the slower of that and the
    # GPU's forward sets the eval; and a fixed time per run (set-up inside the clock: the first steps,
    # the allocator, the first eval's)
    eval_host_s_per_layer: float = 0.0
    run_setup_s: float = 0.0
    # how the data-parallel ranks share the model: fsdp2 (this engine: weights, gradients and optimizer
    # states sharded; weights gathered per micro-batch) or distributed_optimizer (Megatron's ZeRO-1:
    # weights whole, gradients reduce-scattered and weights gathered once per step)
    data_parallel: str = "fsdp2"
    # context parallelism's ring sends K and V expanded to every query head (1: this engine) or the
    # KV heads themselves (0: Transformer Engine)
    cp_ring_expanded_kv: float = 1.0
    # seconds each step of the context-parallel ring costs per layer beside its attention FLOPs and its
    # traffic (forward + backward: a chunk's kernels, the softmax correction, the send/receive waits):
    # c steps per layer, so it grows with CP; 0 for this engine (cp_attn_slowdown and its host constants
    # carry its ring); Transformer Engine's ring in FIXED_FOR_FITTED (plan/engines.py)
    cp_ring_step_s: float = 0.0
    # query length (tokens) at which the attention kernel reaches half its long-sequence rate: each of a
    # CP rank's kernels sees only its S/c local queries, so a wider ring runs shorter, less efficient
    # kernels (rate x n / (n + this)); 0: no length dependence (this engine: its kernel tables)
    attn_half_rate_tokens: float = 0.0
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
    # measured GEMM and attention rates by shape (plan/kernels.py: a packaged name or a JSON file from
    # bench/kernel_rates.py / preflight); when set they replace gemm_eff and attn_eff for the bf16
    # projections, the LM head and attention (the adapters' rank-r GEMMs keep gemm_eff)
    kernel_table: str = ""
    # the plain 8192^3 GEMM efficiency of the machine the table was measured on: a preflight on another
    # machine that measures a different gemm_eff (and no table of its own) scales the table's GEMM
    # rates by gemm_eff / kernel_table_gemm_eff -- a slow GPU stays slow under the packaged table
    kernel_table_gemm_eff: float = 0.0
    # measured float8 GEMM rates on a grid of shapes (plan/kernels.py Fp8GemmGrid: a packaged name or a
    # JSON file from bench/fp8_gemm_grid.py); when set, the float8 projections run at fp8_gemm_eff times
    # the grid's rate at their shape over its best, not at one flat fp8_gemm_eff
    fp8_gemm_grid: str = ""


def scale_host_time(gpu: GPU, scale: float) -> GPU:
    """The GPU with every host-time constant (seconds, not the dimensionless factors) scaled: how fast
    a machine's CPUs issue ops differs between machines more than anything on the GPU side."""
    return dataclasses.replace(gpu, **{f.name: float(getattr(gpu, f.name) * scale) for f in dataclasses.fields(gpu)
                                       if f.name.startswith("host_") and "_s_per_" in f.name})


def _from_datasheet(key: str, **engine) -> GPU:
    return GPU(**dataclasses.asdict(DATASHEETS[key]), **engine)


def _cluster(gpu: GPU, **fields) -> GPU:
    """A GPU preset with its cluster's network: inter-node busbw from the NIC rate and its efficiency."""
    gpu = dataclasses.replace(gpu, **fields)
    return dataclasses.replace(gpu, inter_busbw_gbps=gpu.nic_gbps * gpu.nic_efficiency) if gpu.nic_gbps else gpu


PRESETS: dict[str, GPU] = {
    # H200: GEMM and attention rates by shape from bench/kernel_rates.py (2026-11-30, plan/kernels.py);
    # with them what had been fitted against flat rates was refitted on the same runs: compile's
    # remaining elementwise share (7B LoRA compiled, 2.197 s), ring attention's slowdown (7B CP2) and
    # one scale on the host constants (0.94, least squares over the 1B host-bound grid)
    "h200": scale_host_time(_from_datasheet("h200", kernel_table="h200",
                                kernel_table_gemm_eff=0.80, compile_other_factor=0.46, cp_attn_slowdown=2.12,
                                pcie_gbps=52.0, host_link_gpus=2), 0.94),  # HGX topology: 2 GPUs per PCIe switch
    "h100": _from_datasheet("h100", host_link_gpus=2),  # the same HGX board
    "a100": _from_datasheet("a100", pcie_gbps=25.0),  # PCIe Gen4
    "b200": _from_datasheet("b200"),
}
# cluster presets: a GPU in its usual system, one NDR InfiniBand NIC per GPU, rail-optimized (HGX / DGX)
PRESETS |= {
    "h100-sxm": _cluster(PRESETS["h100"], nic_gbps=50.0, nic_efficiency=0.8),
    "h200-sxm": _cluster(PRESETS["h200"], nic_gbps=50.0, nic_efficiency=0.8),
    # H200 NVL: PCIe cards joined by NVLink bridges in groups of up to 4 (900 GB/s per GPU), 600 W:
    # 3,341 dense fp8 / 1,671 bf16 TFLOP/s (NVIDIA's datasheet halves the 2:4-sparse figures), 4.8 TB/s
    # HBM (4.0 achievable, as the SXM's 4.8 -> 4.27 scaled); 400G Ethernet (RoCE) per GPU pair is common
    "h200-nvl": _cluster(dataclasses.replace(PRESETS["h200"], name="NVIDIA H200 NVL", bf16_tflops=835.0,
                                             fp8_tflops=1671.0, hbm_tbps=4.0, kernel_table="", host_link_gpus=1),
                         nvlink_domain=4.0, nic_gbps=25.0, nic_efficiency=0.7),
    "b200-sxm": _cluster(PRESETS["b200"], nic_gbps=50.0, nic_efficiency=0.8),
    # GB200 NVL72: 72 Blackwell GPUs in one NVLink domain (NVLink 5, 1.8 TB/s per GPU), 4 per compute tray
    # (a node: its Grace CPUs' memory and NICs), one 400G ConnectX-7 NIC per GPU across racks; datasheet
    # figures (core.hardware), not measured
    "gb200": _cluster(dataclasses.replace(_from_datasheet("gb200"), name="NVIDIA GB200 NVL72"), nvlink_domain=72.0,
                      nic_gbps=50.0, nic_efficiency=0.8),
    # GB300 NVL72 (Blackwell Ultra): GB200's domain and dense bf16 / fp8 rates, 288 GB of HBM3e (279 usable,
    # as B200's 192 -> 178 scaled), 8 TB/s, an 800G ConnectX-8 NIC per GPU; datasheet figures, not measured
    "gb300": _cluster(dataclasses.replace(_from_datasheet("gb200"), name="NVIDIA GB300 NVL72", hbm_gib=279.0,
                                          hbm_tbps=7.7), nvlink_domain=72.0, nic_gbps=100.0, nic_efficiency=0.8),
}


def _checked_rates_file(value, base_dir: Path, source: str, field: str, load, what: str, how: str) -> str:
    """A YAML field naming a rates file (``kernel_table``, ``fp8_gemm_grid``): empty for none, a packaged
    name, or a JSON file (relative to the YAML) that ``load`` reads; SpecError saying how to write one."""
    if value in (None, ""):
        return ""
    path = Path(str(value))
    if path.suffix and not path.is_absolute():
        path = base_dir / path
    try:
        load(str(path))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SpecError(f"--gpu {source!r}: {field} {value!r} is not a readable {what} "
                        f"({type(exc).__name__}: {exc}); write one with {how}") from None
    return str(path)


def preset_for_device(device_name: str) -> GPU | None:
    """The preset for a device name such as 'NVIDIA H200' or 'NVIDIA H200 NVL' (None for unknown
    devices): the longest key that names it ('h200-nvl' beats 'h200'; the -sxm cluster presets are only
    chosen by name)."""
    key = parse_gpu_name(device_name).best_key(k for k in PRESETS if not k.endswith("-sxm"))
    return PRESETS[key] if key else None


def load_gpu(name_or_file: str) -> GPU:
    """A preset name, or a YAML file of GPU fields (optionally ``base: h200`` to start from one)."""
    key = name_or_file.lower()
    if key in PRESETS:
        return PRESETS[key]
    p = Path(name_or_file)
    if not p.is_file():
        raise SpecError(f"--gpu {name_or_file!r}: not a preset ({', '.join(PRESETS)}) nor a YAML file")
    import yaml

    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise SpecError(f"--gpu {name_or_file!r}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise SpecError(f"--gpu {name_or_file!r}: expected a mapping of GPU fields")
    base = PRESETS.get(str(data.pop("base", "h200")).lower())
    if base is None:
        raise SpecError(f"--gpu {name_or_file!r}: base must be one of {', '.join(PRESETS)}")
    fields = {f.name: f.type for f in dataclasses.fields(GPU)}
    bad = sorted(set(data) - set(fields))
    if bad:
        raise SpecError(f"--gpu {name_or_file!r}: unknown fields {bad}; valid: {', '.join(fields)}")
    try:
        values = {k: (str(v) if k in ("name", "data_parallel") else v if k in ("kernel_table", "fp8_gemm_grid")
                      else float(v)) for k, v in data.items()}
    except (TypeError, ValueError):
        raise SpecError(f"--gpu {name_or_file!r}: every field but name, data_parallel, kernel_table and fp8_gemm_grid "
                        "must be a number") from None
    if values.get("data_parallel", "fsdp2") not in DATA_PARALLEL_MODES:
        raise SpecError(f"--gpu {name_or_file!r}: data_parallel {values['data_parallel']!r}; valid: "
                        f"{', '.join(DATA_PARALLEL_MODES)}")
    if "kernel_table" in values:
        values["kernel_table"] = _checked_rates_file(values["kernel_table"], p.parent, name_or_file, "kernel_table",
                                                     load_table, "kernel table",
                                                     "bench/kernel_rates.py or trainperf preflight")
    if "fp8_gemm_grid" in values:
        values["fp8_gemm_grid"] = _checked_rates_file(values["fp8_gemm_grid"], p.parent, name_or_file, "fp8_gemm_grid",
                                                      load_fp8_grid, "float8 grid", "bench/fp8_gemm_grid.py")
    return _cluster(base, **values)  # nic_gbps x nic_efficiency, when given, sets the inter-node busbw
