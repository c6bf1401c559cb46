"""Which rows each rank reads at each step: a function of (seed, step, layout) only.

The global batch of step s is sample positions [s*GBS, (s+1)*GBS) of an endless stream made of
per-epoch shuffles of the training rows; data-parallel rank r takes the r-th contiguous slice of
it, cut into micro-batches. The global batch is therefore the same for every layout, which is what
makes an N-process run reproduce a 1-process run step for step.
"""

from __future__ import annotations

import torch


class GlobalBatchSampler:
    def __init__(self, num_rows: int, global_batch_size: int, seed: int):
        self.num_rows, self.gbs, self.seed = num_rows, global_batch_size, seed
        self._perms: dict[int, torch.Tensor] = {}

    def _perm(self, epoch: int) -> torch.Tensor:
        if epoch not in self._perms:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perms = {epoch: torch.randperm(self.num_rows, generator=g)}  # keep one epoch in memory
        return self._perms[epoch]

    def global_batch(self, step: int) -> torch.Tensor:
        """Row indices of the global batch for a 0-based step."""
        pos = torch.arange(step * self.gbs, (step + 1) * self.gbs)
        rows = torch.empty_like(pos)
        for epoch in pos.div(self.num_rows, rounding_mode="floor").unique().tolist():
            sel = pos.div(self.num_rows, rounding_mode="floor") == epoch
            rows[sel] = self._perm(epoch)[pos[sel] % self.num_rows]
        return rows

    def local_micro_batches(self, step: int, dp_rank: int, dp_size: int, micro_batch_size: int) -> list[torch.Tensor]:
        return split_local(self.global_batch(step), dp_rank, dp_size, micro_batch_size)


def split_local(rows: torch.Tensor, dp_rank: int, dp_size: int, micro_batch_size: int) -> list[torch.Tensor]:
    """This data-parallel rank's contiguous slice of a global batch, cut into micro-batches."""
    per_rank = len(rows) // dp_size
    return list(rows[dp_rank * per_rank:(dp_rank + 1) * per_rank].split(micro_batch_size))


def eval_shards(num_rows: int, dp_rank: int, dp_size: int, batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Validation rows for one rank as (row indices, weight) batches. Every rank runs the same number
    of batches -- FSDP needs every rank in every forward -- so short ranks repeat row 0 at weight 0."""
    per_rank = -(-num_rows // dp_size)
    per_rank = -(-per_rank // batch_size) * batch_size
    idx = torch.arange(dp_rank * per_rank, (dp_rank + 1) * per_rank)
    weight = (idx < num_rows).to(torch.float64)
    idx = torch.where(idx < num_rows, idx, torch.zeros_like(idx))
    return list(zip(idx.split(batch_size), weight.split(batch_size)))
