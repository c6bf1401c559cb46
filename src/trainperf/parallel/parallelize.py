"""Compose PyTorch's parallel techniques on one DeviceMesh: one function per technique, applied in a
fixed order (torchtitan's):

    1. pipeline split   torch.distributed.pipelining stages (the model is cut before anything else)
    2. TP + SP          the family's parallelize_module plans (model/families.py tp_plan); loss-parallel output
    2b. EP              a mixture of experts' experts split over parallel.ep ranks, all-to-all dispatch
                        (parallel/expert_parallel.py; their FSDP2 group is applied just before step 6's)
    3. CP               context_parallel() around each step (applied per step, see train/engine.py;
                        the model is built for it: ModelOptions.repeat_kv)
    4. recompute        activation checkpointing per decoder layer (none | selective | full), or
                        activation offload to pinned host memory (offload_layers, spread among them)
    5. compile          torch.compile per decoder layer
                        (4 and 5: one LayerWrapper per decoder layer, parallel/layer_wrapper.py)
    6. FSDP2 / HSDP     fully_shard per layer, embedding, root; bf16 params, fp32 reduce on GPU
                        (skipped for one process with a bf16 LoRA base or hardware.mixed_precision=autocast:
                        runs_without_fsdp)

The mesh's dims and every degree, group and stage count come from ``core.layout.Layout``. Kernel
choices (attention, LoRA kernel, float8 GEMMs) are the model's own, fixed when it is built
(model/options.py): nothing here changes what a layer computes.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from trainperf.core.layout import MESH_DIMS, Layout, layer_memory_modes, stages_per_rank
from trainperf.core.spec import ParallelSpec, RunSpec
from trainperf.model import flash4, lora_kernel  # noqa: F401  register the custom ops the selective policy names
from trainperf.model.families import decoder_layers, tied_weights, tp_plan
from trainperf.model.float8 import FLOAT8_STORAGE
from trainperf.model.lora import LoRALinear, is_adapter_param
from trainperf.parallel.expert_parallel import apply_ep, shard_experts
from trainperf.parallel.layer_wrapper import LayerWrapper
from trainperf.parallel.offload import PREFETCH_DEPTH, ActivationOffloader


def build_mesh(p: ParallelSpec, device_type: str) -> DeviceMesh:
    """The world as one mesh, plus flattened views: 'dp' (data loading), 'dp_shard_cp' (FSDP shards
    over data and context ranks alike: both hold the same parameters), 'dp_cp' (loss scaling) and,
    under TP, 'dp_shard_cp_tp' (the dims a parameter is sharded over: DTensor finds it by layout)."""
    sizes = Layout.of(p).sizes
    mesh = init_device_mesh(device_type, tuple(sizes[d] for d in MESH_DIMS), mesh_dim_names=MESH_DIMS)
    mesh[("dp_replicate", "dp_shard")]._flatten("dp")
    mesh[("dp_shard", "cp")]._flatten("dp_shard_cp")
    mesh[("dp_replicate", "dp_shard", "cp")]._flatten("dp_cp")
    if p.tp > 1:  # the gradient norm of FSDP x TP parameters: one all-reduce over both dims, not two
        mesh[("dp_shard", "cp", "tp") if p.cp > 1 else ("dp_shard", "tp")]._flatten("dp_shard_cp_tp")
    return mesh


# ---------------------------------------------------------------------------------------------
# 1. Pipeline split

def split_for_pipeline(model: nn.Module, p: ParallelSpec, pp_rank: int) -> list[tuple[int, nn.Module]]:
    """Cut the (meta) model into pp x stages_per_rank stages of equal layer counts; this rank keeps
    stages pp_rank, pp_rank + pp, ... (looping placement, as the interleaved schedule expects).
    The first stage keeps the embedding, the last the final norm and LM head (the model class names
    them: FIRST_STAGE_MODULES, LAST_STAGE_MODULES); parameter names stay the full model's names, so
    checkpoints load and adapters export unchanged. A GPT's tied output layer keeps, on the last
    stage, its own copy of the embedding (tie_pipeline_embeddings keeps the two equal)."""
    n_stages = p.pp * stages_per_rank(p)
    layers = list(decoder_layers(model).keys())
    per_stage = len(layers) // n_stages
    out = []
    for stage in range(pp_rank, n_stages, p.pp):
        part = copy.deepcopy(model)
        keep = set(layers[stage * per_stage:(stage + 1) * per_stage])
        for name in layers:
            if name not in keep:
                del decoder_layers(part)[name]
        dropped = (() if stage == 0 else part.FIRST_STAGE_MODULES) + (
            () if stage == n_stages - 1 else part.LAST_STAGE_MODULES)
        for path in dropped:
            parent, _, leaf = path.rpartition(".")
            setattr(part.get_submodule(parent), leaf, None)
        out.append((stage, part))
    return out


def stage_module(model: nn.Module, path: str) -> nn.Module | None:
    """The submodule at ``path``, or None where this pipeline stage dropped it."""
    parent, _, leaf = path.rpartition(".")
    return getattr(model.get_submodule(parent), leaf)


def stage_parameter(model: nn.Module, name: str) -> nn.Parameter | None:
    """The parameter ``name``, or None where this pipeline stage dropped its module."""
    try:
        return model.get_parameter(name)
    except AttributeError:
        return None


def embedding_groups(mesh: DeviceMesh):
    """The process group of this rank's first and last pipeline stage (same data, context and tensor
    coordinates): where a tied embedding's two copies sum their gradients (Megatron's embedding group).
    Every rank creates every pair's group, as new_group requires; None for a middle stage."""
    import torch.distributed as dist

    ranks = mesh.mesh  # [pp, dp_replicate, dp_shard, cp, tp] global ranks
    mine = None
    for first, last in zip(ranks[0].flatten().tolist(), ranks[-1].flatten().tolist()):
        group = dist.new_group([first, last])
        if dist.get_rank() in (first, last):
            mine = group
    return mine


