"""Activation offload (train.offload_layers): a decoder layer's saved activations go to pinned host
memory during its forward and come back ahead of its backward, instead of being recomputed (what
Megatron-LM and NeMo call CPU activation offloading).

Why: on 2 x H200 the 70B closed recipe cannot keep every layer's activations (about 1.8 GiB per layer
per 8192-token sequence) beside its weights. Recomputing a layer runs its forward again, about a
third of its step; copying its activations over PCIe (~50 GB/s each way) takes ~40 ms, to be hidden
under the forward of the layers after it and under the backward (and recomputation) of the layers
above it.

How: ``torch.autograd.graph.saved_tensors_hooks`` around the layer's forward.

* pack: a tensor the layer saves for backward moves to the host unless it is small (< 1 MiB on CUDA) or lives
  in the storage of one of the layer's parameters or buffers (FSDP2's gathered weights, a float8-stored
  frozen weight) or of a forward argument other than the hidden states (RoPE's cos/sin, shared by
  every layer). What moves is the tensor's whole storage, once per storage however many saved tensors
  view it (q, k and v may be views of one projection output); the tensor comes back as the same view
  of a restored storage, same sizes, strides and offset -- compiled backward graphs assert them.
  The copy runs on a side stream after the work that produced it; the device memory returns to the
  caching allocator once the copy is done (``record_stream``). Host buffers come from PyTorch's
  caching pinned-memory allocator, reused step after step.
* unpack: the first unpack in a layer's backward issues its copies back (unless already issued) and
  those of the PREFETCH_DEPTH offloaded layers below it, on another side stream, so their copies run
  under this layer's backward and the next ones'; the compute stream waits only for the layer it
  needs. The highest offloaded layer's copy back is issued PREFETCH_DEPTH layers above it, when the
  backward reaches that layer's output (``fetch_top_ahead``). The link bounds it all: on one H200 a
  7B-shape layer's set (1.08 GiB per 8192-token sequence) takes 20 ms each way at 55 GB/s against
  11 ms of that layer's backward, so offloading layers that would otherwise keep their activations
  only costs time; it pays where it replaces recomputation (docs/PERFORMANCE.md, "Activation offload").

Off CUDA (the CPU tests) the same bookkeeping copies into separate host tensors with no streams."""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from trainperf.core.layout import OFFLOAD_PREFETCH_DEPTH as PREFETCH_DEPTH

# on CUDA a saved tensor smaller than this stays where it is: a copy would cost more than it frees
# (on CPU, where offload only exercises the bookkeeping, everything is copied)
SMALL_BYTES = 1 << 20


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (its storage is what the compiled graph saves), read without an op:
    this also runs inside the pack hook."""
    return getattr(t, "_local_tensor", t)


def _as_bytes(storage: torch.UntypedStorage, device: torch.device) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage)


@dataclass
class OffloadStats:
    tensors: int = 0  # saved tensors packed to the host since the last reset
    bytes: int = 0  # storage bytes copied to the host (each storage once per layer call)
    kept: int = 0  # saved tensors left in place (small, a parameter's or an argument's storage, a subclass)
    kept_subclass_bytes: int = 0  # of those, tensor subclasses (eager DTensor / float8 activations) that stay
    fetched_on_demand: int = 0  # layer calls whose copy back was not issued ahead of their backward


class _Saved:
    """What pack returns for one offloaded tensor: its storage's slot in the layer call and its view."""

    __slots__ = ("call", "key", "dtype", "size", "stride", "offset")

    def __init__(self, call: _LayerCall, key: int, t: torch.Tensor):
        self.call, self.key, self.dtype = call, key, t.dtype
        self.size, self.stride, self.offset = t.size(), t.stride(), t.storage_offset()


class _LayerCall:
    """One forward of one offloaded layer (one micro-batch): its storages on the host, and on the
    device once fetched back. ``below`` is the offloaded layer that ran just before it in the same
    forward pass: its backward comes next, so its copy is issued when this one's backward starts."""

    def __init__(self, offloader: ActivationOffloader, index: int, below: _LayerCall | None):
        self.offloader, self.index, self.below = offloader, index, below
        self.host: dict[int, torch.Tensor] = {}  # storage key -> uint8 host copy
        # the packed device storages, held until the layer's forward returns: a storage freed earlier
        # could be reallocated at the same address within the forward and be taken for the first
        self.alive: list[torch.Tensor] = []
        self.device: dict[int, torch.Tensor] = {}  # storage key -> uint8 device copy (after fetch)
        self.fetched = False  # copies back issued
        self.started = False  # backward reached (first unpack): the calls below have been prefetched
        self.copied_out: torch.cuda.Event | None = None  # after this call's last copy out
        self.ready: torch.cuda.Event | None = None  # after its copies back

    def fetch(self) -> None:
        """Issue the copies back to the device (on the h2d stream under CUDA)."""
        if self.fetched:
            return
        self.fetched = True
        off = self.offloader
        if off.h2d is None:  # CPU: the host copy is the tensor
            self.device = dict(self.host)
            return
        compute = torch.cuda.current_stream(off.device)
        # allocate on the compute stream (its user) and copy once the compute stream has reached this
        # point: a block the compute stream just freed may still be read by kernels queued before it
        self.device = {k: torch.empty_like(h, device=off.device) for k, h in self.host.items()}
        off.h2d.wait_stream(compute)
        if self.copied_out is not None:  # the copy out may still be writing the host buffers
            off.h2d.wait_event(self.copied_out)
        with torch.cuda.stream(off.h2d):
            for k, h in self.host.items():
                self.device[k].copy_(h, non_blocking=True)
                # a call dropped before it is unpacked (backward cut short) frees the block while the
                # copy may still write it
                self.device[k].record_stream(off.h2d)
            self.ready = torch.cuda.Event()
            self.ready.record(off.h2d)

    def restore(self, s: _Saved) -> torch.Tensor:
        if not self.started:  # the first unpack of this layer's backward
            self.started = True
            if not self.fetched:
                self.offloader.stats.fetched_on_demand += 1
                self.fetch()
            below = self.below
            for _ in range(PREFETCH_DEPTH):  # their copies run under this layer's backward and the next
                if below is None:
                    break
                below.fetch()
                below = below.below
        if self.ready is not None:
            torch.cuda.current_stream(self.offloader.device).wait_event(self.ready)
            self.ready = None
        storage = self.device[s.key].untyped_storage()
        return torch.empty(0, dtype=s.dtype, device=storage.device).set_(storage, s.offset, s.size, s.stride)


