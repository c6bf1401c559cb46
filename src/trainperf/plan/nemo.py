"""A layout as NeMo writes it, and Megatron's rules for one.

``nemo_config``: NeMo's own model and trainer variables (tensor_model_parallel_size, ...), paste-ready
as YAML; ``submission_exports``: the variables of an MLPerf submission's config_*.sh that ``trainperf
import`` reads back (mlperf.published.LAYOUT_VARIABLES). ``megatron_violations``: what in a layout
Megatron-LM (and NeMo over it) refuses or silently changes, one line each -- the search
(plan.search.megatron_layouts) only proposes layouts with none.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainperf.core.spec import RunSpec


@dataclass(frozen=True)
class MegatronLayout:
    """A layout in Megatron's terms: degrees, the data-parallel size, batch sizes and the model's shape."""

    tp: int
    cp: int
    pp: int
    vp: int  # virtual pipeline stages per rank (1: not interleaved)
    dp: int
    sp: bool
    mbs: int
    gbs: int | None  # None: not chosen yet (a named layout without gbs=)
    layers: int
    heads: int
    kv_heads: int
    seq_len: int
    lora: bool = False
    dp_replicate: int = 1
    recompute: str = "none"
    fp8: bool = False

    @classmethod
    def of(cls, spec: RunSpec) -> "MegatronLayout":
        p, m, t = spec.parallel, spec.model, spec.train
        vp = (p.pp_stages_per_rank or (2 if p.pp_schedule == "Interleaved1F1B" else 1)) if p.pp > 1 else 1
        return cls(p.tp, p.cp, p.pp, vp, p.dp_replicate * p.dp_shard, bool(p.sp), t.micro_batch_size,
                   t.global_batch_size, m.num_layers, m.num_heads, m.num_kv_heads, spec.data.seq_len,
                   spec.lora.enabled, p.dp_replicate, t.recompute, spec.hardware.fp8 != "none")

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp


def megatron_violations(lay: MegatronLayout) -> list[str]:
    """Each rule of Megatron's (and NeMo's) the layout breaks, as a line saying what would be valid;
    [] when it runs as written."""
    out = []
    if lay.sp and lay.tp == 1:
        out.append("sequence_parallel needs tensor_model_parallel_size > 1 (Megatron turns it off at TP1)")
    if lay.heads % lay.tp:
        out.append(f"num_attention_heads {lay.heads} must divide by tensor_model_parallel_size {lay.tp}")
    if lay.kv_heads % lay.tp and lay.tp % lay.kv_heads:
        out.append(f"num_query_groups {lay.kv_heads} and tensor_model_parallel_size {lay.tp}: one must divide the "
                   "other")
    if lay.vp > 1 and lay.pp == 1:
        out.append("virtual_pipeline_model_parallel_size needs pipeline_model_parallel_size > 1")
    stages = lay.pp * lay.vp
    # NeMo counts the embedding and the loss as a layer each when the layers alone do not split evenly
    if lay.layers < stages or all((lay.layers + extra) % stages for extra in (0, 2)):
        out.append(f"num_layers {lay.layers} (or {lay.layers} + 2 with the embedding and loss in the pipeline "
                   f"split) must divide by pipeline_model_parallel_size x virtual_pipeline_model_parallel_size = "
                   f"{stages}")
    chunk = 2 * lay.cp * (lay.tp if lay.sp else 1)
    if lay.seq_len % chunk:
        out.append(f"the sequence ({lay.seq_len}) must split into 2 x context_parallel_size"
                   + (" x tensor_model_parallel_size (sequence_parallel)" if lay.sp else "") + f" = {chunk} chunks")
    if lay.dp_replicate != 1:
        out.append("data parallelism is the distributed optimizer's: no replicate x shard split (dp_replicate 1)")
    if lay.lora and lay.mbs > 1:
        out.append("NeMo fine-tunes (LoRA) on packed sequences at micro_batch_size 1")
    if lay.gbs is not None:
        if lay.gbs % (lay.mbs * lay.dp):
            out.append(f"global_batch_size {lay.gbs} must divide by micro_batch_size x data-parallel size = "
                       f"{lay.mbs * lay.dp}")
        else:
            micro = lay.gbs // (lay.mbs * lay.dp)
            if lay.pp > 1 and micro < lay.pp:
                out.append(f"{micro} micro-batches per step: a pipeline of {lay.pp} stages needs at least {lay.pp}")
            elif lay.pp > 1 and lay.vp > 1 and micro % lay.pp:
                out.append(f"{micro} micro-batches per step: the interleaved schedule needs a multiple of "
                           f"pipeline_model_parallel_size {lay.pp}")
    return out


def nemo_config(lay: MegatronLayout, gpus_per_node: int) -> dict:
    """NeMo's trainer and model variables for the layout (megatron_gpt_config.yaml's names)."""
    model = {"tensor_model_parallel_size": lay.tp, "pipeline_model_parallel_size": lay.pp,
             "virtual_pipeline_model_parallel_size": lay.vp if lay.vp > 1 else None,
             "context_parallel_size": lay.cp, "sequence_parallel": lay.sp,
             "micro_batch_size": lay.mbs, "global_batch_size": lay.gbs}
    if lay.recompute == "full":  # every layer's activations recomputed (NeMo's default: none)
        model |= {"activations_checkpoint_granularity": "full", "activations_checkpoint_method": "uniform",
                  "activations_checkpoint_num_layers": 1}
    return {"trainer": {"num_nodes": max(1, lay.gpus // gpus_per_node), "devices": min(lay.gpus, gpus_per_node)},
            "model": model | {"fp8": lay.fp8, "optim": {"name": "distributed_fused_adam"}}}


def submission_exports(lay: MegatronLayout, gpus_per_node: int) -> dict[str, str]:
    """The config_*.sh variables of an MLPerf submission for the layout, as NeMo's scripts spell them (its
    LoRA scripts TP / PP / CP / MBS, its pretraining scripts the long names); MINIBS is the batch per
    data-parallel rank."""
    short = lay.lora
    out = {"DGXNNODES": str(max(1, lay.gpus // gpus_per_node)), "DGXNGPU": str(min(lay.gpus, gpus_per_node)),
           "TP" if short else "TENSOR_MODEL_PARALLEL": str(lay.tp),
           "PP" if short else "PIPELINE_MODEL_PARALLEL": str(lay.pp),
           "CP" if short else "CONTEXT_PARALLEL": str(lay.cp), "SP": "1" if lay.sp else "0",
           "MBS" if short else "MICRO_BATCH_SIZE": str(lay.mbs)}
    if lay.vp > 1:
        out["INTERLEAVED_PIPELINE"] = str(lay.vp)
    if lay.gbs is not None:
        out["MINIBS"] = str(lay.gbs // lay.dp)
    out["FP8"] = "True" if lay.fp8 else "False"
    return out


def nemo_lines(spec: RunSpec, gpus_per_node: int) -> list[str]:
    """The paste-ready block: NeMo's variables as YAML, then the submission config's exports."""
    import yaml  # (NeMo's configs are YAML)

    lay = MegatronLayout.of(spec)
    text = yaml.safe_dump(nemo_config(lay, gpus_per_node), sort_keys=False, default_flow_style=False)
    return text.rstrip("\n").splitlines() + [f"export {k}={v}" for k, v in submission_exports(lay, gpus_per_node).items()]
