"""LoRA adapters: y = W x + (alpha / r) * B(A(dropout(x))), base frozen.

``LoRALinear`` keeps the base weight under its original name (``...q_proj.weight``) so Hugging Face
checkpoints still load one to one, and names the adapters as PEFT does (``...q_proj.lora_A.weight``,
``...q_proj.lora_B.weight``), so the adapter export is the PEFT layout with a
``base_model.model.`` prefix.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Replicate

from trainperf.core.spec import LoRASpec
from trainperf.model.float8 import FLOAT8_STORAGE, float8_gemm, frozen_linear, stored_frozen_weight
from trainperf.model.lora_kernel import MAX_ADAPTERS, shared_input_lora_a


def lora_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout on the adapter's input; same distribution as F.dropout (keep 1 - p, scale 1 / (1 - p)).

    On a DTensor (tensor parallel) it is a mask multiply, and the mask is drawn on a plain tensor of
    the *global* shape, then cut to ``x``'s placements without communication:
    - a multiply carries the partial-sum gradient of a replicated input; CUDA's fused dropout backward
      (``native_dropout_backward``, a plain pointwise op to DTensor) would all-reduce a full activation
      per adapter per micro-batch, which the 2 x H200 TP2+SP trace showed (docs/OBSERVABILITY.md);
    - a plain draw, not DTensor's RNG: ``bernoulli_`` on a DTensor fails under torch.compile (fake
      tensors meet DTensor's CUDA RNG tracker, torch 2.11), and off CUDA DTensor keeps no replicated
      draw in step at all. Every rank of a tensor-parallel group is seeded alike
      (``core.layout.Layout.tp_group_seed``), so each draws the same global mask: replicated inputs see one
      mask, sharded ones their shard of it (what one process drawing the global mask this way would
      draw; one process without TP takes F.dropout, another draw). A sharded input (row-parallel
      o/down) pays tp x the draw and a transient global-shape bool tensor; only its shard is kept
      (under selective recompute the whole draw is saved instead: parallelize._selective_policy)."""
    if not training or p == 0:
        return x
    if isinstance(x, DTensor):
        mesh = x.device_mesh
        # the activations of TP live on the 1-D tp mesh; on more dims "Replicate" below would claim
        # equal draws across ranks seeded differently
        assert mesh.ndim == 1, f"LoRA dropout expects a 1-D tensor-parallel mesh, got {mesh.ndim}-D"
        whole = torch.empty(x.shape, dtype=torch.bool, device=x.device).bernoulli_(1.0 - p)
        # a partial-sum input (never one here) would take the same mask on every rank: Replicate
        places = [Replicate() if pl.is_partial() else pl for pl in x.placements]
        keep = DTensor.from_local(whole, mesh, [Replicate()] * mesh.ndim, run_check=False).redistribute(mesh, places)
        return x * keep * (1.0 / (1.0 - p))
    return F.dropout(x, p, True)


