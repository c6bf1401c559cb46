"""Validation before launch on this machine: ``core.validate`` with this machine's answer to "are
there CUDA devices?", then what only the model's kernels can say (FlashAttention-4's package and GPU,
the fused LoRA kernel's tile sizes)."""

from __future__ import annotations

import torch

from trainperf.core.errors import SpecError
from trainperf.core.spec import RunSpec
from trainperf.core.validate import validate
from trainperf.model.flash4 import available as flash4_unavailable_reason
from trainperf.model.lora_layout import takes_rank


def cuda_available() -> bool:
    return torch.cuda.is_available()


def check_kernels(spec: RunSpec) -> None:
    """The kernels a validated spec asks for can run here."""
    if spec.hardware.attention == "flash4":
        why_not = flash4_unavailable_reason(spec.model.head_dim)
        if why_not:
            raise SpecError(why_not)
    if spec.hardware.lora_kernel == "fused" and not takes_rank(spec.lora.rank):
        raise SpecError(f"hardware.lora_kernel=fused takes lora.rank 16, 32, 64, ... (a power of two >= 16); "
                        f"got {spec.lora.rank}; use hardware.lora_kernel=torch")


def validate_run(spec: RunSpec, world_size: int, before_checkpoint: bool = False) -> None:
    """Raise SpecError on the first problem of a run about to be launched from this machine."""
    validate(spec, world_size, cuda=cuda_available(), before_checkpoint=before_checkpoint)
    check_kernels(spec)
