"""gpt-oss (OpenAI's open-weight MoE decoder) as Hugging Face ``GptOssForCausalLM`` computes it.

Per layer: RMSNorm, grouped-query attention with biases on q/k/v/o and one learned attention sink
per head (an extra logit every query's softmax includes, whose probability mass is dropped), then
RMSNorm and a mixture of experts (model/moe.py: top-k router scored by a softmax over the k
chosen logits, clamped SwiGLU experts). Even layers (0, 2, ...) attend within a sliding window of
``sliding_window`` tokens, odd layers to the whole causal prefix. RoPE is YaRN-scaled (``rope_factor``
over ``rope_original_max_positions``) with transformers' attention factor on cos/sin.

Parameter names and shapes are those of Hugging Face's ``GptOssForCausalLM`` state dict:

    model.embed_tokens.weight                              [vocab, hidden]
    model.layers.{i}.input_layernorm.weight                [hidden]
    model.layers.{i}.self_attn.{q,k,v}_proj.{weight,bias}  [heads*head_dim | kv_heads*head_dim, hidden]
    model.layers.{i}.self_attn.o_proj.{weight,bias}        [hidden, heads*head_dim]
    model.layers.{i}.self_attn.sinks                       [heads]
    model.layers.{i}.post_attention_layernorm.weight       [hidden]
    model.layers.{i}.mlp.router.{weight,bias}              [experts, hidden], [experts]
    model.layers.{i}.mlp.experts.gate_up_proj{,_bias}      [experts, hidden, 2*ffn], [experts, 2*ffn]
    model.layers.{i}.mlp.experts.down_proj{,_bias}         [experts, ffn, hidden], [experts, hidden]
    model.norm.weight                                      [hidden]
    lm_head.weight                                         [vocab, hidden]

so a bf16/fp32 safetensors checkpoint of that layout loads by name (MXFP4-quantised expert blocks,
as the original release ships them, are not read).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from trainperf.core.spec import ModelSpec
from trainperf.model.family_modules import FamilyModules
from trainperf.model import llama
from trainperf.model.llama import param_generator
from trainperf.model.loss import chunked_loss_sum
from trainperf.model.moe import MoE
from trainperf.model.options import ModelOptions


class RMSNorm(llama.RMSNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # gpt-oss scales in fp32 and casts afterwards (Llama casts before the scale)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * x32).to(x.dtype)


def yarn_inv_freq(cfg: ModelSpec) -> tuple[torch.Tensor, float]:
    """RoPE inverse frequencies and the cos/sin factor: YaRN (arXiv 2309.00071) as transformers computes
    it with truncate=false (gpt-oss's setting); plain RoPE and factor 1 when rope_factor is 1."""
    dim, base, factor = cfg.head_dim, cfg.rope_theta, cfg.rope_factor
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    if factor <= 1.0:
        return 1.0 / pos_freqs, 1.0

    def correction_dim(rotations: float) -> float:
        return dim * math.log(cfg.rope_original_max_positions / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(correction_dim(cfg.rope_beta_fast), 0)
    high = min(correction_dim(cfg.rope_beta_slow), dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp  # weight of the unscaled frequency per dimension pair
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, 0.1 * math.log(factor) + 1.0


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of each head as pairs (x_i, x_{i+d/2}); cos/sin: [seq, d/2]."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


def sink_attention(q, k, v, sinks: torch.Tensor, window: int) -> torch.Tensor:
    """Causal attention (optionally within ``window`` keys) whose softmax also counts one learned sink
    logit per head; q [b, h, s, d], k/v [b, kv_heads, s, d] -> [b, h, s, d]. Computed in full: the
    score matrix of one layer at a time."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    seq = q.shape[2]
    scores = torch.matmul(q, k.transpose(2, 3)) * q.shape[-1] ** -0.5
    i = torch.arange(seq, device=q.device)
    allowed = i[None, :] <= i[:, None]
    if window:
        allowed &= i[None, :] > i[:, None] - window
    scores = scores.masked_fill(~allowed, float("-inf"))
    sink = sinks.to(scores.dtype).reshape(1, -1, 1, 1).expand(q.shape[0], -1, seq, 1)
    probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    return torch.matmul(probs.to(v.dtype), v)


class Attention(nn.Module):
    def __init__(self, cfg: ModelSpec, window: int):
        super().__init__()
        self.head_dim, self.window = cfg.head_dim, window
        q_out, kv_out = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, q_out, bias=True)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_out, bias=True)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_out, bias=True)
        self.o_proj = nn.Linear(q_out, cfg.hidden_size, bias=True)
        self.sinks = nn.Parameter(torch.empty(cfg.num_heads))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        bsz, seq, _ = x.shape
        q, k, v = (proj(x).view(bsz, seq, -1, self.head_dim).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        out = sink_attention(rope(q, cos, sin), rope(k, cos, sin), v, self.sinks, self.window)
        return self.o_proj(out.transpose(1, 2).reshape(bsz, seq, -1))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelSpec, index: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, cfg.sliding_window if index % 2 == 0 else 0)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MoE(cfg.hidden_size, cfg.intermediate_size, cfg.num_experts, cfg.experts_per_token,
                       cfg.swiglu_alpha, cfg.swiglu_limit)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class GptOssModel(nn.Module):
    def __init__(self, cfg: ModelSpec):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleDict({str(i): DecoderLayer(cfg, i) for i in range(cfg.num_layers)})
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        h = self.embed_tokens(x) if self.embed_tokens is not None else x
        if positions is None:
            positions = torch.arange(h.shape[1], device=h.device)
        inv_freq, scale = yarn_inv_freq(self.cfg)
        freqs = positions.float()[:, None] * inv_freq.to(h.device)[None, :]
        cos, sin = (freqs.cos() * scale).to(h.dtype), (freqs.sin() * scale).to(h.dtype)
        for layer in self.layers.values():
            h = layer(h, cos, sin)
        return self.norm(h) if self.norm is not None else h


class GptOssForCausalLM(nn.Module):
    # where the parallel techniques find the parts they treat alike in every family
    LAYERS = "model.layers"
    FIRST_STAGE_MODULES = ("model.embed_tokens",)
    LAST_STAGE_MODULES = ("model.norm", "lm_head")

    def __init__(self, cfg: ModelSpec, options: ModelOptions | None = None):
        super().__init__()
        self.cfg, self.options = cfg, options or ModelOptions()
        self.model = GptOssModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                label_mask: torch.Tensor | None = None, loss_chunk_tokens: int = 0) -> torch.Tensor:
        h = self.model(x, positions)
        if self.lm_head is None:
            return h
        if labels is not None and loss_chunk_tokens > 0:
            return chunked_loss_sum(self.lm_head, h, labels, label_mask, loss_chunk_tokens)
        return self.lm_head(h)

    def storage_transforms(self, name: str) -> None:
        """Checkpoint order is storage order for every parameter (model/checkpoint.py asks)."""
        return None


def init_full_tensor(name: str, shape: torch.Size, cfg: ModelSpec, seed: int, device) -> torch.Tensor:
    """The full initial value of parameter ``name`` (fp32), as transformers initialises gpt-oss:
    norms 1, projection and expert biases 0, everything else (sinks and the router's bias included)
    N(0, init_std); seeded by name, so no layout changes it."""
    if name.endswith("norm.weight"):
        return torch.ones(shape, device=device)
    if name.endswith(("proj.bias", "proj_bias")):
        return torch.zeros(shape, device=device)
    return torch.randn(shape, generator=param_generator(seed, name, device), device=device) * cfg.init_std


def tp_plan(model: GptOssForCausalLM, tp: int, sequence_parallel: bool):
    """No tensor-parallel plan yet: the family's check refuses parallel.tp > 1 before launch."""
    raise NotImplementedError("model.family=gpt_oss has no tensor-parallel plan (parallel.tp=1)")


MODULES = FamilyModules(build=lambda cfg, options, lora: GptOssForCausalLM(cfg, options),
                        init_full_tensor=init_full_tensor, tp_plan=tp_plan)
