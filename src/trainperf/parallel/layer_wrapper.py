"""How one decoder layer's forward runs, said in one place: ``LayerWrapper``.

Activation checkpointing (train.recompute: none | selective | full per layer), activation offload to
pinned host memory (train.offload_layers, parallel/offload.py) and per-layer torch.compile
(train.compile) all change how a layer's forward runs, never what it computes; the wrapper takes
them as constructor arguments, and parallelize builds one per decoder layer (steps 4 and 5 there).

The wrapper takes the layer's place in the model's decoder layers (``model.model.layers`` of a Llama,
``decoder.layers`` of a GPT) and holds the layer's own submodules under their own names, so parameter
names stay those of the plain model (``model.layers.{i}.self_attn.q_proj.weight``: checkpoints, FSDP2
and the PEFT export see no change, where ``checkpoint_wrapper`` would insert
``_checkpoint_wrapped_module`` into every name); the decoder layer's own forward (its class's
``forward``: a Llama layer takes (x, cos, sin), a GPT layer (x,)) runs on them.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

MEMORY_MODES = ("none", "selective", "full", "offload")  # core.layout.layer_memory_modes' values


class LayerWrapper(nn.Module):
    """One decoder layer and how its forward runs:

    - ``memory_mode``: none (keep the activations), selective (recompute what ``context_fn``'s policy
      says), full (recompute the whole layer) or offload (saved activations to host memory through
      ``offloader``, this layer being number ``index`` of the model's layers);
    - ``compile_backend``: torch.compile the layer (None: eager). A fully recomputed or offloaded
      layer compiles its plain forward, with the checkpoint or the saved-tensor hooks outside the
      graph; a selective one compiles the checkpoint with it, since the policy has to see the
      graph's individual ops (parallelize.apply_compile says why).

    ``layer``: a decoder layer of any family, or a LayerWrapper whose layer this one wraps instead."""

    def __init__(self, layer: nn.Module, index: int, memory_mode: str = "none", context_fn=None,
                 offloader=None, compile_backend: str | None = None, compile_options: dict | None = None):
        super().__init__()
        assert memory_mode in MEMORY_MODES, memory_mode
        assert (memory_mode == "selective") == (context_fn is not None), "a selective layer takes its policy"
        assert (memory_mode == "offload") == (offloader is not None), "an offloaded layer takes its offloader"
        for name, child in layer.named_children():
            self.add_module(name, child)
        # the decoder layer's class forward, run on the submodules this wrapper now holds
        self.layer_class_forward = layer.layer_class_forward if isinstance(layer, LayerWrapper) else type(layer).forward
        self.index, self.memory_mode, self.context_fn, self.offloader = index, memory_mode, context_fn, offloader
        self.compile_backend = compile_backend
        # the part of the forward that a compiled layer compiles
        body = self.selective_forward if memory_mode == "selective" else self.layer_forward
        if compile_backend is not None:
            body = torch.compile(body, fullgraph=True, backend=compile_backend, options=compile_options)
        self.body = body

    def layer_forward(self, *args: torch.Tensor) -> torch.Tensor:
        """The decoder layer's own forward, on the submodules this wrapper holds."""
        return self.layer_class_forward(self, *args)

    def selective_forward(self, *args: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.layer_forward, *args, use_reentrant=False, context_fn=self.context_fn)

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        """args: the decoder layer's own inputs (Llama: x, cos, sin; GPT: x)."""
        if self.memory_mode == "full":  # checkpoint's default context, around the (compiled) forward
            return checkpoint(self.body, *args, use_reentrant=False)
        if self.memory_mode == "offload":
            with self.offloader.layer_context(self.index, self, args):
                return self.body(*args)
        return self.body(*args)
