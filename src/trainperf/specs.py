"""Typed specs for a run: model, LoRA, parallel layout, training, data, eval and hardware.

A spec is resolved in three layers, later ones winning:
  1. the workload's defaults (``trainperf.workloads``),
  2. an optional ``--config FILE`` (YAML or TOML, same ``section: {key: value}`` shape),
  3. repeated ``--set section.key=value`` overrides.
Every value is coerced to the field's declared type and the whole spec is validated before any
process is launched; problems raise :class:`SpecError` with a one-line message.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class SpecError(ValueError):
    """Bad input: a one-line message saying what is wrong and what would be valid."""


@dataclass
class ModelSpec:
    name: str = "llama"
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_layers: int = 32
    num_heads: int = 32
    num_kv_heads: int = 32
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 4096
    fused_qkv: bool = False  # one qkv_proj as in the MLPerf Llama-2-70B checkpoint
    init_std: float = 0.02
    path: str | None = None  # Hugging Face checkpoint dir (config.json + *.safetensors)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


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


RECOMPUTE_MODES = ("none", "selective", "full")
# train.optimizer: adamw = torch.optim.AdamW(fused=True), fp32 states (8 B per trained parameter);
# adamw8bit = torchao's AdamW8bit, both moments quantised to 8 bits in blocks of 256 with an fp32 scale
# each (~2 B per parameter): the memory that lets Llama-3-8B pretraining fit one H200
OPTIMIZERS = ("adamw", "adamw8bit")
PP_SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B")
FP8_RECIPES = ("none", "tensorwise", "rowwise")  # hardware.fp8: torchao float8 recipes


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
    return typing.get_type_hints(type(section_obj))


def set_value(spec: RunSpec, dotted: str, value: Any) -> None:
    """Set ``section.key`` on the spec, coercing the value; unknown names are SpecErrors."""
    if "." not in dotted:
        raise SpecError(f"override {dotted!r}: expected section.key=value with section in {', '.join(SECTIONS)}")
    section, key = dotted.split(".", 1)
    if section not in SECTIONS:
        raise SpecError(f"unknown section {section!r} in {dotted!r}; valid sections: {', '.join(SECTIONS)}")
    obj = getattr(spec, section)
    types = _section_types(obj)
    if key not in types:
        raise SpecError(f"unknown key {dotted!r}; valid keys in {section}: {', '.join(sorted(types))}")
    setattr(obj, key, _coerce(value, types[key], dotted))


def apply_section(spec: RunSpec, section: str, values: Any, source: str) -> None:
    if not isinstance(values, dict):
        raise SpecError(f"{source}: section {section!r} must be a mapping of key: value")
    for key, value in values.items():
        set_value(spec, f"{section}.{key}", value)


def parse_override(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise SpecError(f"--set {text!r}: expected section.key=value")
    key, value = text.split("=", 1)
    return key.strip(), value.strip()


def load_config_file(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"config file {path!r} does not exist")
    try:
        text = p.read_text()
    except (UnicodeDecodeError, OSError) as exc:
        raise SpecError(f"config file {path!r} could not be read as text ({exc.__class__.__name__})") from None
    try:
        if p.suffix.lower() == ".toml":
            import tomllib

            data = tomllib.loads(text)
        elif p.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            raise SpecError(f"config file {path!r}: expected a .yaml, .yml or .toml file")
    except SpecError:
        raise
    except Exception as exc:  # parser errors come in many classes
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecError(f"config file {path!r} could not be parsed: {first}") from None
    if not isinstance(data, dict):
        raise SpecError(f"config file {path!r}: top level must be a mapping of sections")
    return data


def resolve_spec(base: RunSpec, config_file: str | None, overrides: list[str]) -> RunSpec:
    """Layer a config file and --set overrides over a workload's defaults."""
    spec = RunSpec.from_dict(base.to_dict())  # deep copy
    if config_file:
        for section, values in load_config_file(config_file).items():
            if section == "workload":
                continue
            if section not in SECTIONS:
                raise SpecError(f"config file {config_file!r}: unknown section {section!r}; valid: {', '.join(SECTIONS)}")
            apply_section(spec, section, values, source=f"config file {config_file!r}")
    for item in overrides:
        key, value = parse_override(item)
        set_value(spec, key, value)
    check_choices(spec)  # plan and tune price the spec without validate(): a misspelt name fails here
    check_values(spec)  # and a value out of its range
    return spec


