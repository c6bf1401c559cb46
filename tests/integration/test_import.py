"""`trainperf import` and `plan --calibrate --engine` as a user runs them (on the trimmed published
folders of tests/fixtures/published)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.cli import trainperf_cmd

from tests.fixtures.published import PUBLISHED as ROUNDS

PUBLISHED = ROUNDS / "v4.1" / "NVIDIA"


def test_import_then_a_fit_that_names_what_it_needs(tmp_path):
    org = tmp_path / "v4.1" / "NVIDIA"
    res = org / "results" / "h200_ngc24.09_nemo" / "llama2_70b_lora"
    res.mkdir(parents=True)
    shutil.copy(PUBLISHED / "results/h200_ngc24.09_nemo/llama2_70b_lora/result_0.txt", res)
    shutil.copytree(PUBLISHED / "systems", org / "systems")
    shutil.copytree(PUBLISHED / "benchmarks", org / "benchmarks")
    db = ["--db", str(tmp_path / "t.db")]
    out = subprocess.run(trainperf_cmd("import", str(tmp_path / "v4.1"), str(tmp_path / "nothing"), "--json", *db),
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert got["imported"] == 1 and got["groups"][0]["engine"] == "nemo" and got["groups"][0]["layout"] == "CP2 DP4 MBS 1"
    assert "nothing: not an MLPerf submission folder" in out.stderr
    fit = subprocess.run(trainperf_cmd("plan", "--calibrate", "--engine", "nemo", *db), cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert fit.returncode == 2 and "a fit needs at least 3" in fit.stderr and "llama2_70b_lora@8 CP2 DP4" in fit.stderr


def test_plan_names_where_the_stored_layouts_at_its_scale_rank(tmp_path):
    """After `import`, a plan for the engine at a scale the store holds runs of shows each stored layout
    with its measured tokens/s, its rank in this plan and the plan's prediction for it."""
    db = ["--db", str(tmp_path / "t.db")]
    out = subprocess.run(trainperf_cmd("import", str(PUBLISHED.parents[1]), *db), cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = {}
    for engine in ("nemo", "trainperf"):
        plan = subprocess.run(trainperf_cmd("plan", "llama2_70b_lora", "--gpus", "64", "--gpu", "h100", "--engine", engine,
                                            "--gbs", "8", "--top", "3", "--json", *db),
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert plan.returncode == 0, plan.stderr[-2000:]
        got[engine] = json.loads(plan.stdout)["stored_at_scale"]
    nvidia = next(e for e in got["nemo"] if e["layout"] == "TP4 SP CP2 DP8 MBS 1")
    assert nvidia["runs"] >= 5 and nvidia["global_batch_size"] == 8 and 1 <= nvidia["rank"] <= nvidia["ranked"]
    assert abs(nvidia["predicted_tokens_per_s_per_gpu"] / nvidia["tokens_per_s_per_gpu"] - 1) < 0.15
    assert got["trainperf"] == []  # the store holds no run of this engine at 64 GPUs


# ---------------------------------------------------------------------------------------------
# hostile folders, end to end: one line of stderr, exit 2, nothing stored (the cases in-process are
# tests/unit/test_import_hostile.py)

def _edit(log: Path, key: str, value) -> None:
    lines = []
    for line in log.read_text().splitlines():
        if f'"key": "{key}"' in line:
            rec = json.loads(line.split(" ", 1)[1])
            rec["value"] = value
            line = ":::MLLOG " + json.dumps(rec)
        lines.append(line)
    log.write_text("\n".join(lines) + "\n")


def _import_refused(tmp_path, root, timeout=60) -> str:
    db = tmp_path / "t.db"
    out = subprocess.run(trainperf_cmd("import", str(root), "--db", str(db)), cwd=tmp_path, capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and "\x1b" not in out.stderr and not db.exists()
    return out.stderr


@pytest.mark.skipif(not Path("/proc/self/cwd").exists(), reason="no /proc/self/cwd here")
def test_the_traversal_log_runs_nothing(tmp_path):
    """The log of the issue: its division names a rule file in the importing user's working folder."""
    from tests.fixtures.published import fixture_round

    root = fixture_round(tmp_path / "download")
    log = next(root.rglob("result_0.txt"))
    _edit(log, "submission_division", "../../../../../../proc/self/cwd/evil")
    marker = tmp_path / "owned"
    (tmp_path / "evil_common.yaml").write_text(f"- BEGIN:\n    CODE: \"open({str(marker)!r}, 'w').write('x')\"\n")
    err = _import_refused(tmp_path, root)
    assert "submission_division '../../../../../../proc/self/cwd/evil' is not one of closed, open" in err
    assert not marker.exists()


def test_a_fifo_system_description_does_not_hang(tmp_path):
    from tests.fixtures.published import fixture_round

    root = fixture_round(tmp_path / "download")
    system = next(root.rglob("systems/*.json"))
    system.unlink()
    os.mkfifo(system)
    assert "not a regular file" in _import_refused(tmp_path, root, timeout=60)


def test_an_absurd_throughput_is_not_stored(tmp_path):
    from tests.fixtures.published import fixture_round

    root = fixture_round(tmp_path / "download")
    _edit(next(root.rglob("result_0.txt")), "tracked_stats", {"throughput": 1e30})
    assert "not a throughput a GPU can reach" in _import_refused(tmp_path, root)


def test_names_with_escapes_reach_the_terminal_escaped(tmp_path):
    from tests.fixtures.published import fixture_round

    root = fixture_round(tmp_path / "download")
    system = next(root.rglob("systems/*.json"))
    desc = json.loads(system.read_text())
    desc["system_name"] = "DGX\x1b]0;owned\x07\nFORGED line"
    system.write_text(json.dumps(desc))
    (tmp_path / "x\x1b[2J").mkdir()
    out = subprocess.run(trainperf_cmd("import", str(root), str(tmp_path / "x\x1b[2J"), "--db", str(tmp_path / "t.db")),
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "\x1b" not in out.stdout + out.stderr and "DGX\\x1b]0;owned\\x07\\x0aFORGED line" in out.stdout
    assert "x\\x1b[2J: not an MLPerf submission folder" in out.stderr
