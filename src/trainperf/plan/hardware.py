"""GPU presets for the planner, and the YAML form that overrides them.

A GPU is what its datasheet and a preflight say: dense peaks (no 2:4 sparsity), HBM, links, and the
rates plain kernels reach. Bus bandwidths are nccl-tests busbw per GPU: what a collective actually
sustains, not the link's marketing figure. What an engine reaches beside that (its switches and rates)
is an engine profile (plan/profile.py); the cost model prices a PricedGPU, the two together. PRESETS
are the GPUs as this engine runs them: its rates measured on 2 x H200 (2026-11-30; docs/PERFORMANCE.md),
which the other GPUs inherit until a measurement says otherwise.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from trainperf.core.errors import SpecError
from trainperf.core.hardware import DATASHEETS, Datasheet, parse_gpu_name
from trainperf.plan.kernels import load_fp8_grid, load_table
from trainperf.plan.profile import ENGINE_KINDS, OURS, EngineRates, EngineSwitches


DATA_PARALLEL_MODES = ("fsdp2", "distributed_optimizer")


@dataclass(frozen=True)
class GPU(Datasheet):
    """A datasheet plus what a preflight measures on it: host link, NVLink domain, NICs, plain kernel rates."""

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
    attn_eff: float = 0.29  # H200: SDPA flash fwd+bwd 286 of 989 at seq 8192 (measured)
    # GPUs one NVLink domain joins (HGX boards: the node's 8; H200 NVL: bridges of 4; GB200 NVL72: 72);
    # collectives inside it run at intra_busbw_gbps, across it hierarchically over the NICs
    nvlink_domain: float = 8.0
    # the NIC per GPU (GB/s each way: NDR InfiniBand / 400G Ethernet = 50) and the fraction of it a
    # collective across nodes sustains (nccl-tests busbw / line rate: ~0.8 on InfiniBand, lower on RoCE);
    # 0 leaves the datasheet's measured inter_busbw_gbps in charge
    nic_gbps: float = 0.0
    nic_efficiency: float = 0.8
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


@dataclass(frozen=True)
class PricedGPU(EngineSwitches, EngineRates, GPU):
    """A GPU as an engine runs it: the GPU's figures, the engine's rates and switches, flat, as the cost
    model reads them."""


def priced(gpu: GPU, rates: EngineRates = EngineRates(), switches: EngineSwitches = ENGINE_KINDS[OURS].switches
           ) -> PricedGPU:
    """``gpu`` run by an engine with these rates and switches (default: this engine's)."""
    return PricedGPU(**{f.name: getattr(gpu, f.name) for f in dataclasses.fields(GPU)},
                     **dataclasses.asdict(rates), **dataclasses.asdict(switches))


GPU_FIELDS = tuple(f.name for f in dataclasses.fields(GPU))
ENGINE_FIELDS = tuple(f.name for f in dataclasses.fields(EngineRates) + dataclasses.fields(EngineSwitches))


def scale_host_time(gpu, scale: float):
    """The GPU (or engine rates) with every host-time constant (seconds, not the dimensionless factors)
    scaled: how fast a machine's CPUs issue ops differs between machines more than anything on the GPU side."""
    return dataclasses.replace(gpu, **{f.name: float(getattr(gpu, f.name) * scale) for f in dataclasses.fields(gpu)
                                       if f.name.startswith("host_") and "_s_per_" in f.name})


def _from_datasheet(key: str, **fields) -> GPU:
    return GPU(**dataclasses.asdict(DATASHEETS[key]), **fields)


def _cluster(gpu, **fields):
    """A GPU preset with its cluster's network: inter-node busbw from the NIC rate and its efficiency."""
    gpu = dataclasses.replace(gpu, **fields)
    return dataclasses.replace(gpu, inter_busbw_gbps=gpu.nic_gbps * gpu.nic_efficiency) if gpu.nic_gbps else gpu


GPUS: dict[str, GPU] = {
    # H200: GEMM and attention rates by shape from bench/kernel_rates.py (2026-11-30, plan/kernels.py)
    "h200": _from_datasheet("h200", kernel_table="h200", kernel_table_gemm_eff=0.80, pcie_gbps=52.0,
                            host_link_gpus=2),  # HGX topology: 2 GPUs per PCIe switch
    "h100": _from_datasheet("h100", host_link_gpus=2),  # the same HGX board
    "a100": _from_datasheet("a100", pcie_gbps=25.0),  # PCIe Gen4
    "b200": _from_datasheet("b200"),
}
# cluster presets: a GPU in its usual system, one NDR InfiniBand NIC per GPU, rail-optimized (HGX / DGX)
GPUS |= {
    "h100-sxm": _cluster(GPUS["h100"], nic_gbps=50.0, nic_efficiency=0.8),
    "h200-sxm": _cluster(GPUS["h200"], nic_gbps=50.0, nic_efficiency=0.8),
    # H200 NVL: PCIe cards joined by NVLink bridges in groups of up to 4 (900 GB/s per GPU), 600 W:
    # 3,341 dense fp8 / 1,671 bf16 TFLOP/s (NVIDIA's datasheet halves the 2:4-sparse figures), 4.8 TB/s
    # HBM (4.0 achievable, as the SXM's 4.8 -> 4.27 scaled); 400G Ethernet (RoCE) per GPU pair is common
    "h200-nvl": _cluster(dataclasses.replace(GPUS["h200"], name="NVIDIA H200 NVL", bf16_tflops=835.0,
                                             fp8_tflops=1671.0, hbm_tbps=4.0, kernel_table="", host_link_gpus=1),
                         nvlink_domain=4.0, nic_gbps=25.0, nic_efficiency=0.7),
    "b200-sxm": _cluster(GPUS["b200"], nic_gbps=50.0, nic_efficiency=0.8),
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
# this engine's rates on an H200, refitted with its kernel table on the runs the defaults were fitted to:
# compile's remaining elementwise share (7B LoRA compiled, 2.197 s), ring attention's slowdown (7B CP2)
# and one scale on the host constants (0.94, least squares over the 1B host-bound grid); every H200
# preset (SXM, NVL) runs at them, the other GPUs at the defaults
OUR_H200_RATES = scale_host_time(EngineRates(compile_other_factor=0.46, cp_attn_slowdown=2.12), 0.94)
# the GPUs as this engine runs them: what the cost model prices without --engine
PRESETS: dict[str, PricedGPU] = {key: priced(gpu, OUR_H200_RATES if key.split("-")[0] == "h200" else EngineRates())
                                 for key, gpu in GPUS.items()}


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


def preset_for_device(device_name: str) -> PricedGPU | None:
    """The preset for a device name such as 'NVIDIA H200' or 'NVIDIA H200 NVL' (None for unknown
    devices): the longest key that names it ('h200-nvl' beats 'h200'; the -sxm cluster presets are only
    chosen by name)."""
    key = parse_gpu_name(device_name).best_key(k for k in PRESETS if not k.endswith("-sxm"))
    return PRESETS[key] if key else None


def load_gpu(name_or_file: str) -> PricedGPU:
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
    fields = GPU_FIELDS + ENGINE_FIELDS
    bad = sorted(set(data) - set(fields))
    if bad:
        raise SpecError(f"--gpu {name_or_file!r}: unknown fields {bad}; valid: GPU {', '.join(GPU_FIELDS)}; "
                        f"this engine's rates and switches {', '.join(ENGINE_FIELDS)}")
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