class ActivationOffloader:
    """One per model (pipeline stage); ``layer_context(index, layer, args)`` wraps an offloaded
    layer's forward."""

    def __init__(self, device: torch.device):
        self.device = device
        cuda = device.type == "cuda"
        self.d2h = torch.cuda.Stream(device) if cuda else None
        self.h2d = torch.cuda.Stream(device) if cuda else None
        self.min_bytes = SMALL_BYTES if cuda else 0
        self.stats = OffloadStats()
        self._last: weakref.ref[_LayerCall] | None = None

    def _below(self, index: int) -> _LayerCall | None:
        """The call of the offloaded layer that ran just before this one in the same forward pass (a
        lower layer index: a new pass starts at a lower or equal index than the last call's)."""
        last = self._last() if self._last is not None else None
        return last if last is not None and last.index < index else None

    @contextlib.contextmanager
    def layer_context(self, index: int, layer: nn.Module, args: tuple):
        call = _LayerCall(self, index, self._below(index))
        self._last = weakref.ref(call)
        keep = {_storage_key(_local(t)) for t in [*layer.parameters(), *layer.buffers()]}
        keep |= {_storage_key(a) for a in args[1:] if isinstance(a, torch.Tensor)}

        def pack(t: torch.Tensor):
            return self._pack(call, keep, t)

        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
                yield
        finally:
            call.alive.clear()

    def fetch_top_ahead(self, top: int):
        """A forward hook for a layer above ``top``, the highest offloaded layer: once the backward
        reaches that layer's output, the copy back of ``top``'s latest call is issued, to run under the
        backward (and recomputation) of the layers in between. Without it the chain of prefetches
        starts at ``top`` itself, whose whole copy back was exposed once per micro-batch (20 ms of a
        7B layer, 35 ms of a 70B one at 55 GB/s)."""

        def hook(module: nn.Module, args: tuple, output):
            call = self._last() if self._last is not None else None
            if call is None or call.index != top or not isinstance(output, torch.Tensor) or not output.requires_grad:
                return None
            # a weak reference: the output lives until the whole backward ends, and a call held that long
            # would hold its device copies and, through ``below``, every offloaded layer's (+12 GiB of
            # peak on the 7B LoRA with 12 offloaded layers, measured on an H200 before this was weak)
            ref = weakref.ref(call)
            output.register_hook(lambda grad: _fetch_if_alive(ref))
            return None

        return hook

    def _pack(self, call: _LayerCall, keep: set[int], t: torch.Tensor):
        if isinstance(t, nn.Parameter):  # a weight (FSDP2's gathered ones are Parameters too)
            self.stats.kept += 1
            return t
        if type(t) is not torch.Tensor:  # DTensor, float8 subclasses: their own storage layout
            self.stats.kept += 1
            local = _local(t)
            self.stats.kept_subclass_bytes += local.numel() * local.element_size()
            return t
        if t.device.type != self.device.type or t.untyped_storage().nbytes() < self.min_bytes:
            self.stats.kept += 1
            return t
        key = _storage_key(t)
        if key in keep:
            self.stats.kept += 1
            return t
        if key not in call.host:
            storage = t.untyped_storage()
            src = _as_bytes(storage, t.device)
            if self.d2h is None:
                call.host[key] = src.clone()
            else:
                host = torch.empty(src.shape, dtype=torch.uint8, pin_memory=True)
                self.d2h.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(self.d2h):
                    host.copy_(src, non_blocking=True)
                src.record_stream(self.d2h)  # the block is not reused before the copy has read it
                call.host[key] = host
                call.copied_out = torch.cuda.Event()  # the stream is in order: the latest covers them all
                call.copied_out.record(self.d2h)
            call.alive.append(src)
            self.stats.bytes += storage.nbytes()
        self.stats.tensors += 1
        return _Saved(call, key, t)


def _fetch_if_alive(ref: weakref.ref[_LayerCall]) -> None:
    call = ref()
    if call is not None:
        call.fetch()


def _unpack(packed):
    return packed.call.restore(packed) if isinstance(packed, _Saved) else packed
