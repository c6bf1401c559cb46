"""Bus-bandwidth factors of the collectives, as nccl-tests defines them (doc/PERFORMANCE.md of
nccl-tests): ``busbw = algbw * factor(n)`` for a group of n ranks, so that busbw is comparable with
the link's own bandwidth whatever the collective. The one definition that preflight, trace and any
other package use."""

from __future__ import annotations

ALL_REDUCE_KINDS = ("all_reduce",)  # every byte crosses the bus twice, less the rank's own share
SHARE_KINDS = ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter")  # once, less own share
WHOLE_BUFFER_KINDS = ("sendrecv", "send", "recv", "broadcast", "reduce")  # the buffer moves once


def busbw_factor(kind: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor of collective ``kind`` over ``n`` ranks: all-reduce 2(n-1)/n;
    all-gather, reduce-scatter, all-to-all, gather, scatter (n-1)/n; send/recv, broadcast, reduce 1.
    ValueError for a kind nccl-tests gives no factor."""
    if kind in ALL_REDUCE_KINDS:
        return 2.0 * (n - 1) / n
    if kind in SHARE_KINDS:
        return (n - 1) / n
    if kind in WHOLE_BUFFER_KINDS:
        return 1.0
    raise ValueError(f"unknown collective {kind!r}")
