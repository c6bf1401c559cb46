"""The morning report: scaling arithmetic, olympic scores, one self-contained HTML page."""

from __future__ import annotations

import re
import subprocess

import pytest

from conftest import trainperf_cmd
from trainperf.report.html import olympic_scores, render, scaling_rows
from trainperf.store.db import Store


def fill(store: Store, tmp_path) -> None:
    """Runs of two workloads; the five of "v" carry real MLPerf logs (closed llama2_70b_lora, times in
    seconds), which is what the score is computed from."""
    from test_score import write_log

    rows = [("a", "w", 1, 100.0), ("b", "w", 2, 60.0), ("c", "w", 4, 40.0), ("d", "w", 4, 30.0), ("e", "w", 8, None)]
    rows += [(f"s{i}", "v", 2, t) for i, t in enumerate([50.0, 10.0, 20.0, 30.0, 40.0])]
    for i, (run_id, w, n, ttt) in enumerate(rows):
        spec = {"parallel": {"dp_replicate": 1, "dp_shard": n, "tp": 1, "pp": 1, "cp": 1, "sp": False},
                "train": {"global_batch_size": 16, "micro_batch_size": 2}}
        store.create_run(run_id, w, spec, f"dp_shard={n}", n, "open", False, 0.9, str(tmp_path))
        mllog = str(write_log(tmp_path / "logs" / f"{run_id}.txt", ttt / 60, seed=i)) if w == "v" else None
        store.finish_run(run_id, status="success" if ttt else "failed", time_to_train_s=ttt, step_time_s=0.5,
                         tokens_per_s_per_gpu=1000.0 / n, mfu=0.4, mllog_path=mllog, step_rows=[
                             {"step": k, "samples": 16 * k, "loss": 3.0 / k} for k in range(1, 5)])


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


