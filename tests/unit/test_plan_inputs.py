"""`plan`'s own inputs: a bad --samples, --gpus or --gpus-per-node is one line on stderr, exit 2, before
any search; the search itself is bounded (MAX_GPUS) so no count runs for minutes."""

from __future__ import annotations

import time

import pytest
from trainperf.core.errors import SpecError
from trainperf.plan.search import MAX_GPUS, MAX_GPUS_PER_NODE, check_scale, divisors

from tests.fixtures.cli import run_cli


@pytest.mark.parametrize("gpus, per_node, needle", [
    (0, 8, "--gpus 0"), (-8, 8, "--gpus -8"), (100_000_000, 8, f"1 to {MAX_GPUS:,}"), (MAX_GPUS + 8, 8, "--gpus"),
    (16, 0, "--gpus-per-node 0"), (16, 99_999_999_999, "--gpus-per-node 99999999999"),
    (16, MAX_GPUS_PER_NODE + 1, f"1 to {MAX_GPUS_PER_NODE}"), (20, 8, "whole number of nodes"),
])
def test_scale_out_of_range_is_one_line(gpus, per_node, needle):
    with pytest.raises(SpecError) as exc:
        check_scale(gpus, per_node)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_scale_in_range_passes():
    for gpus, per_node in ((1, 1), (4, 8), (MAX_GPUS, 8), (72, 72), (16, MAX_GPUS_PER_NODE)):
        check_scale(gpus, per_node)


def test_divisors_of_a_large_count_are_quick_and_complete():
    t0 = time.perf_counter()
    got = divisors(MAX_GPUS)
    assert got == [2 ** k for k in range(18)]
    assert divisors(11_616) == [k for k in range(1, 11_617) if 11_616 % k == 0]
    assert divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36] and divisors(1) == [1]
    assert time.perf_counter() - t0 < 0.5


@pytest.mark.parametrize("args, needle", [
    (["--samples", "inf"], "--samples is inf; give a finite number"),
    (["--samples", "1e400"], "--samples is 1e400; give a finite number"),
    (["--samples", "nan"], "give a finite number"),
    (["--samples", "0"], "above 0"),
    (["--samples", "ten"], "give a number"),
    (["--gpus-per-node", "0"], "--gpus-per-node 0"),
    (["--gpus-per-node", "99999999999"], "--gpus-per-node 99999999999"),
    (["--gpus", "100000000"], f"1 to {MAX_GPUS:,}"),
])
def test_plan_cli_refuses_in_one_line_before_any_search(tmp_path, args, needle):
    argv = ["plan", "llama2_70b_lora", "--db", str(tmp_path / "t.db")]
    argv += args if "--gpus" in args else ["--gpus", "16", *args]
    t0 = time.perf_counter()
    out = run_cli(*argv, cwd=tmp_path, timeout=60)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], out.stderr
    assert time.perf_counter() - t0 < 30 and not (tmp_path / "t.db").exists()
