"""Loss definitions.

Training: token-mean cross entropy over the global batch's loss-masked targets. Each micro-batch
contributes sum(token losses) / (target tokens in the whole global batch), so accumulating
micro-batches and summing over data-parallel ranks gives exactly the global token mean.

Eval (MLPerf llama2_70b_lora): for every sequence, the mean loss over its masked target tokens; the
eval loss is the unweighted mean of those over sequences (sequences with no targets are skipped).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def token_losses(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Per-position next-token loss [batch, seq-1]: logits at t predict token t+1. fp32 softmax."""
    v = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, v).float(), input_ids[:, 1:].reshape(-1),
                           reduction="none").view(input_ids.shape[0], -1)


def target_mask(loss_mask: torch.Tensor) -> torch.Tensor:
    """loss_mask[t] marks token t as a target; align with token_losses (targets 1..seq-1)."""
    return loss_mask[:, 1:]


def train_loss_sum(logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    m = target_mask(loss_mask).to(torch.float32)
    return (token_losses(logits, input_ids) * m).sum()


def per_sequence_loss(logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean loss over each sequence's targets [batch], whether the sequence has any target [batch])."""
    m = target_mask(loss_mask).to(torch.float32)
    n = m.sum(1)
    per_seq = (token_losses(logits, input_ids) * m).sum(1) / n.clamp(min=1)
    return per_seq, n > 0


def eval_loss_from_parts(per_seq: torch.Tensor, has_targets: torch.Tensor) -> float:
    """Reference definition on one process: unweighted mean of per-sequence means."""
    return float(per_seq[has_targets].mean())
