"""The Llama family's torch-free half (its modules: model/llama.py): RMSNorm, SwiGLU and RoPE
decoders under Hugging Face ``LlamaForCausalLM`` names, q/k/v separate or one fused ``qkv_proj`` (the
MLPerf Llama-2-70B checkpoint), untied embedding, LoRA on any projection."""

from __future__ import annotations

from trainperf.core.errors import SpecError
from trainperf.core.families.family import ModelFamily
from trainperf.core.spec import ModelSpec, RunSpec

HF_CONFIG_KEYS = {  # ModelSpec field -> Hugging Face LlamaConfig key
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "rope_theta": "rope_theta",
    "rms_norm_eps": "rms_norm_eps",
    "max_position_embeddings": "max_position_embeddings",
}


class Llama(ModelFamily):
    name = "llama"
    summary = "RMSNorm, SwiGLU, RoPE; Hugging Face LlamaForCausalLM names (model/llama.py)"
    checkpoint_layout = "Hugging Face"
    config_keys = HF_CONFIG_KEYS
    optional_config_keys = ("rope_theta", "rms_norm_eps", "max_position_embeddings")
    mlp_up_projections = 2  # gate_proj and up_proj

    def check(self, spec: RunSpec) -> None:
        m = spec.model
        if m.head_dim % 2:
            raise SpecError(f"head dim {m.head_dim} (hidden_size/num_heads) must be even for RoPE")

    def lora_targets(self, m: ModelSpec) -> tuple[str, ...]:
        return ("qkv_proj", "o_proj", "gate_proj", "up_proj", "down_proj") if m.fused_qkv else (
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

    def config_to_model_fields(self, config: dict, where: str) -> dict:
        fields = {}
        for ours, theirs in HF_CONFIG_KEYS.items():
            value = config.get(theirs)
            if theirs == "rope_theta" and value is None:  # transformers 5 nests it
                value = (config.get("rope_parameters") or {}).get("rope_theta")
            if theirs == "num_key_value_heads" and value is None:
                value = config.get("num_attention_heads")
            if value is None:
                if theirs in self.optional_config_keys:
                    continue
                hint = " (a Megatron GPT config; this workload trains a Llama)" if "ffn_hidden_size" in config else ""
                raise SpecError(f"{where}: config.json lacks {theirs!r}{hint}")
            fields[ours] = value
        if config.get("tie_word_embeddings"):
            raise SpecError(f"{where}: tied input/output embeddings are not supported (config.json tie_word_embeddings=true)")
        return fields

    def model_fields_to_config(self, m: ModelSpec, dtype: str = "float32") -> dict:
        cfg = {theirs: getattr(m, ours) for ours, theirs in HF_CONFIG_KEYS.items()}
        cfg.update({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            "torch_dtype": dtype,
            "bos_token_id": None,
            "eos_token_id": None,
            "pad_token_id": None,
        })
        return cfg

    def expected_shapes(self, m: ModelSpec, fused_qkv: bool) -> dict[str, list[int]]:
        h, q_out, kv_out = m.hidden_size, m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
        shapes = {"model.embed_tokens.weight": [m.vocab_size, h], "model.norm.weight": [h], "lm_head.weight": [m.vocab_size, h]}
        for i in range(m.num_layers):
            pre = f"model.layers.{i}."
            shapes[pre + "input_layernorm.weight"] = [h]
            shapes[pre + "post_attention_layernorm.weight"] = [h]
            if fused_qkv:
                shapes[pre + "self_attn.qkv_proj.weight"] = [q_out + 2 * kv_out, h]
            else:
                shapes[pre + "self_attn.q_proj.weight"] = [q_out, h]
                shapes[pre + "self_attn.k_proj.weight"] = [kv_out, h]
                shapes[pre + "self_attn.v_proj.weight"] = [kv_out, h]
            shapes[pre + "self_attn.o_proj.weight"] = [h, q_out]
            shapes[pre + "mlp.gate_proj.weight"] = [m.intermediate_size, h]
            shapes[pre + "mlp.up_proj.weight"] = [m.intermediate_size, h]
            shapes[pre + "mlp.down_proj.weight"] = [h, m.intermediate_size]
        return shapes


LLAMA = Llama()
