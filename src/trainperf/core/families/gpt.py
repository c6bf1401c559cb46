"""The GPT family's torch-free half (its modules: model/gpt.py): GPT-3 as Megatron-LM trains it --
pre-LayerNorm blocks with biases, a GeLU MLP of intermediate_size, learned positions, the output
layer tied to the embedding, the vocabulary padded per TP degree, multi-head attention -- under
Megatron Core's tensor names, with a config.json of Megatron's argument names."""

from __future__ import annotations

from trainperf.core.errors import SpecError
from trainperf.core.families.family import ModelFamily
from trainperf.core.spec import ModelSpec, RunSpec

# ModelSpec field -> Megatron argument name, as a GPT checkpoint's config.json spells it
MEGATRON_CONFIG_KEYS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "intermediate_size": "ffn_hidden_size",
    "num_layers": "num_layers",
    "num_heads": "num_attention_heads",
    "max_position_embeddings": "max_position_embeddings",
    "rms_norm_eps": "layernorm_epsilon",
    "make_vocab_size_divisible_by": "make_vocab_size_divisible_by",
}
MEGATRON_OPTIONAL_KEYS = ("layernorm_epsilon", "make_vocab_size_divisible_by")
VOCAB_ROWS = ("embedding.word_embeddings.weight", "output_layer.weight")  # padded rows: any count >= vocab


class GPT(ModelFamily):
    name = "gpt"
    summary = "LayerNorm + biases, GeLU MLP, learned positions, tied embeddings; Megatron Core names (model/gpt.py)"
    checkpoint_layout = "Megatron Core"
    config_keys = MEGATRON_CONFIG_KEYS
    optional_config_keys = MEGATRON_OPTIONAL_KEYS
    mlp_up_projections = 1  # linear_fc1 alone
    tied_embeddings = True
    pads_vocab = True
    padded_rows = VOCAB_ROWS

    def check(self, spec: RunSpec) -> None:
        """What the GPT family has and lacks: multi-head attention, a padded vocabulary, no LoRA, fused
        qkv or Llama-only kernels."""
        from trainperf.core.validate import _at_least  # validate imports the families: no import cycle at load

        m = spec.model
        if m.num_kv_heads != m.num_heads:
            raise SpecError(f"model.family=gpt has multi-head attention: model.num_kv_heads={m.num_kv_heads} must equal "
                            f"model.num_heads={m.num_heads}")
        _at_least("model.make_vocab_size_divisible_by", m.make_vocab_size_divisible_by, 1)
        for key, value, llama_only in (("lora.rank", spec.lora.rank, spec.lora.enabled),
                                       ("model.fused_qkv", m.fused_qkv, m.fused_qkv),
                                       ("hardware.attention", spec.hardware.attention, spec.hardware.attention != "sdpa"),
                                       ("hardware.fp8", spec.hardware.fp8, spec.hardware.fp8 != "none")):
            if llama_only:
                raise SpecError(f"{key}={value} is for model.family=llama; the GPT family trains every weight with SDPA "
                                "attention in bf16 (leave it at its default)")

    def tp_sharded(self, m: ModelSpec) -> tuple[tuple[str, int], ...]:
        # the vocabulary is padded to a multiple of tp (padded_vocab_size), so it need not divide
        return tuple(kv for kv in super().tp_sharded(m) if kv[0] != "vocab_size")

    def projection_shapes(self, m: ModelSpec) -> dict[str, tuple[int, int]]:
        """The same attention projections (linear_qkv, linear_proj) and a two-GEMM MLP: linear_fc1 as
        up_proj, linear_fc2 as down_proj, no gate."""
        shapes = super().projection_shapes(m)
        del shapes["gate_proj"]
        return shapes

    def other_params(self, m: ModelSpec) -> int:
        """The tied output layer is the embedding, counted once (as the LM head), plus the position
        table; biases and LayerNorm shifts are left out (under 0.01% of GPT-3)."""
        return m.max_position_embeddings * m.hidden_size + (2 * m.num_layers + 1) * m.hidden_size

    def config_to_model_fields(self, config: dict, where: str) -> dict:
        fields = {}
        for ours, theirs in MEGATRON_CONFIG_KEYS.items():
            value = config.get(theirs)
            if value is None:
                if theirs in MEGATRON_OPTIONAL_KEYS:
                    continue
                hint = " (a Hugging Face Llama config; this workload trains a GPT)" if config.get("model_type") == "llama" else ""
                raise SpecError(f"{where}: config.json lacks {theirs!r}{hint}; a GPT checkpoint's config.json names "
                                f"Megatron's arguments: {', '.join(MEGATRON_CONFIG_KEYS.values())}")
            fields[ours] = value
        fields["num_kv_heads"] = fields["num_heads"]  # GPT-3 attention: one key/value head per query head
        return fields

    def model_fields_to_config(self, m: ModelSpec, dtype: str = "float32") -> dict:
        cfg = {theirs: getattr(m, ours) for ours, theirs in MEGATRON_CONFIG_KEYS.items()}
        cfg.update({"architectures": ["GPTModel"], "model_type": "megatron-gpt", "torch_dtype": dtype,
                    "padded_vocab_size": self.padded_vocab_size(m, 1)})
        return cfg

    def expected_shapes(self, m: ModelSpec, fused_qkv: bool) -> dict[str, list[int]]:
        """Megatron names -> shapes; the word embedding's row count is the padded vocabulary at TP 1
        (check_checkpoint accepts any row count >= vocab_size for padded_rows)."""
        h, f = m.hidden_size, m.intermediate_size
        shapes = {"embedding.word_embeddings.weight": [self.padded_vocab_size(m, 1), h],
                  "embedding.position_embeddings.weight": [m.max_position_embeddings, h],
                  "decoder.final_layernorm.weight": [h], "decoder.final_layernorm.bias": [h]}
        for i in range(m.num_layers):
            pre = f"decoder.layers.{i}."
            for norm in ("input_layernorm", "pre_mlp_layernorm"):
                shapes[pre + norm + ".weight"] = shapes[pre + norm + ".bias"] = [h]
            shapes.update({pre + "self_attention.linear_qkv.weight": [3 * h, h], pre + "self_attention.linear_qkv.bias": [3 * h],
                           pre + "self_attention.linear_proj.weight": [h, h], pre + "self_attention.linear_proj.bias": [h],
                           pre + "mlp.linear_fc1.weight": [f, h], pre + "mlp.linear_fc1.bias": [f],
                           pre + "mlp.linear_fc2.weight": [h, f], pre + "mlp.linear_fc2.bias": [h]})
        return shapes


GPT_FAMILY = GPT()
