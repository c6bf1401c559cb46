"""A GPT-family decoder (GPT-3 as Megatron-LM trains it) you can read in one sitting.

Pre-LayerNorm blocks with biases everywhere, a GeLU MLP of ``intermediate_size`` (4 x hidden for
GPT-3), learned absolute position embeddings, and the output layer tied to the input embedding. The
vocabulary is padded to a multiple of ``make_vocab_size_divisible_by`` x TP as Megatron does
(``ModelSpec.padded_vocab_size``); the padded rows are ordinary logits that training pushes down.

Parameter names are Megatron Core's (local transformer-layer spec), so a checkpoint in that layout
loads by name:

    embedding.word_embeddings.weight                      [padded_vocab, hidden]
    embedding.position_embeddings.weight                  [max_position_embeddings, hidden]
    decoder.layers.{i}.input_layernorm.{weight,bias}      [hidden]
    decoder.layers.{i}.self_attention.linear_qkv.weight   [3*hidden, hidden]  rows per head: [q_h; k_h; v_h]
    decoder.layers.{i}.self_attention.linear_qkv.bias     [3*hidden]
    decoder.layers.{i}.self_attention.linear_proj.{weight [hidden, hidden], bias [hidden]}
    decoder.layers.{i}.pre_mlp_layernorm.{weight,bias}    [hidden]
    decoder.layers.{i}.mlp.linear_fc1.{weight [ffn, hidden], bias [ffn]}
    decoder.layers.{i}.mlp.linear_fc2.{weight [hidden, ffn], bias [hidden]}
    decoder.final_layernorm.{weight,bias}                 [hidden]
    output_layer.weight    the same tensor as embedding.word_embeddings.weight (a pipeline's last stage
                           holds its own copy under this name, kept equal by summing the two gradients)

Megatron's per-head [q; k; v] row order means a TP rank's contiguous block of linear_qkv holds whole
heads, so tensor parallelism needs no row permutation (unlike a fused Llama qkv_proj).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from trainperf.core.spec import ModelSpec
from trainperf.model.family_modules import FamilyModules, TPPlan
from trainperf.model.llama import attention_backends, param_generator
from trainperf.model.loss import chunked_loss_sum
from trainperf.model.options import ModelOptions

# the parameter a tied copy is initialised from and loaded as (a checkpoint stores it once)
TIED_WEIGHTS = {"output_layer.weight": "embedding.word_embeddings.weight"}


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelSpec):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.linear_qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=True)
        self.linear_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seq, _ = x.shape
        # -1 heads: a tensor-parallel rank holds whole heads, each as [q; k; v] rows (Megatron's order)
        qkv = self.linear_qkv(x).view(bsz, seq, -1, 3 * self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in qkv.split(self.head_dim, dim=-1))
        with attention_backends(q.device.type):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.linear_proj(out.transpose(1, 2).reshape(bsz, seq, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelSpec):
        super().__init__()
        self.linear_fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=True)
        self.linear_fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the tanh form Megatron's fused bias-GeLU computes
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate="tanh"))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: ModelSpec):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.self_attention = SelfAttention(cfg)
        self.pre_mlp_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attention(self.input_layernorm(x))
        return x + self.mlp(self.pre_mlp_layernorm(x))


class Embedding(nn.Module):
    def __init__(self, cfg: ModelSpec, padded_vocab: int):
        super().__init__()
        self.word_embeddings = nn.Embedding(padded_vocab, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.word_embeddings(ids) + self.position_embeddings(positions)


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelSpec):
        super().__init__()
        # keyed "0".."N-1" like a ModuleList's names; a pipeline stage drops the layers it does not own
        self.layers = nn.ModuleDict({str(i): TransformerLayer(cfg) for i in range(cfg.num_layers)})
        self.final_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for layer in self.layers.values():
            h = layer(h)
        return self.final_layernorm(h) if self.final_layernorm is not None else h


class GPTModel(nn.Module):
    """``options.tp`` sets the vocabulary padding (ModelSpec.padded_vocab_size)."""

    # where the parallel techniques find the parts they treat alike in every family
    # (parallel/parallelize.py): the decoder layers, what only the first and only the last stage keeps
    LAYERS = "decoder.layers"
    FIRST_STAGE_MODULES = ("embedding",)
    LAST_STAGE_MODULES = ("decoder.final_layernorm", "output_layer")

    def __init__(self, cfg: ModelSpec, options: ModelOptions | None = None):
        super().__init__()
        options = options or ModelOptions()
        self.cfg, self.options = cfg, options
        self.padded_vocab = cfg.padded_vocab_size(options.tp)
        self.embedding = Embedding(cfg, self.padded_vocab)
        self.decoder = TransformerBlock(cfg)
        self.output_layer = nn.Linear(cfg.hidden_size, self.padded_vocab, bias=False)
        self.output_layer.weight = self.embedding.word_embeddings.weight  # tied

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                label_mask: torch.Tensor | None = None, loss_chunk_tokens: int = 0) -> torch.Tensor:
        """x: token ids [batch, seq], or hidden states [batch, seq, hidden] on a later pipeline stage.
        positions: [seq] token positions (context parallel shards the sequence out of order)."""
        if self.embedding is not None:
            if positions is None:
                positions = torch.arange(x.shape[1], device=x.device)
            x = self.embedding(x, positions)
        h = self.decoder(x)
        if self.output_layer is None:
            return h
        if labels is not None and loss_chunk_tokens > 0:
            return chunked_loss_sum(self.output_layer, h, labels, label_mask, loss_chunk_tokens)
        return self.output_layer(h)

    def storage_transforms(self, name: str) -> None:
        """Checkpoint order is storage order for every GPT parameter (model/checkpoint.py asks)."""
        return None


def build(cfg: ModelSpec, options: ModelOptions | None = None, lora=None) -> GPTModel:
    """The module tree on the current device (the family has no LoRA: core.validate refuses it)."""
    return GPTModel(cfg, options)


def build_on_meta(cfg: ModelSpec, options: ModelOptions | None = None) -> GPTModel:
    """Build the module tree without allocating memory; materialise later with ``to_empty``."""
    with torch.device("meta"):
        return GPTModel(cfg, options)


def init_full_tensor(name: str, shape: torch.Size, cfg: ModelSpec, seed: int, device) -> torch.Tensor:
    """The full initial value of parameter ``name`` in fp32, as Megatron initialises GPT: weights
    N(0, init_std), the two projections into the residual stream N(0, init_std / sqrt(2 x layers)),
    biases 0, LayerNorm scale 1. Seeded by name, so no layout changes it; a tied copy takes the
    embedding's value."""
    name = TIED_WEIGHTS.get(name, name)
    if name.endswith("layernorm.weight"):
        return torch.ones(shape, device=device)
    if name.endswith(".bias"):
        return torch.zeros(shape, device=device)
    std = cfg.init_std
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        std = cfg.init_std / math.sqrt(2.0 * cfg.num_layers)
    return torch.randn(shape, generator=param_generator(seed, name, device), device=device) * std


