"""Validation of a resolved spec: everything checkable without a process group, before launch.

Pure: the one fact about the machine it needs (are there CUDA devices?) is the caller's ``cuda``
argument; the kernels' own availability on this machine (FlashAttention-4's package and GPU) is
asked by the runner (``runner.checks``), which imports the model.
"""

from __future__ import annotations

import importlib.util
import math

from trainperf.core.errors import SpecError
from trainperf.core.families import FAMILIES, family, names as family_names
from trainperf.core.hardware import PEAK_BF16_FLOPS, peak_flops_for
from trainperf.core.layout import (
    Layout,
    data_parallel_size,
    grad_accum_steps,
    layers_per_stage,
    resolve_layout,
)
from trainperf.core.spec import (
    ATTENTION_KERNELS,
    FP8_RECIPES,
    GRAD_SYNC_MODES,
    LORA_KERNELS,
    MIXED_PRECISION,
    OPTIMIZERS,
    PP_SCHEDULES,
    RECOMPUTE_MODES,
    RunSpec,
    TrainSpec,
)


def _runs_on_cpu(spec: RunSpec, cuda: bool) -> bool:
    """hardware.device=cpu, or auto on a machine without CUDA."""
    return spec.hardware.device == "cpu" or (spec.hardware.device == "auto" and not cuda)


def validate_layout(spec: RunSpec, cuda: bool) -> None:
    """What each technique needs of the model and the batch."""
    p, m, t, d = spec.parallel, spec.model, spec.train, spec.data
    if family(m.family).mixture_of_experts:  # model/moe.py has no TP, CP or pipeline plan yet
        for key, value in (("parallel.tp", p.tp), ("parallel.cp", p.cp), ("parallel.pp", p.pp)):
            if value > 1:
                raise SpecError(f"{key}={value} is not supported for model.family={m.family} (a mixture of experts "
                                f"trains under FSDP2/HSDP with expert parallel: parallel.ep, dp_shard, dp_replicate); "
                                f"valid: {key}=1")
    if p.sp and p.tp == 1:
        raise SpecError("parallel.sp=true needs parallel.tp > 1 (sequence parallel splits the tensor-parallel group's work)")
    if p.tp > 1:
        for name, value in family(m.family).tp_sharded(m):
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
        if _runs_on_cpu(spec, cuda):
            raise SpecError("parallel.cp > 1 needs CUDA GPUs: in torch 2.13 context parallel attention has no "
                            "CPU kernels (no backward); use cp=1 on CPU")
        if t.compile:
            raise SpecError(f"train.compile=true with parallel.cp={p.cp} fails in torch 2.11: the compiled layer's "
                            "backward sends ring attention's cuDNN backward to the CPU kernel table (seen on "
                            "2 x H200, with and without recompute); use train.compile=false or parallel.cp=1")
    if p.pp > 1 and t.grad_sync == "every":
        raise SpecError("train.grad_sync=every needs parallel.pp=1: the pipeline schedule reduce-scatters "
                        "on each stage's last micro-batch itself; valid with pp > 1: train.grad_sync=last")
    if p.pp > 1:
        vstages = Layout.of(p).stages_per_rank
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
    if importlib.util.find_spec("torchao") is None:
        raise SpecError(f"hardware.fp8={h.fp8} needs torchao (pip install torchao, or a wheel on a machine "
                        "without network); it is not installed")


def _refuse_off_gpu_or_fp32(spec: RunSpec, cuda: bool, setting: str, needs: str, fallback: str) -> None:
    """A GPU kernel that computes in bf16 (``setting``, e.g. hardware.attention=flash4): refused on CPU
    and with fp32 compute, naming ``fallback``, the setting that runs there."""
    if _runs_on_cpu(spec, cuda):
        raise SpecError(f"{setting} {needs}; use {fallback} on CPU")
    if spec.hardware.dtype == "fp32":
        raise SpecError(f"{setting} runs bf16 only, not hardware.dtype=fp32; use hardware.dtype=auto or bf16, or {fallback}")


def check_attention(spec: RunSpec, cuda: bool) -> None:
    """hardware.attention: a known kernel; flash4 on a single-sequence-per-rank layout (context
    parallel's ring attention is SDPA's) and on a GPU and package that can run it."""
    kernel = spec.hardware.attention  # a known name: check_choices
    if kernel == "sdpa":
        return
    if spec.parallel.cp > 1:
        raise SpecError(f"hardware.attention=flash4 with parallel.cp={spec.parallel.cp} is not supported (context "
                        "parallel's ring attention runs SDPA); use hardware.attention=sdpa or parallel.cp=1")
    _refuse_off_gpu_or_fp32(spec, cuda, "hardware.attention=flash4", "needs CUDA GPUs (Hopper or Blackwell)",
                            "hardware.attention=sdpa")
    head_dim = spec.model.head_dim
    if head_dim % 8 or not 8 <= head_dim <= 256:
        raise SpecError(f"hardware.attention=flash4 takes head dims 8 to 256 in multiples of 8; this model's is {head_dim} "
                        "(hidden_size / num_heads); use hardware.attention=sdpa")


