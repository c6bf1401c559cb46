"""The morning report: scaling arithmetic, olympic scores, one self-contained HTML page."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.fixtures.cli import trainperf_cmd
from trainperf.report.html import render
from trainperf.store.db import Store

from tests.fixtures.report import fill, fill_operator_store


def test_html_report_is_self_contained(tmp_path):
    store = Store(tmp_path / "t.db")
    fill(store, tmp_path)
    runs = store.list_runs()
    page = render(runs, {r["run_id"]: store.evals(r["run_id"]) for r in runs})
    assert page.startswith("<!doctype html>") and page.count("<table>") >= 4
    images = re.findall(r"<img [^>]*src='([^']+)'", page)
    assert len(images) == 2 and all(src.startswith("data:image/png;base64,") for src in images)
    assert "http://" not in page.replace("https://", "") and "<script" not in page
    assert "Eos_n128" not in page  # open-division runs only: no published results beside them
    out = subprocess.run(trainperf_cmd("report", "--db", str(tmp_path / "t.db"), "--html", str(tmp_path / "r.html")),
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and (tmp_path / "r.html").stat().st_size > 10_000


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

    from tests.fixtures.score import write_log
    from tests.unit.test_report_engines import imported_row

    store = Store(tmp_path / "t.db")
    fill_operator_store(store, tmp_path)  # several workloads, layouts, GPU counts, and trials left out
    # beside them imported runs, one named with matplotlib mathtext and terminal escapes
    store.import_runs([imported_row(i) | {"mllog_path": str(write_log(tmp_path / "nemo" / f"r{i}.txt", 24.0 + i, seed=i))}
                       for i in range(10)] + [imported_row(0, gpus=64, gpu="NVIDIA H200 $\\undefinedcommand$ \x1b[2J",
                                                           system="Eos_n8") | {"run_id": "imp-\x1b]0;x\x07"}])
    runs = store.list_runs(trials=False)
    page = tmp_path / "report.html"
    page.write_text(render(runs, {r["run_id"]: store.evals(r["run_id"]) for r in runs}, trials_left_out=3))
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
    # every chart drawn and decoded: time to train and eval loss per workload, predicted vs measured
    assert n_all == page.read_text().count("<img ") >= 5 and n_ok == n_all, title
    assert "\x1b" not in page.read_text() and "$\\undefinedcommand$" in page.read_text()
    assert int(re.search(r"tables:(\d+)", title).group(1)) >= 4