# ---------------------------------------------------------------------------------------------
# Validation: everything checkable without a process group is checked here, before launch.

def data_parallel_size(p: ParallelSpec) -> int:
    return p.dp_replicate * p.dp_shard


def resolve_layout(spec: RunSpec, world_size: int) -> None:
    """Fill dp_shard=-1 from the world size and check the layout multiplies out."""
    p = spec.parallel
    for name in ("dp_replicate", "tp", "cp", "pp"):
        if getattr(p, name) < 1:
            raise SpecError(f"parallel.{name}={getattr(p, name)}: must be >= 1")
    others = p.tp * p.cp * p.pp * p.dp_replicate
    if p.dp_shard == -1:
        if world_size % others:
            raise SpecError(
                f"world size {world_size} is not divisible by parallel.tp x cp x pp x dp_replicate = {p.tp} x {p.cp} x "
                f"{p.pp} x {p.dp_replicate} = {others}; choose them so that their product divides {world_size}"
            )
        p.dp_shard = world_size // others
    if p.dp_shard < 1:
        raise SpecError(f"parallel.dp_shard={p.dp_shard}: must be >= 1 or -1 (fill the world size)")
    product = others * p.dp_shard
    if product != world_size:
        raise SpecError(
            f"layout dp_replicate={p.dp_replicate} x dp_shard={p.dp_shard} x tp={p.tp} x cp={p.cp} x pp={p.pp} "
            f"= {product} processes, but the world size is {world_size}; make the product equal {world_size}"
        )


def grad_accum_steps(spec: RunSpec) -> int:
    dp = data_parallel_size(spec.parallel)
    return spec.train.global_batch_size // (dp * spec.train.micro_batch_size)


def eval_interval_samples(spec: RunSpec) -> int:
    """MLPerf: every N samples, rounded up to a whole number of global batches."""
    gbs = spec.train.global_batch_size
    return math.ceil(spec.eval.every_samples / gbs) * gbs


def eval_skip_count(spec: RunSpec) -> int:
    """How many of the first evals are skipped (MLPerf llama2_70b_lora: FLOOR(0.125*GBS + 2))."""
    if spec.eval.skip_first < 0:
        return math.floor(0.125 * spec.train.global_batch_size + 2)
    return spec.eval.skip_first


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _runs_on_cpu(spec: RunSpec) -> bool:
    """hardware.device=cpu, or auto on a machine without CUDA."""
    return spec.hardware.device == "cpu" or (spec.hardware.device == "auto" and not _cuda_available())


def stages_per_rank(p: ParallelSpec) -> int:
    """Pipeline stages each rank holds: parallel.pp_stages_per_rank, else 2 for Interleaved1F1B, else 1
    (1 without pipeline parallelism)."""
    if p.pp == 1:
        return 1
    return p.pp_stages_per_rank or (2 if p.pp_schedule == "Interleaved1F1B" else 1)


def layers_per_stage(spec: RunSpec) -> int:
    return spec.model.num_layers // (spec.parallel.pp * stages_per_rank(spec.parallel))


# offloaded layers below the one in backward whose copies back are already issued (parallel/offload.py);
# the highest offloaded layer's copy is issued this many layers above it. Here for the planner too.
OFFLOAD_PREFETCH_DEPTH = 2


