"""Collectives in a trace: their kind, bytes and group, matched across ranks, and the collective
table. Bandwidths follow nccl-tests (algbw = S / t, busbw = algbw x ``core.collectives.busbw_factor``);
t is the *transfer* time, the shortest duration of the same collective over the ranks (TraceLens),
since a rank that arrives early spends the difference waiting: that wait is counted per rank."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, fields

from trainperf.core import collectives as nccl_tests

NS = 1e-9
P2P = ("send", "recv")
RING_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")  # move nothing in a group of one

_DTYPE_BYTES = {"float": 4, "float32": 4, "bfloat16": 2, "half": 2, "float16": 2, "double": 8, "float64": 8,
                "int": 4, "int32": 4, "long": 8, "int64": 8, "long int": 8, "short": 2, "int16": 2, "char": 1,
                "int8": 1, "byte": 1, "uint8": 1, "unsigned char": 1, "bool": 1, "signed char": 1,
                "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
                "complexfloat": 8, "complexdouble": 16}


def dtype_bytes(dtype: str | None) -> int | None:
    if not dtype:
        return None
    return _DTYPE_BYTES.get(dtype.lower().replace("c10::", "").replace("at::", "").strip())


def op_kind(name: str) -> str:
    """Normalised collective name from a 'Collective name', c10d op or gloo/nccl annotation."""
    n = name.lower().replace("c10d::", "").replace("gloo:", "").replace("nccl:", "").replace("_", "")
    for key, kind in (("reducescatter", "reduce_scatter"), ("allgather", "all_gather"), ("allreduce", "all_reduce"),
                      ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("barrier", "barrier"),
                      ("recvanysource", "recv"), ("send", "send"), ("recv", "recv"), ("gather", "gather"),
                      ("scatter", "scatter"), ("reduce", "reduce")):
        if key in n:
            return kind
    return name


def busbw_factor(kind: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor (``core.collectives``) for whatever a trace holds: a group of
    one moves nothing for the ring collectives (0), and a kind without a factor (a barrier) counts 1."""
    if n <= 1:
        return 0.0 if kind in RING_KINDS else 1.0
    try:
        return nccl_tests.busbw_factor(kind, n)
    except ValueError:
        return 1.0


def algo_bytes(kind: str, in_bytes: int, out_bytes: int) -> int:
    """S of nccl-tests: all-gather the total output, reduce-scatter the total input, else the buffer."""
    if kind in ("all_gather", "gather"):
        return out_bytes
    if kind in ("reduce_scatter", "scatter"):
        return in_bytes
    return max(in_bytes, out_bytes) if kind in ("broadcast", "reduce") else in_bytes


@dataclass
class Collective:
    """One collective call on one rank, in ns."""
    rank: int
    kind: str
    name: str
    start: int
    end: int
    in_bytes: int | None
    out_bytes: int | None
    dtype: str | None
    group_size: int | None
    pg_name: str | None
    ranks: tuple[int, ...] | None
    group: str  # the parallel dimension (or a description of the group)
    step: int | None = None

    @property
    def dur(self) -> int:
        return self.end - self.start

    @property
    def bytes(self) -> int | None:
        if self.in_bytes is None or self.out_bytes is None:
            return None
        return algo_bytes(self.kind, self.in_bytes, self.out_bytes)


@dataclass
class CollectiveRow:
    """One row of the summary's collective table: one kind of call on one group, over the ranks."""
    op: str
    group: str
    group_size: int | None
    dtype: str | None
    bytes: int | None
    in_bytes: int | None
    out_bytes: int | None
    ranks: int
    count_per_rank: float
    total_s_per_rank: float
    mean_s: float
    transfer_s: float
    wait_s: float
    algbw_gbps: float | None
    busbw_gbps: float | None

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


Matched = dict[tuple, list[Collective]]


