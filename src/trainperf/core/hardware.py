"""The GPUs trainperf knows: datasheet figures, one table.

Peaks are dense (no 2:4 sparsity: the H100/H200 SXM's 1,979 bf16 TFLOP/s assumes it). Bus bandwidths
are nccl-tests busbw per GPU, what a collective sustains: inside a node over NVLink, across nodes over
the NICs. MFU divides by ``bf16_tflops``; the planner (``plan.hardware``) adds the engine's measured
efficiencies to these.
"""

from __future__ import annotations

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
# figures, not measured. Keys are matched against device names ('NVIDIA H200', 'NVIDIA H100 80GB HBM3'): the longest key
# whose words all appear in the name wins, so 'h100 pcie' beats 'h100'
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


def datasheet_key(device_name: str) -> str | None:
    """The DATASHEETS key for a device name such as 'NVIDIA H200' (None when unknown)."""
    n = device_name.lower()
    for key in sorted(DATASHEETS, key=len, reverse=True):
        if all(part in n for part in key.split()):
            return key
    return None


def peak_flops_for(device_name: str) -> float | None:
    """Peak dense bf16 FLOP/s from a device name such as 'NVIDIA H200' (None when unknown)."""
    key = datasheet_key(device_name)
    return PEAK_BF16_FLOPS[key] if key else None
