"""The model as this rank holds it -- the whole model, or its pipeline stages -- and how one training
step, one eval batch and the adapter export run on it under the layout's techniques.

Every rank's loss is its share of the global-batch token sum (divided by the global target-token
count, scaled by the FSDP averaging factor), so DP, FSDP, HSDP, TP, CP and PP all add up to the
single-process loss: the distributed tests check it to 1e-4.
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist
from torch import nn

from trainperf.core.families import family
from trainperf.core.layout import Layout, grad_accum_steps, stages_per_rank
from trainperf.core.spec import RunSpec
from trainperf.model import checkpoint as ckpt
from trainperf.model.float8 import FLOAT8_STORAGE, write_float8_weight
from trainperf.model.families import build_on_meta, init_full_tensor
from trainperf.model.lora import is_adapter_param, store_frozen_base_in
from trainperf.model.loss import masked_loss_sum, row_loss_sums, shift_targets
from trainperf.model.moe import model_aux_loss
from trainperf.model.options import ModelOptions
from trainperf.parallel.parallelize import (
    embedding_groups,
    parallelize,
    split_for_pipeline,
    tie_pipeline_embeddings,
)


def _materialise(part: nn.Module, spec: RunSpec, device: torch.device) -> None:
    """Allocate a (sharded) meta module and give each parameter its layout-independent initial value."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    part.to_empty(device=device)
    with torch.no_grad():
        for name, p in part.named_parameters():
            full = ckpt.to_storage(part, name, init_full_tensor(name, p.shape, spec.model, spec.train.seed, device))
            if p.dtype == FLOAT8_STORAGE:  # hardware.frozen_dtype=fp8
                write_float8_weight(part, name, p, full)
            elif isinstance(p, DTensor):
                p.to_local().copy_(distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local())
            else:
                p.copy_(full)


def frozen_storage_dtype(spec: RunSpec, param_dtype) -> torch.dtype | None:
    """The dtype a LoRA run stores its frozen base in (None: leave it fp32). With frozen_dtype=fp8
    this is the dtype of the rest of the base (embedding, norms, LM head), as auto would choose."""
    h = spec.hardware
    if not spec.lora.enabled or h.frozen_dtype == "fp32":
        return None
    if h.frozen_dtype == "bf16" or param_dtype == torch.bfloat16:
        return torch.bfloat16
    return None


def model_options(spec: RunSpec, device: torch.device, param_dtype) -> ModelOptions:
    """What the model is built with (model/options.py): the hardware section's kernels, float8 GEMMs
    emulated off GPU, the float8-stored frozen weights' source dtype (the rest of the base's, as
    lora.store_frozen_base_in stores it, else fp32), and the layout's context and tensor parallel."""
    h = spec.hardware
    float8_from = None
    if spec.lora.enabled and h.frozen_dtype == "fp8":
        float8_from = frozen_storage_dtype(spec, param_dtype) or torch.float32
    return ModelOptions(attention=h.attention, lora_kernel=h.lora_kernel, fp8=h.fp8,
                        emulate_fp8=device.type != "cuda", frozen_float8_from=float8_from,
                        repeat_kv=spec.parallel.cp > 1, tp=spec.parallel.tp,
                        sequence_parallel=spec.parallel.sp and spec.parallel.tp > 1)


