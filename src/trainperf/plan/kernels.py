"""Measured kernel rates by shape: the planner's GEMM and attention time when a table exists.

One flat efficiency per kind of work (a GEMM rate from an 8192^3 GEMM, an attention rate from one
sequence length) misses how much the rate moves with shape. Measured on an H200 (bench/kernel_rates.py,
2026-11-30): a 2048-token micro-batch through 1024-wide projections runs at 380 TFLOP/s, 8192 tokens
through 4096-wide ones at ~700; causal attention with 128-wide heads at 330 TFLOP/s at seq 2048 and
595 at seq 8192, but with 100-wide heads (no cuDNN kernel) at 100-200. The table is what
`python bench/kernel_rates.py` writes; a GPU preset or YAML file names it (``kernel_table``).

Lookups outside the measured shapes take the nearest measured shape in log space, smaller or
larger (rates change slowly with size once a GEMM fills the GPU). The sweep times contiguous
row-major products [M,K] @ [K,N]; the engine's GEMMs run the same shapes with a transposed operand
(x @ W^T; the weight gradient as g^T @ x), so the table is a proxy for their layouts.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

PACKAGED = Path(__file__).with_name("data")


def _read_packaged_or_file(name_or_path: str, packaged_suffix: str) -> dict:
    """The JSON of a packaged file by name (``h200`` -> data/h200{packaged_suffix}) or of a path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PACKAGED / f"{name_or_path}{packaged_suffix}"
    with open(path) as fh:
        return json.load(fh)


@functools.lru_cache(maxsize=8)
def load_table(name_or_path: str) -> "KernelTable":
    """A packaged table by name (``h200``) or a JSON file written by bench/kernel_rates.py."""
    return KernelTable(_read_packaged_or_file(name_or_path, "_kernels.json"))


class KernelTable:
    def __init__(self, raw: dict):
        self.device = raw.get("device", "?")
        self.gemm = {tuple(int(x) for x in key.split("x")): rate * 1e12
                     for key, rate in (raw.get("gemm_tflops") or {}).items()}
        self.attention = _attention_rates(raw.get("attention_tflops_fwd_bwd"))
        # hardware.attention=flash4's rates, where the table was measured with FlashAttention-4 installed
        self.attention_flash4 = _attention_rates(raw.get("attention_flash4_tflops_fwd_bwd"))
        if not self.gemm or not self.attention:
            raise ValueError("a kernel table needs gemm_tflops and attention_tflops_fwd_bwd entries")
        rates = [*self.attention.values(), *self.attention_flash4.values()]
        if min(self.gemm.values()) <= 0 or min(min(r) for r in rates) <= 0:
            raise ValueError("a kernel table's rates must be positive TFLOP/s")
        self._log_gemm = [(tuple(math.log(x) for x in shape), rate) for shape, rate in self.gemm.items()]
        self._memo: dict[tuple, float] = {}
        self._attention_memo: dict[tuple, tuple[float, float]] = {}

    def has_attention_kernel(self, kernel: str) -> bool:
        """Whether the table holds rates measured with ``kernel`` (``sdpa`` always)."""
        return kernel == "sdpa" or (kernel == "flash4" and bool(self.attention_flash4))

    def gemm_flops_per_s(self, m: float, k: float, n: float) -> float:
        """Rate of [m, k] @ [k, n] in bf16: the measured shape nearest in log space."""
        key = (m, k, n)
        rate = self._memo.get(key)
        if rate is None:  # a search ranks thousands of layouts over the same few shapes
            best = min(self._log_gemm, key=lambda e: sum(abs(a - math.log(b)) for a, b in zip(e[0], key)))
            rate = self._memo[key] = best[1]
        return rate

    def gemm_seconds(self, m: float, k: float, n: float) -> float:
        return 2.0 * m * k * n / self.gemm_flops_per_s(m, k, n)

    def attention_seconds(self, batch: float, heads: float, kv_heads: float, head_dim: int, seq: float,
                          backward: bool = True, kernel: str = "sdpa") -> float:
        """Causal attention over ``seq`` tokens of ``batch`` sequences with ``heads`` query heads: forward
        (+ backward) seconds; FLOPs counted as the table counts them (causal once, backward 2.5x).
        ``kernel``: hardware.attention; flash4 takes SDPA's rates where the table has none of its own."""
        measured = self.attention_flash4 if kernel == "flash4" and self.attention_flash4 else self.attention
        key = (heads, kv_heads, head_dim, seq, measured is self.attention)
        rates = self._attention_memo.get(key)
        if rates is None:
            ratio = heads / max(kv_heads, 1)

            def distance(s):
                h, kv, d, L = s
                return (4 * abs(math.log(d / head_dim)) + abs(math.log(L / seq)) + 0.5 * abs(math.log(h / heads))
                        + 0.25 * abs(math.log((h / kv) / ratio)))

            rates = self._attention_memo[key] = measured[min(measured, key=distance)]
        fwd_rate, bwd_rate = rates
        flops_fwd = 2.0 * seq * seq * head_dim * heads * batch  # 2 GEMMs x 2 FLOPs x s^2 d / 2 (causal)
        return flops_fwd / fwd_rate + (2.5 * flops_fwd / bwd_rate if backward else 0.0)


