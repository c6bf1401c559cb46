"""A mixture-of-experts feed-forward block: top-k router, dropless dispatch, grouped experts.

The tokens of one micro-batch are routed (each to its ``top_k`` experts), sorted by expert, run
through every expert's SwiGLU as one grouped GEMM over the sorted rows (``torch._grouped_mm`` on a
GPU that has it; a loop over the experts' row blocks elsewhere: CPU has no grouped-GEMM backward),
then weighted by their router scores and summed back in token order. No token is dropped and no
capacity factor pads anything.

Expert parallelism (parallel/expert_parallel.py) replaces ``GroupedExperts.dispatcher``: the
sorted rows and per-expert counts go through it before the GEMMs and back after, so the same
module runs with all experts local or with each rank holding ``num_experts / ep`` of them.

Parameter names and shapes are Hugging Face ``GptOssMLP``'s:

    router.weight            [experts, hidden]     router.bias          [experts]
    experts.gate_up_proj     [experts, hidden, 2*ffn]   (gate and up interleaved along the last dim)
    experts.gate_up_proj_bias [experts, 2*ffn]
    experts.down_proj        [experts, ffn, hidden]     experts.down_proj_bias [experts, hidden]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class TopKRouter(nn.Module):
    """gpt-oss scoring: a linear layer with bias gives each token a logit per expert; the token goes
    to its ``top_k`` highest, weighted by a softmax over those k logits alone."""

    def __init__(self, hidden: int, num_experts: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.weight = nn.Parameter(torch.empty(num_experts, hidden))
        self.bias = nn.Parameter(torch.empty(num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [tokens, hidden] -> (logits [tokens, experts], scores [tokens, k], experts [tokens, k])."""
        logits = F.linear(x, self.weight, self.bias)
        top, idx = torch.topk(logits, self.top_k, dim=-1)
        return logits, torch.softmax(top, dim=-1), idx


