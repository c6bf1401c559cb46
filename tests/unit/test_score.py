"""`trainperf score`: olympic mean, RCP check and scaling, package export, bad input -- on fabricated logs.

The logs are written line by line exactly as ``mlperf_logging.mllog`` writes them (``:::MLLOG`` +
``json.dumps`` of namespace, time_ms, event_type, key, value, metadata with file/lineno), with every key
the ``training_6.0.0`` closed llama2_70b_lora rules require, so the package's own compliance, seed and
RCP checkers accept them. Expected numbers are computed by hand in the comments.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainperf.mlperf import score as S
from trainperf.core.errors import SpecError
from trainperf.store.db import Store

from tests.fixtures.score import T0, _line, write_log, write_set, run_cli, TEN

RCP8_MEAN = 3178.6667  # olympic mean of the GBS-8 RCP (spec section 1.9: 3178.7)
RCP8_MIN = 2960.634  # minimum acceptable submission mean at GBS 8 (spec: 2960.6)


def score_of(paths, ruleset="6.0.0") -> S.Score:
    return S.score_runs(S.gather_runs([str(p) for p in paths], ruleset=ruleset), ruleset=ruleset)


# drop 29 and 40: (33 + 30 + 36.5 + 31 + 35 + 32.5 + 34 + 38) / 8 = 270 / 8
TEN_OLYMPIC = 33.75


# ---------------------------------------------------------------------------------------------
# Olympic mean


def test_ten_runs_olympic_mean_and_package_helpers_agree(tmp_path):
    sc = score_of(write_set(tmp_path, TEN))
    assert sc.required_runs == 10 and len(sc.runs) == 10
    assert sc.olympic_mean_minutes == pytest.approx(TEN_OLYMPIC)
    assert sc.score_minutes == pytest.approx(TEN_OLYMPIC) and sc.scaling_factor == 1.0  # 3456 > RCP mean: no scaling
    assert sc.valid and sc.reasons == []
    roles = dict(zip((r.minutes for r in sc.runs), sc.roles))
    assert roles[29.0] == "dropped: fastest" and roles[40.0] == "dropped: slowest" and roles[33.0] == "counted"
    # same number from the summarizer's own end-to-end function on the same folder
    from mlperf_logging.result_summarizer import result_summarizer as rs

    ref, _, factor = rs._compute_strong_score_standalone("llama2_70b_lora", "sys", False, str(tmp_path), "training",
                                                         "6.0.0")
    assert ref == pytest.approx(TEN_OLYMPIC) and factor == 1.0


def test_one_failed_run_counts_as_the_slowest(tmp_path):
    # nine converged runs; the failed one is the *fastest* by the clock (20 min) but counts as the slowest:
    # drop 30 (fastest converged) and the failed run: (33+36.5+31+35+32.5+34+38+41) / 8 = 281 / 8
    mins = [33.0, 30.0, 36.5, 31.0, 20.0, 35.0, 32.5, 34.0, 38.0, 41.0]
    sc = score_of(write_set(tmp_path, mins, failed={4}))
    assert sc.olympic_mean_minutes == pytest.approx(35.125)
    assert sc.valid, sc.reasons
    assert [r.path for r in sc.failed_runs] == [str(tmp_path / "result_4.txt")]
    assert sc.roles[4] == "dropped: not converged" and sc.roles[1] == "dropped: fastest"
    assert "dropped: slowest" not in sc.roles and sc.roles[9] == "counted"
    assert sc.rcp["passed"] and sc.rcp["submission_mean"] == pytest.approx(3456)  # the failed run (1e9) is dropped


def test_two_failed_runs_make_the_score_invalid(tmp_path, capsys):
    write_set(tmp_path, TEN, failed={2, 7})
    rc, out, _ = run_cli(capsys, "score", str(tmp_path), "--json")
    d = json.loads(out)
    assert rc == 1
    assert d["valid"] is False and d["score_minutes"] is None and d["olympic_mean_minutes"] is None
    assert "2 of 10 runs did not converge" in d["reason"]
    assert len(d["failed_runs"]) == 2 and d["failed_runs"][0]["reason"] == "run_stop status 'aborted'"
    assert d["rcp"]["passed"] is False and d["rcp"]["message"] == "Insufficient convergence"


def test_fewer_runs_than_required_still_get_a_mean_but_no_valid_score(tmp_path, capsys):
    write_set(tmp_path, [10.0, 50.0, 20.0, 40.0, 30.0])
    rc, out, _ = run_cli(capsys, "score", str(tmp_path), "--json")
    d = json.loads(out)
    assert rc == 1 and d["valid"] is False
    assert d["olympic_mean_minutes"] == pytest.approx(30.0)  # (20 + 30 + 40) / 3
    assert "not a valid MLPerf score (5 of 10 runs)" in d["reason"]
    assert d["required_runs"] == 10


def test_required_runs_come_from_benchmark_meta(tmp_path, monkeypatch):
    from mlperf_logging import benchmark_meta

    monkeypatch.setitem(benchmark_meta._ALL_RESULT_FILE_COUNTS["training"], "llama2_70b_lora", 5)
    sc = score_of(write_set(tmp_path, [10.0, 50.0, 20.0, 40.0, 30.0]))
    assert sc.required_runs == 5 and not any("runs)" in r for r in sc.reasons)


# ---------------------------------------------------------------------------------------------
# RCP


def test_rcp_pass_without_scaling_reports_reference(tmp_path):
    sc = score_of(write_set(tmp_path, TEN, samples=[3072, 3456, 3456, 3840, 3456, 3456, 3456, 3456, 3456, 4608]))
    rcp = sc.rcp
    assert rcp["passed"] and rcp["message"] == "RCP found" and rcp["kind"] == "rcp"
    assert rcp["reference"] == "llama2_70b_lora_ref_8" and rcp["global_batch_size"] == 8
    assert rcp["rcp_mean"] == pytest.approx(RCP8_MEAN, abs=1e-3)
    assert rcp["min_acceptable_mean"] == pytest.approx(RCP8_MIN, abs=1e-2)
    assert rcp["submission_mean"] == pytest.approx((3456 * 7 + 3840) / 8)
    assert rcp["scaling_factor"] == 1.0 and sc.score_minutes == pytest.approx(TEN_OLYMPIC)


def test_rcp_scaled_between_bound_and_mean(tmp_path):
    # olympic mean of samples drops 2688 and 4608 -> 3072, between 2960.6 and 3178.7: passes, score scaled
    samples = [2688] + [3072] * 8 + [4608]
    sc = score_of(write_set(tmp_path, TEN, samples=samples))
    factor = 3178.6666666666665 / 3072
    assert sc.rcp["passed"] and sc.rcp["submission_mean"] == pytest.approx(3072)
    assert sc.scaling_factor == pytest.approx(factor) and sc.rcp["scaling_factor"] == pytest.approx(factor)
    assert sc.olympic_mean_minutes == pytest.approx(TEN_OLYMPIC)
    assert sc.score_minutes == pytest.approx(TEN_OLYMPIC * factor)
    assert sc.valid


def test_rcp_fail_converging_too_fast(tmp_path, capsys):
    write_set(tmp_path, TEN, samples=2688)  # 2688 < 2960.6
    rc, out, _ = run_cli(capsys, "score", str(tmp_path), "--json")
    d = json.loads(out)
    assert rc == 1 and d["valid"] is False
    assert d["rcp"]["passed"] is False and "RCP check failed: RCP found" in d["reason"]
    assert d["rcp"]["submission_mean"] == pytest.approx(2688) and d["scaling_factor"] == 1.0
    assert d["score_minutes"] is None and d["olympic_mean_minutes"] == pytest.approx(TEN_OLYMPIC)  # no score


def test_rcp_interpolated_gbs(tmp_path):
    sc = score_of(write_set(tmp_path, TEN, samples=3456, gbs=9))
    assert sc.rcp["message"] == "RCP Interpolation" and sc.rcp["kind"] == "interpolated"
    assert sc.rcp["rcp_mean"] == pytest.approx(3285.3, abs=0.05)
    assert sc.rcp["min_acceptable_mean"] == pytest.approx(3061.4, abs=0.05)
    assert sc.rcp["passed"] and sc.scaling_factor == 1.0


def test_open_division_skips_rcp(tmp_path, capsys):
    write_set(tmp_path, TEN, samples=1536, division="open")  # would fail the RCP if it were checked
    rc, out, _ = run_cli(capsys, "score", str(tmp_path))
    assert rc == 0
    assert "RCP check not applicable (open division)" in out
    assert "score          33.750 min  (valid MLPerf score)" in out


# ---------------------------------------------------------------------------------------------
# Store inputs


def _store_with_runs(tmp_path: Path, n: int, failed_oldest: int = 0) -> Path:
    db = tmp_path / "t.db"
    store = Store(db)
    mins = [20.0, 21.0] + TEN
    for i in range(n):
        log = write_log(tmp_path / "runs" / f"r{i}" / "mllog.txt", mins[i], seed=i, success=i >= failed_oldest)
        store.create_run(f"r{i}", "lora70", {"mlperf": {"benchmark": "llama2_70b_lora"}}, "dp_shard=8", 8, "closed",
                         True, 0.925, str(log.parent))
        store.finish_run(f"r{i}", status="success" if i >= failed_oldest else "failed", mllog_path=str(log))
        store.conn.execute("UPDATE runs SET created_at = ? WHERE run_id = ?", (1000.0 + i, f"r{i}"))
    store.close()
    return db


def test_workload_takes_the_newest_required_runs(tmp_path, capsys):
    db = _store_with_runs(tmp_path, 12, failed_oldest=2)  # the two oldest failed; the newest ten are TEN
    rc, out, _ = run_cli(capsys, "score", "--db", str(db), "--workload", "lora70", "--json")
    d = json.loads(out)
    assert rc == 0 and d["valid"] and d["score_minutes"] == pytest.approx(TEN_OLYMPIC)
    assert sorted(r["run_id"] for r in d["runs"]) == sorted(f"r{i}" for i in range(2, 12))
    rc, out, _ = run_cli(capsys, "score", "--db", str(db), "--workload", "lora70", "--last", "12", "--json")
    assert rc == 1 and "did not converge" in json.loads(out)["reason"]
    # explicit run ids mixed with a path
    rc, out, _ = run_cli(capsys, "score", "--db", str(db), "r2", "r3", str(tmp_path / "runs" / "r4"), "--json")
    d = json.loads(out)
    assert rc == 1 and [r["run_id"] for r in d["runs"]] == ["r2", "r3", None]
    assert d["olympic_mean_minutes"] == pytest.approx(33.0)  # 30, 33, 36.5 -> 33


def test_package_checker_rejects_a_broken_export(tmp_path):
    # same seeds on the same line in two runs: the seed checker must refuse the exported package
    src = tmp_path / "src"
    paths = write_set(src, TEN)
    paths[1].write_text(paths[1].read_text().replace('"value": 1001,', '"value": 1000,'))
    sc = score_of(paths)
    exp = S.export_package(sc, tmp_path / "pkg")
    assert exp["org"] == "Acme" and exp["system"] == "8xH200"
    assert not exp["package_check"]["passed"]
    assert any("Seed checker failed" in e for e in exp["package_check"]["errors"])


# ---------------------------------------------------------------------------------------------
# Bad input: exit 2, one line


def _one_line_error(capsys, *args) -> str:
    rc, out, err = run_cli(capsys, "score", *args)
    assert rc == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainperf: error: ")
    return lines[0]


def test_bad_inputs_exit_2_with_one_line(tmp_path, capsys):
    ok = write_log(tmp_path / "a" / "result_0.txt", 30.0, seed=1)
    db = _store_with_runs(tmp_path, 1)
    assert "'nope' is neither a file or directory nor a run id" in _one_line_error(capsys, "--db", str(db), "nope")
    garbage = tmp_path / "garbage.txt"
    garbage.write_text("hello\nnot a log\n")
    assert "no ':::MLLOG' lines" in _one_line_error(capsys, str(garbage))
    other = write_log(tmp_path / "b" / "result_0.txt", 30.0, seed=2, benchmark="llama31_8b")
    assert "different benchmarks" in _one_line_error(capsys, str(ok), str(other))
    gbs16 = write_log(tmp_path / "c" / "result_0.txt", 30.0, seed=3, gbs=16)
    assert "different global_batch_size" in _one_line_error(capsys, str(ok), str(gbs16))
    assert "--ruleset '9.9.9'" in _one_line_error(capsys, str(ok), "--ruleset", "9.9.9")
    assert "nothing to score" in _one_line_error(capsys)
    assert "given twice" in _one_line_error(capsys, str(ok), str(tmp_path / "a"))
    assert "--last N only goes with --workload" in _one_line_error(capsys, str(ok), "--last", "3")
    assert "cannot write the package" in _one_line_error(capsys, str(ok), "--export", str(garbage))
    # --json: the error as JSON on stdout too
    rc, out, _ = run_cli(capsys, "score", str(garbage), "--json")
    assert rc == 2 and json.loads(out)["exit_code"] == 2


def test_reader_errors_are_spec_errors(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        S.read_run(tmp_path / "missing.txt")
    nobench = tmp_path / "nobench.txt"
    nobench.write_text(_line(T0, "POINT_IN_TIME", "cache_clear", True) + "\n")
    with pytest.raises(SpecError, match="no submission_benchmark"):
        S.read_run(nobench)


# ---------------------------------------------------------------------------------------------
# Which ruleset a run is scored under


def test_the_ruleset_of_a_stored_or_given_run_is_its_rounds():
    imported = {"engine": "nemo", "software_json": json.dumps({"round": "v5.0", "org": "NVIDIA"})}
    assert S.ruleset_of_row(imported) == ("5.0.0", "round v5.0")
    assert S.ruleset_of_row(imported, given="6.0.0") == ("6.0.0", "--ruleset")  # named by the user: that one
    recorded = dict(imported, software_json=json.dumps({"round": "v5.0", "ruleset": "5.0.1"}))
    assert S.ruleset_of_row(recorded) == ("5.0.1", "as imported")
    own = dict(imported, software_json=json.dumps({"round": "v5.0", "ruleset": "5.0.0"}))
    assert S.ruleset_of_row(own) == ("5.0.0", "round v5.0")  # the round's own ruleset names the round
    # this engine's runs, and logs imported from a folder that names no round: the default
    assert S.ruleset_of_row({"software_json": json.dumps({"round": "v5.0"})}) == ("6.0.0", "default")
    assert S.ruleset_of_row(dict(imported, software_json=json.dumps({"round": "downloads"}))) == ("6.0.0", "default")
    assert S.ruleset_of_path("/x/training_results_v4.1/NVIDIA/results/sys/gpt3/result_0.txt") == ("4.1.0", "round v4.1")
    assert S.ruleset_of_path("/x/v4.1/runs/result_0.txt") == ("6.0.0", "default")  # not a results/ tree
    with pytest.raises(SpecError, match=r"ruleset 9\.9\.0 \(round v9\.9\), which the installed mlperf_logging"):
        S._one_ruleset([("9.9.0", "round v9.9", "imp-1")])
    with pytest.raises(SpecError, match="runs of different rounds are not one set"):
        S._one_ruleset([("4.1.0", "round v4.1", "a"), ("5.0.0", "round v5.0", "b")])
