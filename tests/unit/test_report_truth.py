"""The report tells the truth by default: every run listed unless --limit says what it cut (and no
figure changes), one set per score with the set named (terminal and page agree), an invalid set has no
score, fp8 MFU against both peaks, closed and open runs apart, seed-to-seed spread a note rather than
a warning, a headline per workload, and names that can break neither a terminal nor a chart
(matplotlib mathtext) nor the page. In-process, on fabricated rows and logs."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from tests.fixtures.report import fill_operator_store
from tests.fixtures.score import run_cli, write_log
from tests.unit.test_report_engines import imported_row
from trainperf.core.errors import SpecError
from trainperf.mlperf.score import gather, run_set_of, score_gathered
from trainperf.report.html import headline, olympic_scores, render
from trainperf.report.labels import division_label, mfu_text, plot_text, status_label
from trainperf.report.plots import time_to_train_png
from trainperf.report.scaling import ScalingRow, scaling_table
from trainperf.report.table import print_table
from trainperf.store.db import Store

HOSTILE_GPU = "$\\undefinedcommand$ \x1b[2J\x1b]0;pwned\x07"  # mathtext and terminal escapes in one name


@pytest.fixture
def store(tmp_path):
    """The operator store (this engine's runs, 5 of them with logs) plus NeMo's ten 8 x H200 runs (logs)
    and three of a 64 x H100 system (no logs)."""
    s = Store(tmp_path / "t.db")
    fill_operator_store(s, tmp_path)
    rows = [imported_row(i) | {"mllog_path": str(write_log(tmp_path / "nemo" / f"result_{i}.txt", 24.0 + 0.1 * i,
                                                            seed=i))} for i in range(10)]
    rows += [imported_row(i, gpus=64, gpu="NVIDIA H100-SXM5-80GB", minutes=4.6, system="Eos_n8") for i in range(3)]
    s.import_runs(rows)
    yield s
    s.close()


def _text(runs, width=120, **kw) -> str:
    buf = io.StringIO()
    print_table(runs, console=Console(file=buf, width=width), **kw)
    return buf.getvalue()


def test_report_lists_every_run_and_a_limit_says_what_it_cut(store, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    db = str(tmp_path / "t.db")
    n = len(store.list_runs(limit=1000, trials=False))
    rc, out, _ = run_cli(capsys, "report", "--db", db)
    assert rc == 0 and f"{n} runs, every one listed" in out and "imp-8-9" in out and "70b-8-0" in out
    page = tmp_path / "r.html"
    rc, out, _ = run_cli(capsys, "report", "--db", db, "--limit", "3", "--html", str(page))
    assert rc == 0 and f"the newest 3 of {n} runs listed (--limit); {n - 3} older runs not listed" in out
    assert f"report page: {page.resolve()}" in out  # where the page went
    every = store.list_runs(limit=1000, trials=False)
    full = render(every, {r["run_id"]: store.evals(r["run_id"]) for r in every})
    cut = page.read_text()
    # every figure is of all runs: the scaling tables and scores of the cut page are the full page's
    section = lambda p: p.split("<h2>Headline</h2>")[1].split("<h2>Runs</h2>")[0]  # noqa: E731
    assert section(cut) == section(full) and "(the runs table lists the newest 3)" in cut
    runs_table = cut.split("<h2>Runs</h2>")[1].split("</table>")[0]
    assert runs_table.count("<tr class=") == 3 and f"The newest 3 of {n} runs" in cut
    rc, out, err = run_cli(capsys, "report", "--db", db, "--limit", "0")
    assert rc == 2 and "--limit 0" in err and len(err.strip().splitlines()) == 1


def test_a_score_is_of_one_set_named_in_its_header(store, tmp_path, capsys):
    db = str(tmp_path / "t.db")
    got = gather(db=db, workload="llama2_70b_lora", engine="nemo")
    assert got.run_set.startswith("nemo, v4.1 NVIDIA DGX H200, 8 × NVIDIA H200-SXM5-141GB, DP8")
    assert any(s.startswith("trainperf, 8 × NVIDIA H200, DP8") for s in got.other_sets)
    # narrowed by system (any case, part of the name), GPU count and layout
    assert gather(db=db, workload="llama2_70b_lora", system="dgx h2", gpus=8, layout="dp8").run_set == got.run_set
    assert gather(db=db, workload="llama2_70b_lora", system="h200").run_set.startswith("trainperf")  # the newest
    with pytest.raises(SpecError, match=r"no set of these runs matches --gpus 16.*sets: "):
        gather(db=db, workload="llama2_70b_lora", engine="nemo", gpus=16)
    with pytest.raises(SpecError, match="runs of different sets are not one score"):  # 8 and 16 GPUs
        gather(["70b-8-0", "70b-16-tp2"], db=db)
    rc, out, _ = run_cli(capsys, "score", "--db", db, "--workload", "llama2_70b_lora", "--engine", "nemo")
    assert rc == 0 and "set            nemo, v4.1 NVIDIA DGX H200, 8 × NVIDIA H200-SXM5-141GB" in out
    assert "other set      trainperf, 8 × NVIDIA H200, DP8" in out and "ruleset 4.1.0 (round v4.1)" in out
    rc, out, err = run_cli(capsys, "score", "--db", db, "--gpus", "8")
    assert rc == 2 and "--gpus only goes with --workload" in err


def test_an_invalid_set_has_no_score_and_terminal_and_page_agree(store, tmp_path, capsys):
    db = str(tmp_path / "t.db")
    rc, out, _ = run_cli(capsys, "score", "--db", db, "--workload", "llama2_70b_lora", "--json")
    d = json.loads(out)  # our five 8-GPU runs: llama2_70b_lora is scored on ten
    assert rc == 1 and d["valid"] is False and d["score_minutes"] is None and d["olympic_mean_minutes"] > 0
    assert d["set"] == "trainperf, 8 × NVIDIA H200, DP8, GBS 8, MBS 1"
    page_scores = {s["set"]: s for s in olympic_scores(store.list_runs(limit=1000, trials=False))}
    for engine in ("trainperf", "nemo"):
        terminal = score_gathered(gather(db=db, workload="llama2_70b_lora", engine=engine))
        page = page_scores[terminal.run_set]
        assert (page["valid"], page["score_min"], page["runs"]) == (terminal.valid, terminal.score_minutes,
                                                                    len(terminal.runs))
        assert page["olympic_min"] == pytest.approx(terminal.olympic_mean_minutes)
    html_page = render(store.list_runs(limit=1000, trials=False), {})
    scores = html_page.split("<h2>MLPerf scores</h2>")[1].split("</table>")[0]
    assert "none (not valid)" in scores and "4.1.0 (round v4.1)" in scores and "6.0.0 (default)" in scores


def test_fp8_mfu_is_labelled_against_both_peaks():
    assert mfu_text(0.42) == "42.0%"
    assert mfu_text(0.9, "NVIDIA H100-SXM5-80GB", "fp8") == "90.0% (fp8 peak 45.0%)"  # 989 / 1979 TFLOP/s
    assert mfu_text(0.9, "a GPU of no datasheet", "fp8") == "90.0% (fp8 peak unknown)"
    row = imported_row(0)
    assert run_set_of(row).precision == "fp8" and "MFU (bf16 peak)" in render([row | {"mllog_path": None}], {})


def test_labels_of_published_runs_probes_and_open_runs():
    assert division_label(imported_row(0)) == "closed (published)"
    assert division_label({"division": "open", "comparable": 0}) == "open (not comparable)"
    assert division_label({"division": "closed", "comparable": 1}) == "closed"
    probe = {"status": "failed", "status_reason": "throughput probe: 20 steps measured, no eval within them"}
    assert status_label(probe) == "probe (no eval)" and status_label({"status": "failed"}) == "failed"


def test_closed_and_open_runs_have_their_own_rows_plots_and_headline(store, tmp_path):
    from trainperf.core.resolve import resolve_spec
    from trainperf.workloads import get_workload

    shrunk = resolve_spec(get_workload("llama2_70b_lora").defaults(), None,
                          ["mlperf.division=open", "model.num_layers=2", "parallel.dp_shard=8"])
    for i in range(3):  # a shrunk model of ours: open division, far faster than any real time to train
        store.create_run(f"shrunk-{i}", "llama2_70b_lora", shrunk.to_dict(), "dp_shard=8", 8, "open", False, 0.925,
                         str(tmp_path), hardware={"device": "cuda", "gpu": "NVIDIA H200", "gpus": 8})
        store.finish_run(f"shrunk-{i}", status="success", time_to_train_s=180.0 + i, step_time_s=0.2)
    runs = store.list_runs(limit=1000, trials=False)
    rows = [r for r in scaling_table(runs) if r.workload == "llama2_70b_lora"]
    assert {r.closed for r in rows if r.run_ids[0].startswith("shrunk")} == {False}
    assert all(r.closed for r in rows if r.engine == "nemo")
    page = render(runs, {})
    lora = page.split("<h2>llama2_70b_lora</h2>")[1].split("<h2>")[0]
    assert "<h3>closed division</h3>" in lora and "<h3>open division</h3>" in lora
    assert "time to train vs GPUs (closed division)" in lora and "time to train vs GPUs (open division)" in lora
    (entry,) = [e for e in headline(runs, scaling_table(runs), olympic_scores(runs)) if e["workload"] == "llama2_70b_lora"]
    # the best closed time of ours (16 GPUs, TP2), not the shrunk model's 3 minutes, against 16 x H200 published
    assert entry["where"] == "trainperf, 16 × NVIDIA H200, DP8·TP2·SP" and entry["minutes"] == pytest.approx(13.4)
    assert entry["published"] == pytest.approx(12.45) and "Krai" in entry["published_where"]
    assert "<h2>Headline</h2>" in page and page.index("<h2>Headline</h2>") < page.index("<h2>System</h2>")


def test_seed_to_seed_spread_is_a_note_and_unexplained_spread_a_warning(tmp_path):
    def row(i, minutes, samples):
        return imported_row(i, minutes=0) | {"run_id": f"r{i}", "time_to_train_s": minutes * 60,
                                             "samples_to_target": samples}

    (spread,) = scaling_table([row(0, 20, 2688), row(1, 26, 3456), row(2, 23, 3072)])
    assert spread.anomalies == [] and "seeds converged at 2,688 to 3,456 samples" in spread.notes[0]
    (slow,) = scaling_table([row(0, 20, 3072), row(1, 26, 3072), row(2, 23, 3072)])
    assert slow.notes == [] and "differ by 30% at like samples" in slow.anomalies[0]


def test_terminal_keeps_the_measurements_at_120_columns(store, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")  # not a terminal: the width a pipe or log file is given
    text = _text(store.list_runs(limit=1000, trials=False))
    for table in text.split("└")[:-1]:
        header = " ".join(line for line in table.splitlines() if line.startswith("┃"))
        for column in ("run", "status", "train (min)", "GBS/MBS", "tok/s/GPU", "(fp8) peak"):
            assert column in header, (column, header)
    assert max(len(line) for line in text.splitlines() if line[:1] in "┏┃┡│└") <= 120
    assert "llama2_70b_lora: " in text and "mini-pretrain: " in text  # one table per workload
    assert "79.0% (39.5%)" in text and "against the GPU's dense bf16 peak" in text


def test_hostile_names_reach_neither_terminal_nor_chart_nor_page_raw(store, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    bad = imported_row(0, gpu=HOSTILE_GPU) | {"run_id": "imp-\x1b[31mred", "mllog_path": None}
    store.import_runs([bad])
    runs = store.list_runs(limit=1000, trials=False)
    text = _text(runs, wide=True)
    assert "\x1b" not in text and "\\x1b[31mred" in text
    page = render(runs, {})  # matplotlib would raise on "$\undefinedcommand$" read as mathtext
    assert "\x1b" not in page and "\x07" not in page and "\\x1b[2J" in page and "$\\undefinedcommand$" in page
    assert plot_text("$x$") == "\\$x\\$"
    row = ScalingRow("w", 8, "DP8 $\\bad$", 8, 1, 1, 1, 60.0, "1 run", None, None, None, None, None,
                     gpu_model=HOSTILE_GPU, engine="nemo")
    assert time_to_train_png("$\\oops$", [row], [(1, 2, 3, 4, 8, 8, 1.0)], "$\\label$").startswith("data:image/png")


@pytest.mark.parametrize("damage", [
    {"spec_json": json.dumps({"parallel": {"dp_shard": "x", "tp": [2]}, "train": [1]})},
    {"spec_json": "not json", "hardware_json": json.dumps({"gpu": ["a", "list"]})},
    {"software_json": "[]", "hardware_json": "null"},
    {"software_json": json.dumps({"round": {"v": 1}, "org": 7}), "spec_json": json.dumps({"hardware": "fp8"})},
])
def test_odd_json_in_a_row_is_shown_not_raised(damage, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    rows = [imported_row(i) | damage | {"mllog_path": None} for i in range(3)]
    assert run_set_of(rows[0]).engine == "nemo"
    assert "imp-8-0" in _text(rows) and "imp-8-0" in render(rows, {})
