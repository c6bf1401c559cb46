"""`trainperf score`: olympic mean, RCP check and scaling, package export, bad input -- on fabricated logs.

The logs are written line by line exactly as ``mlperf_logging.mllog`` writes them (``:::MLLOG`` +
``json.dumps`` of namespace, time_ms, event_type, key, value, metadata with file/lineno), with every key
the ``training_6.0.0`` closed llama2_70b_lora rules require, so the package's own compliance, seed and
RCP checkers accept them. Expected numbers are computed by hand in the comments.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


from tests.fixtures.score import write_set, run_cli, TEN


# ---------------------------------------------------------------------------------------------
# Export + package checker


def test_export_is_accepted_by_the_package_checker(tmp_path, capsys):
    src = tmp_path / "src"
    # one failed run (the last), srun-style line prefixes; RCP: drop 2688 and the failed run -> 3072, scaled;
    # minutes: drop 29 and the failed run -> (33 + 30 + 36.5 + 31 + 40 + 35 + 32.5 + 34) / 8 = 34.0
    samples = [2688] + [3072] * 9
    write_set(src, TEN, samples=samples, failed={9}, prefix="0: ")
    out_dir = tmp_path / "pkg"
    rc, out, _ = run_cli(capsys, "score", str(src), "--export", str(out_dir), "--system", "my box", "--json")
    d = json.loads(out)
    assert rc == 0, d["reason"]
    assert d["olympic_mean_minutes"] == pytest.approx(34.0)
    assert d["scaling_factor"] == pytest.approx(3178.6666666666665 / 3072)
    org = out_dir / "Acme"
    bench = org / "results" / "my_box" / "llama2_70b_lora"
    assert sorted(p.name for p in bench.glob("result_*.txt")) == [f"result_{i}.txt" for i in range(10)]
    assert (org / "benchmarks" / "llama2_70b_lora" / "implementations" / "trainperf" / "README.md").is_file()
    desc = json.loads((org / "systems" / "my_box.json").read_text())
    assert desc["division"] == "closed" and desc["submitter"] == "Acme" and desc["status"] == "Available on-premise"
    chk = d["export"]["package_check"]
    assert chk["passed"] and chk["errors"] == [], chk
    assert any("1 file does not comply" in w for w in chk["warnings"])  # the failed run, accepted under olympic
    # the package checker (re)wrote scaling.json: same factor as ours
    assert json.loads((bench / "scaling.json").read_text())["scaling_factor"] == pytest.approx(d["scaling_factor"])
    # the summarizer reading the package gets our score
    from mlperf_logging.result_summarizer import result_summarizer as rs

    ref, _, _ = rs._compute_strong_score_standalone("llama2_70b_lora", "my_box", False, str(bench), "training", "6.0.0")
    assert ref == pytest.approx(d["score_minutes"])
    # and the real CLI, in a fresh interpreter (it always exits 0, so read its verdict line)
    proc = subprocess.run([sys.executable, "-m", "mlperf_logging.package_checker", str(org), "training", "6.0.0",
                           "--log_output", str(tmp_path / "pc.log")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    assert "PACKAGE CHECKER FOUND NO ERRORS, SUCCESS" in proc.stdout + proc.stderr


# ---------------------------------------------------------------------------------------------
# The cluster-scale pretraining benchmarks: RCPs in tokens (gpt3) and in samples (llama31_405b)

@pytest.mark.parametrize("benchmark, ruleset, evals, unit, converged", [
    # gpt3 GBS 2048: evals every 24,576 x 2048 = 50,331,648 tokens; the 24th: 1,207,959,552 tokens (an RCP value)
    ("gpt3", "4.1.0", 24, "tokens", 24 * 24_576 * 2048),
    # llama31_405b GBS 1152: 14 evals skipped, then every 18,432 samples; the 3rd: 17 x 18,432 = 313,344 samples
    ("llama31_405b", "5.1.0", 3, "samples", 313_344),
    ("llama31_405b", "6.0.0", 3, "samples", 313_344),
])
def test_pretraining_sets_score_in_their_rcp_unit_and_export(tmp_path, capsys, benchmark, ruleset, evals, unit,
                                                             converged):
    from tests.fixtures.score import write_pretrain_log

    src = tmp_path / "src"
    for i, minutes in enumerate((100.0, 90.0, 95.0)):
        write_pretrain_log(src / f"result_{i}.txt", benchmark, minutes, seed=2000 + i, evals_to_target=evals)
    rc, out, _ = run_cli(capsys, "score", str(src), "--ruleset", ruleset, "--export", str(tmp_path / "pkg"),
                         "--system", "h100 pod", "--json")
    d = json.loads(out)
    assert rc == 0 and d["valid"], d["reason"]
    assert d["required_runs"] == 3 and d["olympic_mean_minutes"] == pytest.approx(95.0)  # drop 90 and 100
    assert d["convergence_unit"] == unit and d["rcp"]["unit"] == unit
    assert [r["samples_to_converge"] for r in d["runs"]] == [converged] * 3
    assert d["rcp"]["passed"] and d["rcp"]["submission_mean"] == pytest.approx(converged)
    chk = d["export"]["package_check"]
    assert chk["passed"] and chk["errors"] == [], chk


# ---------------------------------------------------------------------------------------------
# Imported published submissions: each set under its own round's ruleset, as MLCommons scored it

from tests.fixtures.published import ALL_PUBLISHED, PUBLISHED  # noqa: E402

# (workload, --system, --gpus, the published score in minutes, ruleset): the round folders' own results
PUBLISHED_SCORES = [
    ("llama2_70b_lora", "Eos", 8, 27.928, "4.1.0"),
    ("llama2_70b_lora", "DGX H200", 8, 24.116, "4.1.0"),
    ("llama2_70b_lora", "Eos_n8", 64, 4.573, "4.1.0"),
    ("gpt3", None, None, 96.664, "4.1.0"),
    ("llama31_405b", None, None, 269.122, "5.0.0"),
]


def _imported_store(tmp_path, rounds: tuple[str, ...]) -> Path:
    from trainperf.mlperf.published import read_submissions
    from trainperf.store.db import Store

    imported, problems = read_submissions([str(PUBLISHED / r) for r in rounds], "6.0.0")
    assert problems == [] and imported
    db = tmp_path / "t.db"
    store = Store(db)
    store.import_runs([r.row for r in imported])
    store.close()
    return db


def _score(capsys, db, workload: str, *args: str) -> tuple[int, dict]:
    rc, out, _ = run_cli(capsys, "score", "--db", str(db), "--workload", workload, "--json", *args)
    return rc, json.loads(out)


def test_imported_rounds_score_as_published_in_the_terminal_and_on_the_page(tmp_path, capsys):
    """NVIDIA's v4.1 and v5.0 submissions imported into one store: `score --workload` with --system /
    --gpus reproduces each published score under that round's ruleset (gpt3, gone from 6.0.0, valid
    under 4.1.0; llama31_405b 269.122 with 5.0.0's RCP scaling, not 261.43 with 6.0.0's), and the
    page scores every set the same, of all its runs."""
    from trainperf.report.html import olympic_scores
    from trainperf.store.db import Store

    db = _imported_store(tmp_path, ("v4.1", "v5.0"))
    store = Store(db)
    page = {s["set"]: s for s in olympic_scores(store.list_runs(limit=1000))}
    store.close()
    assert len(page) == len(PUBLISHED_SCORES)  # one score per submitted set, never a pool of them
    for workload, system, gpus, minutes, ruleset in PUBLISHED_SCORES:
        args = ["--system", system] * (system is not None) + ["--gpus", str(gpus)] * (gpus is not None)
        rc, d = _score(capsys, db, workload, *args)
        assert rc == 0 and d["valid"], (workload, system, d["reason"])
        assert round(d["score_minutes"], 3) == minutes and d["ruleset"] == ruleset, (workload, system, d)
        assert d["ruleset_basis"] == f"round v{ruleset[:3]}" and d["runs_given"] == d["required_runs"]
        assert page[d["set"]]["valid"] and round(page[d["set"]]["score_min"], 3) == minutes
    # --ruleset still overrides: the 405B set under 6.0.0 is the figure the page used to show
    rc, d = _score(capsys, db, "llama31_405b", "--ruleset", "6.0.0")
    assert round(d["score_minutes"], 2) == 261.43 and d["ruleset_basis"] == "--ruleset"
    rc, _, err = run_cli(capsys, "score", "--db", str(db), "--workload", "gpt3", "--ruleset", "6.0.0")
    assert rc == 2 and "not part of MLPerf training 6.0.0" in err


@pytest.mark.slow  # Cisco's logs are 11 MB: seconds to parse and to check
@pytest.mark.skipif(not (ALL_PUBLISHED / "v5.1").is_dir(), reason="no published v5.1 MLPerf folders here")
def test_a_published_folder_scores_under_its_rounds_ruleset(capsys):
    """A results folder given by path inside its round folder (v5.1/Cisco/results/hpf_n8/llama31_8b) is
    scored under that round's ruleset, 5.1.0, not the 6.0.0 default."""
    folder = ALL_PUBLISHED / "v5.1" / "Cisco" / "results" / "hpf_n8" / "llama31_8b"
    rc, out, _ = run_cli(capsys, "score", str(folder), "--json")
    d = json.loads(out)
    assert rc == 0 and d["valid"] and round(d["score_minutes"], 3) == 45.445
    assert (d["ruleset"], d["ruleset_basis"]) == ("5.1.0", "round v5.1")