def routing_balance(logits: torch.Tensor, chosen: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's (share of tokens routed to each expert, mean router probability of each expert),
    the two factors of the load-balancing loss; only the probabilities carry a gradient."""
    probs = torch.softmax(logits.float(), dim=-1)
    counts = torch.zeros(num_experts, device=logits.device, dtype=torch.float32)
    counts.index_add_(0, chosen.reshape(-1), torch.ones(chosen.numel(), device=logits.device))
    return counts / logits.shape[0], probs.mean(dim=0)


def load_balancing_loss(balances: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Switch Transformer's auxiliary loss as transformers computes it for a whole model: experts x
    sum_e (token share of e, averaged over layers) x (router probability of e, averaged over layers).
    k for a perfectly even router (1 with top-1)."""
    shares = torch.stack([b[0] for b in balances]).mean(dim=0)
    probs = torch.stack([b[1] for b in balances]).mean(dim=0)
    return shares.numel() * torch.sum(shares * probs)


def clamped_swiglu(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """gpt-oss's activation: gate and up interleaved (even and odd columns), the gate clamped from
    above and up both ways at ``limit``, then (up + 1) x gate x sigmoid(alpha x gate)."""
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def grouped_mm(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor, counts_list: list[int] | None) -> torch.Tensor:
    """x [rows sorted by expert, in] @ w [experts, in, out], row block e with expert e.
    ``counts_list``: the same counts on the host (the loop needs them; the GPU kernel reads ``counts``)."""
    # the kernel wants bf16 and 16-byte-aligned rows (a multiple of 8 bf16 values on both sides)
    if x.is_cuda and x.dtype == torch.bfloat16 and w.dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm") \
            and x.shape[1] % 8 == 0 and w.shape[2] % 8 == 0:
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        return torch._grouped_mm(x, w, offs=offs)
    blocks = x.split(counts_list if counts_list is not None else counts.tolist(), dim=0)
    return torch.cat([b @ w[e] for e, b in enumerate(blocks)], dim=0)


class _ScaleGrad(torch.autograd.Function):
    """The identity forward; the gradient times a constant backward."""

    @staticmethod
    def forward(ctx, x, factor: float):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def local_dispatch(x: torch.Tensor, counts: torch.Tensor, experts_fn):
    """All experts on this rank: the sorted rows go straight to the GEMMs."""
    return experts_fn(x, counts, None)


class GroupedExperts(nn.Module):
    """Every expert's clamped SwiGLU, with biases, as grouped GEMMs over rows sorted by expert."""

    def __init__(self, num_experts: int, hidden: int, ffn: int, alpha: float, limit: float):
        super().__init__()
        self.num_experts, self.alpha, self.limit = num_experts, alpha, limit
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, hidden, 2 * ffn))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(num_experts, 2 * ffn))
        self.down_proj = nn.Parameter(torch.empty(num_experts, ffn, hidden))
        self.down_proj_bias = nn.Parameter(torch.empty(num_experts, hidden))
        # (rows, counts per expert, fn) -> rows: expert parallelism's all-to-all replaces it
        self.dispatcher = local_dispatch
        # factor on the weights' gradients: expert parallel's FSDP2 group is smaller than the other
        # parameters' (parallel/expert_parallel.py), so its average needs this to divide alike
        self.grad_scale = 1.0

    def _weights(self):
        from torch.distributed.tensor import DTensor

        # under expert parallelism each rank's local block holds its own experts
        ws = [w.to_local() if isinstance(w, DTensor) else w
              for w in (self.gate_up_proj, self.gate_up_proj_bias, self.down_proj, self.down_proj_bias)]
        return ws if self.grad_scale == 1.0 else [_ScaleGrad.apply(w, self.grad_scale) for w in ws]

    def compute(self, x: torch.Tensor, counts: torch.Tensor, counts_list: list[int] | None) -> torch.Tensor:
        """x: rows sorted by local expert; counts: rows per local expert."""
        w1, b1, w2, b2 = self._weights()
        # one bias row per input row: the expert index of each row, from the counts
        expert_of_row = torch.repeat_interleave(torch.arange(w1.shape[0], device=x.device), counts,
                                                output_size=x.shape[0])
        h = grouped_mm(x, w1, counts, counts_list) + b1[expert_of_row]
        h = clamped_swiglu(h, self.alpha, self.limit)
        return grouped_mm(h, w2, counts, counts_list) + b2[expert_of_row]

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return self.dispatcher(x, counts, self.compute)


class MoE(nn.Module):
    """Route, sort by expert, run the experts, weight and sum back. ``balance`` holds the last
    forward's routing_balance (in the graph), which ``model_aux_loss`` combines over the layers."""

    def __init__(self, hidden: int, ffn: int, num_experts: int, top_k: int, alpha: float, limit: float):
        super().__init__()
        self.num_experts, self.top_k = num_experts, top_k
        self.router = TopKRouter(hidden, num_experts, top_k)
        self.experts = GroupedExperts(num_experts, hidden, ffn, alpha, limit)
        self.balance: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits, scores, chosen = self.router(x)
        self.balance = routing_balance(logits, chosen, self.num_experts)
        flat = chosen.reshape(-1)
        order = torch.argsort(flat, stable=True)  # slot order sorted by expert; ties keep token order
        counts = torch.bincount(flat, minlength=self.num_experts)
        token_of_slot = order // self.top_k
        out = self.experts(x[token_of_slot], counts)
        out = out * scores.reshape(-1)[order].unsqueeze(-1).to(out.dtype)
        y = torch.zeros_like(x).index_add_(0, token_of_slot, out.to(x.dtype))
        return y.reshape(shape)


def model_aux_loss(model: nn.Module) -> torch.Tensor | None:
    """The load-balancing loss of the model's last forward over all its MoE layers; None for a model
    without MoE layers (or before any forward)."""
    balances = [m.balance for m in model.modules() if isinstance(m, MoE) and m.balance is not None]
    return load_balancing_loss(balances) if balances else None