def tp_plan(model: GPTModel, tp: int, sequence_parallel: bool) -> TPPlan:
    """Megatron's TP for the GPT family: the vocabulary-padded word embedding split by rows
    (vocabulary), positions replicated, the sum scattered along the sequence under SP; linear_qkv and
    linear_fc1 column-parallel (whole heads per rank: Megatron's per-head [q; k; v] rows), linear_proj
    and linear_fc2 row-parallel; LayerNorms sequence-parallel with SP; the output layer column-parallel
    over the vocabulary with loss-parallel output, on the embedding's own (tied) weight."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    seq = Shard(1) if sequence_parallel else Replicate()
    top = {}
    if model.embedding is not None:
        top["embedding.word_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
        if sequence_parallel:  # word + position embeddings summed whole, then each rank keeps its positions
            top["embedding"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=seq)
    if model.decoder.final_layernorm is not None and sequence_parallel:
        top["decoder.final_layernorm"] = SequenceParallel()
    if model.output_layer is not None:
        top["output_layer"] = ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False)
    steps = [(model, top)]
    for layer in model.decoder.layers.values():
        plan = {
            "self_attention": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
            "self_attention.linear_qkv": ColwiseParallel(),
            "self_attention.linear_proj": RowwiseParallel(output_layouts=seq),
            "mlp": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
            "mlp.linear_fc1": ColwiseParallel(),
            "mlp.linear_fc2": RowwiseParallel(output_layouts=seq),
        }
        if sequence_parallel:
            plan["input_layernorm"] = SequenceParallel()
            plan["pre_mlp_layernorm"] = SequenceParallel()
        steps.append((layer, plan))

    def retie() -> None:
        # both styles shard the weight by vocabulary rows (Shard(0)); the output style's new Parameter
        # object is replaced by the embedding's, so the two stay one tensor with one gradient
        if model.embedding is not None and model.output_layer is not None:
            model.output_layer.weight = model.embedding.word_embeddings.weight

    return TPPlan(steps, sp_embedding=model.embedding, after=retie)


MODULES = FamilyModules(build=build, init_full_tensor=init_full_tensor, tp_plan=tp_plan, tied_weights=TIED_WEIGHTS)
