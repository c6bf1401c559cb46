"""The GPUs trainperf knows: datasheet figures, one table.

Peaks are dense (no 2:4 sparsity: the H100/H200 SXM's 1,979 bf16 TFLOP/s assumes it). Bus bandwidths
are nccl-tests busbw per GPU, what a collective sustains: inside a node over NVLink, across nodes over
the NICs. MFU divides by ``bf16_tflops``; the planner (``plan.hardware``) adds the engine's measured
efficiencies to these.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Datasheet:
    name: str
    bf16_tflops: float  # dense peak
    fp8_tflops: float
    hbm_gib: float  # usable device memory
    hbm_tbps: float  # achievable HBM copy bandwidth, TB/s (bytes read + written)
    intra_busbw_gbps: float  # busbw inside a node (NVLink), GB/s per GPU
    inter_busbw_gbps: float  # busbw across nodes (NIC), GB/s per GPU

    @property
    def peak_flops(self) -> float:
        """Dense bf16 peak, FLOP/s: what MFU divides by."""
        return self.bf16_tflops * 1e12


# Rows without a planner preset (plan.hardware) serve the MFU peak; their bandwidths are datasheet
# figures, not measured. Keys are matched against device names ('NVIDIA H200', 'NVIDIA H100 80GB HBM3') by
# parse_gpu_name: the model, then the longest key whose other words appear in the name ('h100 pcie' beats 'h100')
DATASHEETS: dict[str, Datasheet] = {
    "h200": Datasheet("NVIDIA H200 SXM", 989, 1979, 139, 4.27, 277, 40),
    "h100": Datasheet("NVIDIA H100 SXM", 989, 1979, 79, 3.0, 277, 40),
    "h100 pcie": Datasheet("NVIDIA H100 PCIe", 756, 1513, 79, 1.8, 0, 40),
    "h100 nvl": Datasheet("NVIDIA H100 NVL", 835, 1671, 93, 3.4, 0, 40),
    "a100": Datasheet("NVIDIA A100 SXM 80GB", 312, 0, 79, 1.7, 150, 20),
    "b200": Datasheet("NVIDIA B200", 2250, 4500, 178, 7.0, 550, 40),
    "gb200": Datasheet("NVIDIA GB200", 2500, 5000, 184, 7.2, 550, 40),
}

# Dense bf16 peak per GPU, FLOP/s, by the same keys.
PEAK_BF16_FLOPS = {key: sheet.peak_flops for key, sheet in DATASHEETS.items()}


# a GPU model in a device, system or file name: 'NVIDIA H200-SXM5-141GB', 'DGXH100', 'config_XE9680L_B200.sh',
# 'AMD Instinct MI300X' (Grace Blackwell / Grace Hopper superchips before their B / H parts)
GPU_MODEL = re.compile(r"GB\d00|GH\d00|MI\d{3}X|[ABHV]\d00")
# the generation of each GPU model (what a submission's config file name may say beside its system's)
GPU_GENERATIONS = {"H100": "hopper", "H200": "hopper", "GH200": "hopper", "B200": "blackwell", "GB200": "blackwell",
                   "B300": "blackwell", "GB300": "blackwell", "MI300X": "cdna3", "MI325X": "cdna3", "MI355X": "cdna4"}
# models whose datasheet row is another's: GH200's GPU is an H200-class Hopper die (989 dense bf16 TFLOP/s)
DATASHEET_OF_MODEL = {"GH200": "h200"}


@dataclass(frozen=True)
class GpuName:
    """A device name, parsed once: its GPU model ('H200'; None when it names none) and its words
    ('nvidia', 'h200', 'nvl'), which tell variants of one model apart (PCIe, NVL)."""

    model: str | None
    words: frozenset[str]

    def matches(self, key: str) -> bool:
        """Whether a table key such as 'h100 pcie' or 'h200-nvl' names this GPU: its first word is the
        model, the others are words of the name."""
        first, *rest = re.split(r"[\s-]+", key.lower())
        return self.model is not None and first == self.model.lower() and set(rest) <= self.words

    def best_key(self, keys) -> str | None:
        """The longest of ``keys`` that names this GPU ('h100 pcie' beats 'h100'), None when none does."""
        found = [k for k in keys if self.matches(k)]
        return max(found, key=len) if found else None


def parse_gpu_name(name: str | None) -> GpuName:
    """The one reader of GPU names: every module that asks which GPU a name means asks this."""
    found = GPU_MODEL.findall((name or "").upper())
    return GpuName(found[0] if found else None, frozenset(re.findall(r"[a-z0-9]+", (name or "").lower())))


def gpu_model(name: str | None) -> str | None:
    """The GPU model a name mentions ('NVIDIA H200-SXM5-141GB' -> 'H200'), None when it names none."""
    return parse_gpu_name(name).model


def gpu_generation(name: str | None) -> str | None:
    """The generation of the GPU a name mentions (config_XE9680L_B200.sh: blackwell), None if unknown."""
    return GPU_GENERATIONS.get(gpu_model(name) or "")


def datasheet_key(device_name: str) -> str | None:
    """The DATASHEETS key for a device name such as 'NVIDIA H200' (None when unknown)."""
    parsed = parse_gpu_name(device_name)
    if parsed.model in DATASHEET_OF_MODEL:
        return DATASHEET_OF_MODEL[parsed.model]
    return parsed.best_key(DATASHEETS)


def peak_flops_for(device_name: str) -> float | None:
    """Peak dense bf16 FLOP/s from a device name such as 'NVIDIA H200' (None when unknown)."""
    key = datasheet_key(device_name)
    return PEAK_BF16_FLOPS[key] if key else None
