"""A Llama-family decoder you can read in one sitting.

GQA attention through ``F.scaled_dot_product_attention``, RoPE in the Hugging Face (rotate-half)
convention, SwiGLU MLP, RMSNorm computed in fp32 as HF does, untied input/output embeddings and an
optional fused ``qkv_proj`` (the MLPerf Llama-2-70B checkpoint's layout).

Parameter names are those of Hugging Face's ``LlamaForCausalLM`` state dict, one to one:

    model.embed_tokens.weight                         [vocab, hidden]
    model.layers.{i}.input_layernorm.weight           [hidden]
    model.layers.{i}.self_attn.q_proj.weight          [heads*head_dim, hidden]
    model.layers.{i}.self_attn.k_proj.weight          [kv_heads*head_dim, hidden]
    model.layers.{i}.self_attn.v_proj.weight          [kv_heads*head_dim, hidden]
      (fused: model.layers.{i}.self_attn.qkv_proj.weight = cat(q, k, v) along dim 0)
    model.layers.{i}.self_attn.o_proj.weight          [hidden, heads*head_dim]
    model.layers.{i}.post_attention_layernorm.weight  [hidden]
    model.layers.{i}.mlp.gate_proj.weight             [intermediate, hidden]
    model.layers.{i}.mlp.up_proj.weight               [intermediate, hidden]
    model.layers.{i}.mlp.down_proj.weight             [hidden, intermediate]
    model.norm.weight                                 [hidden]
    lm_head.weight                                    [vocab, hidden]

so a Hugging Face safetensors checkpoint loads without renaming or permuting anything.
"""

from __future__ import annotations

import contextlib
import hashlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from trainperf.core.spec import LoRASpec, ModelSpec
from trainperf.model.flash4 import causal_attention
from trainperf.model.family_modules import FamilyModules, TPPlan
from trainperf.model.float8 import apply_float8
from trainperf.model.lora import apply_lora, lora_aware_tp_styles, project
from trainperf.model.loss import chunked_loss_sum
from trainperf.model.options import ModelOptions


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # fp32 statistics, then cast back before the scale: the order HF uses, so logits match
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rope_cos_sin(seq_len: int, head_dim: int, theta: float, device, dtype):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    t = torch.arange(seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)  # HF rotate-half layout: [f0..f_{d/2-1}, f0..f_{d/2-1}]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


def attention_backends(device_type: str):
    """On GPU prefer cuDNN's fused attention (about 1.8x flash's rate on H200 at seq 8192, bf16),
    then flash, then memory-efficient; SDPA falls through to the next one a shape does not fit."""
    if device_type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    return sdpa_kernel(order, set_priority=True)


