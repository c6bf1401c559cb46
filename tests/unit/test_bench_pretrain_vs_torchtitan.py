"""bench/pretrain_vs_torchtitan.py's pieces that decide its table, on CPU: the shared token chain, the
loss-agreement verdict, the figures of a row, how a failed side shows, and the planner's prediction."""

from __future__ import annotations

import argparse
import math
from collections import Counter

from bench import pretrain_vs_torchtitan as pvt


def test_token_chain_is_seeded_bounded_and_learnable():
    a = pvt.token_batches(128256, 2048, 3)
    assert a == pvt.token_batches(128256, 2048, 3) and a != pvt.token_batches(128256, 2048, 3, seed=2)
    assert [len(r) for r in a] == [2048] * 3
    ids = {t for row in a for t in row}
    assert len(ids) <= pvt.ACTIVE_TOKENS and max(ids) < 128256 and max(ids) > 4096  # ids spread over the vocabulary
    # each token's most frequent successor takes ~80% of its transitions (fixed successor, else uniform)
    pairs = Counter((x, y) for row in a for x, y in zip(row, row[1:]))
    firsts = Counter(x for row in a for x in row[:-1])
    top = {}
    for (x, y), n in pairs.items():
        top[x] = max(top.get(x, 0), n)
    share = sum(top.values()) / sum(firsts.values())
    assert 0.75 < share < 0.9


def test_agreement_verdict():
    ref = [12.6, 11.0, 9.0]
    assert pvt.agreement([12.61, 11.02, 9.01], ref)["agree"]
    far = pvt.agreement([12.6, 11.5, 9.0], ref)
    assert not far["agree"] and math.isclose(far["max_abs"], 0.5) and math.isclose(far["fall"], 3.6)
    assert not pvt.agreement([12.6, float("nan"), 9.0], ref)["agree"]


def _args(**kw):
    base = dict(timed_from=2, seq=8192, shape="8b", layers=16)
    return argparse.Namespace(**{**base, **kw})


def test_figures_time_the_steps_after_the_first_ones_and_keep_errors():
    res = pvt.figures(dict(times=[30.0, 1.0, 0.5, 0.4, 0.6], losses=[1.0] * 5), _args(), 2.7e10)
    assert res["step_s"] == 0.5 and res["compile_step_s"] == 30.0
    assert math.isclose(res["tokens_per_s"], 8192 / 0.5) and math.isclose(res["mfu"], 2.7e10 * 16384 / 989e12)
    assert pvt.figures(dict(side="torchtitan", error="out of memory"), _args(), 1.0) == dict(
        side="torchtitan", error="out of memory")


def test_table_shows_a_failed_side_and_puts_the_ratio_on_trainperfs_row():
    tp = pvt.figures(dict(side="trainperf", precision="bf16", times=[9, 0.5, 0.5], losses=[12.0, 11.0],
                          peak_gib=80.0, prediction=dict(step_s=0.45, tokens_per_s=18000.0)), _args(), 2.7e10)
    tt = dict(side="torchtitan", precision="bf16", error="out of memory")
    table = pvt.markdown([tp, tt], _args(), {"bf16": {"ratio": 1.2, "agreement": pvt.agreement([12.0], [12.0])}})
    rows = [ln for ln in table.splitlines() if ln.startswith("| 8b")]
    assert "1.200x" in rows[0] and "0.450 (18,000)" in rows[0] and "16,384" in rows[0]
    assert "out of memory" in rows[1] and "x |" not in rows[1]


def test_planner_prices_the_trainperf_row():
    from trainperf.core.resolve import resolve_spec
    from trainperf.core.spec import DataSpec, LoRASpec, RunSpec, TrainSpec

    spec = pvt.model_spec("8b", 16, 8192)
    assert spec.intermediate_size == 14336 and spec.num_layers == 16
    run = resolve_spec(RunSpec(workload="bench", model=spec, lora=LoRASpec(rank=0), data=DataSpec(seq_len=8192),
                               train=TrainSpec(micro_batch_size=1, global_batch_size=1, compile=True)), None, [])
    run.parallel.dp_shard = 1
    bf16 = pvt.planner_prediction(run)
    fp8 = pvt.planner_prediction(resolve_spec(run, None, ["hardware.fp8=tensorwise"]))
    assert 0.3 < bf16["step_s"] < 0.7 and fp8["step_s"] < bf16["step_s"]
    assert math.isclose(bf16["tokens_per_s"], 8192 / bf16["step_s"], rel_tol=1e-6)