class Engine:
    def __init__(self, spec: RunSpec, mesh, device: torch.device, param_dtype, on_load_tensor=None):
        self.spec, self.mesh, self.device = spec, mesh, device
        p = spec.parallel
        self.pp = p.pp
        self.scale = Layout.of(p).loss_scale
        self.global_tokens = 1.0
        model = build_on_meta(spec.model, model_options(spec, device, param_dtype),
                              spec.lora if spec.lora.enabled else None)
        if spec.lora.enabled:
            frozen = frozen_storage_dtype(spec, param_dtype)
            if frozen is not None:
                store_frozen_base_in(model, frozen)
        if p.pp > 1:
            self.parts = split_for_pipeline(model, p, mesh["pp"].get_local_rank())
        else:
            self.parts = [(0, model)]
        # each part's activation offloader (train.offload_layers), for offloaded_bytes
        self.offloaders = []
        for _, part in self.parts:
            offloader = parallelize(part, spec, mesh, param_dtype)
            if offloader is not None:
                self.offloaders.append(offloader)
            _materialise(part, spec, device)
        self.load_s, self.load_bytes = 0.0, 0
        if spec.model.path:  # untimed: before run_start
            t0 = time.perf_counter()
            index = ckpt.inspect_checkpoint(spec.model.path)
            self.load_bytes = sum(ckpt.load_checkpoint_into(part, index, on_load_tensor) for _, part in self.parts)
            self.load_s = time.perf_counter() - t0
        if spec.lora.enabled:  # only adapters train, whatever a parallel style did to the flags
            for _, part in self.parts:
                for name, q in part.named_parameters():
                    q.requires_grad_(is_adapter_param(name))
        self.trainable = [q for _, part in self.parts for q in part.parameters() if q.requires_grad]
        # a GPT's tied embedding split over the pipeline: the first and last stage sum their gradients
        # (tie_pipeline_embeddings); the last stage's copy then stays out of the gradient norm, which
        # counts the embedding once as one process does
        self.embedding_group = embedding_groups(mesh) if (
            p.pp > 1 and family(spec.model.family).tied_embeddings) else None
        self.tied_copies = [part.output_layer.weight for _, part in self.parts
                            if self.embedding_group is not None and part.output_layer is not None]
        # FSDP2's switch for syncing gradients only on the last micro-batch; None without FSDP2 (one
        # process with a bf16 LoRA base, parallelize.runs_without_fsdp)
        self._gradient_sync = getattr(self.parts[0][1], "set_requires_gradient_sync", None)
        self._sync_every_micro_batch = spec.train.grad_sync == "every"  # train.grad_sync
        # hardware.mixed_precision=autocast: no FSDP2 casts the fp32 masters, autocast does (None: off)
        self._autocast_dtype = param_dtype if spec.hardware.mixed_precision == "autocast" else None
        self.schedule = self._pipeline_schedule() if p.pp > 1 else None
        self._eval_rows: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._evaluating = False

    # -- contexts ---------------------------------------------------------------------------------

    def _loss_parallel(self):
        if self.spec.parallel.tp > 1:
            from torch.distributed.tensor.parallel import loss_parallel

            return loss_parallel()
        return contextlib.nullcontext()

    def _context_parallel(self, buffers: list[torch.Tensor]):
        """Shard the sequence of every buffer over the CP ranks (load-balanced) and run attention as
        ring attention inside; buffers are [ids, labels, label_mask] (seq dim 1) and positions (dim 0)."""
        if self.spec.parallel.cp == 1:
            return contextlib.nullcontext()
        from torch.distributed.tensor.experimental import context_parallel

        return context_parallel(self.mesh["cp"], buffers=buffers, buffer_seq_dims=[1, 1, 1, 0],
                                no_restore_buffers=set(buffers))

    def _autocast(self):
        if self._autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self._autocast_dtype)

    def _inputs(self, ids: torch.Tensor, mask: torch.Tensor):
        ids = ids.to(self.device, non_blocking=True)
        labels, label_mask = shift_targets(ids, mask.to(self.device, non_blocking=True))
        positions = torch.arange(ids.shape[1], device=self.device)
        return ids, labels, label_mask.to(torch.float32), positions

    # -- training ---------------------------------------------------------------------------------

    def train(self, mode: bool = True) -> None:
        for _, part in self.parts:
            part.train(mode)

    def train_step(self, micro_batches: list[tuple[torch.Tensor, torch.Tensor]], global_tokens: float) -> torch.Tensor:
        """Forward and backward over this rank's micro-batches; returns this rank's share of the loss."""
        self.global_tokens = global_tokens
        if self.schedule is not None:
            return self._pipeline_step(micro_batches)
        model = self.parts[0][1]
        loss_local = torch.zeros((), device=self.device)
        for i, (ids, mask) in enumerate(micro_batches):
            ids, labels, label_mask, positions = self._inputs(ids, mask)
            if self._gradient_sync is not None:
                self._gradient_sync(i == len(micro_batches) - 1 or self._sync_every_micro_batch)
            with self._context_parallel([ids, labels, label_mask, positions]), self._loss_parallel():
                pos = positions if self.spec.parallel.cp > 1 else None
                chunk = self.spec.train.loss_chunk_tokens
                if chunk > 0:  # the loss inside forward, chunk by chunk: no full logits tensor
                    with self._autocast():
                        loss = model(ids, pos, labels=labels, label_mask=label_mask, loss_chunk_tokens=chunk)
                    loss = loss / global_tokens
                else:
                    with self._autocast():
                        logits = model(ids, pos)
                    loss = masked_loss_sum(logits, labels, label_mask) / global_tokens
                ((loss + self._aux_loss(model, label_mask, global_tokens)) * self.scale).backward()
            loss_local += loss.detach()
        return loss_local

    def _aux_loss(self, model, label_mask: torch.Tensor, global_tokens: float):
        """A MoE model's load-balancing loss x model.moe_aux_loss_coeff, weighted by this micro-batch's
        share of the global batch's tokens (0 for a dense model): it trains, it is not reported."""
        coeff = self.spec.model.moe_aux_loss_coeff
        aux = model_aux_loss(model) if coeff else None
        return 0.0 if aux is None else coeff * aux * (label_mask.sum() / global_tokens)

    # -- pipeline ---------------------------------------------------------------------------------

    def _pipeline_schedule(self):
        from torch.distributed import pipelining as pl

        p = self.spec.parallel
        n_stages = self.n_stages = p.pp * stages_per_rank(p)
        group = self.mesh["pp"].get_group()
        stages = [pl.PipelineStage(part, idx, n_stages, self.device, group=group) for idx, part in self.parts]
        self.first = any(idx == 0 for idx, _ in self.parts)
        self.last = any(idx == n_stages - 1 for idx, _ in self.parts)
        n_micro = grad_accum_steps(self.spec)
        cls = {"GPipe": pl.ScheduleGPipe, "1F1B": pl.Schedule1F1B, "Interleaved1F1B": pl.ScheduleInterleaved1F1B}[p.pp_schedule]
        # our loss is already each micro-batch's share of the global sum: no extra 1/n_microbatches
        stage_arg = stages if p.pp_schedule == "Interleaved1F1B" else stages[0]
        return cls(stage_arg, n_microbatches=n_micro, loss_fn=self._pipeline_loss, scale_grads=False)

    def _pipeline_loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        labels, label_mask = target[..., 0], target[..., 1].to(torch.float32)
        if self._evaluating:
            sums, counts = row_loss_sums(logits, labels, label_mask)
            self._eval_rows.append((sums.detach(), counts))
            return sums.sum()
        return masked_loss_sum(logits, labels, label_mask) / self.global_tokens * self.scale

    def _pipeline_batch(self, micro_batches):
        ids = torch.cat([m[0] for m in micro_batches])
        mask = torch.cat([m[1] for m in micro_batches])
        ids, labels, label_mask, _ = self._inputs(ids, mask)
        return ids, torch.stack([labels, label_mask.to(labels.dtype)], dim=-1)

    def _run_schedule(self, fn, ids, target, losses=None):
        args = (ids,) if self.first else ()
        kwargs = {"target": target, "losses": losses} if self.last else {}
        with self._loss_parallel():
            fn(*args, **kwargs)

    def _pipeline_step(self, micro_batches) -> torch.Tensor:
        ids, target = self._pipeline_batch(micro_batches)
        losses: list[torch.Tensor] = []
        self._run_schedule(self.schedule.step, ids, target, losses)
        if self.embedding_group is not None:
            tie_pipeline_embeddings([part for idx, part in self.parts if idx in (0, self.n_stages - 1)],
                                    self.embedding_group)
        if self.last and losses:
            return torch.stack([x.detach() for x in losses]).sum() / self.scale
        return torch.zeros((), device=self.device)

    # -- eval -------------------------------------------------------------------------------------

    @torch.no_grad()
    def eval_batch(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Per-row (sum of target losses, target count) over whole sequences, or None on pipeline
        ranks without the last stage."""
        if self.schedule is not None:
            self._evaluating, self._eval_rows = True, []
            try:
                pids, target = self._pipeline_batch([(ids, mask)])
                self._run_schedule(self.schedule.eval, pids, target, [])
            finally:
                self._evaluating = False
            if not self.last:
                return None
            return torch.cat([r[0] for r in self._eval_rows]), torch.cat([r[1] for r in self._eval_rows])
        model = self.parts[0][1]
        ids, labels, label_mask, positions = self._inputs(ids, mask)
        with self._context_parallel([ids, labels, label_mask, positions]), self._loss_parallel():
            with self._autocast():
                logits = model(ids, positions if self.spec.parallel.cp > 1 else None)
            sums, counts = row_loss_sums(logits, labels, label_mask)
        if self.spec.parallel.cp > 1:  # each CP rank saw part of every sequence
            both = torch.stack([sums, counts])
            dist.all_reduce(both, group=self.mesh["cp"].get_group())
            sums, counts = both[0], both[1]
        return sums, counts

    def offloaded_bytes(self, kept_subclasses: bool = False) -> int:
        """Bytes of saved activations this rank has copied to host memory so far (train.offload_layers),
        or with ``kept_subclasses`` those an offloaded layer had to keep on the device (DTensor and
        float8 tensor subclasses: eager tensor parallel, eager float8)."""
        return sum(o.stats.kept_subclass_bytes if kept_subclasses else o.stats.bytes for o in self.offloaders)

    # -- export -----------------------------------------------------------------------------------

    def gather(self, only_adapters: bool = False, base_only: bool = False) -> dict[str, torch.Tensor] | None:
        """Full tensors from every rank's shards and stages, on global rank 0 (None elsewhere)."""
        mine: dict[str, torch.Tensor] = {}
        for _, part in self.parts:
            mine.update(ckpt.gather_full_state(part, only_adapters=only_adapters, base_only=base_only))
        if self.pp == 1:
            return mine if dist.get_rank() == 0 else None
        gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(mine, gathered, dst=0)  # in-memory transfer between our own ranks
        if dist.get_rank() != 0:
            return None
        merged: dict[str, torch.Tensor] = {}
        for d in gathered:
            merged.update(d)
        return merged
