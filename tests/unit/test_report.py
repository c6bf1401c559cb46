"""The morning report: scaling arithmetic, olympic scores, one self-contained HTML page."""

from __future__ import annotations

import re

import pytest
from trainperf.report.html import olympic_scores, render
from trainperf.report.scaling import full_layout, scaling_table
from trainperf.report.table import print_table
from trainperf.store.db import Store

from tests.fixtures.report import fill, fill_operator_store


def test_scaling_rows_are_one_layout_each_and_compare_against_the_smallest_comparable_row(tmp_path):
    store = Store(tmp_path / "t.db")
    fill_operator_store(store, tmp_path)
    rows = {(r.workload, r.gpus, r.layout): r for r in scaling_table(store.list_runs(trials=False))}
    assert set(rows) == {("llama2_70b_lora", 8, "DP8"), ("llama2_70b_lora", 16, "DP8·CP2"),
                         ("llama2_70b_lora", 16, "DP8·TP2·SP"), ("mini-pretrain", 1, "DP1"),
                         ("mini-pretrain", 2, "DP2"), ("mini-pretrain", 2, "DP1·TP2·SP"), ("mini-pretrain", 4, "DP4"),
                         ("synthetic-lora", 8, "DP8")}  # two layouts at 16 GPUs are two rows, not a pool
    eight = rows[("llama2_70b_lora", 8, "DP8")]
    assert eight.time_basis == "olympic mean of 5" and eight.time_to_train_s == pytest.approx((24.1 + 24.4 + 24.9) * 20)
    tp = rows[("llama2_70b_lora", 16, "DP8·TP2·SP")]
    assert tp.speedup == pytest.approx(eight.time_to_train_s / (13.4 * 60)) and tp.speedup_basis == "time to train"
    assert tp.efficiency == pytest.approx(tp.speedup / 2) and (tp.gbs, tp.mbs) == (8, 1)
    one = rows[("mini-pretrain", 1, "DP1")]
    assert one.time_basis == "mean of 2" and any("differ by 116%" in a for a in one.anomalies)  # the cold first run
    assert any(a.startswith("superlinear") for a in rows[("mini-pretrain", 2, "DP2")].anomalies)
    assert any("planner predicted" in a for a in rows[("mini-pretrain", 4, "DP4")].anomalies)
    probe = rows[("synthetic-lora", 8, "DP8")]
    assert probe.time_to_train_s is None and probe.speedup is None and probe.tokens_per_s_per_gpu > 0


def test_full_layout_names_every_degree():
    spec = {"parallel": {"dp_replicate": 1, "dp_shard": 2, "tp": 4, "cp": 2, "pp": 1, "sp": True}}
    assert full_layout(spec) == "DP2·TP4·CP2·SP"
    assert full_layout({"parallel": {"dp_replicate": 2, "dp_shard": 4, "tp": 1, "pp": 2}}) == "DP2x4·PP2"
    assert full_layout({"parallel": {"dp_replicate": 2, "dp_shard": 1, "pp": 2, "pp_schedule": "GPipe"}}) == "DP2·PP2(GPipe)"


def test_trials_stay_out_of_the_page_unless_asked_for(tmp_path):
    store = Store(tmp_path / "t.db")
    fill_operator_store(store, tmp_path)
    runs = store.list_runs(trials=False)
    assert not [r for r in runs if r["run_id"].startswith("trial")] and len(store.list_runs()) == len(runs) + 3
    page = render(runs, {r["run_id"]: store.evals(r["run_id"]) for r in runs}, trials_left_out=3)
    assert "trial-0" not in page and "3 tune trials left out" in page
    assert "/tmp" not in page and str(tmp_path) not in page  # no path of this machine in any caption
    for section in ("System", "llama2_70b_lora", "mini-pretrain", "Predicted vs measured", "MLPerf scores"):
        assert f"<h2>{section}" in page
    assert "NVIDIA H200" in page and "torch 2.13.0" in page
    assert "Eos_n128" in page  # closed llama2_70b_lora runs: the published results travel with them