def test_html_report_is_self_contained(tmp_path):
    store = Store(tmp_path / "t.db")
    fill(store, tmp_path)
    runs = store.list_runs()
    page = render(runs, {r["run_id"]: store.steps(r["run_id"]) for r in runs})
    assert page.startswith("<!doctype html>") and page.count("<table>") >= 4
    images = re.findall(r"<img [^>]*src='([^']+)'", page)
    assert len(images) == 2 and all(src.startswith("data:image/png;base64,") for src in images)
    assert "http://" not in page.replace("https://", "") and "<script" not in page
    assert "Eos_n128" in page  # the published results travel with it
    out = subprocess.run(trainperf_cmd("report", "--db", str(tmp_path / "t.db"), "--html", str(tmp_path / "r.html")),
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and (tmp_path / "r.html").stat().st_size > 10_000


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


def test_projected_time_to_train_from_throughput_runs(tmp_path):
    """Throughput runs (failed by design: random weights) of llama2_70b_lora projected with the RCP's
    samples to converge at their GBS plus the recipe's evals -- measured eval pass where the run made
    one, planned otherwise; labelled a projection in the page."""
    import json
    import math

    from trainperf.report.projection import projected_scaling_rows
    from trainperf.mlperf.score import rcp_reference_samples
    from trainperf.core.resolve import resolve_spec
    from trainperf.workloads import get_workload

    store = Store(tmp_path / "t.db")
    mllog = tmp_path / "mllog.txt"
    lines = [{"key": "eval_samples", "value": 173, "time_ms": 0, "metadata": {}},
             {"key": "eval_start", "value": None, "time_ms": 1_000, "metadata": {"samples_count": 24}},
             {"key": "eval_stop", "value": None, "time_ms": 101_000, "metadata": {"samples_count": 24}}]
    mllog.write_text("".join(f":::MLLOG {json.dumps(e)}\n" for e in lines))
    for run_id, gpus, step, log in (("two", 2, 24.55, str(mllog)), ("eight", 8, 7.0, None), ("eight-slow", 8, 9.0, None)):
        spec = resolve_spec(get_workload("llama2_70b_lora").defaults(), None,
                            ["mlperf.division=open", f"parallel.dp_shard={gpus}", "eval.every_samples=1000000000"])
        store.create_run(run_id, "llama2_70b_lora", spec.to_dict(), f"dp_shard={gpus}", gpus, "open", False, 0.925,
                         str(tmp_path))
        store.update_run_info(run_id, hardware_json=json.dumps({"device": "cuda", "gpu": "NVIDIA H200", "gpus": gpus}))
        store.finish_run(run_id, status="failed", step_time_s=step, mllog_path=log, mfu=0.4)
    # not projected: a shrunken model of the benchmark, and a mini workload that borrows its log name
    shrunk = resolve_spec(get_workload("llama2_70b_lora").defaults(), None, ["mlperf.division=open", "model.num_layers=2"])
    store.create_run("shrunk", "llama2_70b_lora", shrunk.to_dict(), "x", 4, "open", False, 0.925, str(tmp_path))
    store.finish_run("shrunk", status="failed", step_time_s=0.01)
    from trainperf.workloads.mini import mini_lora_defaults

    mini = mini_lora_defaults()
    assert mini.mlperf.benchmark == "llama2_70b_lora"
    store.create_run("mini", "mini-lora", mini.to_dict(), "x", 4, "open", False, 0.9, str(tmp_path))
    store.finish_run("mini", status="success", step_time_s=0.01, time_to_train_s=5.0)
    rows = {r["gpus"]: r for r in projected_scaling_rows(store.list_runs())}
    assert set(rows) == {2, 8} and rows[8]["run_id"] == "eight"  # the faster of the two 8-GPU runs
    samples, _ = rcp_reference_samples("llama2_70b_lora", 8)
    evals = math.ceil(samples / 384) - 3  # every 384 samples after FLOOR(0.125 x 8 + 2) = 3 skipped
    two = rows[2]
    assert two["eval_source"] == "measured" and two["eval_s"] == pytest.approx(evals * 100.0)
    assert two["projected_s"] == pytest.approx(samples / 8 * 24.55 + evals * 100.0)
    assert rows[8]["eval_source"] == "planned" and rows[8]["eval_s"] > 0
    assert rows[8]["speedup"] == pytest.approx(two["projected_s"] / rows[8]["projected_s"])
    assert rows[8]["efficiency"] == pytest.approx(rows[8]["speedup"] / 4)
    page = render(store.list_runs(), {})
    assert "Projected time to train" in page and "not a time to train" in page
    cli = subprocess.run(trainperf_cmd("report", "--db", str(tmp_path / "t.db")), capture_output=True, text=True,
                         timeout=120, env={**__import__("os").environ, "COLUMNS": "250"})
    assert cli.returncode == 0 and "projected time to train" in cli.stdout, cli.stderr[-2000:]


@pytest.mark.skipif(__import__("shutil").which("chromium") is None, reason="no headless chromium on this machine")
def test_html_report_renders_in_a_headless_browser(tmp_path):
    """The page a user opens: headless Chromium renders it (plots are embedded PNGs) to a screenshot
    that is not blank; its DOM has the tables and every image decoded (naturalWidth > 0)."""
    import matplotlib.image as mpimg

    store = Store(tmp_path / "t.db")
    fill(store, tmp_path)
    runs = store.list_runs()
    page = tmp_path / "report.html"
    page.write_text(render(runs, {r["run_id"]: store.steps(r["run_id"]) for r in runs}))
    shot = tmp_path / "shot.png"
    base = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,2400"]
    subprocess.run([*base, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    img = mpimg.imread(shot)
    assert img.shape[0] >= 2000 and img.std() > 0.05  # drawn, not a blank page
    probe = tmp_path / "probe.html"  # the report in an iframe, with a script that reports what rendered
    probe.write_text(page.read_text().replace("</body>", "<script>document.title = 'imgs:' + "
                     "[...document.images].filter(i => i.complete && i.naturalWidth > 0).length + '/' + "
                     "document.images.length + ' tables:' + document.querySelectorAll('table').length;</script></body>"))
    dom = subprocess.run([*base, "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120).stdout
    title = re.search(r"<title>([^<]*)</title>", dom).group(1)
    n_ok, n_all = map(int, re.search(r"imgs:(\d+)/(\d+)", title).groups())
    assert n_all >= 2 and n_ok == n_all, title
    assert int(re.search(r"tables:(\d+)", title).group(1)) >= 4
