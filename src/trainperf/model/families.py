"""The model families' torch halves by ``model.family`` (the torch-free halves: core/families): which
module tree a spec builds, how its parameters start, its tensor-parallel plan. Everything above the
model package asks here, never a family module directly; a new family adds one line to ``MODULES``."""

from __future__ import annotations

import torch
from torch import nn

from trainperf.core.errors import SpecError
from trainperf.core.spec import LoRASpec, ModelSpec
from trainperf.model import gpt, gpt_oss, llama
from trainperf.model.family_modules import FamilyModules, TPPlan
from trainperf.model.options import ModelOptions

MODULES: dict[str, FamilyModules] = {"llama": llama.MODULES, "gpt": gpt.MODULES, "gpt_oss": gpt_oss.MODULES}

__all__ = ["MODULES", "FamilyModules", "TPPlan", "build", "build_on_meta", "decoder_layers", "init_full_tensor",
           "modules_of", "register", "tied_source", "tied_weights", "tp_plan"]


def register(name: str, modules: FamilyModules) -> FamilyModules:
    """Make ``modules`` the torch half of model.family=``name`` (its torch-free half: core.families.register)."""
    MODULES[name] = modules
    return modules


def modules_of(name: str) -> FamilyModules:
    """The torch half of model.family=``name``."""
    try:
        return MODULES[name]
    except KeyError:
        raise SpecError(f"model.family={name!r}: valid values are {', '.join(MODULES)}") from None


def build_on_meta(cfg: ModelSpec, options: ModelOptions | None = None, lora: LoRASpec | None = None) -> nn.Module:
    """The family's module tree on the meta device (core.validate refuses LoRA where the family has
    none: ModelFamily.lora_targets)."""
    with torch.device("meta"):
        return modules_of(cfg.family).build(cfg, options, lora)


def build(cfg: ModelSpec, options: ModelOptions | None = None) -> nn.Module:
    """The family's module tree on the current device, uninitialised."""
    return modules_of(cfg.family).build(cfg, options, None)


def init_full_tensor(name: str, shape: torch.Size, cfg: ModelSpec, seed: int, device) -> torch.Tensor:
    """The full, layout-independent initial value of parameter ``name`` (fp32)."""
    return modules_of(cfg.family).init_full_tensor(name, shape, cfg, seed, device)


def tied_weights(model: nn.Module) -> dict[str, str]:
    """Tied copy -> the parameter it stands for, in ``model``'s family (empty where nothing is tied)."""
    return dict(modules_of(model.cfg.family).tied_weights)


def tied_source(model: nn.Module, name: str) -> str:
    """The parameter (and checkpoint tensor) a tied copy stands for; ``name`` itself otherwise."""
    return modules_of(model.cfg.family).tied_weights.get(name, name)


def tp_plan(model: nn.Module, tp: int, sequence_parallel: bool) -> TPPlan:
    """The tensor-parallel plan of ``model``'s family over ``tp`` ranks (parallel/parallelize.py applies it)."""
    return modules_of(model.cfg.family).tp_plan(model, tp, sequence_parallel)


def decoder_layers(model: nn.Module) -> nn.ModuleDict:
    return model.get_submodule(model.LAYERS)
