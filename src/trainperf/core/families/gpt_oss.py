"""The gpt-oss family's torch-free half (its modules: model/gpt_oss.py, model/moe.py): OpenAI's
open-weight mixture of experts -- GQA attention with q/k/v/o biases and a learned sink per head,
sliding-window and full layers alternating, YaRN RoPE, a top-k router scored by a softmax over the
k chosen logits, clamped-SwiGLU experts with biases -- under Hugging Face ``GptOssForCausalLM``'s
tensor names and config.json keys."""

from __future__ import annotations

from trainperf.core.errors import SpecError
from trainperf.core.families.family import ModelFamily
from trainperf.core.spec import ModelSpec, RunSpec

# ModelSpec field -> Hugging Face GptOssConfig key
HF_CONFIG_KEYS = {
    "vocab_size": "vocab_size", "hidden_size": "hidden_size", "intermediate_size": "intermediate_size",
    "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads",
    "attention_head_dim": "head_dim", "num_experts": "num_local_experts", "experts_per_token": "num_experts_per_tok",
    "sliding_window": "sliding_window", "rms_norm_eps": "rms_norm_eps",
    "max_position_embeddings": "max_position_embeddings", "swiglu_limit": "swiglu_limit",
}
OPTIONAL_KEYS = ("rms_norm_eps", "max_position_embeddings", "swiglu_limit", "sliding_window")
# ModelSpec field -> key of config.json's rope_parameters (transformers 5) or rope_scaling (4.x)
ROPE_KEYS = {"rope_theta": "rope_theta", "rope_factor": "factor", "rope_beta_fast": "beta_fast",
             "rope_beta_slow": "beta_slow", "rope_original_max_positions": "original_max_position_embeddings"}


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


