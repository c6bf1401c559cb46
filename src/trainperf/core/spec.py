"""Typed specs for a run: model, LoRA, parallel layout, training, data, eval, hardware and MLPerf.

Every value reaches a spec with its field's declared type (``set_value`` coerces it, or raises a
one-line :class:`SpecError` naming the key). Resolution from config files and ``--set`` is
``core.resolve``; validation is ``core.validate``; the layout arithmetic is ``core.layout``.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from trainperf.core.errors import SpecError


@dataclass
class ModelSpec:
    name: str = "llama"
    # llama: HF LlamaForCausalLM names; gpt: Megatron GPT (LayerNorm + biases, GeLU MLP of intermediate_size,
    # learned positions, tied embeddings, vocabulary padded per TP degree; num_kv_heads = num_heads)
    family: str = "llama"
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_layers: int = 32
    num_heads: int = 32
    num_kv_heads: int = 32
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5  # the norm's epsilon: RMSNorm (llama) or LayerNorm (gpt)
    max_position_embeddings: int = 4096
    fused_qkv: bool = False  # one qkv_proj as in the MLPerf Llama-2-70B checkpoint
    init_std: float = 0.02
    path: str | None = None  # Hugging Face checkpoint dir (config.json + *.safetensors)

    # gpt: the embedding's rows are the vocabulary padded to a multiple of this x parallel.tp (Megatron's
    # --make-vocab-size-divisible-by); llama keeps vocab_size rows
    make_vocab_size_divisible_by: int = 128

    # attention heads' width; 0: hidden_size / num_heads (gpt-oss: 64 heads of 64 over a hidden of 2880)
    attention_head_dim: int = 0
    # mixture of experts (gpt_oss): experts per MoE layer, the k each token is routed to, and the
    # load-balancing loss's weight in the training loss (0: not added)
    num_experts: int = 0
    experts_per_token: int = 0
    moe_aux_loss_coeff: float = 0.0
    # gpt_oss: the sliding-window layers' window (every other layer, the first one included); 0: none
    sliding_window: int = 0
    swiglu_alpha: float = 1.702  # gpt_oss's clamped SwiGLU: x * sigmoid(alpha * x), inputs clamped at limit
    swiglu_limit: float = 7.0
    # YaRN RoPE scaling (gpt_oss): 1 = plain RoPE; else the context stretch over the original length
    rope_factor: float = 1.0
    rope_original_max_positions: int = 4096
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0

    @property
    def head_dim(self) -> int:
        return self.attention_head_dim or self.hidden_size // self.num_heads

    def padded_vocab_size(self, tp: int = 1) -> int:
        """Rows of the embedding and the output layer: Megatron pads the GPT vocabulary to a multiple
        of make_vocab_size_divisible_by x tp, so every TP rank holds an equal, aligned block; other
        families keep vocab_size rows (ModelFamily.padded_vocab_size)."""
        from trainperf.core.families import family  # the registry imports these specs: no cycle at load

        return family(self.family).padded_vocab_size(self, tp)


@dataclass
class LoRASpec:
    rank: int = 0  # 0 = no LoRA: every parameter trains
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclass
class ParallelSpec:
    dp_replicate: int = 1
    dp_shard: int = -1  # -1: whatever the world size leaves over
    tp: int = 1
    sp: bool = False
    cp: int = 1
    pp: int = 1
    pp_schedule: str = "1F1B"  # GPipe | 1F1B | Interleaved1F1B
    pp_stages_per_rank: int = 0  # virtual stages per pipeline rank; 0: 2 for Interleaved1F1B, else 1
    # expert parallel: a MoE model's experts split over ep ranks borrowed from dp_shard (torchtitan's
    # scheme): each rank holds num_experts / ep of them; tokens reach them by all-to-all
    ep: int = 1


RECOMPUTE_MODES = ("none", "selective", "full")
# train.optimizer: adamw = torch.optim.AdamW(fused=True), fp32 states (8 B per trained parameter);
# adamw8bit = torchao's AdamW8bit, both moments quantised to 8 bits in blocks of 256 with an fp32 scale
# each (~2 B per parameter): the memory that lets Llama-3-8B pretraining fit one H200
OPTIMIZERS = ("adamw", "adamw8bit")
# train.grad_sync: when FSDP2 reduce-scatters the gradients of a step's micro-batches. last: once, after
# the last (the others accumulate the full local gradient unsharded, in fp32: 4 B per trained parameter
# / tp); every: after each (gradients stay sharded, at one reduce-scatter per micro-batch)
GRAD_SYNC_MODES = ("last", "every")
PP_SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B")
FP8_RECIPES = ("none", "tensorwise", "rowwise")  # hardware.fp8: torchao float8 recipes
ATTENTION_KERNELS = ("sdpa", "flash4")
LORA_KERNELS = ("torch", "fused")
MIXED_PRECISION = ("fsdp", "autocast")  # hardware.mixed_precision


@dataclass
class TrainSpec:
    micro_batch_size: int = 1
    global_batch_size: int = 8
    lr: float = 4e-4
    min_lr_ratio: float = 0.0  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 0
    decay_steps: int = 0  # 0: the cosine ends at max_steps
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    grad_clip: float = 1.0  # 0 disables clipping
    optimizer: str = "adamw"  # adamw | adamw8bit (OPTIMIZERS, above; the MLPerf references use adamw)
    max_steps: int = 1000
    recompute: str = "none"
    # with recompute != none: how many decoder layers of each pipeline stage (its first ones) are
    # recomputed; the others keep their activations (faster, more memory). -1: every layer
    recompute_layers: int = -1
    # the layers recompute_layers leaves out: none (keep every activation) or selective (keep the
    # projections' outputs, recompute the pointwise ops) -- between the two in memory and time
    recompute_others: str = "none"
    # decoder layers of each pipeline stage whose saved activations wait in pinned host memory between
    # forward and backward instead of being recomputed (parallel/offload.py): spread among the first
    # offload_layers + recompute_layers layers, which recompute_layers' recomputed ones fill out
    # (layer_memory_modes, below); PCIe bounds what it hides (docs/PERFORMANCE.md)
    offload_layers: int = 0
    grad_sync: str = "last"  # GRAD_SYNC_MODES, above
    seed: int = 1234
    log_every: int = 10
    compile: bool = False
    save_final_model: bool = False  # write the trained (base) weights to RUN_DIR/model at the end
    # forward+backward passes on synthetic tokens before the clock starts (allocator, kernels, NCCL);
    # no optimizer step, gradients dropped and RNG states restored, so no model or optimizer state changes
    untimed_warmup_steps: int = 0
    # >0: compute the training loss this many tokens at a time (LM head + cross entropy checkpointed per
    # chunk) instead of materialising all logits; saves ~10 B x vocab per token (needs tp=1, pp=1)
    loss_chunk_tokens: int = 0
    # torch.profiler on every rank (trainperf trace): 0 = off; else loop steps 1..profile_wait run unprofiled,
    # profile_warmup more warm the profiler up, then profile_steps are recorded to RUN_DIR/trace
    profile_steps: int = 0
    profile_warmup: int = 1
    profile_wait: int = 1
    # a collective that does not complete in this many seconds ends the run as 'hung' (NCCL watchdog /
    # gloo timeout), with PyTorch's Flight Recorder dump in RUN_DIR/flight_recorder/
    collective_timeout_s: float = 600.0
    metrics_port: int = 0  # >0: rank 0 serves Prometheus metrics (step time, tokens/s, MFU, memory) on it
    metrics_host: str = "127.0.0.1"


@dataclass
class DataSpec:
    path: str | None = None  # dir with train.safetensors / validation.safetensors
    seq_len: int = 4096
    train_samples: int = 0  # synthetic workloads: how many rows to generate
    eval_samples: int = 0  # synthetic workloads: rows to generate; with data.path: evaluate the first N (0: all)


@dataclass
class EvalSpec:
    every_samples: int = 384  # rounded up to a multiple of the global batch size
    skip_first: int = 0  # evals skipped at the start; -1: the LoRA rule floor(0.125*GBS + 2)
    target: float = 0.925  # eval loss at or below this ends the run successfully
    batch_size: int = 1


@dataclass
class HardwareSpec:
    device: str = "auto"  # auto | cpu | cuda
    gpu: str = "auto"  # name used to look up peak FLOP/s; auto = from the device
    peak_tflops: float = 0.0  # 0: look up by gpu name
    dtype: str = "auto"  # auto: bf16 autocast on GPU, fp32 on CPU
    memory_check: bool = True  # refuse, before launch, a run the planner predicts will not fit
    # storage dtype of a LoRA run's frozen base weights: auto = the compute dtype (bf16 on GPU), so the
    # base costs 2 bytes/parameter instead of an fp32 master copy nothing ever updates; fp8 (with
    # fp8=tensorwise): the decoder layers' frozen projections in float8 + a scale each, 1 byte
    frozen_dtype: str = "auto"
    # float8 GEMMs in the decoder layers through torchao: none | tensorwise | rowwise (model/float8.py)
    fp8: str = "none"
    # causal attention kernel: sdpa (PyTorch's SDPA, cuDNN first on GPU) | flash4 (FlashAttention-4's
    # CuTe-DSL kernels, model/flash4.py; Hopper/Blackwell, needs the flash-attn-4 package)
    attention: str = "sdpa"
    # LoRA adapters' input side: torch (F.dropout, then A's GEMM, per adapter) | fused (one Triton
    # kernel per input draws the dropout masks inside A's GEMM for every adapter reading it, q/k/v
    # together, and keeps 1-bit records of them for the backward; model/lora_kernel.py; CUDA only)
    lora_kernel: str = "torch"
    # host memory per node, GiB, that train.offload_layers may fill with pinned activations (half of
    # it, the rest left to the OS and the data); 0: this machine's own (/proc/meminfo)
    host_mem_gib: float = 0.0
    # PyTorch's CUDA caching allocator in growable segments (PYTORCH_CUDA_ALLOC_CONF=
    # expandable_segments:True, what torchtitan's launcher sets): blocks of one size class no longer
    # strand memory between fixed segments, so a run near capacity retries (frees its cache and
    # re-allocates) less; the 8B pretraining run on 2 x H200 retried 7 times at 136.5 of 140 GiB
    # reserved. An explicit setting in the environment wins.
    expandable_segments: bool = False
    # full training in one process: fsdp (FSDP2 on the one rank: bf16 gathers of the fp32 masters, fp32
    # gradient reduction) | autocast (no FSDP2: fp32 parameters, the forward under torch.autocast in the
    # compute dtype, as torchtitan trains on one GPU; refused with more than one process or with LoRA)
    mixed_precision: str = "fsdp"


@dataclass
class MLPerfSpec:
    benchmark: str = ""  # submission_benchmark
    division: str = "open"
    org: str = "trainperf"
    platform: str = ""
    comparable: bool = False  # whether the figures may be put beside published results


@dataclass
class RunSpec:
    workload: str
    model: ModelSpec = field(default_factory=ModelSpec)
    lora: LoRASpec = field(default_factory=LoRASpec)
    parallel: ParallelSpec = field(default_factory=ParallelSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    data: DataSpec = field(default_factory=DataSpec)
    eval: EvalSpec = field(default_factory=EvalSpec)
    hardware: HardwareSpec = field(default_factory=HardwareSpec)
    mlperf: MLPerfSpec = field(default_factory=MLPerfSpec)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunSpec:
        spec = cls(workload=d["workload"])
        for section, values in d.items():
            if section == "workload":
                continue
            apply_section(spec, section, values, source="spec")
        return spec


SECTIONS = tuple(f.name for f in dataclasses.fields(RunSpec) if f.name != "workload")


# ---------------------------------------------------------------------------------------------
# Coercion: every value reaches the spec with its declared type, or a SpecError names the key.


def did_you_mean(name: str, choices, prefix: str = "") -> str:
    """' (did you mean 'x'?)' for the closest of ``choices`` to a misspelt name, or ''."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {prefix + close[0]!r}?)" if close else ""