def layer_memory_modes(n: int, recompute: str, recompute_layers: int = -1, others: str = "none",
                       offload: int = 0) -> list[str]:
    """What each of a stage's ``n`` decoder layers does with its activations: offload | full |
    selective | none. The first ``offload`` + k layers (k = recompute_layers; -1: all the others) are
    the ones that keep least on the GPU: ``offload`` of them (train.offload_layers) keep their
    activations in pinned host memory, spread evenly among the k that get train.recompute -- a layer's
    copy back then runs under the backward and the recomputation of the layers between it and the
    offloaded layer above it, not under one layer's backward alone; the layers after them get
    train.recompute_others (Megatron's recompute-num-layers). Offloading the first layers first: their
    copies out overlap the forward of every layer after them."""
    offload = min(offload, n)
    if recompute == "none":
        k, others = 0, "none"
    else:
        k = n - offload if recompute_layers < 0 else min(recompute_layers, n - offload)
    block = offload + k
    offloaded = {i * block // offload for i in range(offload)} if offload else set()
    return ["offload" if i in offloaded else recompute if i < block else others for i in range(n)]


def validate_layout(spec: RunSpec) -> None:
    """What each technique needs of the model and the batch."""
    p, m, t, d = spec.parallel, spec.model, spec.train, spec.data
    if p.sp and p.tp == 1:
        raise SpecError("parallel.sp=true needs parallel.tp > 1 (sequence parallel splits the tensor-parallel group's work)")
    if p.tp > 1:
        for name, value in (("num_heads", m.num_heads), ("num_kv_heads", m.num_kv_heads),
                            ("intermediate_size", m.intermediate_size), ("vocab_size", m.vocab_size)):
            if value % p.tp:
                raise SpecError(f"model.{name}={value} is not divisible by parallel.tp={p.tp}; "
                                f"choose tp among the divisors of {value}")
    if p.sp and p.tp > 1 and d.seq_len % p.tp:
        raise SpecError(f"data.seq_len={d.seq_len} is not divisible by parallel.tp={p.tp} (sequence parallel splits it)")
    if p.cp > 1:
        if d.seq_len % (2 * p.cp):
            raise SpecError(f"data.seq_len={d.seq_len} is not divisible by 2 x parallel.cp = {2 * p.cp} "
                            "(load-balanced context parallel cuts each sequence into 2*cp chunks)")
        if p.tp > 1 and p.sp and d.seq_len % (2 * p.cp * p.tp):
            raise SpecError(f"data.seq_len={d.seq_len} is not divisible by 2 x cp x tp = {2 * p.cp * p.tp}")
        if p.pp > 1:
            raise SpecError("parallel.cp > 1 together with parallel.pp > 1 is not supported yet; use one of them")
        if spec.hardware.dtype == "fp32":
            raise SpecError("parallel.cp > 1 with hardware.dtype=fp32 hangs in PyTorch's ring attention "
                            "(fp32 takes the memory-efficient kernel; seen on torch 2.11 + H200); use hardware.dtype=auto (bf16)")
        if _runs_on_cpu(spec):
            raise SpecError("parallel.cp > 1 needs CUDA GPUs: in torch 2.13 context parallel attention has no "
                            "CPU kernels (no backward); use cp=1 on CPU")
        if t.compile:
            raise SpecError(f"train.compile=true with parallel.cp={p.cp} fails in torch 2.11: the compiled layer's "
                            "backward sends ring attention's cuDNN backward to the CPU kernel table (seen on "
                            "2 x H200, with and without recompute); use train.compile=false or parallel.cp=1")
    if p.pp > 1:
        vstages = stages_per_rank(p)
        if p.pp_schedule == "Interleaved1F1B" and vstages < 2:
            raise SpecError("parallel.pp_schedule=Interleaved1F1B needs parallel.pp_stages_per_rank >= 2")
        if p.pp_schedule != "Interleaved1F1B" and vstages != 1:
            raise SpecError(f"parallel.pp_stages_per_rank={vstages} needs parallel.pp_schedule=Interleaved1F1B")
        stages = p.pp * vstages
        if m.num_layers % stages:
            raise SpecError(f"model.num_layers={m.num_layers} is not divisible by the {stages} pipeline stages "
                            f"(pp={p.pp} x {vstages} per rank)")
        micro = grad_accum_steps(spec)
        if micro < p.pp:
            raise SpecError(f"{micro} micro-batches per step (GBS {t.global_batch_size} / dp {data_parallel_size(p)} / "
                            f"micro-batch {t.micro_batch_size}) are fewer than the {p.pp} pipeline stages; "
                            f"raise train.global_batch_size to at least {p.pp * data_parallel_size(p) * t.micro_batch_size}")


def _validate_fp8(spec: RunSpec) -> None:
    """hardware.fp8 (a torchao recipe, check_choices): torchao importable, tensor parallel off (float8 TP
    styles are not wired), and GEMM dimensions float8 kernels accept (multiples of 16)."""
    h, m = spec.hardware, spec.model
    if h.fp8 == "none":
        return
    if spec.parallel.tp > 1:
        raise SpecError(f"hardware.fp8={h.fp8} with parallel.tp={spec.parallel.tp} is not supported (float8 tensor "
                        "parallel styles are not wired); use tp=1 with FSDP, CP or PP")
    dims = {"hidden_size": m.hidden_size, "intermediate_size": m.intermediate_size,
            "num_kv_heads x head_dim": m.num_kv_heads * m.head_dim}
    for name, v in dims.items():
        if v % 16:
            raise SpecError(f"hardware.fp8={h.fp8} needs GEMM dimensions divisible by 16; model {name}={v} is not")
    import importlib.util

    if importlib.util.find_spec("torchao") is None:
        raise SpecError(f"hardware.fp8={h.fp8} needs torchao (pip install torchao, or a wheel on a machine "
                        "without network); it is not installed")


ATTENTION_KERNELS = ("sdpa", "flash4")
LORA_KERNELS = ("torch", "fused")


def _refuse_off_gpu_or_fp32(spec: RunSpec, setting: str, needs: str, fallback: str) -> None:
    """A GPU kernel that computes in bf16 (``setting``, e.g. hardware.attention=flash4): refused on CPU
    and with fp32 compute, naming ``fallback``, the setting that runs there."""
    if _runs_on_cpu(spec):
        raise SpecError(f"{setting} {needs}; use {fallback} on CPU")
    if spec.hardware.dtype == "fp32":
        raise SpecError(f"{setting} runs bf16 only, not hardware.dtype=fp32; use hardware.dtype=auto or bf16, or {fallback}")


def _validate_attention(spec: RunSpec) -> None:
    """hardware.attention: a known kernel; flash4 on a single-sequence-per-rank layout (context
    parallel's ring attention is SDPA's) and on a GPU and package that can run it."""
    kernel = spec.hardware.attention  # a known name: check_choices
    if kernel == "sdpa":
        return
    if spec.parallel.cp > 1:
        raise SpecError(f"hardware.attention=flash4 with parallel.cp={spec.parallel.cp} is not supported (context "
                        "parallel's ring attention runs SDPA); use hardware.attention=sdpa or parallel.cp=1")
    _refuse_off_gpu_or_fp32(spec, "hardware.attention=flash4", "needs CUDA GPUs (Hopper or Blackwell)",
                            "hardware.attention=sdpa")
    head_dim = spec.model.head_dim
    if head_dim % 8 or not 8 <= head_dim <= 256:
        raise SpecError(f"hardware.attention=flash4 takes head dims 8 to 256 in multiples of 8; this model's is {head_dim} "
                        "(hidden_size / num_heads); use hardware.attention=sdpa")
    from trainperf.model.flash4 import available

    why_not = available(head_dim)
    if why_not:
        raise SpecError(why_not)


def _validate_lora_kernel(spec: RunSpec) -> None:
    """hardware.lora_kernel=fused: a LoRA run on CUDA GPUs with Triton, in bf16, without tensor
    parallel (its adapters see DTensors), at an adapter rank the kernel's tiles take."""
    if spec.hardware.lora_kernel == "torch":
        return
    if not spec.lora.enabled:
        raise SpecError("hardware.lora_kernel=fused is for LoRA runs (lora.rank > 0); this run trains every "
                        "parameter; use hardware.lora_kernel=torch")
    _refuse_off_gpu_or_fp32(spec, "hardware.lora_kernel=fused", "is a Triton kernel for CUDA GPUs",
                            "hardware.lora_kernel=torch")
    if spec.parallel.tp > 1:
        raise SpecError(f"hardware.lora_kernel=fused with parallel.tp={spec.parallel.tp} is not supported (tensor "
                        "parallel's adapters see DTensors); use hardware.lora_kernel=torch or parallel.tp=1")
    from trainperf.model.lora_layout import takes_rank

    rank = spec.lora.rank
    if not takes_rank(rank):
        raise SpecError(f"hardware.lora_kernel=fused takes lora.rank 16, 32, 64, ... (a power of two >= 16); "
                        f"got {rank}; use hardware.lora_kernel=torch")
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        raise SpecError("hardware.lora_kernel=fused needs the triton package (it ships with CUDA builds of torch); "
                        "valid without it: hardware.lora_kernel=torch")


def check_choices(spec: RunSpec) -> None:
    """The fields that take one of a fixed set of names: SpecError naming the field, the value and the
    valid ones. resolve_spec runs it (``plan`` and ``tune`` price a spec without validate()), validate too."""
    p, t, h = spec.parallel, spec.train, spec.hardware
    for key, value, valid in (
            ("parallel.pp_schedule", p.pp_schedule, PP_SCHEDULES),
            ("train.recompute", t.recompute, RECOMPUTE_MODES),
            ("train.recompute_others", t.recompute_others, ("none", "selective")),
            ("train.optimizer", t.optimizer, OPTIMIZERS),
            ("hardware.device", h.device, ("auto", "cpu", "cuda")),
            ("hardware.dtype", h.dtype, ("auto", "fp32", "bf16")),
            ("hardware.frozen_dtype", h.frozen_dtype, ("auto", "fp32", "bf16", "fp8")),
            ("hardware.fp8", h.fp8, FP8_RECIPES),
            ("hardware.attention", h.attention, ATTENTION_KERNELS),
            ("hardware.lora_kernel", h.lora_kernel, LORA_KERNELS),
            ("mlperf.division", spec.mlperf.division, ("open", "closed"))):
        if value not in valid:
            raise SpecError(f"{key}={value!r}: valid values are {', '.join(valid)}")


def _at_least(key: str, value, low, note: str = "") -> None:
    if value < low:
        raise SpecError(f"{key}={value}: must be >= {low}{note}")


def _above(key: str, value, low, note: str = "") -> None:
    if value <= low:
        raise SpecError(f"{key}={value}: must be > {low}{note}")


def check_values(spec: RunSpec) -> None:
    """Every number in its range, and the model's own arithmetic: what needs neither the world size nor
    a checkpoint. resolve_spec runs it (``plan``, ``tune`` and sweeps too), validate again."""
    m, lo, p, t, d, e, h = spec.model, spec.lora, spec.parallel, spec.train, spec.data, spec.eval, spec.hardware
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                 "max_position_embeddings"):
        _at_least(f"model.{name}", getattr(m, name), 1)
    if m.hidden_size % m.num_heads:
        raise SpecError(f"model.hidden_size={m.hidden_size} is not divisible by model.num_heads={m.num_heads}")
    if m.num_heads % m.num_kv_heads:
        raise SpecError(
            f"model.num_heads={m.num_heads} is not divisible by model.num_kv_heads={m.num_kv_heads} (GQA needs whole groups)"
        )
    if m.head_dim % 2:
        raise SpecError(f"head dim {m.head_dim} (hidden_size/num_heads) must be even for RoPE")
    for name in ("rope_theta", "rms_norm_eps", "init_std"):
        _above(f"model.{name}", getattr(m, name), 0)
    _at_least("lora.rank", lo.rank, 0, " (0 disables LoRA)")
    if lo.enabled:
        _above("lora.alpha", lo.alpha, 0, " (the adapters' scale is alpha / rank)")
        if not 0.0 <= lo.dropout < 1.0:
            raise SpecError(f"lora.dropout={lo.dropout}: must be in [0, 1)")
    _at_least("parallel.pp_stages_per_rank", p.pp_stages_per_rank, 0, " (0: the schedule's default)")
    _at_least("train.micro_batch_size", t.micro_batch_size, 1)
    _at_least("train.global_batch_size", t.global_batch_size, 1)
    _above("train.lr", t.lr, 0)
    if not 0.0 <= t.min_lr_ratio <= 1.0:
        raise SpecError(f"train.min_lr_ratio={t.min_lr_ratio}: must be in [0, 1] (the cosine ends at lr x min_lr_ratio)")
    _at_least("train.warmup_steps", t.warmup_steps, 0)
    _at_least("train.decay_steps", t.decay_steps, 0, " (0: the cosine ends at max_steps)")
    _at_least("train.weight_decay", t.weight_decay, 0.0)
    for name in ("beta1", "beta2"):
        if not 0.0 <= getattr(t, name) < 1.0:
            raise SpecError(f"train.{name}={getattr(t, name)}: must be in [0, 1)")
    _above("train.eps", t.eps, 0)
    _at_least("train.grad_clip", t.grad_clip, 0.0, " (0 disables clipping)")
    _at_least("train.max_steps", t.max_steps, 1)
    _at_least("train.recompute_layers", t.recompute_layers, -1, " (-1: every layer)")
    _at_least("train.offload_layers", t.offload_layers, 0)
    _at_least("train.log_every", t.log_every, 1, " (steps between logged losses)")
    _at_least("train.untimed_warmup_steps", t.untimed_warmup_steps, 0)
    _at_least("train.loss_chunk_tokens", t.loss_chunk_tokens, 0, " (0: no chunking)")
    if min(t.profile_steps, t.profile_warmup, t.profile_wait) < 0:
        raise SpecError("train.profile_steps, profile_warmup and profile_wait must be >= 0")
    _above("train.collective_timeout_s", t.collective_timeout_s, 0, " seconds")
    if not 0 <= t.metrics_port < 65536:
        raise SpecError(f"train.metrics_port={t.metrics_port}: must be a TCP port (1-65535), or 0 for none")
    _at_least("data.seq_len", d.seq_len, 2)
    if d.seq_len > m.max_position_embeddings and not m.path:  # a checkpoint's config.json may raise it
        raise SpecError(f"data.seq_len={d.seq_len} exceeds model.max_position_embeddings={m.max_position_embeddings}")
    _at_least("data.train_samples", d.train_samples, 0)
    _at_least("data.eval_samples", d.eval_samples, 0)
    _at_least("eval.every_samples", e.every_samples, 1)
    _at_least("eval.skip_first", e.skip_first, -1, " (-1: the MLPerf LoRA rule)")
    _at_least("eval.batch_size", e.batch_size, 1)
    _at_least("hardware.peak_tflops", h.peak_tflops, 0.0, " (0: look it up from hardware.gpu)")
    if h.gpu != "auto" and not h.peak_tflops:  # the name is only looked up for the peak
        from trainperf.train.metrics import PEAK_BF16_FLOPS, peak_flops_for

        if peak_flops_for(h.gpu) is None:
            raise SpecError(f"hardware.gpu={h.gpu!r}: no peak FLOP/s known for it; valid: auto (the device's own "
                            f"name), {', '.join(PEAK_BF16_FLOPS)}, or give hardware.peak_tflops")
    _at_least("hardware.host_mem_gib", h.host_mem_gib, 0.0, " (0: this machine's memory)")