def _attention_rates(raw: dict | None) -> dict[tuple, tuple[float, float]]:
    """{(heads, kv_heads, head_dim, seq): (forward, backward) FLOP/s} from a table's TFLOP/s entries."""
    return {tuple(int(x) for x in key.split("x")): (fwd * 1e12, bwd * 1e12) for key, (fwd, bwd) in (raw or {}).items()}


@functools.lru_cache(maxsize=8)
def load_fp8_grid(name_or_path: str) -> "Fp8GemmGrid":
    """A packaged float8 grid by name (``h200``) or a JSON file written by bench/fp8_gemm_grid.py."""
    return Fp8GemmGrid(_read_packaged_or_file(name_or_path, "_fp8_gemm.json"))


class Fp8GemmGrid:
    """Tensorwise float8 GEMM rates on a full M x K x N grid: how fast a shape runs against the grid's
    best, interpolated linearly in log2 of each size between grid points and held at the edges (a
    flat efficiency prices a token-deep weight gradient or a projection split eight ways as fast as a
    large square GEMM; measured on an H200 they run 2-5% slower per FLOP, bench/fp8_gemm_grid.py)."""

    def __init__(self, raw: dict):
        self.device = raw.get("device", "?")
        self.sizes = sorted(int(s) for s in raw["sizes"])
        self.rate = {tuple(int(x) for x in key.split("x")): float(r) for key, r in raw["gemm_fp8_tflops"].items()}
        missing = [(m, k, n) for m in self.sizes for k in self.sizes for n in self.sizes if (m, k, n) not in self.rate]
        if missing or min(self.rate.values()) <= 0:
            raise ValueError(f"a float8 grid needs a positive rate at every size cubed ({len(missing)} missing)")
        self.best = max(self.rate.values())
        self._log = [math.log2(s) for s in self.sizes]
        self._memo: dict[tuple, float] = {}

    def _bracket(self, x: float) -> tuple[int, int, float]:
        """(lower index, upper index, weight of the upper) of log2(x) among the grid sizes, held at the edges."""
        lx = math.log2(max(x, 1.0))
        if lx <= self._log[0]:
            return 0, 0, 0.0
        if lx >= self._log[-1]:
            return len(self._log) - 1, len(self._log) - 1, 0.0
        i = next(j for j in range(1, len(self._log)) if lx <= self._log[j]) - 1
        return i, i + 1, (lx - self._log[i]) / (self._log[i + 1] - self._log[i])

    def relative(self, m: float, k: float, n: float) -> float:
        """The rate of [m, k] @ [k, n] as a share of the grid's best rate."""
        key = (m, k, n)
        if key not in self._memo:
            brackets = [self._bracket(x) for x in key]
            total = 0.0
            for corner in range(8):
                weight, idx = 1.0, []
                for axis, (lo, hi, w) in enumerate(brackets):
                    upper = corner >> axis & 1
                    weight *= w if upper else 1.0 - w
                    idx.append(hi if upper else lo)
                if weight:
                    total += weight * self.rate[tuple(self.sizes[i] for i in idx)]
            self._memo[key] = total / self.best
        return self._memo[key]
