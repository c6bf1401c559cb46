"""LoRA adapters: y = W x + (alpha / r) * B(A(dropout(x))), base frozen.

``LoRALinear`` keeps the base weight under its original name (``...q_proj.weight``) so Hugging Face
checkpoints still load one to one, and names the adapters as PEFT does (``...q_proj.lora_A.weight``,
``...q_proj.lora_B.weight``), so the adapter export is the PEFT layout with a
``base_model.model.`` prefix.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainperf.model.float8 import frozen_linear
from trainperf.specs import LoRASpec


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float):
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.weight.requires_grad_(False)
        device = base.weight.device
        self.lora_A = nn.Linear(self.in_features, rank, bias=False, device=device)
        self.lora_B = nn.Linear(rank, self.out_features, bias=False, device=device)
        nn.init.zeros_(self.lora_B.weight)  # PEFT's init: the adapter starts as a no-op
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.scaling = alpha / rank
        self._float8 = None  # (mm config, torchao config) once hardware.fp8 is applied (model/float8.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return frozen_linear(x, self.weight, self._float8) + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling


def apply_lora(model: nn.Module, spec: LoRASpec) -> list[str]:
    """Freeze every parameter, then swap each targeted Linear for a LoRALinear (adapters train).

    Returns the qualified names of the wrapped modules."""
    for p in model.parameters():
        p.requires_grad_(False)
    wrapped = []
    for name, module in list(model.named_modules()):
        leaf = name.rsplit(".", 1)[-1]
        if isinstance(module, nn.Linear) and leaf in spec.target_modules:
            parent = model.get_submodule(name.rsplit(".", 1)[0])
            setattr(parent, leaf, LoRALinear(module, spec.rank, spec.alpha, spec.dropout))
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
