"""The torch-free half of a model family: what ``core`` and ``plan`` need to know about it.

A :class:`ModelFamily` owns, for one ``model.family`` value: the checks of its config fields, the
shapes of its decoder-layer projections (from which the FLOP and parameter formulas of core.flops
and the planner follow), its checkpoint adapter (config.json keys and tensor names with their
expected shapes), the LoRA target names it accepts and the traits the planner prices it by. The
torch half (modules, initialisation, tensor-parallel plan, pipeline parts) is the family's
``FamilyModules`` in ``model/families.py``; both are registered under the same name.

The defaults here are those of a Llama-style decoder (q/k/v/o attention, gated MLP, untied
embedding); a family overrides what differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from trainperf.core.errors import SpecError

if TYPE_CHECKING:  # the specs import the registry back (ModelSpec.padded_vocab_size)
    from trainperf.core.spec import ModelSpec, RunSpec


class ModelFamily:
    """One model family. Subclass it, set the class attributes, override what differs, and register
    an instance (core/families/__init__.py ``register``)."""

    name: str = ""  # the model.family value
    summary: str = ""  # one line: what the family's decoder is
    checkpoint_layout: str = ""  # whose names its checkpoints use, in words ("Hugging Face", "Megatron Core")
    config_keys: Mapping[str, str] = {}  # ModelSpec field -> the checkpoint config.json key
    optional_config_keys: tuple[str, ...] = ()  # config.json keys a checkpoint may leave out (the spec's value stays)
    mlp_up_projections: int = 2  # GEMMs from the hidden size up to intermediate_size: gate and up (2), or one (1)
    tied_embeddings: bool = False  # the output layer is the input embedding's weight
    pads_vocab: bool = False  # embedding rows padded to make_vocab_size_divisible_by x tp (Megatron)
    padded_rows: tuple[str, ...] = ()  # checkpoint tensors that may hold any row count >= vocab_size
    mixture_of_experts: bool = False  # routed experts: model.num_experts, experts_per_token, parallel.ep apply

    # -- config fields and their checks --------------------------------------------------------------

    def check(self, spec: RunSpec) -> None:
        """The family's own checks of a resolved spec (core.validate.check_values calls it): SpecError
        naming the field and what would be valid."""

    def tp_sharded(self, m: ModelSpec) -> tuple[tuple[str, int], ...]:
        """(field, value) of every size tensor parallelism splits: each must divide by parallel.tp."""
        return (("num_heads", m.num_heads), ("num_kv_heads", m.num_kv_heads),
                ("intermediate_size", m.intermediate_size), ("vocab_size", m.vocab_size))

    def lora_targets(self, m: ModelSpec) -> tuple[str, ...]:
        """The projection names lora.target_modules may hold; () where the family has no LoRA."""
        return ()

    def padded_vocab_size(self, m: ModelSpec, tp: int = 1) -> int:
        """Rows of the embedding and the output layer at tensor-parallel degree ``tp``."""
        if not self.pads_vocab:
            return m.vocab_size
        multiple = m.make_vocab_size_divisible_by * tp
        return -(-m.vocab_size // multiple) * multiple

    # -- FLOP and parameter formulas (core.flops, plan) ----------------------------------------------

    def projection_shapes(self, m: ModelSpec) -> dict[str, tuple[int, int]]:
        """(input width, output width) of each decoder-layer projection, by the planner's names
        (q/k/v/o_proj, gate/up/down_proj); ``qkv_proj`` is the fused q, k and v (counted once: it
        holds the same weights as q, k and v)."""
        h, q_out, kv_out, ff = m.hidden_size, m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim, m.intermediate_size
        return {"q_proj": (h, q_out), "k_proj": (h, kv_out), "v_proj": (h, kv_out), "qkv_proj": (h, q_out + 2 * kv_out),
                "o_proj": (q_out, h), "gate_proj": (h, ff), "up_proj": (h, ff), "down_proj": (ff, h)}

    def linear_params(self, m: ModelSpec) -> dict[str, int]:
        """Weights of every projection summed over the layers (q, k, v unfused: a fused qkv holds the
        same), and of the LM head: all of them (a mixture of experts counts every expert)."""
        out = {name: i * o * m.num_layers for name, (i, o) in self.projection_shapes(m).items() if name != "qkv_proj"}
        out["lm_head"] = m.hidden_size * m.vocab_size
        return out

    def active_linear_params(self, m: ModelSpec) -> dict[str, int]:
        """The projection weights one token passes through (the model FLOPs count these): all of them
        in a dense model; a mixture of experts counts its routed top-k and shared experts only."""
        return self.linear_params(m)

    def other_params(self, m: ModelSpec) -> int:
        """Weights outside the decoder layers' projections and the LM head: the input embedding, norms."""
        return m.vocab_size * m.hidden_size + (2 * m.num_layers + 1) * m.hidden_size

    def attention_fwd_flops_per_token(self, m: ModelSpec, seq_len: int) -> float:
        """Causal attention's QK^T and PV, forward, per token over all layers (the mask halves the square)."""
        return 2.0 * seq_len * m.num_heads * m.head_dim * m.num_layers

    # -- checkpoint adapter ------------------------------------------------------------------------

    def config_to_model_fields(self, config: dict, where: str) -> dict:
        """ModelSpec fields from a checkpoint's config.json; SpecError naming a missing key."""
        fields = {}
        for ours, theirs in self.config_keys.items():
            value = config.get(theirs)
            if value is None:
                if theirs in self.optional_config_keys:
                    continue
                raise SpecError(f"{where}: config.json lacks {theirs!r}; a {self.name} checkpoint's config.json "
                                f"names {', '.join(self.config_keys.values())}")
            fields[ours] = value
        return fields

    def model_fields_to_config(self, m: ModelSpec, dtype: str = "float32") -> dict:
        """The config.json a checkpoint of this family is written with."""
        return {theirs: getattr(m, ours) for ours, theirs in self.config_keys.items()}

    def expected_shapes(self, m: ModelSpec, fused_qkv: bool) -> dict[str, list[int]]:
        """Checkpoint tensor name -> shape, every tensor the model loads."""
        raise NotImplementedError(f"model.family={self.name} names no checkpoint tensors")

    def __repr__(self) -> str:
        return f"ModelFamily({self.name!r})"
