"""One definition of nccl-tests' bus-bandwidth factors (core.collectives), used by preflight and trace alike."""

from __future__ import annotations

import pytest

from trainperf.core.collectives import busbw_factor
from trainperf.preflight import checks
from trainperf.trace import collectives as trace_collectives


@pytest.mark.parametrize("n", [2, 3, 4, 8, 16])
def test_core_factors_are_nccl_tests(n):
    assert busbw_factor("all_reduce", n) == pytest.approx(2 * (n - 1) / n)
    for kind in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        assert busbw_factor(kind, n) == pytest.approx((n - 1) / n)
    for kind in ("sendrecv", "send", "recv", "broadcast", "reduce"):
        assert busbw_factor(kind, n) == 1.0
    with pytest.raises(ValueError):
        busbw_factor("barrier", n)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_preflight_and_trace_take_the_core_factor(n):
    for kind in checks.COLLECTIVES + ("sendrecv",):
        assert checks.busbw_factor(kind, n) == busbw_factor(kind, n)
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send"):
        assert trace_collectives.busbw_factor(kind, n) == busbw_factor(kind, n)


def test_trace_factor_of_a_lone_rank_or_a_kind_without_one():
    assert trace_collectives.busbw_factor("all_reduce", 1) == 0.0
    assert trace_collectives.busbw_factor("broadcast", 1) == 1.0
    assert trace_collectives.busbw_factor("barrier", 8) == 1.0