def tie_pipeline_embeddings(parts: list[nn.Module], group) -> None:
    """After the backward: the first stage's embedding and the last stage's output-layer copy each
    hold the gradient of their own use; both get the sum, so the two copies take the same step and
    stay equal (both start from the same, name-seeded value)."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    for part in parts:
        for copy, source in tied_weights(part).items():  # the family names them (FamilyModules.tied_weights)
            weight = stage_parameter(part, copy)
            if weight is None:  # the first stage: the embedding itself
                weight = stage_parameter(part, source)
            if weight is None:
                continue
            grad = weight.grad
            if grad is None:
                grad = torch.zeros_like(weight)
                weight.grad = grad
            dist.all_reduce(grad.to_local() if isinstance(grad, DTensor) else grad, group=group)


# ---------------------------------------------------------------------------------------------
# 2. Tensor + sequence parallel

def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Megatron-style TP by the family's plan (model/families.py tp_plan): attention heads and MLP
    columns split over the TP ranks; with SP the norms and the residual stream are split along the
    sequence between the blocks; the LM head keeps its output vocab-sharded for loss-parallel cross
    entropy (no gathering of [tokens, vocab] logits)."""
    from torch.distributed.tensor.parallel import parallelize_module

    plan = tp_plan(model, tp_mesh.size(), sequence_parallel)
    frozen = {n: q.requires_grad for n, q in model.named_parameters()}
    for module, styles in plan.steps:
        parallelize_module(module, tp_mesh, styles)
    if plan.sp_embedding is not None and sequence_parallel:
        own_output_storage(plan.sp_embedding)
    if plan.after is not None:
        plan.after()
    # SequenceParallel re-registers the norm weights without their requires_grad (torch 2.13):
    # restore every flag so frozen weights stay frozen under LoRA.
    for n, q in model.named_parameters():
        q.requires_grad_(frozen[n])


def own_output_storage(module: nn.Module) -> None:
    """Under SP the embedding returns its sequence shard as a view of the scattered buffer; FSDP2 hooks
    the backward on that output and warns on a view (an in-place op would drop the hook), so the
    shard (tokens / TP x hidden: small next to the layers' activations) gets its own storage."""
    module.register_forward_hook(lambda _module, _args, out: out.clone() if out._is_view() else out)


