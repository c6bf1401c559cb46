"""The MLPerf Training benchmarks trainperf knows, one `Benchmark` (trainperf.mlperf.benchmark) each, in
the order the CLI lists them. Adding one: its module here, its line below, its tests (docs/ARCHITECTURE.md)."""

from __future__ import annotations

from trainperf.core.errors import SpecError
from trainperf.core.spec import RunSpec
from trainperf.mlperf.benchmark import Benchmark
from trainperf.mlperf.benchmarks import deepseekv3_671b, gpt3, gpt_oss_20b, llama2_70b_lora, llama31_8b, llama31_405b

BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in (
    llama2_70b_lora.BENCHMARK,
    llama31_8b.BENCHMARK,
    gpt3.BENCHMARK,
    llama31_405b.BENCHMARK,
    gpt_oss_20b.BENCHMARK,
    deepseekv3_671b.BENCHMARK,
)}
# the result summarizer drops the fastest and slowest of every benchmark's runs but unet3d's (4 of 40),
# whatever benchmark a log names
OTHER_DROPPED_RUNS = {"unet3d": 4}


def find(name: str | None) -> Benchmark | None:
    """The benchmark of that submission_benchmark, None for one trainperf has no rules of."""
    return BENCHMARKS.get(name or "")


def benchmark(name: str) -> Benchmark:
    """The benchmark of that name, else a one-line SpecError naming the known ones."""
    found = find(name)
    if found is None:
        raise SpecError(f"unknown MLPerf benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    return found


def of_run(spec: RunSpec) -> Benchmark | None:
    """The benchmark whose reference workload this run is (its workload is the benchmark's own), else None:
    a mini workload borrowing a benchmark's log name has no closed rules, recipe or RCPs of its own."""
    found = find(spec.mlperf.benchmark)
    return found if found is not None and spec.workload == found.name else None


def runnable() -> dict[str, Benchmark]:
    """The benchmarks whose model trainperf builds (a workload runs them, an imported run is priced)."""
    return {name: b for name, b in BENCHMARKS.items() if b.runnable}


def rcp_unit(name: str | None) -> str:
    """What the benchmark's RCPs count progress in: samples unless its instance says tokens."""
    found = find(name)
    return found.rcp_unit if found else "samples"


def dropped_runs(name: str | None) -> int:
    """How many fastest (and slowest) runs the olympic mean of the benchmark drops."""
    found = find(name)
    return found.dropped_runs if found else OTHER_DROPPED_RUNS.get(name or "", 1)