class GptOss(ModelFamily):
    name = "gpt_oss"
    summary = ("mixture of experts: sink attention (sliding/full alternating), YaRN RoPE, top-k router, "
               "clamped-SwiGLU experts; Hugging Face GptOss names (model/gpt_oss.py)")
    checkpoint_layout = "Hugging Face"
    config_keys = HF_CONFIG_KEYS
    optional_config_keys = OPTIONAL_KEYS
    mlp_up_projections = 2  # each expert's gate and up (one interleaved GEMM)
    mixture_of_experts = True

    # -- config fields and their checks --------------------------------------------------------------

    def check(self, spec: RunSpec) -> None:
        """Experts, top-k, window, clamp and YaRN numbers in range; ep dividing the experts (dp_shard's
        share is resolve_layout's; the layouts a mixture of experts takes, validate_layout's); the
        Llama-only options refused."""
        from trainperf.core.validate import _above, _at_least  # validate imports the families: no cycle at load

        m, p = spec.model, spec.parallel
        _at_least("model.num_experts", m.num_experts, 1, " (model.family=gpt_oss is a mixture of experts)")
        if not 1 <= m.experts_per_token <= m.num_experts:
            raise SpecError(f"model.experts_per_token={m.experts_per_token}: each token's top-k must be "
                            f"1..{m.num_experts} (model.num_experts={m.num_experts})")
        if m.head_dim % 2:
            raise SpecError(f"head dim {m.head_dim} must be even for RoPE (model.attention_head_dim, or "
                            "hidden_size/num_heads)")
        _at_least("model.moe_aux_loss_coeff", m.moe_aux_loss_coeff, 0.0, " (0: no load-balancing loss)")
        _at_least("model.sliding_window", m.sliding_window, 0, " (0: every layer attends to the whole prefix)")
        _above("model.swiglu_alpha", m.swiglu_alpha, 0)
        _above("model.swiglu_limit", m.swiglu_limit, 0)
        _at_least("model.rope_factor", m.rope_factor, 1.0, " (1: plain RoPE)")
        _at_least("model.rope_original_max_positions", m.rope_original_max_positions, 1)
        _above("model.rope_beta_slow", m.rope_beta_slow, 0)
        _above("model.rope_beta_fast", m.rope_beta_fast, m.rope_beta_slow, " (model.rope_beta_slow)")
        for key, value, set_ in (("lora.rank", spec.lora.rank, spec.lora.enabled),
                                 ("model.fused_qkv", m.fused_qkv, m.fused_qkv),
                                 ("hardware.attention", spec.hardware.attention, spec.hardware.attention != "sdpa"),
                                 ("hardware.fp8", spec.hardware.fp8, spec.hardware.fp8 != "none")):
            if set_:
                raise SpecError(f"{key}={value} is for model.family=llama; model.family=gpt_oss trains every weight "
                                "with its own sink attention (leave it at its default)")
        if p.ep >= 1 and m.num_experts % p.ep:
            raise SpecError(f"parallel.ep={p.ep} does not divide model.num_experts={m.num_experts} (each rank holds "
                            f"whole experts); valid: {_divisors(m.num_experts)} (and dividing parallel.dp_shard)")

    def tp_sharded(self, m: ModelSpec) -> tuple[tuple[str, int], ...]:
        return ()  # no tensor parallel (check refuses it)

    # -- FLOP and parameter formulas -----------------------------------------------------------------

    def linear_params(self, m: ModelSpec) -> dict[str, int]:
        """Every expert's gate, up and down, the router, the attention projections and the LM head."""
        out = super().linear_params(m)
        for name in ("gate_proj", "up_proj", "down_proj"):
            out[name] *= m.num_experts
        out["router"] = m.hidden_size * m.num_experts * m.num_layers
        return out

    def active_linear_params(self, m: ModelSpec) -> dict[str, int]:
        """What one token passes through: its top-k experts (not all of them) and the router."""
        out = super().linear_params(m)
        for name in ("gate_proj", "up_proj", "down_proj"):
            out[name] *= m.experts_per_token
        out["router"] = m.hidden_size * m.num_experts * m.num_layers
        return out

    def other_params(self, m: ModelSpec) -> int:
        """Input embedding, norms, sinks and every bias (projections', experts', router's)."""
        h, f, e, L = m.hidden_size, m.intermediate_size, m.num_experts, m.num_layers
        q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
        per_layer = 2 * h + m.num_heads + (q + 2 * kv + h) + e * (2 * f + h) + e
        return m.vocab_size * h + L * per_layer + h

    def attention_fwd_flops_per_token(self, m: ModelSpec, seq_len: int) -> float:
        """QK^T and PV, 4 x keys x heads x head_dim per token: half the prefix on average on the full
        layers (odd), at most ``sliding_window`` keys on the sliding ones (even)."""
        d = m.num_heads * m.head_dim
        full = seq_len / 2.0
        w = m.sliding_window
        window = full if not w or w >= seq_len else (w * (w + 1) / 2 + (seq_len - w) * w) / seq_len
        sliding_layers = (m.num_layers + 1) // 2
        return 4.0 * d * (sliding_layers * window + (m.num_layers - sliding_layers) * full)

    # -- checkpoint adapter ------------------------------------------------------------------------

    def config_to_model_fields(self, config: dict, where: str) -> dict:
        fields = super().config_to_model_fields(config, where)
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        if not isinstance(rope, dict):
            raise SpecError(f"{where}: config.json rope_parameters must be an object, found {type(rope).__name__}")
        kind = rope.get("rope_type", "yarn")
        if kind not in ("yarn", "default"):
            raise SpecError(f"{where}: config.json rope_type {kind!r} is not read for gpt_oss; valid: yarn, default")
        for ours, theirs in ROPE_KEYS.items():
            value = rope.get(theirs, config.get(theirs))
            if value is not None:
                fields[ours] = value
        if kind == "default":
            fields["rope_factor"] = 1.0
        if rope.get("truncate", False):
            raise SpecError(f"{where}: config.json rope_parameters truncate=true is not read; gpt-oss's YaRN has "
                            "truncate=false")
        types = config.get("layer_types")
        pattern = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(len(types or []))]
        if types is not None and types != pattern:
            raise SpecError(f"{where}: config.json layer_types must alternate sliding_attention, full_attention "
                            "from the first layer (gpt-oss's pattern)")
        if config.get("tie_word_embeddings"):
            raise SpecError(f"{where}: tied input/output embeddings are not supported for gpt_oss "
                            "(config.json tie_word_embeddings=true)")
        return fields

    def model_fields_to_config(self, m: ModelSpec, dtype: str = "float32") -> dict:
        cfg = super().model_fields_to_config(m, dtype)
        cfg.update({"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "torch_dtype": dtype,
                    "tie_word_embeddings": False, "attention_bias": True, "swiglu_alpha": m.swiglu_alpha,
                    "head_dim": m.head_dim,
                    "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(m.num_layers)],
                    "rope_parameters": {"rope_type": "yarn" if m.rope_factor > 1 else "default",
                                        "rope_theta": m.rope_theta, "factor": m.rope_factor,
                                        "beta_fast": m.rope_beta_fast, "beta_slow": m.rope_beta_slow, "truncate": False,
                                        "original_max_position_embeddings": m.rope_original_max_positions}})
        return cfg

    def expected_shapes(self, m: ModelSpec, fused_qkv: bool) -> dict[str, list[int]]:
        """Every tensor of the Hugging Face layout -> its shape (expert tensors [experts, ...])."""
        h, f, e, d = m.hidden_size, m.intermediate_size, m.num_experts, m.head_dim
        q, kv = m.num_heads * d, m.num_kv_heads * d
        shapes = {"model.embed_tokens.weight": [m.vocab_size, h], "model.norm.weight": [h],
                  "lm_head.weight": [m.vocab_size, h]}
        for i in range(m.num_layers):
            pre = f"model.layers.{i}."
            shapes.update({
                pre + "input_layernorm.weight": [h], pre + "post_attention_layernorm.weight": [h],
                pre + "self_attn.q_proj.weight": [q, h], pre + "self_attn.q_proj.bias": [q],
                pre + "self_attn.k_proj.weight": [kv, h], pre + "self_attn.k_proj.bias": [kv],
                pre + "self_attn.v_proj.weight": [kv, h], pre + "self_attn.v_proj.bias": [kv],
                pre + "self_attn.o_proj.weight": [h, q], pre + "self_attn.o_proj.bias": [h],
                pre + "self_attn.sinks": [m.num_heads],
                pre + "mlp.router.weight": [e, h], pre + "mlp.router.bias": [e],
                pre + "mlp.experts.gate_up_proj": [e, h, 2 * f], pre + "mlp.experts.gate_up_proj_bias": [e, 2 * f],
                pre + "mlp.experts.down_proj": [e, f, h], pre + "mlp.experts.down_proj_bias": [e, h],
            })
        return shapes


GPT_OSS = GptOss()