def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
            if type(None) in args:
                return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], key)
    if origin is list:
        (item_tp,) = args
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise SpecError(f"{key}: expected a list (comma-separated), got {value!r}")
        return [_coerce(v, item_tp, key) for v in value]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise SpecError(f"{key}: expected true or false, got {value!r}")
    if tp in (int, float):
        what = "an integer" if tp is int else "a number"
        if not isinstance(value, bool):  # bool is an int subclass, never a count
            number = None
            if isinstance(value, (int, float)) and (tp is float or float(value).is_integer()):
                number = tp(value)
            elif isinstance(value, str):
                try:
                    number = tp(value)
                except ValueError:
                    pass
            if number is not None:
                if tp is float and not math.isfinite(number):
                    raise SpecError(f"{key}: expected a finite number, got {value!r}")
                return number
        raise SpecError(f"{key}: expected {what}, got {value!r}")
    if tp is str:
        if isinstance(value, (dict, list)):
            raise SpecError(f"{key}: expected a string, got {value!r}")
        return str(value)
    raise SpecError(f"{key}: unsupported type {tp}")


def _section_types(section_obj: Any) -> dict[str, Any]:
    return _class_types(type(section_obj))


@functools.cache  # the hints of a section class never change; evaluating them is most of a spec's resolve time
def _class_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def set_value(spec: RunSpec, dotted: str, value: Any) -> None:
    """Set ``section.key`` on the spec, coercing the value; unknown names are SpecErrors."""
    if "." not in dotted:
        raise SpecError(f"override {dotted!r}: expected section.key=value with section in {', '.join(SECTIONS)}")
    section, key = dotted.split(".", 1)
    if section not in SECTIONS:
        raise SpecError(f"unknown section {section!r} in {dotted!r}{did_you_mean(section, SECTIONS)}; valid sections: "
                        f"{', '.join(SECTIONS)}")
    obj = getattr(spec, section)
    types = _section_types(obj)
    if key not in types:
        raise SpecError(f"unknown key {dotted!r}{did_you_mean(key, types, section + '.')}; valid keys in {section}: "
                        f"{', '.join(sorted(types))}")
    setattr(obj, key, _coerce(value, types[key], dotted))


def apply_section(spec: RunSpec, section: str, values: Any, source: str) -> None:
    if not isinstance(values, dict):
        raise SpecError(f"{source}: section {section!r} must be a mapping of key: value")
    for key, value in values.items():
        set_value(spec, f"{section}.{key}", value)


def eval_interval_samples(spec: RunSpec) -> int:
    """MLPerf: every N samples, rounded up to a whole number of global batches."""
    gbs = spec.train.global_batch_size
    return math.ceil(spec.eval.every_samples / gbs) * gbs


def eval_skip_count(spec: RunSpec) -> int:
    """How many of the first evals are skipped (MLPerf llama2_70b_lora: FLOOR(0.125*GBS + 2))."""
    if spec.eval.skip_first < 0:
        return math.floor(0.125 * spec.train.global_batch_size + 2)
    return spec.eval.skip_first