def check_mixed_precision(spec: RunSpec) -> None:
    """hardware.mixed_precision=autocast: full training in one process (it replaces FSDP2, which more
    processes need; a LoRA run in one process already runs without FSDP2)."""
    if spec.hardware.mixed_precision == "fsdp":
        return
    p = spec.parallel
    world = p.dp_replicate * p.dp_shard * p.tp * p.cp * p.pp
    if world != 1:
        raise SpecError(f"hardware.mixed_precision=autocast is for one process; this layout has {world}; "
                        "use hardware.mixed_precision=fsdp")
    if spec.lora.enabled:
        raise SpecError("hardware.mixed_precision=autocast is for full training (lora.rank=0); a LoRA run in one "
                        "process already runs without FSDP2: use hardware.mixed_precision=fsdp")


def check_lora_kernel(spec: RunSpec, cuda: bool) -> None:
    """hardware.lora_kernel=fused: a LoRA run on CUDA GPUs with Triton, in bf16, without tensor
    parallel (its adapters see DTensors), at an adapter rank the kernel's tiles take."""
    if spec.hardware.lora_kernel == "torch":
        return
    if not spec.lora.enabled:
        raise SpecError("hardware.lora_kernel=fused is for LoRA runs (lora.rank > 0); this run trains every "
                        "parameter; use hardware.lora_kernel=torch")
    _refuse_off_gpu_or_fp32(spec, cuda, "hardware.lora_kernel=fused", "is a Triton kernel for CUDA GPUs",
                            "hardware.lora_kernel=torch")
    if spec.parallel.tp > 1:
        raise SpecError(f"hardware.lora_kernel=fused with parallel.tp={spec.parallel.tp} is not supported (tensor "
                        "parallel's adapters see DTensors); use hardware.lora_kernel=torch or parallel.tp=1")
    if importlib.util.find_spec("triton") is None:
        raise SpecError("hardware.lora_kernel=fused needs the triton package (it ships with CUDA builds of torch); "
                        "valid without it: hardware.lora_kernel=torch")


def check_choices(spec: RunSpec) -> None:
    """The fields that take one of a fixed set of names: SpecError naming the field, the value and the
    valid ones. resolve_spec runs it (``plan`` and ``tune`` price a spec without validate()), validate too."""
    p, t, h = spec.parallel, spec.train, spec.hardware
    for key, value, valid in (
            ("model.family", spec.model.family, family_names()),
            ("parallel.pp_schedule", p.pp_schedule, PP_SCHEDULES),
            ("train.recompute", t.recompute, RECOMPUTE_MODES),
            ("train.recompute_others", t.recompute_others, ("none", "selective")),
            ("train.optimizer", t.optimizer, OPTIMIZERS),
            ("train.grad_sync", t.grad_sync, GRAD_SYNC_MODES),
            ("hardware.device", h.device, ("auto", "cpu", "cuda")),
            ("hardware.dtype", h.dtype, ("auto", "fp32", "bf16")),
            ("hardware.frozen_dtype", h.frozen_dtype, ("auto", "fp32", "bf16", "fp8")),
            ("hardware.fp8", h.fp8, FP8_RECIPES),
            ("hardware.attention", h.attention, ATTENTION_KERNELS),
            ("hardware.lora_kernel", h.lora_kernel, LORA_KERNELS),
            ("hardware.mixed_precision", h.mixed_precision, MIXED_PRECISION),
            ("mlperf.division", spec.mlperf.division, ("open", "closed"))):
        if value not in valid:
            raise SpecError(f"{key}={value!r}: valid values are {', '.join(valid)}")


COLLECTIVE_TIMEOUT_RANGE_S = (1.0, 7 * 86400.0)  # below a second every step times out; above a week is no timeout
MAX_GENERATED_TOKENS = 2**30  # a generated dataset is held in memory: 8 GiB of int64 token ids at most


def _finite(key: str, value) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise SpecError(f"{key}={value}: must be a finite number")


def _at_least(key: str, value, low, note: str = "") -> None:
    _finite(key, value)
    if value < low:
        raise SpecError(f"{key}={value}: must be >= {low}{note}")


def _above(key: str, value, low, note: str = "") -> None:
    _finite(key, value)
    if value <= low:
        raise SpecError(f"{key}={value}: must be > {low}{note}")


def _within(key: str, value, low, high, note: str = "") -> None:
    _finite(key, value)
    if not low <= value <= high:
        raise SpecError(f"{key}={value}: must be in [{low:g}, {high:g}]{note}")