def test_published_points_only_beside_comparable_runs_of_their_gpu_model():
    from trainperf.report.html import published_points_for

    run = {"comparable": 1, "spec_json": '{"mlperf": {"benchmark": "llama2_70b_lora"}}',
           "hardware_json": '{"gpu": "NVIDIA H200"}'}
    points, label = published_points_for([run])
    assert points and {p[3] for p in points} == {"H200"} and "H200" in label
    assert published_points_for([run | {"comparable": 0}]) == ([], "")  # a toy workload: no 70B points on its axes
    assert published_points_for([run | {"hardware_json": '{"gpu": null}'}])[0] == []


def test_terminal_table_drops_columns_to_fit_and_keeps_values_whole(tmp_path, monkeypatch):
    import io

    monkeypatch.setenv("COLUMNS", "120")  # not a terminal: the width a pipe or log file is given

    from rich.console import Console

    store = Store(tmp_path / "t.db")
    fill_operator_store(store, tmp_path)
    runs = store.list_runs(trials=False)
    out = io.StringIO()
    print_table(runs, Console(file=out, width=120))
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines() if line.startswith(("│", "┃"))) <= 120
    assert "DP8·TP2·SP" in text and "70b-16-tp2" in text and "8/1" in text and "…" not in text
    assert "columns left out to fit 120" in text and "--wide" in text
    wide = io.StringIO()
    print_table(runs, Console(file=wide, width=120), wide=True)
    assert "columns left out" not in wide.getvalue() and "open (not comparable)" in wide.getvalue()


def test_olympic_score_drops_fastest_and_slowest(tmp_path):
    store = Store(tmp_path / "t.db")
    fill(store, tmp_path)
    (score,) = olympic_scores(store.list_runs())
    assert score["workload"] == "v" and score["runs"] == 5
    assert score["olympic_min"] == pytest.approx((20 + 30 + 40) / 3 / 60, rel=1e-4)
    assert score["valid"] is False and "5 of 10 runs" in score["verdict"]  # llama2_70b_lora is scored on 10
    assert score["score_min"] is None  # an invalid set has no score
    assert score["rcp"] == "pass"  # 3456 samples per run: at the GBS 8 RCP mean


def test_trace_breakdown_of_traced_runs_is_plotted(tmp_path):
    """A run with RUN_DIR/trace_summary.json gets a compute / exposed comm / idle bar in the report."""
    import json

    from trainperf.report.html import trace_breakdowns

    store = Store(tmp_path / "t.db")
    fill(store, tmp_path)
    run_dir = tmp_path / "traced"
    run_dir.mkdir()
    (run_dir / "trace_summary.json").write_text(json.dumps({"totals": {
        "step_s": 0.1, "compute_s": 0.06, "comm_s": 0.03, "exposed_comm_s": 0.01, "idle_s": 0.03, "overlap_pct": 66.7}}))
    store.create_run("traced", "w", {"x": 1}, "dp_shard=2", 2, "open", False, 0.9, str(run_dir))
    store.finish_run("traced", status="failed", step_time_s=0.1)
    runs = store.list_runs()
    (t,) = trace_breakdowns(runs)
    assert t["compute_s"] + t["exposed_comm_s"] + t["idle_s"] == pytest.approx(t["step_s"])
    page = render(runs, {r["run_id"]: store.evals(r["run_id"]) for r in runs})
    assert "Step-time breakdown" in page and len(re.findall(r"<img ", page)) == 3  # time to train x2, breakdown


def test_system_section_names_the_node_count_each_run_recorded():
    import json as _json

    from trainperf.report.html import system_section

    hw = {"device": "cuda", "gpu": "NVIDIA H200", "gpus": 16, "nodes": 2}
    runs = [{"run_id": "a", "world_size": 16, "host": "n1", "hardware_json": _json.dumps(hw), "software_json": "{}"},
            {"run_id": "b", "world_size": 8, "host": "n1", "hardware_json": _json.dumps(hw | {"gpus": 8, "nodes": 1}),
             "software_json": "{}"},
            {"run_id": "c", "world_size": 4, "host": "n1", "hardware_json": _json.dumps(hw | {"nodes": None}),
             "software_json": "{}"}]
    page = system_section(runs, None)
    assert "4, 8 on 1 node, 16 on 2 nodes" in page  # an older row without a node count: the count alone
