"""A plan as data: each ranked layout's fields, its time to train by term and one run's p10-p90 band,
the named layout, the hint when nothing fits, and the whole ranking as ``plan --json`` prints it."""

from __future__ import annotations

from trainperf.plan.costs import eight_bit_optimizer_hint
from trainperf.plan.nemo import MegatronLayout, nemo_config, submission_exports
from trainperf.plan.request import PlanRequest, Ranking
from trainperf.plan.search import explain, rcp_samples, samples_band, time_to_train, time_to_train_terms


def hint(ranking: Ranking) -> str:
    """When nothing fits: what an 8-bit optimizer would save ("" if it would not help)."""
    if not ranking.oom or ranking.fits:
        return ""
    return eight_bit_optimizer_hint(ranking.oom[0].spec, ranking.gpu, ranking.per_node, ranking.usable_gib)


def plan_json(req: PlanRequest, ranking: Ranking) -> dict:
    """The ranking as ``plan --json`` prints it."""
    fits = ranking.fits
    rows = [{"id": c.id, "set": c.set_line, "layout": layout_fields(c), "peak_gib": c.est.reserved_gib,
             "step_time_s": c.est.step_time_s,
             "tokens_per_s_per_gpu": c.est.tokens_per_s_per_gpu, "mfu": c.est.mfu,
             "memory_gib": c.est.reserved_gib, "time_to_train_s": c.time_to_train_s,
             "time_to_train_terms_s": ttt_terms(req, c), "time_to_train_p10_p90_s": ttt_band(req, c),
             "time": c.est.time, "memory": {k: v / 2**30 for k, v in c.est.memory.items()},
             "host_offload_gib": c.est.host_offload_bytes / 2**30,
             "comm_gib": {k: v / 2**30 for k, v in c.est.comm.items()}}
            | (engine_config(c, ranking.per_node) if ranking.kind.config == "nemo" else {}) for c in fits[:req.top]]
    return {"gpu": ranking.gpu.name, "engine": req.engine, "measured": ranking.measured_note, "gpus": req.gpus,
                      "gpus_per_node": ranking.per_node, "ranked": rows,
                      "memory_headroom": ranking.headroom, "usable_gib": ranking.usable_gib, "fitting": len(fits),
                      "not_fitting": len(ranking.oom), "over_headroom": ranking.over_headroom,
                      "hint": hint(ranking) or None, "stored_at_scale": ranking.stored,
                      "named_layout": named_json(ranking.named),
                      "explain": [explain(fits[0], c) for c in fits[1:req.top]] if req.explain and fits else []}


def samples_for(req, c) -> float | None:
    """The samples to converge a ranked layout's time to train counts: --samples, else its GBS's RCP mean."""
    return (float(req.samples) if req.samples else rcp_samples(c.spec)) if c.time_to_train_s else None


def ttt_terms(req, c) -> dict | None:
    """A layout's time to train by term (steps / evals / setup, seconds)."""
    n = samples_for(req, c)
    return time_to_train_terms(c.spec, c.est, n) if n else None


def ttt_band(req, c) -> list[float] | None:
    """One run's time to train at the 10th and 90th percentile of the RCP's samples to converge (None with
    --samples or without an RCP)."""
    n = None if req.samples else samples_for(req, c)
    band = samples_band(c.spec, n) if n else None
    return [time_to_train(c.spec, c.est, b) for b in band] if band else None


def named_json(named) -> dict | None:
    if named is None:
        return None
    c = named.candidate
    return {"set": c.set_line, "layout": layout_fields(c), "step_time_s": c.est.step_time_s,
            "tokens_per_s_per_gpu": c.est.tokens_per_s_per_gpu, "memory_gib": c.est.reserved_gib,
            "time_to_train_s": c.time_to_train_s, "fits": named.fits, "rank": named.rank, "ranked": named.ranked,
            "searched": named.searched,
            "over_best": named.over_best, "time": c.est.time}


def layout_fields(c) -> dict:
    """One ranked layout as structured fields (what --json consumers read instead of the --set line)."""
    sp, p, tr, hw = c.spec, c.spec.parallel, c.spec.train, c.spec.hardware
    return {"tp": p.tp, "sp": p.sp, "cp": p.cp, "pp": p.pp, "pp_schedule": p.pp_schedule if p.pp > 1 else None,
            "virtual_stages": p.pp_stages_per_rank or (2 if p.pp_schedule == "Interleaved1F1B" else 1) if p.pp > 1 else 1,
            "dp_replicate": p.dp_replicate, "dp_shard": p.dp_shard, "dp": p.dp_replicate * p.dp_shard,
            "global_batch_size": tr.global_batch_size, "micro_batch_size": tr.micro_batch_size,
            "recompute": tr.recompute, "recompute_layers": tr.recompute_layers, "offload_layers": tr.offload_layers,
            "fp8": hw.fp8, "compile": tr.compile, "frozen_dtype": hw.frozen_dtype, "attention": hw.attention,
            "grad_sync": tr.grad_sync, "seq_len": sp.data.seq_len}


def engine_config(c, gpus_per_node: int) -> dict:
    """A ranked layout in NeMo's variables and the submission config's (a Megatron engine's rows only)."""
    lay = MegatronLayout.of(c.spec)
    return {"nemo": nemo_config(lay, gpus_per_node), "submission_exports": submission_exports(lay, gpus_per_node)}
