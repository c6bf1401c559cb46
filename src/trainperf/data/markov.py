"""A source of text whose best achievable loss is known exactly: a first-order Markov chain.

Each token's successor distribution puts its mass on a few tokens (Dirichlet weights), so a small
decoder can learn it in seconds. Because the chain is first-order, no model can beat the true
transition probabilities: the Bayes-optimal loss of a dataset is computed exactly from them, which
is what the synthetic workloads set their targets against.
"""

from __future__ import annotations

import torch

from trainperf.data.tokens import TokenSplit


class MarkovSource:
    def __init__(self, vocab_size: int, branching: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        probs = torch.zeros(vocab_size, vocab_size, dtype=torch.float64)
        for i in range(vocab_size):
            succ = torch.randperm(vocab_size, generator=g)[:branching]
            w = -torch.rand(branching, generator=g, dtype=torch.float64).log()  # Dirichlet(1, ..., 1)
            probs[i, succ] = w / w.sum()
        self.vocab_size = vocab_size
        self.probs = probs

    def with_rows_redrawn(self, rows: list[int], seed: int, branching: int) -> MarkovSource:
        """A different source: the successor distributions of ``rows`` are drawn afresh."""
        other = MarkovSource.__new__(MarkovSource)
        other.vocab_size, other.probs = self.vocab_size, self.probs.clone()
        g = torch.Generator().manual_seed(seed)
        for i in rows:
            other.probs[i] = 0
            succ = torch.randperm(self.vocab_size, generator=g)[:branching]
            other.probs[i, succ] = torch.rand(branching, generator=g, dtype=torch.float64) + 0.5
            other.probs[i] /= other.probs[i].sum()
        return other

    def stationary(self) -> torch.Tensor:
        pi = torch.full((self.vocab_size,), 1.0 / self.vocab_size, dtype=torch.float64)
        for _ in range(2000):
            pi = pi @ self.probs
        return pi / pi.sum()

    def entropy_rate(self) -> float:
        """Expected per-token loss of the Bayes-optimal predictor (nats), at stationarity."""
        p = self.probs
        row_h = -(torch.where(p > 0, p * p.log(), torch.zeros_like(p))).sum(1)
        return float(self.stationary() @ row_h)

    def sample(self, rows: int, seq_len: int, seed: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        out = torch.empty(rows, seq_len, dtype=torch.int64)
        out[:, 0] = torch.multinomial(self.stationary().float(), rows, replacement=True, generator=g)
        cum = self.probs.float()
        for t in range(1, seq_len):
            out[:, t] = torch.multinomial(cum[out[:, t - 1]], 1, generator=g).squeeze(1)
        return out

    def optimal_loss(self, split: TokenSplit) -> float:
        """Exact Bayes-optimal eval loss of a split under the eval-loss definition used for
        training (mean over rows of each row's mean loss over its masked target tokens)."""
        ids, mask = split.input_ids, split.loss_mask
        nll = -self.probs[ids[:, :-1], ids[:, 1:]].log()
        m = mask[:, 1:].double()
        per_row = (nll * m).sum(1) / m.sum(1).clamp(min=1)
        keep = m.sum(1) > 0
        return float(per_row[keep].mean())


def prompt_answer_mask(rows: int, seq_len: int, prompt_len: int) -> torch.Tensor:
    """Fine-tuning layout: the first ``prompt_len`` tokens are context, the rest are answer targets."""
    mask = torch.zeros(rows, seq_len, dtype=torch.bool)
    mask[:, prompt_len:] = True
    return mask
