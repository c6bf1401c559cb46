"""The fused LoRA kernel's layout of random numbers and mask records, as plain arithmetic (no torch):
what the kernels (model/lora_kernel.py, model/lora_triton.py), validation (specs) and the planner's
memory count (plan/costs.py) share.

Each Philox call yields SLOTS 16-bit half words; one half word decides one element for one adapter.
The n adapters reading one input take slots_per_element(n) half words per element, so a call decides
elements_per_call(n) elements. A row's columns come in column groups of SEGMENT x elements_per_call(n),
each drawn by one run of SEGMENT counters (model/lora_kernel.keep_masks has the exact mapping); the
forward records each slot's keep bits as one int32 per row and column group.
"""

from __future__ import annotations

WORD_BITS = 16  # one keep/drop decision per 16-bit half word
SLOTS = 8  # half words per Philox call; the forward packs one word of keep bits per slot, row and column group
SEGMENT = 32  # counters per run: a column group covers SEGMENT * elements_per_call columns
MAX_ADAPTERS = 4  # the adapters on one element share the eight half words of a Philox call: at most four


def drop_threshold(p: float) -> int:
    """A 16-bit half word >= this keeps its element."""
    return min(round(p * 2**WORD_BITS), 2**WORD_BITS - 1)


def keep_scale(p: float) -> float:
    """1 / (keep probability): the keep probability is 1 - threshold / 2**16 (p = 0.1: 0.899994), and
    scaling by its exact inverse keeps the expectation exact."""
    return 2**WORD_BITS / (2**WORD_BITS - drop_threshold(p))


def slots_per_element(n: int) -> int:
    """Half words one element takes for n adapters: n rounded up to a power of two (1, 2, 4, 4)."""
    return 1 if n == 1 else 2 if n == 2 else 4


def elements_per_call(n: int) -> int:
    """Elements one Philox call decides for all n adapters: 8, 4, 2, 2."""
    return SLOTS // slots_per_element(n)


def column_groups(width: int, n: int) -> int:
    """Column groups per row (the last one ragged when width is not a multiple)."""
    return -(-width // (SEGMENT * elements_per_call(n)))


def counters_per_row(width: int, n: int) -> int:
    return column_groups(width, n) * SEGMENT


def padded_width(width: int, n: int) -> int:
    """Columns the kernels draw for: whole column groups."""
    return counters_per_row(width, n) * elements_per_call(n)


def mask_record_bytes(width: int, n: int) -> int:
    """Bytes of keep bits the forward keeps per row of x for the backward: one int32 per slot and column
    group -- 1 bit per element for one adapter, 4 for three (two slots unused)."""
    return column_groups(width, n) * SLOTS * 4


def takes_rank(rank: int) -> bool:
    """Adapter ranks the kernels' tiles take: powers of two >= 16 (Triton's dots need 16 at least)."""
    return rank >= 16 and not rank & (rank - 1)
