"""A run's results in one list (core.results.RunSummary) and the store, `run --json` and `report` lists
derived from it; per-GPU throughput; the eval-skip rule where FLOOR and round() disagree."""

from __future__ import annotations

import dataclasses
import json

import pytest

from trainperf.core.results import (
    REPORT_COLUMNS,
    RESULT_COLUMNS,
    RUN_JSON_KEYS,
    RunSummary,
    per_gpu,
    steady_throughput,
)
from trainperf.core.spec import eval_interval_samples, eval_skip_count
from trainperf.mlperf import recipes as mlperf
from trainperf.report.columns import STORED_FIELDS as COLUMNS
from trainperf.report.table import rows_for_json
from trainperf.store.db import RUN_RESULT_FIELDS, Store

# summary.json's keys, in order, as every run has written them
SUMMARY_JSON_KEYS = (
    "run_id", "workload", "status", "status_reason", "time_to_train_s", "samples_to_target", "final_eval_loss",
    "target", "evals", "steps", "step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "model_flops_per_token",
    "model_tflops_per_gpu", "mfu", "peak_flops", "peak_mem_gib", "peak_mem_kind", "peak_reserved_gib", "optimizer",
    "optimizer_state_gib", "cuda_alloc_retries", "cuda_alloc_conf", "pinned_host_gib", "checkpoint_load_s",
    "checkpoint_load_gib", "activation_offload_gib_per_step", "activation_offload_kept_gib_per_step", "layout",
    "placement", "world_size", "hardware", "division", "comparable", "mllog", "adapter", "model_dir", "out_dir",
    "seed", "predicted",
)


def a_summary(**changes) -> RunSummary:
    values = {f.name: None for f in dataclasses.fields(RunSummary)}
    values.update(run_id="r1", workload="mini-pretrain", status="success", time_to_train_s=12.5, samples_to_target=96,
                  final_eval_loss=3.1, target=3.2, evals=[{"samples_count": 96, "step": 12, "eval_loss": 3.1,
                                                          "elapsed_s": 12.0}],
                  steps=12, step_time_s=0.5, tokens_per_s=4096.0, tokens_per_s_per_gpu=2048.0,
                  model_tflops_per_gpu=0.01, peak_mem_gib=1.5, layout="dp_shard=2", world_size=2, division="open",
                  comparable=False, mllog="/runs/r1/mllog.txt", out_dir="/runs/r1", predicted={"step_time_s": 0.4})
    values.update(changes)
    return RunSummary(**values)


def test_summary_json_keeps_its_keys_and_order():
    assert tuple(a_summary().as_dict()) == SUMMARY_JSON_KEYS


def test_run_json_prints_the_summary_keys_it_always_printed():
    printed = {"run_id", "workload", "status", "status_reason", "time_to_train_s", "samples_to_target",
               "final_eval_loss", "target", "step_time_s", "tokens_per_s", "tokens_per_s_per_gpu",
               "model_tflops_per_gpu", "mfu", "peak_mem_gib", "peak_reserved_gib", "optimizer", "optimizer_state_gib",
               "cuda_alloc_retries", "cuda_alloc_conf", "activation_offload_gib_per_step", "pinned_host_gib", "layout",
               "placement", "world_size", "mllog", "out_dir", "adapter", "seed", "predicted", "evals"}
    assert set(RUN_JSON_KEYS) == printed
    assert len(RUN_JSON_KEYS) == len(printed)


def test_store_and_report_columns_come_from_the_summary():
    assert set(RESULT_COLUMNS) == {"status", "status_reason", "time_to_train_s", "samples_to_target",
                                   "final_eval_loss", "steps", "step_time_s", "tokens_per_s", "tokens_per_s_per_gpu",
                                   "model_tflops_per_gpu", "mfu", "peak_mem_gib", "mllog_path"}
    assert set(RUN_RESULT_FIELDS) == set(RESULT_COLUMNS) | {"finished_at", "summary_path"}
    assert set(REPORT_COLUMNS) <= set(COLUMNS)
    assert set(COLUMNS) == {"run_id", "workload", "status", "layout", "world_size", "time_to_train_s",
                            "samples_to_target", "final_eval_loss", "target", "tokens_per_s", "tokens_per_s_per_gpu",
                            "mfu", "peak_mem_gib", "division", "comparable", "status_reason", "mllog_path",
                            "step_time_s", "predicted_step_time_s", "predicted_peak_gib"}
    assert len(COLUMNS) == len(set(COLUMNS))


def test_a_finished_summary_lands_in_the_store_and_the_report(tmp_path):
    summary = a_summary()
    store = Store(tmp_path / "t.db")
    store.create_run("r1", "mini-pretrain", {}, "dp_shard=2", 2, "open", False, 3.2, "/runs/r1")
    store.finish_run("r1", **summary.result_columns(), summary_path="/runs/r1/summary.json")
    row = store.get_run("r1")
    store.close()
    for f in dataclasses.fields(RunSummary):
        column = f.metadata["column"]
        if column is not None:
            assert row[column] == getattr(summary, f.name), f.name
    shown = rows_for_json([row])[0]
    assert shown["mllog_path"] == "/runs/r1/mllog.txt"
    assert shown["tokens_per_s_per_gpu"] == 2048.0
    assert shown["comparable"] is False
    json.dumps(summary.as_dict())  # summary.json is plain JSON


def test_per_gpu_throughput_divides_by_the_world():
    assert per_gpu(4096.0, 2) == 2048.0
    assert per_gpu(4096.0, 1) == 4096.0
    assert per_gpu(1000.0, 8) == 125.0


def test_steady_throughput_is_the_median_past_the_first_step_per_rank():
    step_time, tps, tps_gpu = steady_throughput([9.0, 1.0, 4.0, 2.0], tokens_per_step=1000, world=4)
    assert step_time == 2.0  # the first step (compilation, warm-up) is left out
    assert tps == 500.0
    assert tps_gpu == 125.0
    assert steady_throughput([2.0], tokens_per_step=1000, world=2) == (2.0, 500.0, 250.0)


@pytest.mark.parametrize("gbs,skip,first_eval", [(12, 3, 1536), (28, 5, 2352)])
def test_eval_skip_rounds_down_where_round_would_round_up(gbs, skip, first_eval):
    """FLOOR(0.125 * GBS + 2): 3.5 and 5.5 are where round() (to even: 4 and 6) and FLOOR differ."""
    spec = mlperf.llama2_70b_lora_defaults()
    spec.train.global_batch_size = gbs
    assert eval_skip_count(spec) == skip
    assert (skip + 1) * eval_interval_samples(spec) == first_eval