def _validate_optimizer(t: TrainSpec) -> None:
    import importlib.util

    if t.optimizer == "adamw8bit" and importlib.util.find_spec("torchao") is None:
        raise SpecError("train.optimizer=adamw8bit needs torchao (pip install torchao, or a wheel on a machine "
                        "without network); it is not installed")


def validate(spec: RunSpec, world_size: int, before_checkpoint: bool = False) -> None:
    """Raise SpecError on the first problem; call before any process is launched. ``before_checkpoint``:
    model.path's config.json is not applied yet (it may raise max_position_embeddings)."""
    check_choices(spec)  # names first: the layout's arithmetic reads some of them (pp_schedule)
    check_values(spec)
    resolve_layout(spec, world_size)
    m, t, lo, d, e = spec.model, spec.train, spec.lora, spec.data, spec.eval
    dp = data_parallel_size(spec.parallel)
    if t.global_batch_size % (dp * t.micro_batch_size):
        raise SpecError(
            f"train.global_batch_size={t.global_batch_size} is not divisible by data-parallel size {dp} x "
            f"micro_batch_size {t.micro_batch_size} = {dp * t.micro_batch_size}; use a multiple of {dp * t.micro_batch_size}"
        )
    _validate_fp8(spec)
    _validate_attention(spec)
    _validate_lora_kernel(spec)
    _validate_optimizer(t)
    per_stage = layers_per_stage(spec)
    if not 0 <= t.offload_layers <= per_stage:
        raise SpecError(f"train.offload_layers={t.offload_layers}: must be 0..{per_stage} (the decoder layers of one "
                        "pipeline stage)")
    if t.recompute_layers != -1:
        if t.recompute == "none":
            raise SpecError(f"train.recompute_layers={t.recompute_layers} needs train.recompute=full or selective")
        if not 0 <= t.recompute_layers <= per_stage - t.offload_layers:
            raise SpecError(f"train.recompute_layers={t.recompute_layers}: must be -1 (every layer) or "
                            f"0..{per_stage - t.offload_layers} (the decoder layers of one pipeline stage"
                            + (f" after the {t.offload_layers} offloaded ones)" if t.offload_layers else ")"))
    if t.recompute_others != "none" and (t.recompute != "full" or t.recompute_layers == -1):
        raise SpecError(f"train.recompute_others={t.recompute_others} applies to the layers train.recompute_layers "
                        "leaves out: it needs train.recompute=full and train.recompute_layers=0..layers per stage")
    if lo.enabled:
        valid = ("qkv_proj", "o_proj", "gate_proj", "up_proj", "down_proj") if m.fused_qkv else (
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
        bad = [x for x in lo.target_modules if x not in valid]
        if bad or not lo.target_modules:
            raise SpecError(f"lora.target_modules={lo.target_modules}: valid names for this model are {', '.join(valid)}")
    validate_layout(spec)
    if d.path is None and (d.train_samples < 1 or d.eval_samples < 0):
        raise SpecError(f"data.train_samples={d.train_samples}, data.eval_samples={d.eval_samples}: a generated "
                        "dataset needs at least 1 row of each (or give data.path)")
    if d.seq_len > m.max_position_embeddings and not (before_checkpoint and m.path):
        raise SpecError(
            f"data.seq_len={d.seq_len} exceeds model.max_position_embeddings={m.max_position_embeddings}"
        )
    if t.loss_chunk_tokens > 0 and (spec.parallel.tp > 1 or spec.parallel.pp > 1):
        raise SpecError("train.loss_chunk_tokens > 0 needs parallel.tp=1 and parallel.pp=1 (tensor parallel already "
                        "shards the logits over the vocabulary; the pipeline's last stage computes its own loss)")
    if spec.hardware.frozen_dtype == "fp8" and not (spec.lora.enabled and spec.hardware.fp8 == "tensorwise"):
        raise SpecError("hardware.frozen_dtype=fp8 stores LoRA's frozen base in float8 for the tensorwise float8 "
                        f"GEMMs; it needs lora.rank > 0 and hardware.fp8=tensorwise (got lora.rank={spec.lora.rank}, "
                        f"hardware.fp8={spec.hardware.fp8})")
    if spec.hardware.frozen_dtype == "bf16" and not (
            spec.hardware.dtype == "bf16" or (spec.hardware.dtype == "auto" and spec.hardware.device != "cpu" and _cuda_available())):
        raise SpecError("hardware.frozen_dtype=bf16 needs bf16 compute (hardware.dtype=bf16, or auto on a GPU); "
                        "use hardware.frozen_dtype=auto")