class Attention(nn.Module):
    def __init__(self, cfg: ModelSpec, kernel: str = "sdpa", repeat_kv: bool = False):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_out, kv_out = self.n_heads * self.head_dim, self.n_kv * self.head_dim
        self.fused = cfg.fused_qkv
        if self.fused:
            self.qkv_proj = nn.Linear(cfg.hidden_size, q_out + 2 * kv_out, bias=False)
        else:
            self.q_proj = nn.Linear(cfg.hidden_size, q_out, bias=False)
            self.k_proj = nn.Linear(cfg.hidden_size, kv_out, bias=False)
            self.v_proj = nn.Linear(cfg.hidden_size, kv_out, bias=False)
        self.o_proj = nn.Linear(q_out, cfg.hidden_size, bias=False)
        self.kernel = kernel  # "sdpa" or "flash4" (ModelOptions.attention)
        self.repeat_kv = repeat_kv  # context parallel's ring attention takes no enable_gqa

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        bsz, seq, _ = x.shape
        if self.fused:
            qkv = self.qkv_proj(x)
            # local sizes: under tensor parallel each rank holds its own slice of q, k and v
            unit = qkv.shape[-1] // (self.n_heads + 2 * self.n_kv)
            q, k, v = qkv.split([self.n_heads * unit, self.n_kv * unit, self.n_kv * unit], dim=-1)
        else:
            q, k, v = project(x, (self.q_proj, self.k_proj, self.v_proj))
        # -1 rather than n_heads so that a tensor-parallel shard with fewer local heads still works
        q = q.view(bsz, seq, -1, self.head_dim)
        k = k.view(bsz, seq, -1, self.head_dim)
        v = v.view(bsz, seq, -1, self.head_dim)
        if self.kernel == "flash4":  # (batch, seq, heads, head_dim) throughout: no transposes
            cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # broadcast over heads
            out = causal_attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)
            return self.o_proj(out.reshape(bsz, seq, -1))
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        gqa = self.n_heads != self.n_kv
        if gqa and self.repeat_kv:  # context parallel's ring attention takes no enable_gqa
            k = k.repeat_interleave(self.n_heads // self.n_kv, dim=1)
            v = v.repeat_interleave(self.n_heads // self.n_kv, dim=1)
            gqa = False
        with attention_backends(q.device.type):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        return self.o_proj(out.transpose(1, 2).reshape(bsz, seq, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelSpec):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = project(x, (self.gate_proj, self.up_proj))
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelSpec, options: ModelOptions):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, options.attention, options.repeat_kv)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelSpec, options: ModelOptions):
        super().__init__()
        self.cfg, self.options = cfg, options
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        # a dict keyed "0".."N-1" names parameters exactly as a ModuleList would, and lets a pipeline
        # stage drop the layers it does not own without renaming the rest
        self.layers = nn.ModuleDict({str(i): DecoderLayer(cfg, options) for i in range(cfg.num_layers)})
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """x: token ids [batch, seq], or hidden states [batch, seq, hidden] on a later pipeline stage.
        positions: [seq] token positions (context parallel shards the sequence out of order)."""
        h = self.embed_tokens(x) if self.embed_tokens is not None else x
        seq_len = x.shape[1]
        if self.embed_tokens is None and self.options.sequence_parallel:
            seq_len *= self.options.tp  # a later pipeline stage receives its sequence shard
        cos, sin = rope_cos_sin(self.cfg.max_position_embeddings if positions is not None else seq_len,
                                self.cfg.head_dim, self.cfg.rope_theta, h.device, torch.float32)
        if positions is not None:
            cos, sin = cos[positions], sin[positions]
        cos, sin = cos.to(h.dtype), sin.to(h.dtype)
        for layer in self.layers.values():
            h = layer(h, cos, sin)
        return self.norm(h) if self.norm is not None else h


class LlamaForCausalLM(nn.Module):
    """``options``: the kernels and weight forms the layers use (model/options.py); ``lora``: LoRA
    adapters on the targeted projections, the rest frozen (model/lora.py). Float8 GEMMs, when
    ``options.fp8`` asks for them, are part of the build (model/float8.py), so every later step --
    tensor parallel, compile, FSDP2 -- sees the final modules."""

    # where the parallel techniques find the parts they treat alike in every family
    # (parallel/parallelize.py): the decoder layers, what only the first and only the last stage keeps
    LAYERS = "model.layers"
    FIRST_STAGE_MODULES = ("model.embed_tokens",)
    LAST_STAGE_MODULES = ("model.norm", "lm_head")

    def __init__(self, cfg: ModelSpec, options: ModelOptions | None = None, lora: LoRASpec | None = None):
        super().__init__()
        options = options or ModelOptions()
        self.cfg, self.options = cfg, options
        self.model = LlamaModel(cfg, options)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if lora is not None:
            apply_lora(self, lora)
        apply_float8(self)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                label_mask: torch.Tensor | None = None, loss_chunk_tokens: int = 0) -> torch.Tensor:
        """Logits; or, given labels (and their mask) and a chunk size, the summed masked loss computed
        chunk by chunk (train.loss_chunk_tokens) -- inside forward, so FSDP's root hooks cover the head."""
        h = self.model(x, positions)
        if self.lm_head is None:
            return h
        if labels is not None and loss_chunk_tokens > 0:
            return chunked_loss_sum(self.lm_head, h, labels, label_mask, loss_chunk_tokens)
        return self.lm_head(h)

    def storage_transforms(self, name: str) -> tuple | None:
        """(checkpoint order -> storage order, and back) for parameter ``name``, or None where the
        two agree: a fused qkv_proj under tensor parallel (options.tp) is stored so that each TP rank's
        contiguous Shard(0) block holds its own [q_r; k_r; v_r]."""
        tp = self.options.tp
        if tp == 1 or not name.endswith(("self_attn.qkv_proj.weight", "self_attn.qkv_proj.lora_B.weight")):
            return None
        order = qkv_row_order(self.cfg.num_heads, self.cfg.num_kv_heads, self.cfg.head_dim, tp)
        inverse = torch.argsort(order)
        return (lambda t: t[order.to(t.device)], lambda t: t[inverse.to(t.device)])