def check_values(spec: RunSpec) -> None:
    """Every number in its range, and the model's own arithmetic: what needs neither the world size nor
    a checkpoint. resolve_spec runs it (``plan``, ``tune`` and sweeps too), validate again."""
    m, lo, p, t, d, e, h = spec.model, spec.lora, spec.parallel, spec.train, spec.data, spec.eval, spec.hardware
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                 "max_position_embeddings"):
        _at_least(f"model.{name}", getattr(m, name), 1)
    _at_least("model.attention_head_dim", m.attention_head_dim, 0, " (0: hidden_size / num_heads)")
    if not m.attention_head_dim and m.hidden_size % m.num_heads:
        raise SpecError(f"model.hidden_size={m.hidden_size} is not divisible by model.num_heads={m.num_heads}")
    if m.num_heads % m.num_kv_heads:
        raise SpecError(
            f"model.num_heads={m.num_heads} is not divisible by model.num_kv_heads={m.num_kv_heads} (GQA needs whole groups)"
        )
    _check_experts(spec)
    family(m.family).check(spec)
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
    _within("train.collective_timeout_s", t.collective_timeout_s, *COLLECTIVE_TIMEOUT_RANGE_S, " seconds")
    if not 0 <= t.metrics_port < 65536:
        raise SpecError(f"train.metrics_port={t.metrics_port}: must be a TCP port (1-65535), or 0 for none")
    _at_least("data.seq_len", d.seq_len, 2)
    if d.seq_len > m.max_position_embeddings and not m.path:  # a checkpoint's config.json may raise it
        raise SpecError(f"data.seq_len={d.seq_len} exceeds model.max_position_embeddings={m.max_position_embeddings}")
    _at_least("data.train_samples", d.train_samples, 0)
    _at_least("data.eval_samples", d.eval_samples, 0)
    if d.path is None and (d.train_samples + d.eval_samples) * d.seq_len > MAX_GENERATED_TOKENS:
        raise SpecError(f"data.train_samples={d.train_samples} + data.eval_samples={d.eval_samples} rows of "
                        f"data.seq_len={d.seq_len}: a generated dataset holds at most {MAX_GENERATED_TOKENS} tokens "
                        "(8 GiB); generate fewer rows, or convert a dataset and give data.path")
    _at_least("eval.every_samples", e.every_samples, 1)
    _at_least("eval.skip_first", e.skip_first, -1, " (-1: the MLPerf LoRA rule)")
    _at_least("eval.batch_size", e.batch_size, 1)
    _at_least("hardware.peak_tflops", h.peak_tflops, 0.0, " (0: look it up from hardware.gpu)")
    if h.gpu != "auto" and not h.peak_tflops:  # the name is only looked up for the peak
        if peak_flops_for(h.gpu) is None:
            raise SpecError(f"hardware.gpu={h.gpu!r}: no peak FLOP/s known for it; valid: auto (the device's own "
                            f"name), {', '.join(PEAK_BF16_FLOPS)}, or give hardware.peak_tflops")
    _at_least("hardware.host_mem_gib", h.host_mem_gib, 0.0, " (0: this machine's memory)")


def _check_experts(spec: RunSpec) -> None:
    """Experts and expert parallel belong to a mixture-of-experts family; a dense one refuses them."""
    m, p = spec.model, spec.parallel
    _at_least("parallel.ep", p.ep, 1, " (1: every rank holds every expert)")
    if family(m.family).mixture_of_experts:
        return
    moe = [n for n in FAMILIES if FAMILIES[n].mixture_of_experts]
    for key, value, default in (("parallel.ep", p.ep, 1), ("model.num_experts", m.num_experts, 0),
                                ("model.experts_per_token", m.experts_per_token, 0)):
        if value != default:
            raise SpecError(f"{key}={value} needs a mixture-of-experts model (model.family={', '.join(moe)}); "
                            f"model.family={m.family} is dense: valid {key}={default}")


def _validate_optimizer(t: TrainSpec) -> None:
    if t.optimizer == "adamw8bit" and importlib.util.find_spec("torchao") is None:
        raise SpecError("train.optimizer=adamw8bit needs torchao (pip install torchao, or a wheel on a machine "
                        "without network); it is not installed")


def validate(spec: RunSpec, world_size: int, *, cuda: bool, before_checkpoint: bool = False) -> None:
    """Raise SpecError on the first problem; call before any process is launched. ``cuda``: whether the
    machine that will run it has CUDA devices (hardware.device=auto follows it). ``before_checkpoint``:
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
    check_attention(spec, cuda)
    check_lora_kernel(spec, cuda)
    check_mixed_precision(spec)
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
        valid = family(m.family).lora_targets(m)
        if not valid:
            raise SpecError(f"lora.rank={lo.rank}: model.family={m.family} has no LoRA; use lora.rank=0")
        bad = [x for x in lo.target_modules if x not in valid]
        if bad or not lo.target_modules:
            raise SpecError(f"lora.target_modules={lo.target_modules}: valid names for this model are {', '.join(valid)}")
    validate_layout(spec, cuda)
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
            spec.hardware.dtype == "bf16" or (spec.hardware.dtype == "auto" and spec.hardware.device != "cpu" and cuda)):
        raise SpecError("hardware.frozen_dtype=bf16 needs bf16 compute (hardware.dtype=bf16, or auto on a GPU); "
                        "use hardware.frozen_dtype=auto")
