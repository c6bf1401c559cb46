"""The morning report: scaling arithmetic, olympic scores, one self-contained HTML page."""

from __future__ import annotations

import re

import pytest
from trainperf.report.html import olympic_scores, render, scaling_rows
from trainperf.store.db import Store

from tests.fixtures.report import fill


def test_scaling_speedup_and_efficiency(tmp_path):
    store = Store(tmp_path / "t.db")
    fill(store, tmp_path)
    rows = {(r["workload"], r["gpus"]): r for r in scaling_rows(store.list_runs())}
    assert set(rows) == {("w", 1), ("w", 2), ("w", 4), ("v", 2)}  # the failed 8-GPU run is not a time
    assert rows[("w", 4)]["time_to_train_s"] == 30.0 and rows[("w", 4)]["runs"] == 2  # fastest of the two
    assert rows[("w", 2)]["speedup"] == pytest.approx(100 / 60)
    assert rows[("w", 4)]["efficiency"] == pytest.approx((100 / 30) / 4)
    assert rows[("v", 2)]["speedup"] == 1.0
    assert (rows[("w", 4)]["dp"], rows[("w", 4)]["gbs"], rows[("w", 4)]["mbs"], rows[("w", 4)]["tp"]) == (4, 16, 2, 1)


def test_olympic_score_drops_fastest_and_slowest(tmp_path):
    store = Store(tmp_path / "t.db")
    fill(store, tmp_path)
    (score,) = olympic_scores(store.list_runs())
    assert score["workload"] == "v" and score["runs"] == 5
    assert score["score_min"] == pytest.approx((20 + 30 + 40) / 3 / 60, rel=1e-4)
    assert score["valid"] is False and "5 of 10 runs" in score["verdict"]  # llama2_70b_lora is scored on 10
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
    page = render(runs, {r["run_id"]: store.steps(r["run_id"]) for r in runs})
    assert "Step-time breakdown" in page and len(re.findall(r"<img ", page)) == 3