def match_collectives(traces) -> Matched:
    """The same collective on every rank of its group: keyed by (group ranks or label, kind, i-th
    occurrence on that group). All ranks of a group issue its collectives in the same order.
    Point-to-point transfers stay unmatched (one rank each): they do not synchronise a group.
    Collectives outside the profiled steps are left out."""
    matched: Matched = defaultdict(list)
    for t in traces:
        seq: dict[tuple, int] = defaultdict(int)
        for c in sorted(t.collectives, key=lambda c: c.start):
            if c.step is None:
                continue
            gkey = (("p2p", c.rank), c.kind) if c.kind in P2P else (c.ranks or (c.group,), c.kind)
            matched[gkey + (seq[gkey],)].append(c)
            seq[gkey] += 1
    return matched


def _complete(cs: list[Collective]) -> bool:
    """Every rank of the group is in the match (so the fastest is a transfer time, not a lone rank)."""
    return len(cs) == (cs[0].group_size or len(cs)) and len(cs) > 1


def collective_waits(matched: Matched) -> tuple[dict[int, int], dict[int, int]]:
    """({rank: ns waited inside complete collectives}, {rank: how often it arrived last})."""
    wait_ns: dict[int, int] = defaultdict(int)
    arrived_last: dict[int, int] = defaultdict(int)
    for cs in matched.values():
        if _complete(cs):
            fastest = min(c.dur for c in cs)
            for c in cs:
                wait_ns[c.rank] += c.dur - fastest
            arrived_last[max(cs, key=lambda c: c.start).rank] += 1
    return wait_ns, arrived_last


def collective_table(matched: Matched) -> list[CollectiveRow]:
    """One row per (kind, group, size, dtype, bytes), the most time per rank first."""
    table: dict[tuple, dict] = {}
    for cs in matched.values():
        fastest = min(c.dur for c in cs)
        for c in cs:
            row_key = (c.kind, c.group, c.group_size, c.dtype, c.bytes, c.in_bytes, c.out_bytes)
            r = table.setdefault(row_key, {"calls": 0, "dur": 0, "transfer": 0, "ranks": set()})
            r["calls"] += 1
            r["dur"] += c.dur
            r["transfer"] += fastest
            r["ranks"].add(c.rank)
    rows = []
    for (kind, group, gsize, dtype, nbytes, in_b, out_b), r in table.items():
        nr = len(r["ranks"])
        mean_s = r["dur"] / r["calls"] * NS
        transfer_s = r["transfer"] / r["calls"] * NS
        algbw = nbytes / transfer_s / 1e9 if nbytes and transfer_s > 0 else None
        rows.append(CollectiveRow(
            op=kind, group=group, group_size=gsize, dtype=dtype, bytes=nbytes, in_bytes=in_b, out_bytes=out_b,
            ranks=nr, count_per_rank=r["calls"] / nr, total_s_per_rank=r["dur"] / nr * NS, mean_s=mean_s,
            transfer_s=transfer_s, wait_s=mean_s - transfer_s, algbw_gbps=algbw,
            busbw_gbps=algbw * busbw_factor(kind, gsize or 1) if algbw is not None and gsize else None))
    rows.sort(key=lambda r: -r.total_s_per_rank)
    return rows


def comm_by_group(rows: list[CollectiveRow], steps_per_rank: list[int]) -> dict[str, dict]:
    """Per parallel dimension, per step: time in its collectives, transfer time, bytes and calls."""
    n_steps = max(statistics.mean(steps_per_rank), 1) if steps_per_rank else 1
    by_group: dict[str, dict] = {}
    for c in rows:
        g = by_group.setdefault(str(c.group), {"comm_s_per_step": 0.0, "transfer_s_per_step": 0.0,
                                               "bytes_per_step": 0, "calls_per_step": 0.0})
        g["comm_s_per_step"] += c.total_s_per_rank / n_steps
        g["transfer_s_per_step"] += c.transfer_s * c.count_per_rank / n_steps
        g["bytes_per_step"] += (c.bytes or 0) * c.count_per_rank / n_steps
        g["calls_per_step"] += c.count_per_rank / n_steps
    return by_group
