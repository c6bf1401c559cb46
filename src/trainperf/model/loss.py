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


def shift_targets(input_ids: torch.Tensor, loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(labels, label_mask) aligned with the logits: position t predicts token t+1; the last position
    predicts nothing. Shifting before any sequence sharding (context parallel) keeps every pair whole."""
    labels = torch.zeros_like(input_ids)
    labels[:, :-1] = input_ids[:, 1:]
    label_mask = torch.zeros_like(loss_mask)
    label_mask[:, :-1] = loss_mask[:, 1:]
    return labels, label_mask


def label_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-position cross entropy [batch, seq] in fp32. Vocab-sharded logits (a DTensor under
    tensor parallel's loss_parallel) are reduced without gathering the vocabulary."""
    from torch.distributed.tensor import DTensor

    v = logits.shape[-1]
    ce = F.cross_entropy(logits.reshape(-1, v).float(), labels.reshape(-1), reduction="none")
    if isinstance(ce, DTensor):
        ce = ce.full_tensor()
    return ce.view(labels.shape)


def masked_loss_sum(logits: torch.Tensor, labels: torch.Tensor, label_mask: torch.Tensor) -> torch.Tensor:
    return (label_losses(logits, labels) * label_mask.to(torch.float32)).sum()


def row_loss_sums(logits: torch.Tensor, labels: torch.Tensor, label_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: (sum of target losses, number of targets) -- summable across sequence shards."""
    m = label_mask.to(torch.float32)
    return (label_losses(logits, labels) * m).sum(1), m.sum(1)


def train_loss_sum(logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    return masked_loss_sum(logits, *shift_targets(input_ids, loss_mask))


def per_sequence_loss(logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean loss over each sequence's targets [batch], whether the sequence has any target [batch])."""
    sums, n = row_loss_sums(logits, *shift_targets(input_ids, loss_mask))
    return sums / n.clamp(min=1), n > 0


def eval_loss_from_parts(per_seq: torch.Tensor, has_targets: torch.Tensor) -> float:
    """Reference definition on one process: unweighted mean of per-sequence means."""
    return float(per_seq[has_targets].mean())


def _chunk_loss_sum(head: torch.nn.Module, h: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (F.cross_entropy(head(h).float(), labels, reduction="none") * mask.to(torch.float32)).sum()


def chunked_loss_sum(head: torch.nn.Module, hidden: torch.Tensor, labels: torch.Tensor, label_mask: torch.Tensor,
                     chunk_tokens: int) -> torch.Tensor:
    """masked_loss_sum(head(hidden), ...) without ever holding the [tokens, vocab] logits (plus their
    fp32 copy and gradient) at once: the LM head and the cross entropy run on ``chunk_tokens`` tokens at
    a time under activation checkpointing, so backward recomputes one chunk's logits at a time. Costs
    one extra LM-head forward; saves ~10 bytes x vocab per token (9.8 GiB at 8192 tokens x 128k vocab)."""
    from torch.utils.checkpoint import checkpoint

    h = hidden.reshape(-1, hidden.shape[-1])
    lab, msk = labels.reshape(-1), label_mask.reshape(-1)
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for start in range(0, h.shape[0], chunk_tokens):
        end = start + chunk_tokens
        total = total + checkpoint(_chunk_loss_sum, head, h[start:end], lab[start:end], msk[start:end],
                                   use_reentrant=False)
    return total
