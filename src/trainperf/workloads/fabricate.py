"""Fabricated llama2_70b_lora inputs in the real on-disk formats, for smoke tests and CI.

A CPU cannot run Llama-2-70B, so tests stand a tiny model in for the architecture -- never for the
recipe. The fabricated data make the 0.925 target reachable within the closed schedule's first eval:

* text: a first-order Markov chain over an 8-token vocabulary in which every token has exactly two
  equally likely successors, so the best possible loss is ln 2 = 0.693 nats per target token;
* base checkpoint (Hugging Face layout, fused or unfused q/k/v): one decoder layer whose attention and
  MLP outputs are zero (o_proj = down_proj = 0) and whose embedding / LM head encode the chain, so the
  base model already predicts near the optimum (eval ~0.70 < 0.925). LoRA trains on top of it; the
  tests are about the recipe, the schedule and the log, not about learning (mini-lora shows that);
* rows as the preprocessed GovReport files have them: training labels on every token, validation
  labels only on the second half ("the summary"), -100 elsewhere.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from trainperf.core.spec import ModelSpec
from trainperf.data import govreport
from trainperf.model.checkpoint import model_fields_to_hf_config

VOCAB = 8
SUCCESSOR_STEPS = (1, 3)  # token x is followed by x+1 or x+3 (mod VOCAB), each with probability 1/2
LOGIT_MARGIN = 4.0


def tiny_model() -> ModelSpec:
    return ModelSpec(name="tiny-llama-stand-in", vocab_size=VOCAB, hidden_size=VOCAB, intermediate_size=16,
                     num_layers=1, num_heads=1, num_kv_heads=1, max_position_embeddings=8192, fused_qkv=True)


def optimal_loss() -> float:
    return math.log(len(SUCCESSOR_STEPS))


def sample_chain(rows: int, seq: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.empty(rows, seq, dtype=torch.int64)
    ids[:, 0] = torch.randint(0, VOCAB, (rows,), generator=g)
    steps = torch.tensor(SUCCESSOR_STEPS)
    choice = torch.randint(0, len(SUCCESSOR_STEPS), (rows, seq), generator=g)
    for t in range(1, seq):
        ids[:, t] = (ids[:, t - 1] + steps[choice[:, t]]) % VOCAB
    return ids


def base_weights(m: ModelSpec, fused_qkv: bool, seed: int = 0) -> dict[str, torch.Tensor]:
    """The analytic base model: logits = sqrt(h) * W_lm[:, x] after RMSNorm of a one-hot embedding."""
    assert m.vocab_size == m.hidden_size == VOCAB, "the analytic base needs vocab == hidden"
    g = torch.Generator().manual_seed(seed)
    h, f = m.hidden_size, m.intermediate_size
    q_out, kv_out = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    lm = torch.full((VOCAB, VOCAB), -LOGIT_MARGIN)
    for x in range(VOCAB):
        for s in SUCCESSOR_STEPS:
            lm[(x + s) % VOCAB, x] = LOGIT_MARGIN
    w = {
        "model.embed_tokens.weight": torch.eye(VOCAB),
        "model.norm.weight": torch.ones(h),
        "lm_head.weight": lm / math.sqrt(h),
    }
    for i in range(m.num_layers):
        pre = f"model.layers.{i}."
        rnd = lambda *shape: torch.randn(*shape, generator=g) * 0.02  # noqa: E731
        q, k, v = rnd(q_out, h), rnd(kv_out, h), rnd(kv_out, h)
        if fused_qkv:
            w[pre + "self_attn.qkv_proj.weight"] = torch.cat([q, k, v])
        else:
            w.update({pre + "self_attn.q_proj.weight": q, pre + "self_attn.k_proj.weight": k,
                      pre + "self_attn.v_proj.weight": v})
        w[pre + "self_attn.o_proj.weight"] = torch.zeros(h, q_out)
        w[pre + "mlp.gate_proj.weight"] = rnd(f, h)
        w[pre + "mlp.up_proj.weight"] = rnd(f, h)
        w[pre + "mlp.down_proj.weight"] = torch.zeros(h, f)
        w[pre + "input_layernorm.weight"] = torch.ones(h)
        w[pre + "post_attention_layernorm.weight"] = torch.ones(h)
    return w


def write_base_checkpoint(dest: str | Path, fused_qkv: bool = True, shards: int = 2) -> Path:
    """A Hugging Face checkpoint dir (config.json, safetensors shards, index) of the analytic base."""
    m = tiny_model()
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    weights = {k: v.to(torch.bfloat16).contiguous() for k, v in base_weights(m, fused_qkv).items()}
    names = sorted(weights)
    weight_map = {}
    for s in range(shards):
        part = names[s::shards]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: weights[n] for n in part}, str(dest / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    (dest / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    (dest / "config.json").write_text(json.dumps(model_fields_to_hf_config(m, "bfloat16"), indent=1))
    return dest


def write_govreport_like(dest: str | Path, train_rows: int, eval_rows: int, seq_len: int, fmt: str = "parquet") -> Path:
    """GovReport-format rows of the chain: train loss on all tokens, validation on the second half."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    train_ids = sample_chain(train_rows, seq_len, seed=11)
    val_ids = sample_chain(eval_rows, seq_len, seed=12)
    train_mask = torch.ones_like(train_ids, dtype=torch.bool)
    val_mask = torch.zeros_like(val_ids, dtype=torch.bool)
    val_mask[:, seq_len // 2:] = True
    writer = govreport.write_govreport_parquet if fmt == "parquet" else govreport.write_govreport_npy
    writer(dest, "train", train_ids, train_mask)
    writer(dest, "validation", val_ids, val_mask)
    return dest
