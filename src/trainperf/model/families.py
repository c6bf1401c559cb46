"""The model families by ``model.family``: which module tree a spec builds and how its parameters
start. Everything above the model package asks here, never a family module directly."""

from __future__ import annotations

import torch
from torch import nn

from trainperf.core.spec import LoRASpec, ModelSpec
from trainperf.model import gpt, gpt_oss, llama
from trainperf.model.options import ModelOptions


def build_on_meta(cfg: ModelSpec, options: ModelOptions | None = None, lora: LoRASpec | None = None) -> nn.Module:
    """The family's module tree on the meta device (LoRA exists for the Llama family only:
    core.validate refuses it for gpt)."""
    if cfg.family == "gpt":
        return gpt.build_on_meta(cfg, options)
    if cfg.family == "gpt_oss":
        return gpt_oss.build_on_meta(cfg, options)
    return llama.build_on_meta(cfg, options, lora)


def build(cfg: ModelSpec, options: ModelOptions | None = None) -> nn.Module:
    """The family's module tree on the current device, uninitialised."""
    if cfg.family == "gpt_oss":
        return gpt_oss.GptOssForCausalLM(cfg, options)
    return gpt.GPTModel(cfg, options) if cfg.family == "gpt" else llama.LlamaForCausalLM(cfg, options)


def init_full_tensor(name: str, shape: torch.Size, cfg: ModelSpec, seed: int, device) -> torch.Tensor:
    """The full, layout-independent initial value of parameter ``name`` (fp32)."""
    fn = {"gpt": gpt.init_full_tensor, "gpt_oss": gpt_oss.init_full_tensor}.get(cfg.family, llama.init_full_tensor)
    return fn(name, shape, cfg, seed, device)


def tied_source(model: nn.Module, name: str) -> str:
    """The parameter (and checkpoint tensor) a tied copy stands for; ``name`` itself otherwise."""
    return gpt.TIED_WEIGHTS.get(name, name) if isinstance(model, gpt.GPTModel) else name


def decoder_layers(model: nn.Module) -> nn.ModuleDict:
    return model.get_submodule(model.LAYERS)
