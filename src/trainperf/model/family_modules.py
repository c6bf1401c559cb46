"""The torch half of a model family (its torch-free half: core/families): how a spec becomes modules,
how their parameters start, and the family's tensor-parallel plan, which parallel/parallelize.py
applies. The pipeline split needs no function: every family's model class names its parts
(``LAYERS``, ``FIRST_STAGE_MODULES``, ``LAST_STAGE_MODULES``) and the generic split cuts by them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from trainperf.core.spec import LoRASpec, ModelSpec
from trainperf.model.options import ModelOptions


@dataclass
class TPPlan:
    """What tensor (+ sequence) parallelism does to one model or pipeline stage.

    ``steps``: ``parallelize_module`` plans, applied in order, each on its module ({submodule path:
    ParallelStyle}); ``sp_embedding``: the module whose output is the sequence-split residual stream's
    start (under SP its shard gets its own storage: parallelize.own_output_storage); ``after``: run
    once every step is applied (a tied weight made one tensor again)."""

    steps: list[tuple[nn.Module, dict]]
    sp_embedding: nn.Module | None = None
    after: Callable[[], None] | None = None


@dataclass(frozen=True)
class FamilyModules:
    """``build(cfg, options, lora)``: the module tree on the current device (under ``torch.device("meta")``
    for a meta build), uninitialised; ``init_full_tensor(name, shape, cfg, seed, device)``: a
    parameter's full, layout-independent initial value (fp32); ``tp_plan(model, tp, sequence_parallel)``:
    the family's :class:`TPPlan`; ``tied_weights``: parameter -> the parameter it is a tied copy of
    (initialised from and loaded as it)."""

    build: Callable[[ModelSpec, ModelOptions | None, LoRASpec | None], nn.Module]
    init_full_tensor: Callable[[str, torch.Size, ModelSpec, int, object], torch.Tensor]
    tp_plan: Callable[[nn.Module, int, bool], TPPlan]
    tied_weights: Mapping[str, str] = field(default_factory=dict)
