"""Naming a set of ranks by its parallel dimension. The mesh arithmetic (sizes, the groups of every
dim) is ``core.layout.Layout``'s; this module only compares a collective's ranks with those groups."""

from __future__ import annotations

import math

from trainperf.core.layout import FLATTENED, MESH_DIMS, Layout

Groups = dict[str, tuple[int, ...]]
GROUP_NAMES = MESH_DIMS + tuple(FLATTENED) + ("world",)  # single dims first, then flattened ones
FSDP_DIMS = ("dp_shard_cp", "dp_shard", "dp", "dp_cp")  # where FSDP's collectives run, first present wins


def resolve_mesh_sizes(parallel: dict, world: int) -> dict[str, int]:
    """{dim: size} from a spec's parallel section (dp_shard=-1 filled in from the world size)."""
    return Layout.from_sizes(parallel, world).sizes


def mesh_groups(sizes: dict[str, int], rank: int) -> Groups:
    """The ranks of ``rank``'s group along every mesh dim and flattened dim, plus 'world'."""
    return Layout.from_sizes(sizes, math.prod(int(v) for v in sizes.values())).groups(rank)


def label_group(ranks: tuple[int, ...] | None, groups: Groups) -> str | None:
    """The mesh dim whose group is exactly ``ranks``: a single dim first, then a flattened one."""
    if not ranks or not groups:
        return None
    want = tuple(sorted(ranks))
    for name in GROUP_NAMES:
        g = groups.get(name)
        if g is not None and len(g) > 1 and tuple(sorted(g)) == want:
            return name
    return None


def dims_of_size(n: int, groups: Groups) -> list[str]:
    """Distinct groups of size n (one name each, single dims first) -- candidates when only the size is known."""
    seen, out = set(), []
    for name in GROUP_NAMES:
        g = groups.get(name)
        if g is not None and len(g) == n and n > 1 and g not in seen:
            seen.add(g)
            out.append(name)
    return out


def infer_group(gsize: int | None, in_fsdp: bool, groups: Groups,
                fsdp_dims: tuple[str, ...] = FSDP_DIMS) -> tuple[str, tuple[int, ...] | None]:
    """(name, ranks) of the group a collective ran on when only its size is known (gloo traces):
    the one group of that size; inside an FSDP span, the shard dim; else the candidates, ambiguous."""
    if not groups:
        return (f"size {gsize}" if gsize else "?"), None
    cands = dims_of_size(gsize, groups) if gsize else [n for n in MESH_DIMS + tuple(FLATTENED)
                                                         if len(groups.get(n, ())) > 1]
    if in_fsdp:
        # FSDP's collectives run on the (flattened) shard dim; the same set may carry another name
        fsdp = [d for d in fsdp_dims if len(groups.get(d, ())) > 1 and (gsize is None or len(groups[d]) == gsize)]
        if fsdp:
            return label_group(groups[fsdp[0]], groups) or fsdp[0], groups[fsdp[0]]
    distinct = {groups[c] for c in cands}
    if len(distinct) == 1:
        return cands[0], groups[cands[0]]
    if cands:
        return "|".join(cands) + " (ambiguous)", None
    return (f"size {gsize}" if gsize else "?"), None
