"""Interval arithmetic on integer nanoseconds: half-open [start, end); a "merged" list is sorted,
disjoint and without empty intervals. Every time in trace analysis goes through these."""

from __future__ import annotations

from bisect import bisect_left, bisect_right

Interval = tuple[int, int]


def to_ns(us) -> int:
    """A trace's microsecond float as integer nanoseconds (rounded once, at load, so sums are exact)."""
    return int(round(float(us) * 1000.0))


def merge(intervals) -> list[Interval]:
    """Union of any intervals as a merged list; empty ones dropped, touching ones joined."""
    out: list[list[int]] = []
    for s, e in sorted((s, e) for s, e in intervals if e > s):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def total(merged: list[Interval]) -> int:
    return sum(e - s for s, e in merged)


def union(a: list[Interval], b: list[Interval]) -> list[Interval]:
    return merge(list(a) + list(b))


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Intersection of two merged lists (two-pointer sweep)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """a minus b, both merged."""
    out, j = [], 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            if cur >= e:
                break
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def clip(merged: list[Interval], lo: int, hi: int) -> list[Interval]:
    """The part of a merged list inside [lo, hi)."""
    if hi <= lo or not merged:
        return []
    starts = [s for s, _ in merged]
    i = max(bisect_right(starts, lo) - 1, 0)
    j = bisect_left(starts, hi)
    return [(max(s, lo), min(e, hi)) for s, e in merged[i:j] if min(e, hi) > max(s, lo)]


def holes(merged: list[Interval], lo: int, hi: int) -> list[Interval]:
    """The stretches of [lo, hi) that no interval of a merged list covers, in order."""
    cursor, out = lo, []
    for s, e in clip(merged, lo, hi):
        if s > cursor:
            out.append((cursor, s))
        cursor = max(cursor, e)
    if cursor < hi:
        out.append((cursor, hi))
    return out