def qkv_row_order(n_heads: int, n_kv: int, head_dim: int, tp: int) -> torch.Tensor:
    """Row order of a fused [q; k; v] weight such that TP rank r's contiguous Shard(0) block holds
    [q_r; k_r; v_r]. The full checkpoint tensor is permuted by this before sharding."""
    q, kv = n_heads * head_dim, n_kv * head_dim
    order = []
    for r in range(tp):
        order += list(range(r * q // tp, (r + 1) * q // tp))
        order += list(range(q + r * kv // tp, q + (r + 1) * kv // tp))
        order += list(range(q + kv + r * kv // tp, q + kv + (r + 1) * kv // tp))
    return torch.tensor(order)


def build_on_meta(cfg: ModelSpec, options: ModelOptions | None = None, lora: LoRASpec | None = None) -> LlamaForCausalLM:
    """Build the module tree without allocating memory; materialise later with ``to_empty``."""
    with torch.device("meta"):
        return LlamaForCausalLM(cfg, options, lora)


def param_generator(seed: int, name: str, device) -> torch.Generator:
    """A generator seeded by (seed, parameter name): the initial value of a parameter does not
    depend on the parallel layout, the device count or the order parameters are visited in."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    g = torch.Generator(device=device)
    g.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    return g


def init_full_tensor(name: str, shape: torch.Size, cfg: ModelSpec, seed: int, device) -> torch.Tensor:
    """The full (unsharded) initial value of parameter ``name``, in fp32."""
    g = param_generator(seed, name, device)
    if name.endswith("norm.weight"):
        return torch.ones(shape, device=device)
    if name.endswith("lora_B.weight"):
        return torch.zeros(shape, device=device)
    if name.endswith("lora_A.weight"):
        # PEFT's default: kaiming_uniform(a=sqrt(5)) -> U(-1/sqrt(fan_in), 1/sqrt(fan_in))
        bound = 1.0 / math.sqrt(shape[1])
        return (torch.rand(shape, generator=g, device=device) * 2 - 1) * bound
    return torch.randn(shape, generator=g, device=device) * cfg.init_std


def tp_plan(model: LlamaForCausalLM, tp: int, sequence_parallel: bool) -> TPPlan:
    """Megatron-style TP: the embedding row-parallel, q/k/v (or the fused qkv) and gate/up
    column-parallel, o and down row-parallel (LoRA-aware styles: the adapters are placed with their
    base), RMSNorms sequence-parallel with SP; the LM head column-parallel with loss-parallel output."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    # a fused qkv_proj sharded by rows gives every rank its own slice of q, k and v only when the
    # model stores it in that order (LlamaForCausalLM.storage_transforms)
    assert model.options.tp == tp or not model.cfg.fused_qkv, (model.options.tp, tp)
    Col, Row = lora_aware_tp_styles()
    seq = Shard(1) if sequence_parallel else Replicate()
    top = {}
    if model.model.embed_tokens is not None:
        top["model.embed_tokens"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if model.model.norm is not None and sequence_parallel:
        top["model.norm"] = SequenceParallel()
    if model.lm_head is not None:
        top["lm_head"] = ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False)
    steps = [(model, top)]
    for layer in model.model.layers.values():
        plan = {
            "self_attn": PrepareModuleInput(input_layouts=(seq, None, None), desired_input_layouts=(Replicate(), None, None)),
            "self_attn.o_proj": Row(output_layouts=seq),
            "mlp": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
            "mlp.gate_proj": Col(),
            "mlp.up_proj": Col(),
            "mlp.down_proj": Row(output_layouts=seq),
        }
        for name in ("qkv_proj",) if layer.self_attn.fused else ("q_proj", "k_proj", "v_proj"):
            plan[f"self_attn.{name}"] = Col()
        if sequence_parallel:
            plan["input_layernorm"] = SequenceParallel()
            plan["post_attention_layernorm"] = SequenceParallel()
        steps.append((layer, plan))
    return TPPlan(steps, sp_embedding=model.model.embed_tokens)


MODULES = FamilyModules(build=LlamaForCausalLM, init_full_tensor=init_full_tensor, tp_plan=tp_plan)