# ---------------------------------------------------------------------------------------------
# 4. Activation checkpointing, 5. compile

def _selective_policy(adapter_rank: int | None = None):
    """Save the outputs of the projections and of attention; recompute the cheap pointwise ops (norms,
    SiLU, RoPE, dropout, residual adds) in the backward pass. A LoRA adapter's GEMMs (one side is
    the rank, ``adapter_rank``) are recomputed too: they cost ~r/h of their projection, while their
    outputs (B's is as wide as the projection's) would cost as much memory as the projection's own."""
    from torch.utils.checkpoint import CheckpointPolicy

    matmuls = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}
    save = matmuls | {torch.ops.aten._scaled_dot_product_flash_attention.default,
                      torch.ops.aten._scaled_dot_product_efficient_attention.default,
                      torch.ops.aten._scaled_dot_product_cudnn_attention.default,
                      torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
                      torch.ops.trainperf.flash4_attn.default,
                      # the fused LoRA kernel's outputs, A's (tokens, adapters x rank) and the masks'
                      # bits: saving them costs little, recomputing them a pass over x
                      torch.ops.trainperf.lora_dropout_a.default}

    def is_adapter_gemm(op, args) -> bool:
        if adapter_rank is None or op not in matmuls:
            return False
        a, b = args[-2], args[-1]  # addmm(bias, a, b), mm(a, b), bmm(a, b)
        return adapter_rank in (a.shape[-1], b.shape[-1])  # inner dim r (B) or output width r (A)

    # LoRA dropout's mask under tensor parallel (model/lora.py) is a plain boolean draw, then
    # DTensor's from_local + redistribute: recomputing that chain made AOT autograd save the
    # DeviceMesh itself (an assertion, torch 2.13, compiled TP + selective); that mask is saved
    # instead (1 byte per element). Other draws -- CUDA's fused dropout (native_dropout), CPU's
    # F.dropout (bernoulli_ into a float mask) -- are recomputed as before.
    random_draws = {torch.ops.aten.bernoulli_.float, torch.ops.aten.bernoulli.p, torch.ops.aten.bernoulli.default}

    def is_boolean_mask_draw(op, args) -> bool:
        return op in random_draws and bool(args) and getattr(args[0], "dtype", None) == torch.bool

    # the fused LoRA kernel's seed draw (model/lora_kernel.py), 8 bytes: kept like its outputs, so a
    # recomputation neither reruns nor redraws any part of the op
    seed_draws = {torch.ops.aten.randint.low}

    def policy(ctx, op, *args, **kwargs):
        if ((op in save and not is_adapter_gemm(op, args)) or is_boolean_mask_draw(op, args)
                or op in seed_draws):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _selective_context_fns():
    """A function (LoRA adapter rank or None -> selective checkpoint context_fn) that makes one
    context_fn per rank, shared by the layers: compiled layers guard on its identity, so one per layer
    would recompile each layer (and fail at dynamo's recompile limit)."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    shared: dict[int | None, object] = {}

    def for_rank(rank: int | None):
        if rank not in shared:
            policy = _selective_policy(rank)

            # a plain function, not a functools.partial: dynamo inlines checkpoint only with a user
            # function (or a partial of one) as context_fn
            def context_fn():
                return create_selective_checkpoint_contexts(policy)
            shared[rank] = context_fn
        return shared[rank]

    return for_rank


def _adapter_rank(layer: nn.Module) -> int | None:
    return next((m.lora_A.out_features for m in layer.modules() if isinstance(m, LoRALinear)), None)


def _compile_options(backend: str | None) -> dict | None:
    """Random ops (LoRA dropout) run eager's kernels inside the graph (Inductor's ``fallback_random``):
    Inductor's own Triton draws cost one Philox call per element, 0.14 ms per 7B dropout mask,
    while eager's kernel is bandwidth-bound; on one H200 the compiled 7B LoRA step gained 1.2%
    (docs/PERFORMANCE.md), and a compiled layer now drops exactly what the eager one drops."""
    return {"fallback_random": True} if backend == "inductor" else None  # None: eager, or a test backend


def wrap_layers(model: nn.Module, modes: list[str], offloader=None, compile_backend: str | None = None) -> None:
    """Steps 4 and 5: every decoder layer becomes a LayerWrapper that says how its forward runs --
    ``modes`` (core.layout.layer_memory_modes: none | selective | full | offload per layer),
    ``offloader`` (parallel/offload.py, for the offload layers) and ``compile_backend`` (None: eager).

    Compiling: each decoder layer separately (fast compile, reused across identical layers: nothing
    a layer's graph guards on may differ per layer). A fully recomputed layer keeps its checkpoint
    outside the compiled graph (checkpoint(compiled forward)), and an offloaded layer its saved-tensor
    hooks (they apply when the compiled forward saves its tensors, at run time). Traced inside, the
    checkpoint of a layer with float8 GEMMs kept 1.16 GiB per 70B layer of float8 copies on the H200
    (1.28 GiB instead of the 0.125 GiB input, every full layer; the recipe ran out of memory in its
    first forward), while the eager checkpoint around the compiled forward drops whatever the graph
    saves, as it does for any function. Selective layers stay compiled with their checkpoint inside:
    the policy has to see the graph's individual ops."""
    selective = _selective_context_fns()
    layers = decoder_layers(model)
    for index, (name, mode) in enumerate(zip(list(layers.keys()), modes)):
        layer = layers[name]
        context_fn = selective(_adapter_rank(layer)) if mode == "selective" else None
        layers[name] = LayerWrapper(layer, index, mode, context_fn, offloader if mode == "offload" else None,
                                    compile_backend, _compile_options(compile_backend))
    if offloader is not None:
        wrapped = list(layers.values())
        top = max(i for i, mode in enumerate(modes) if mode == "offload")
        ahead = min(top + PREFETCH_DEPTH, len(wrapped) - 1)
        if ahead > top:  # a module hook: outside any compiled forward or checkpoint, not run by recomputation
            wrapped[ahead].register_forward_hook(offloader.fetch_top_ahead(top))


def apply_activation_checkpointing(model: nn.Module, mode: str, n_layers: int = -1, others: str = "none") -> None:
    """train.recompute alone (no offload, no compile): none | selective (recompute pointwise ops) |
    full (recompute each layer); ``n_layers`` >= 0 limits it to n of this model's (stage's) first
    decoder layers (Megatron's recompute-num-layers), -1 applies it to all; ``others``
    (train.recompute_others) is what the remaining layers get: none (keep their activations) or
    selective."""
    wrap_layers(model, layer_memory_modes(len(decoder_layers(model)), mode, n_layers, others, 0))


def apply_compile(model: nn.Module, backend: str = "inductor") -> None:
    """train.compile alone: each decoder layer compiled, keeping how it recomputes (if
    apply_activation_checkpointing wrapped it). ``backend``: tests capture with aot_eager."""
    layers = decoder_layers(model)
    for index, name in enumerate(list(layers.keys())):
        layer = layers[name]
        # a new wrapper would drop them: wrap_layers compiles a layer it hooks (offload's prefetch)
        assert not (layer._forward_hooks or layer._forward_pre_hooks), f"layer {name} has module hooks"
        if isinstance(layer, LayerWrapper):
            layers[name] = LayerWrapper(layer, layer.index, layer.memory_mode, layer.context_fn, layer.offloader,
                                        backend, _compile_options(backend))
        else:
            layers[name] = LayerWrapper(layer, index, compile_backend=backend, compile_options=_compile_options(backend))


# ---------------------------------------------------------------------------------------------
# 6. FSDP2 / HSDP

def fsdp_mesh(mesh: DeviceMesh, p: ParallelSpec) -> DeviceMesh:
    # without CP, dp_shard_cp is dp_shard: slice the real dim (torch deprecates slicing a flattened one from the root)
    shard = "dp_shard_cp" if p.cp > 1 else "dp_shard"
    return mesh[("dp_replicate", shard)] if p.dp_replicate > 1 else mesh[shard]


def data_parallel_rank(mesh: DeviceMesh, p: ParallelSpec) -> int:
    """This rank's index in the flattened 'dp' dim (replicate-major), read from the root's own dims."""
    return mesh.get_local_rank("dp_replicate") * p.dp_shard + mesh.get_local_rank("dp_shard")


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, param_dtype: torch.dtype | None, pipelined: bool) -> None:
    """FSDP2 per decoder layer, the embedding, and [norm, lm_head] with the root; HSDP on a 2-D mesh
    (replicate, shard). Gradients are reduced in fp32 even when parameters are gathered in bf16.
    Under PP parameters stay gathered between micro-batches (each is reused by many). An embedding
    tied to the output layer (GPT, one stage) stays in the root's group: one parameter in one group."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
    reshard = not pipelined
    for layer in decoder_layers(model).values():
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    output = {id(q) for path in model.LAST_STAGE_MODULES if (m := stage_module(model, path)) is not None
              for q in m.parameters()}
    for path in model.FIRST_STAGE_MODULES:
        module = stage_module(model, path)
        if module is not None and not any(id(q) in output for q in module.parameters()):
            fully_shard(module, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    # the root keeps norm + lm_head; not resharded after forward since backward needs them first
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)


def parallelize(model: nn.Module, spec: RunSpec, mesh: DeviceMesh, param_dtype: torch.dtype | None):
    """Steps 2-6 on one model (or one pipeline stage) in place, built with its kernels and float8
    GEMMs already (model/options.py). Returns the stage's activation offloader (None without
    train.offload_layers): the engine reads how much it moved."""
    p, tr = spec.parallel, spec.train
    if p.tp > 1:
        apply_tp(model, mesh["tp"], p.sp)
    if p.ep > 1:  # 2b. expert parallel (parallel/expert_parallel.py)
        apply_ep(model, mesh, p)
    modes = layer_memory_modes(len(decoder_layers(model)), tr.recompute, tr.recompute_layers, tr.recompute_others,
                               tr.offload_layers)
    offloader = None
    if "offload" in modes:
        cuda = mesh.device_type == "cuda"
        offloader = ActivationOffloader(torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu"))
    wrap_layers(model, modes, offloader, "inductor" if tr.compile else None)
    if not runs_without_fsdp(model, mesh, param_dtype, spec.hardware.mixed_precision == "autocast"):
        if p.ep > 1:  # the experts' own FSDP2 group first: the layers' then leaves their weights to it
            shard_experts(model, mesh, p, param_dtype, reshard=p.pp == 1)
        apply_fsdp(model, fsdp_mesh(mesh, p), param_dtype, pipelined=p.pp > 1)
    return offloader


def runs_without_fsdp(model: nn.Module, mesh: DeviceMesh, param_dtype: torch.dtype | None,
                      autocast: bool = False) -> bool:
    """One process with ``autocast`` (hardware.mixed_precision=autocast: full training, fp32 parameters,
    the engine's forward under torch.autocast; FSDP2's gathers, casts and gradient copies per
    micro-batch are gone, the bf16 weight copies autocast saves for the backward are held instead),
    or one process whose frozen parameters are stored in the compute dtype (LoRA with a bf16 base):
    FSDP2 would shard nothing, only copy every layer's weights into its gather buffer and out again
    before each forward and backward (4,400 copies per step of the 7B LoRA on one H200, 2.5% of it)
    and run its hooks. The adapters then cast themselves to the compute dtype (LoRALinear.forward).
    Float8-stored frozen projections (hardware.frozen_dtype=fp8) qualify too: their matmul takes the
    float8 weight as stored."""
    if mesh.size() != 1:
        return False
    if autocast:
        return True
    if param_dtype is None:
        return False
    params = list(model.named_parameters())
    trains = [name for name, q in params if q.requires_grad]
    return bool(trains) and all(is_adapter_param(name) for name in trains) \
        and all(q.dtype in (param_dtype, FLOAT8_STORAGE) for _, q in params if not q.requires_grad)