class LoRALinear(nn.Module):
    """``kernel``: hardware.lora_kernel, torch (F.dropout, then A's GEMM) or fused (model/lora_kernel.py);
    ``float8_gemm``: (mm config, torchao config) when the frozen base's GEMM runs in float8, else None;
    ``float8_stored_from``: the base weight is stored in float8, quantised from this dtype
    (model/float8.py)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float, kernel: str = "torch",
                 float8_gemm=None, float8_stored_from: torch.dtype | None = None):
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        base.weight.requires_grad_(False)
        weight, scale = stored_frozen_weight(base.weight, float8_stored_from)
        self.weight = weight
        self.register_buffer("weight_scale", scale)
        device = base.weight.device
        self.lora_A = nn.Linear(self.in_features, rank, bias=False, device=device)
        self.lora_B = nn.Linear(rank, self.out_features, bias=False, device=device)
        nn.init.zeros_(self.lora_B.weight)  # PEFT's init: the adapter starts as a no-op
        self.dropout = dropout
        self.scaling = alpha / rank
        self.kernel = kernel
        self.float8_gemm = float8_gemm
        self.float8_stored_from = float8_stored_from

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fused_kernel_applies(x, (self,)):
            return fused_outputs(x, (self,))[0]
        dropped = lora_dropout(x, self.dropout, self.training)
        # Under FSDP2 the adapters arrive in the compute dtype already (a no-op here); a one-process
        # run without FSDP (parallelize.py) keeps fp32 adapters next to a bf16 base, and the cast is
        # then FSDP2's mixed precision: bf16 GEMMs, gradients back to the fp32 masters through it.
        a = self.lora_A.weight.to(x.dtype)
        return self.base(x) + self.adapter_b(F.linear(dropped, a))

    def base(self, x: torch.Tensor) -> torch.Tensor:
        return frozen_linear(x, self.weight, self.float8_gemm, self.weight_scale)

    def adapter_b(self, h: torch.Tensor) -> torch.Tensor:
        """The adapter's second half on A's output ``h``: (alpha / r) * B h."""
        return F.linear(h, self.lora_B.weight.to(h.dtype)) * self.scaling


def fused_kernel_applies(x: torch.Tensor, modules) -> bool:
    """Whether ``modules``, all reading ``x``, take the fused kernel together: LoRA layers set to it,
    training with dropout (without dropout A's GEMM alone is what the kernel would do), one rank and
    dropout, at most four (they share each Philox call's eight half words), on a plain tensor and
    without module hooks (tensor parallel's hooks would turn x into a DTensor inside each module's
    call; validation refuses the pair)."""
    first = modules[0]
    if getattr(first, "kernel", "torch") != "fused":  # the default path: one attribute read per call
        return False
    return (len(modules) <= MAX_ADAPTERS and not isinstance(x, DTensor)
            and all(isinstance(m, LoRALinear) and m.kernel == "fused" and m.training and m.dropout > 0
                    and m.dropout == first.dropout and m.lora_A.out_features == first.lora_A.out_features
                    and not (m._forward_pre_hooks or m._forward_hooks) for m in modules))


def fused_outputs(x: torch.Tensor, modules) -> list[torch.Tensor]:
    """Each LoRA layer's output for the shared input x, the adapters' A side in one kernel call."""
    h = shared_input_lora_a(x, [m.lora_A.weight for m in modules], modules[0].dropout)
    rank = modules[0].lora_A.out_features
    return [m.base(x) + m.adapter_b(h[..., i * rank:(i + 1) * rank]) for i, m in enumerate(modules)]


def project(x: torch.Tensor, modules) -> list[torch.Tensor]:
    """``[m(x) for m in modules]`` for projections that read the same x (q, k, v; gate, up): LoRA layers
    on the fused kernel share one pass over x for their adapters' dropout and A."""
    if fused_kernel_applies(x, modules):
        return fused_outputs(x, modules)
    return [m(x) for m in modules]


def apply_lora(model: nn.Module, spec: LoRASpec) -> list[str]:
    """Freeze every parameter, then replace each targeted Linear by a LoRALinear (adapters train),
    built with the model's options: its LoRA kernel, its frozen base's float8 GEMM and storage.

    Returns the qualified names of the wrapped modules."""
    for p in model.parameters():
        p.requires_grad_(False)
    options = model.options
    gemm = float8_gemm(options.fp8, options.emulate_fp8)
    wrapped = []
    for name, module in list(model.named_modules()):
        leaf = name.rsplit(".", 1)[-1]
        if isinstance(module, nn.Linear) and leaf in spec.target_modules:
            parent = model.get_submodule(name.rsplit(".", 1)[0])
            setattr(parent, leaf, LoRALinear(module, spec.rank, spec.alpha, spec.dropout, options.lora_kernel,
                                             gemm, options.frozen_float8_from))
            wrapped.append(name)
    if not wrapped:
        raise ValueError(f"lora.target_modules={spec.target_modules} matched no Linear in the model")
    return wrapped


def is_adapter_param(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def peft_key(name: str) -> str:
    """Our parameter name -> the key PEFT writes in adapter_model.safetensors."""
    return "base_model.model." + name


def peft_adapter_config(spec: LoRASpec, base_model_path: str | None) -> dict:
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_path,
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": spec.dropout,
        "target_modules": sorted(spec.target_modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
    }


def store_frozen_base_in(model: nn.Module, dtype: torch.dtype) -> None:
    """Re-type the frozen (non-adapter) parameters of a meta model. Under FSDP2 mixed precision the
    compute copies are bf16 anyway, so a bf16-stored base computes exactly the same values while
    halving its memory; only the adapters keep fp32 masters (FSDP2 wants the trainable ones uniform).
    Weights the model stores in float8 (hardware.frozen_dtype=fp8) stay so."""
    for full_name, q in list(model.named_parameters()):
        if is_adapter_param(full_name) or q.dtype in (dtype, FLOAT8_STORAGE):
            continue
        owner_name, _, leaf = full_name.rpartition(".")
        setattr(model.get_submodule(owner_name), leaf, nn.Parameter(q.to(dtype), requires_grad=False))


# ---------------------------------------------------------------------------------------------
# Tensor parallel styles for LoRALinear

def _lora_aware(style_cls, base_place, lora_a_place, lora_b_place, desired_input):
    """A Colwise/RowwiseParallel that also places a LoRALinear's adapters.

    Colwise base (q/k/v/qkv, gate/up): weight Shard(0); lora_A replicated (it reads the full input);
    lora_B Shard(0) (its output is the base's output shard). Rowwise base (o/down): weight Shard(1);
    lora_A Shard(1) (a partial sum, reduced together with the base's in the same collective);
    lora_B replicated. requires_grad is carried over, so frozen weights stay frozen."""
    from torch.distributed.tensor import distribute_module, distribute_tensor

    class Style(style_cls):
        def _apply(self, module, device_mesh):
            if not isinstance(module, LoRALinear):
                return super()._apply(module, device_mesh)
            places = {"": base_place, "lora_A": lora_a_place, "lora_B": lora_b_place}
            self.desired_input_layouts = (desired_input,)

            def partition(name, sub, mesh):
                if name not in places:
                    return
                for pname, param in list(sub.named_parameters(recurse=False)):
                    dt = distribute_tensor(param, mesh, [places[name]], src_data_rank=None)
                    sub.register_parameter(pname, nn.Parameter(dt, requires_grad=param.requires_grad))

            return distribute_module(
                module, device_mesh, partition,
                partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
                partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))

    return Style


def lora_aware_tp_styles():
    """(Colwise, Rowwise) parallel styles that place a LoRALinear's adapters beside its base weight
    (a family's tensor-parallel plan uses them on the projections LoRA may target)."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return (_lora_aware(ColwiseParallel, Shard(0), Replicate(), Shard(0), Replicate()),
            _lora_aware(RowwiseParallel, Shard(1), Shard(1), Replicate(), Shard(-1)))
