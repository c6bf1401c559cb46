"""Imported runs of another engine (`trainperf import`) in the report beside this engine's runs: the
engine column, scaling rows and scores that never pool two engines, no projection of imported runs,
a published result shown once, and `score` sets of one engine. In-process; one test reads a published
submission (tests/fixtures/published)."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from tests.fixtures.published import one_h200_submission
from tests.fixtures.report import fill_operator_store
from trainperf.core.errors import SpecError
from trainperf.mlperf.published import LLAMA2_70B_LORA, read_submissions, run_spec
from trainperf.mlperf.score import check_one_engine, gather, gather_runs, one_engine
from trainperf.report.html import olympic_scores, plotted_imported_rows, published_points_for, render, split_imported
from trainperf.report.plots import time_to_train_png
from trainperf.report.projection import project
from trainperf.report.scaling import scaling_table
from trainperf.report.table import print_table, rows_for_json
from trainperf.store.db import Store

NEMO_LAYOUT = {"tp": 1, "pp": 1, "cp": 1, "sp": False, "dp": 8, "vp": 1, "mbs": 1, "fp8": True, "fp8_attention": False}


def imported_row(i: int, gpus: int = 8, gpu: str = "NVIDIA H200-SXM5-141GB", minutes: float = 24.0,
                 org: str = "NVIDIA", rnd: str = "v4.1", system: str = "DGX H200") -> dict:
    """One llama2_70b_lora run of NeMo as `trainperf import` stores it: the recipe with NVIDIA's layout
    (here DP8 at 8 GPUs: the very layout of this engine's 8-GPU runs), GBS 8, FP8."""
    spec = run_spec("llama2_70b_lora", 8, None, NEMO_LAYOUT | {"dp": gpus})
    return {"run_id": f"imp-{gpus}-{i}", "created_at": 1.7e9 + i, "finished_at": 1.7e9 + i + minutes * 60,
            "workload": "llama2_70b_lora", "status": "success", "division": "closed", "comparable": 0,
            "spec_json": json.dumps(spec.to_dict(), sort_keys=True), "layout": f"DP{gpus} MBS 1", "world_size": gpus,
            "hardware_json": json.dumps({"device": "cuda", "gpu": gpu, "gpus": gpus, "nodes": gpus // 8,
                                         "gpus_per_node": 8, "system": system, "network": "", "interconnect": "NVLink"}),
            "software_json": json.dumps({"framework": "NeMo", "org": org, "round": rnd, "precision": "fp8"}),
            "time_to_train_s": (minutes + 0.1 * i) * 60, "samples_to_target": 3072, "step_time_s": 3.2,
            "tokens_per_s": 8 * 8192 / 3.2, "tokens_per_s_per_gpu": 8 * 8192 / 3.2 / gpus, "model_tflops_per_gpu": 780.0,
            "mfu": 0.79, "engine": "nemo"}


@pytest.fixture
def mixed_store(tmp_path):
    """This engine's operator store plus NeMo's 8 x H200 submission (ten runs, the published v4.1 NVIDIA
    8 x H200 result) and three runs of a 64 x H100 one."""
    store = Store(tmp_path / "t.db")
    fill_operator_store(store, tmp_path)
    from tests.fixtures.score import write_log

    rows = [imported_row(i) | {"mllog_path": str(write_log(tmp_path / "nemo" / f"result_{i}.txt", 24.0 + 0.1 * i,
                                                            seed=i))} for i in range(10)]
    rows += [imported_row(i, gpus=64, gpu="NVIDIA H100-SXM5-80GB", minutes=4.6, system="Eos_n8") for i in range(3)]
    assert len(store.import_runs(rows)) == 13
    yield store
    store.close()


def _table_text(runs: list[dict], monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "120")
    buf = io.StringIO()
    print_table(runs, console=Console(file=buf, force_terminal=False))
    return buf.getvalue()


def test_engine_column_and_json_rows_name_the_engine(mixed_store, monkeypatch):
    runs = mixed_store.list_runs(limit=1000, trials=False)
    text = _table_text(runs, monkeypatch)
    lora = text.split("llama2_70b_lora:", 1)[1].split("└", 1)[0]  # the table of both engines' runs
    header = next(line for line in lora.splitlines() if "run" in line and "status" in line)
    table_lines = [line for line in text.splitlines() if line[:1] in "┏┃┡│└"]
    assert "engine" in header and max(len(line) for line in table_lines) <= 120
    assert "imp-8-0" in text and " nemo " in text and " trainperf " in text
    ours = [r for r in runs if not r.get("engine")]
    assert "engine" not in _table_text(ours, monkeypatch)  # no imported run listed: no engine column
    by_id = {r["run_id"]: r for r in rows_for_json(runs)}
    assert by_id["imp-8-0"]["engine"] == "nemo" and by_id["70b-8-0"]["engine"] == "trainperf"
    # throughput and MFU come from the imported row itself
    assert by_id["imp-8-0"]["mfu"] == pytest.approx(0.79) and by_id["imp-8-0"]["tokens_per_s_per_gpu"] > 0
    wide = io.StringIO()
    print_table([r for r in runs if r["run_id"] == "imp-8-0"], console=Console(file=wide), wide=True)
    # an fp8 run's MFU against the bf16 peak, and against H200's fp8 peak (989 / 1979 of it) beside it
    assert "79.0% (39.5%)" in wide.getvalue() and "2,560" in wide.getvalue()
    assert "against the GPU's dense bf16 peak" in wide.getvalue()
    assert by_id["imp-8-0"]["mfu_fp8_peak"] == pytest.approx(0.79 * 989 / 1979)
    assert by_id["imp-8-0"]["precision"] == "fp8" and by_id["70b-8-0"]["mfu_fp8_peak"] is None


def test_scaling_rows_never_pool_engines_or_gpu_models(mixed_store):
    rows = scaling_table(mixed_store.list_runs(limit=1000, trials=False))
    at_8 = [r for r in rows if r.workload == "llama2_70b_lora" and r.gpus == 8 and r.layout == "DP8"]
    # the same workload, GPU count, layout, GBS and MBS: one row per engine
    assert sorted((r.engine, r.runs) for r in at_8) == [("nemo", 10), ("trainperf", 5)]
    for r in rows:
        assert len({rid.startswith("imp-") for rid in r.run_ids}) == 1, r
    nemo_64 = next(r for r in rows if r.engine == "nemo" and r.gpus == 64)
    # its base would be the 8 x H200 row if GPU models were pooled; alone on H100 it has none
    assert nemo_64.speedup is None and nemo_64.system == "v4.1 NVIDIA Eos_n8"
    ours_16 = [r for r in rows if r.engine == "trainperf" and r.gpus == 16]
    base = next(r for r in at_8 if r.engine == "trainperf")
    assert all(r.speedup == pytest.approx(base.time_to_train_s / r.time_to_train_s) for r in ours_16)


def test_scores_are_per_engine(mixed_store):
    scores = olympic_scores(mixed_store.list_runs(limit=1000, trials=False))
    # ours and NeMo's 8-GPU DP8 runs with logs: two sets, never one of fifteen
    assert sorted((s["engine"], s["gpus"], s["runs"]) for s in scores) == [("nemo", 8, 10), ("trainperf", 8, 5)]


def test_imported_runs_are_not_projected_with_this_engines_preset(mixed_store):
    row = mixed_store.get_run("imp-8-0")
    assert project(row) is None
    as_ours = dict(row, engine=None)  # the same measurements as this engine's run would be projected
    assert project(as_ours) is not None


def test_a_published_result_shows_once_as_its_imported_runs(mixed_store):
    runs = mixed_store.list_runs(limit=1000, trials=False)
    shown, left_out = split_imported(LLAMA2_70B_LORA, runs, "llama2_70b_lora")
    assert [p[:5] for p in left_out] == [("v4.1", "NVIDIA", "DGX H200 (NeMo, FP8)", "H200", 8),
                                         ("v4.1", "NVIDIA", "Eos_n8", "H100", 64)]
    assert len(shown) == len(LLAMA2_70B_LORA) - 2
    points, _ = published_points_for(runs)
    assert points and not any(p[:2] == ("v4.1", "NVIDIA") and p[4] == 8 and p[3] == "H200" for p in points)
    page = render(runs, {})
    published = page.split("<h2>Published MLPerf llama2_70b_lora results</h2>", 1)[1]
    assert "DGX H200 (NeMo, FP8)" not in published and "Lenovo" in published
    assert "shown once, as the imported runs" in published and "v4.1 NVIDIA 8xH200" in published
    assert "Imported runs of other engines" in page and "<td>nemo</td>" in page


def test_score_sets_hold_one_engine(mixed_store, tmp_path):
    rows = mixed_store.list_runs(workload="llama2_70b_lora", limit=1000, trials=False)
    assert {r.get("engine") for r in one_engine(rows, None)} == {None}  # the newest runs are this engine's
    assert {r["engine"] for r in one_engine(rows, "nemo")} == {"nemo"}
    with pytest.raises(SpecError, match="engines with runs: nemo, trainperf"):
        one_engine(rows, "megatron")
    with pytest.raises(SpecError, match="different engines"):
        check_one_engine([mixed_store.get_run("70b-8-0"), mixed_store.get_run("imp-8-0")])
    with pytest.raises(SpecError, match="different engines"):
        gather_runs(["70b-8-0", "imp-8-0"], db=str(tmp_path / "t.db"))
    got = gather_runs(db=str(tmp_path / "t.db"), workload="llama2_70b_lora", engine="nemo")
    assert sorted(r.run_id for r in got) == sorted(f"imp-8-{i}" for i in range(10))  # NeMo's ten, none of ours
    # the newest runs with logs are ours at 8 GPUs: that set alone, never NeMo's runs nor our 16-GPU ones
    ours = gather(db=str(tmp_path / "t.db"), workload="llama2_70b_lora", last=20)
    assert sorted(r.run_id for r in ours.runs) == [f"70b-8-{i}" for i in range(5)]
    assert ours.run_set == "trainperf, 8 × NVIDIA H200, DP8, GBS 8, MBS 1"
    assert ours.other_sets == ["nemo, v4.1 NVIDIA DGX H200, 8 × NVIDIA H200-SXM5-141GB, DP8, GBS 8, MBS 1, fp8 (10 runs)"]


def test_a_real_imported_submission_beside_this_engines_runs(tmp_path):
    """NVIDIA's 8 x H200 submission read by the import reader (two of its logs), stored beside this
    engine's runs: its own scaling row, its MFU read from the row, and its published result not
    repeated in the published table."""
    one_h200_submission(tmp_path, runs=2)
    imported, problems = read_submissions([str(tmp_path / "v4.1")], "4.1.0")
    assert problems == [] and len(imported) == 2
    store = Store(tmp_path / "t.db")
    fill_operator_store(store, tmp_path)
    store.import_runs([r.row for r in imported])
    runs = store.list_runs(limit=1000, trials=False)
    nemo = [r for r in scaling_table(runs) if r.engine == "nemo"]
    assert [(r.gpus, r.layout, r.runs) for r in nemo] == [(8, "DP4·CP2", 2)] and 0.5 < nemo[0].mfu < 1.0
    _, left_out = split_imported(LLAMA2_70B_LORA, runs, "llama2_70b_lora")
    assert [p[2] for p in left_out] == ["DGX H200 (NeMo, FP8)"]
    store.close()


def test_time_to_train_plot_has_imported_series_of_the_same_gpu_model(mixed_store):
    runs = [r for r in mixed_store.list_runs(limit=1000, trials=False) if r["workload"] == "llama2_70b_lora"]
    plotted = plotted_imported_rows(scaling_table(runs), runs)
    # ours ran on H200: NeMo's H200 row is drawn as its own series, its H100 row is not
    assert sorted({(r.engine, r.gpu_model) for r in plotted}) == [("nemo", "NVIDIA H200-SXM5-141GB"),
                                                                ("trainperf", "NVIDIA H200")]
    assert time_to_train_png("llama2_70b_lora", plotted, [], "").startswith("data:image/png;base64,")
    imported_only = [r for r in runs if r.get("engine")]
    assert {r.gpus for r in plotted_imported_rows(scaling_table(imported_only), imported_only)} == {8, 64}
