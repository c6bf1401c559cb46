"""`trainperf import` of submission folders an adversary wrote: nothing from a log reaches a path
mlperf_logging builds and executes, every bad file is one line of stderr with exit 2 and nothing
stored, long lines are refused before the quadratic parser, copies are not stored twice, names are
escaped. In-process on the round folder tests/fixtures/published.py writes (no published file)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.published import BENCHMARK, SYSTEM, fixture_round
from trainperf.cli import main
from trainperf.core.errors import SpecError
from trainperf.mlperf import published
from trainperf.mlperf.published import read_submissions

# the issue's traversal, and one deep enough to reach / from any install
TRAVERSAL = "../../../../../../proc/self/cwd/evil"
DEEP_TRAVERSAL = "../" * 40 + "proc/self/cwd/evil"
needs_proc = pytest.mark.skipif(not Path("/proc/self/cwd").exists(), reason="no /proc/self/cwd here")


def _log(root: Path, i: int = 0) -> Path:
    return root / "Acme" / "results" / SYSTEM / BENCHMARK / f"result_{i}.txt"


def _edit_log(root: Path, key: str, change, i: int = 0) -> None:
    """Apply ``change`` to the parsed record of every ``key`` line of the log (returns the new line body)."""
    path = _log(root, i)
    lines = []
    for line in path.read_text().splitlines():
        if f'"key": "{key}"' in line:
            new = change(json.loads(line.split(" ", 1)[1]))
            line = ":::MLLOG " + (new if isinstance(new, str) else json.dumps(new))
        lines.append(line)
    path.write_text("\n".join(lines) + "\n")


def _set_value(key: str, value):
    def change(rec):
        rec["value"] = value
        return rec
    return change


def _evil_rules(cwd: Path) -> Path:
    """evil_common.yaml where a traversal lands: its BEGIN code creates a marker file."""
    marker = cwd / "owned"
    (cwd / "evil_common.yaml").write_text(f"- BEGIN:\n    CODE: \"open({str(marker)!r}, 'w').write('code ran')\"\n")
    return marker


@pytest.fixture
def checker_spy(monkeypatch):
    """Every entry into mlperf_logging's compliance and RCP checkers, recorded."""
    from mlperf_logging.compliance_checker import mlp_compliance
    from mlperf_logging.rcp_checker import rcp_checker

    calls = []
    for owner, name in ((mlp_compliance.ComplianceChecker, "check_loglines"),
                        (mlp_compliance.ComplianceChecker, "configured_checks"),
                        (mlp_compliance, "make_checker"), (rcp_checker, "check_directory"),
                        (rcp_checker.RCP_Checker, "__init__")):
        real = getattr(owner, name)

        def spy(*a, _real=real, _name=name, **k):
            calls.append(_name)
            return _real(*a, **k)
        monkeypatch.setattr(owner, name, spy)
    return calls


def _cli(capsys, *args) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def _refused(capsys, tmp_path, *paths, match: str = "") -> str:
    """The import of ``paths`` is refused: exit 2, one line of stderr, no store written; the line."""
    db = tmp_path / "refused.db"
    rc, out, err = _cli(capsys, "import", *map(str, paths), "--db", str(db))
    assert rc == 2, (out, err)
    assert len(err.splitlines()) == 1 and err.startswith("trainperf: error: "), err
    assert "\x1b" not in err and "Traceback" not in err
    assert not db.exists()
    assert match in err, err
    return err


# ---------------------------------------------------------------------------------------------
# 1. no code execution


@needs_proc
def test_the_traversal_runs_code_in_the_bare_checker(tmp_path, monkeypatch):
    """The exploit is live: mlperf_logging's own checker, given the log, executes evil_common.yaml."""
    from mlperf_logging.compliance_checker import mlp_compliance, mlp_parser

    root = fixture_round(tmp_path / "r")
    _edit_log(root, "submission_division", _set_value("submission_division", DEEP_TRAVERSAL))
    monkeypatch.chdir(tmp_path)
    marker = _evil_rules(tmp_path)
    loglines, _ = mlp_parser.parse_file(str(_log(root)), ruleset="4.1.0")
    checker = mlp_compliance.make_checker("training", "4.1.0", True, False)
    try:
        checker.check_loglines(loglines, "training_4.1.0/common.yaml")
    except Exception:
        pass  # what it does after running the code does not matter
    finally:
        mlp_compliance.enqueued_configs.clear()
    assert marker.read_text() == "code ran"


@needs_proc
@pytest.mark.parametrize("key,value", [
    ("submission_division", TRAVERSAL), ("submission_division", DEEP_TRAVERSAL),
    ("submission_benchmark", DEEP_TRAVERSAL), ("submission_division", "Closed"), ("submission_division", 7),
    ("submission_benchmark", "resnet"), ("submission_benchmark", ["llama2_70b_lora"]),
])
def test_a_name_off_its_allow_list_is_refused_before_the_checker(tmp_path, monkeypatch, capsys, checker_spy, key,
                                                                 value):
    root = fixture_round(tmp_path / "r")
    _edit_log(root, key, _set_value(key, value))
    monkeypatch.chdir(tmp_path)
    marker = _evil_rules(tmp_path)
    err = _refused(capsys, tmp_path, root, match=f"line ")
    assert f"{key} " in err and "refused before any checker reads it" in err
    assert not marker.exists() and checker_spy == []


@needs_proc
def test_a_second_division_line_is_refused_too(tmp_path, monkeypatch, capsys, checker_spy):
    root = fixture_round(tmp_path / "r")
    path = _log(root)
    text = path.read_text()
    evil = next(ln for ln in text.splitlines() if "submission_division" in ln).replace('"closed"',
                                                                                     json.dumps(DEEP_TRAVERSAL))
    path.write_text(text + evil + "\n")
    monkeypatch.chdir(tmp_path)
    marker = _evil_rules(tmp_path)
    _refused(capsys, tmp_path, root, match="submission_division")
    assert not marker.exists() and checker_spy == []


@needs_proc
def test_the_checker_loads_only_its_own_rule_files(tmp_path, monkeypatch):
    """The second guard: a log that reached the checker with the traversal (the allow-list bypassed)
    is refused when the checker asks for the rule file, before its code runs."""
    from trainperf.mlperf.log import read_log

    root = fixture_round(tmp_path / "r")
    _edit_log(root, "submission_division", _set_value("submission_division", DEEP_TRAVERSAL))
    monkeypatch.chdir(tmp_path)
    marker = _evil_rules(tmp_path)
    with pytest.raises(SpecError, match="points outside"):
        published.compliance_failure(read_log(_log(root), "4.1.0"), "4.1.0")
    assert not marker.exists()
    from mlperf_logging.compliance_checker import mlp_compliance
    assert mlp_compliance.enqueued_configs == []


def test_a_ruleset_not_installed_is_refused(tmp_path, capsys, checker_spy):
    root = fixture_round(tmp_path / "r")
    _refused(capsys, tmp_path, root, "--ruleset", "../../../x", match="is not a training ruleset")
    newer = fixture_round(tmp_path / "n", round_name="v9.9")
    runs, problems = read_submissions([str(newer)], "6.0.0")
    assert runs == [] and "no training ruleset 9.9.0 for round v9.9" in problems[0]
    assert checker_spy == []


# ---------------------------------------------------------------------------------------------
# 2. one line, exit 2, nothing stored


def _system_file(root: Path) -> Path:
    return root / "Acme" / "systems" / f"{SYSTEM}.json"


def _config(root: Path) -> Path:
    return root / "Acme" / "benchmarks" / BENCHMARK / "implementations" / SYSTEM / "config_DGXH200_1x8x2xtp1pp1cp2.sh"


def _replace_with(target: Path, kind: str, tmp_path: Path) -> None:
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "zero":
        target.symlink_to("/dev/zero")
    elif kind == "outside":
        outside = tmp_path / "outside" / target.name
        outside.parent.mkdir(exist_ok=True)
        outside.write_text("{}")
        target.symlink_to(outside)


@pytest.mark.parametrize("which", ["system", "config", "log"])
@pytest.mark.parametrize("kind,match", [("fifo", "not a regular file"), ("zero", "points outside"),
                                        ("outside", "points outside")])
def test_files_that_are_not_the_folders_own_regular_files(tmp_path, capsys, which, kind, match):
    root = fixture_round(tmp_path / "r")
    target = {"system": _system_file, "config": _config, "log": _log}[which](root)
    _replace_with(target, kind, tmp_path)
    started = time.monotonic()
    _refused(capsys, tmp_path, root, match=match)
    assert time.monotonic() - started < 30  # a FIFO is never opened for reading


def test_a_results_folder_linked_out_of_the_tree(tmp_path, capsys):
    root = fixture_round(tmp_path / "r")
    elsewhere = fixture_round(tmp_path / "elsewhere")
    system_dir = root / "Acme" / "results" / SYSTEM
    shutil.rmtree(system_dir)
    system_dir.symlink_to(elsewhere / "Acme" / "results" / SYSTEM)
    _refused(capsys, tmp_path, root, match="points outside")


SYSTEM_CASES = {
    "nested 100k deep": lambda s: "[" * 100_000 + "]" * 100_000,
    "a list": lambda s: json.dumps([s]),
    "system_name a list": lambda s: json.dumps({**s, "system_name": ["DGX", "H200"]}),
    "accelerator a dict": lambda s: json.dumps({**s, "accelerator_model_name": {"a": 1}}),
    "nodes inf": lambda s: json.dumps({**s, "number_of_nodes": "inf"}),
    "nodes 1e400": lambda s: json.dumps({**s, "number_of_nodes": "1e400"}),
    "nodes negative": lambda s: json.dumps({**s, "number_of_nodes": -1}),
    "gpus a list": lambda s: json.dumps({**s, "accelerators_per_node": [8]}),
    "NaN": lambda s: json.dumps(s)[:-1] + ', "x": NaN}',
    "not UTF-8": lambda s: json.dumps(s)[:-1] + ', "x": "\udcff"}',
    "truncated": lambda s: json.dumps(s)[:40],
}


@pytest.mark.parametrize("case", sorted(SYSTEM_CASES))
def test_system_descriptions_that_cannot_be_read(tmp_path, capsys, case):
    root = fixture_round(tmp_path / "r")
    path = _system_file(root)
    path.write_bytes(SYSTEM_CASES[case](json.loads(path.read_text())).encode("utf-8", "surrogateescape"))
    _refused(capsys, tmp_path, root, match="system description")


def _without(name):
    def change(rec):
        del rec[name]
        return rec
    return change


LOG_CASES = {
    "no key": ("seed", _without("key"), "no 'key'"),
    "no metadata": ("seed", _without("metadata"), "no 'metadata'"),
    "no time_ms": ("seed", _without("time_ms"), "no 'time_ms'"),
    "metadata a list": ("run_stop", lambda r: {**r, "metadata": [r["metadata"]]}, "'metadata' is a list"),
    "record a list": ("seed", lambda r: json.dumps([r]), "a list where the record"),
    "key a dict": ("seed", lambda r: {**r, "key": {"k": 1}}, "'key' is a dict"),
    "time_ms NaN": ("run_stop", lambda r: json.dumps({**r, "time_ms": float("nan")}), "'time_ms' is nan"),
    "record nested 100k deep": ("seed", lambda r: json.dumps({**r, "value": 0})[:-1] + ', "x": '
                                + "[" * 100_000 + "]" * 100_000 + "}", "characters, more than the"),
    "record nested 5k deep": ("seed", lambda r: json.dumps({**r, "value": 0})[:-1] + ', "x": '
                              + "[" * 5000 + "]" * 5000 + "}", "nested more than 16 deep"),
    "gbs NaN": ("global_batch_size", lambda r: json.dumps({**r, "value": float("nan")}), "global_batch_size is nan"),
    "gbs text": ("global_batch_size", _set_value("", "eight"), "global_batch_size is 'eight'"),
    "gbs zero": ("global_batch_size", _set_value("", 0), "at least 1"),
    "gbs fraction": ("global_batch_size", _set_value("", 8.5), "whole number"),
    "throughput 0": ("tracked_stats", _set_value("", {"throughput": 0}), "tracked_stats.throughput is 0"),
    "throughput negative": ("tracked_stats", _set_value("", {"throughput": -2.5}), "above 0"),
    "throughput inf": ("tracked_stats", lambda r: json.dumps({**r, "value": {"throughput": float("inf")}}),
                       "finite"),
    "throughput absurd": ("tracked_stats", _set_value("", {"throughput": 1e30}), "not a throughput a GPU can reach"),
    "throughput text": ("tracked_stats", _set_value("", {"throughput": "fast"}), "give a number"),
    "step time NaN": ("tracked_stats", lambda r: json.dumps({**r, "value": {"train_step_time": float("nan")}}),
                      "train_step_time is nan"),
    "bogus division": ("submission_division", _set_value("", "closd"), "submission_division 'closd'"),
    "bogus benchmark": ("submission_benchmark", _set_value("", "llama2_70b_lorax"), "submission_benchmark"),
    "org a list": ("submission_org", _set_value("", ["Acme"]), "submission_org is"),
    "stop before start": ("run_stop", lambda r: {**r, "time_ms": 1}, "comes before run_start"),
    "samples NaN": ("eval_accuracy", lambda r: json.dumps({**r, "metadata": {**r["metadata"], "samples_count":
                                                                           float("nan")}}), "samples_count"),
    "seq len huge": ("seed", lambda r: {**r, "key": "max_sequence_length", "value": 10 ** 12}, "max_sequence_length"),
}


@pytest.mark.parametrize("case", sorted(LOG_CASES))
def test_log_lines_that_cannot_be_read(tmp_path, capsys, checker_spy, case):
    key, change, match = LOG_CASES[case]
    root = fixture_round(tmp_path / "r")
    _edit_log(root, key, change)
    _refused(capsys, tmp_path, root, match=match)
    assert "check_directory" not in checker_spy


def test_a_config_with_impossible_numbers_or_lines(tmp_path, capsys):
    root = fixture_round(tmp_path / "r")
    config = _config(root)
    base = config.read_text()
    for text, match in (("export TP=inf\n", "TP=inf"), ("export CP=-2\n", "CP=-2"), ("export TP=1e400\n", "TP=1e400"),
                        ("source " + "a" * 100_000 + "\n", "line 7 is 100,007 characters")):
        config.write_text(base + text)
        started = time.monotonic()
        _refused(capsys, tmp_path, root, match=match)
        assert time.monotonic() - started < 10


def test_a_store_is_left_as_it_was(tmp_path, capsys):
    good = fixture_round(tmp_path / "good")
    db = tmp_path / "t.db"
    rc, _, err = _cli(capsys, "import", str(good), "--db", str(db))
    assert rc == 0, err
    before = db.read_bytes()
    bad = fixture_round(tmp_path / "bad", org="Acme")
    _edit_log(bad, "tracked_stats", _set_value("", {"throughput": 0}))
    rc, _, err = _cli(capsys, "import", str(bad), "--db", str(db))
    assert rc == 2 and len(err.splitlines()) == 1 and db.read_bytes() == before


# ---------------------------------------------------------------------------------------------
# 3. long lines and big logs refused before the parser


def test_a_long_line_is_refused_before_the_quadratic_parser(tmp_path, capsys, checker_spy):
    root = fixture_round(tmp_path / "r")
    _edit_log(root, "seed", lambda r: {**r, "metadata": {**r["metadata"], "pad": "x" * 200_000}})
    started = time.monotonic()
    err = _refused(capsys, tmp_path, root, match="characters, more than the 16,384 allowed")
    assert time.monotonic() - started < 5 and " line 8 is 200,1" in err  # mlperf_logging's parser: 42 s
    assert checker_spy == []


def test_a_log_over_the_size_cap_is_not_read(tmp_path, capsys):
    from trainperf.mlperf.log import MAX_LOG_BYTES

    root = fixture_round(tmp_path / "r")
    with open(_log(root), "r+b") as fh:
        fh.truncate(MAX_LOG_BYTES + 1)  # sparse: refused from its size, never read
    _refused(capsys, tmp_path, root, match=f"more than the {MAX_LOG_BYTES:,} allowed")


def test_the_reader_gives_what_mlperf_loggings_parser_gives(tmp_path):
    from mlperf_logging.compliance_checker.mlp_parser import parse_file

    from trainperf.mlperf.log import read_log

    root = fixture_round(tmp_path / "r")
    path = _log(root)
    # a prefix before the token, a line that is not JSON, a line without the token
    path.write_text("rank0: " + path.read_text() + ":::MLLOG {not json\nplain output\n")
    got = read_log(path, "4.1.0")
    loglines, errors = parse_file(str(path), ruleset="4.1.0")
    assert got.loglines == loglines and got.errors == errors and len(errors) == 1


# ---------------------------------------------------------------------------------------------
# 4. the same logs under another folder are stored once


def test_copied_logs_are_stored_once(tmp_path, capsys):
    root = fixture_round(tmp_path / "r", runs=2)
    copy = tmp_path / "copy" / "v4.1"
    shutil.copytree(root, copy)
    (copy / "Acme").rename(copy / "AcmeMirror")
    db = tmp_path / "t.db"
    rc, out, err = _cli(capsys, "import", str(root), "--db", str(db))
    assert rc == 0 and "imported 2 runs" in out, err
    rc, out, err = _cli(capsys, "import", str(copy), "--db", str(db))
    assert rc == 0 and "imported 0 runs" in out, err
    again = [line for line in out.splitlines() if "already imported" in line]
    assert again == ["2 of these logs were already imported (the same log bytes as stored runs): "
                     f"v4.1/AcmeMirror/results/{SYSTEM}/{BENCHMARK} (2)"]
    # both at once: stored once as well
    db2 = tmp_path / "t2.db"
    rc, out, err = _cli(capsys, "import", str(root), str(copy), "--db", str(db2), "--json")
    got = json.loads(out)
    assert rc == 0 and got["imported"] == 2 and got["already_stored"] == 2 and len(got["already_imported"]) == 1
    from trainperf.store.db import Store
    store = Store(db2)
    assert len(store.list_runs()) == 2
    store.close()


# ---------------------------------------------------------------------------------------------
# 5. names escaped where import prints or stores them


def test_folder_and_system_names_are_escaped(tmp_path, capsys):
    evil = "acme\x1b]0;owned\x07\x1b[2J"
    root = fixture_round(tmp_path / "r")
    org = root / "Acme"
    (org / "results" / SYSTEM).rename(org / "results" / evil)
    (org / "systems" / f"{SYSTEM}.json").rename(org / "systems" / f"{evil}.json")
    system = json.loads((org / "systems" / f"{evil}.json").read_text())
    system["system_name"] = "DGX\x1b[2J\nFORGED: imported 1000 runs"
    system["host_networking"] = "IB\x1b]8;;http://x\x07"
    (org / "systems" / f"{evil}.json").write_text(json.dumps(system))
    impl = org / "benchmarks" / BENCHMARK / "implementations"
    (impl / SYSTEM).rename(impl / "x\x1b[31m_nemo\x1b[0m")
    stray = tmp_path / "stray\x1b[2J\nFORGED"
    stray.mkdir()
    (org / "results" / "other\x1b[5m" / BENCHMARK).mkdir(parents=True)
    db = tmp_path / "t.db"
    rc, out, err = _cli(capsys, "import", str(root), str(stray), "--db", str(db))
    assert rc == 0, err
    assert "\x1b" not in out + err and "\x07" not in out + err
    assert "other\\x1b[5m/" in err and "stray\\x1b[2J\\x0aFORGED" in err  # the problems, escaped
    assert not any(line.startswith("FORGED") for line in (out + err).splitlines())
    assert "DGX\\x1b[2J\\x0aFORGED" in out
    from trainperf.store.db import Store
    store = Store(db)
    row = store.list_runs()[0]
    store.close()
    stored = row["hardware_json"] + row["software_json"] + row["engine"]
    assert "\x1b" not in stored and "\\\\x1b" in stored  # JSON of the escaped text


# ---------------------------------------------------------------------------------------------
# the good path still imports

def test_the_fixture_round_imports(tmp_path):
    runs, problems = read_submissions([str(fixture_round(tmp_path, runs=2))], "6.0.0")
    assert problems == [] and len(runs) == 2
    assert {r.row["layout"] for r in runs} == {"CP2 DP4 MBS 1"} and runs[0].engine == "nemo"
    assert runs[0].row["run_id"] != runs[1].row["run_id"] and runs[0].row["run_id"].startswith("imp-")
    assert 0.5 < runs[0].row["mfu"] < 1.0 and sys.float_info.max > runs[0].row["tokens_per_s_per_gpu"] > 2000


# ---------------------------------------------------------------------------------------------
# 6. fuzz: mutated real inputs to each reader; a one-line SpecError or a result, never anything else

FUZZ_SEED = 37
HOSTILE = [None, True, [], {}, "", "x" * 3000, "\x1b[2J\nFORGED", "../../../../etc/passwd", -1, 0, 2.5, 1e308,
           -1e308, float("nan"), float("inf"), 10 ** 30, [[[[[[[[1]]]]]]]], {"a": {"b": {"c": [1, {}]}}},
           {"throughput": 0}, {"throughput": -1}, {"throughput": float("inf")}, {"train_step_time": 1e-300},
           "closed", "open", "llama2_70b_lora", "success", "1e400", "nan", "inf", "-3", "８"]


def _seed_inputs(tmp_path: Path) -> list[Path]:
    """Round folders of real inputs: the fixture's, and NVIDIA's 8 x H200 submission (the trimmed copy)."""
    from tests.fixtures.published import one_h200_submission

    return [fixture_round(tmp_path / "seed-fixture"), one_h200_submission(tmp_path / "seed-published")]


def _mutate_json(rng, value, depth: int = 0):
    """``value`` with one node replaced, removed or added."""
    if isinstance(value, dict) and value and depth < 4 and rng.random() < 0.7:
        key = rng.choice(sorted(value))
        roll = rng.random()
        if roll < 0.2:
            return {k: v for k, v in value.items() if k != key}
        if roll < 0.3:
            return {**value, rng.choice(["x", "key", "value", "metadata", "status", "samples_count"]):
                    rng.choice(HOSTILE)}
        return {**value, key: _mutate_json(rng, value[key], depth + 1)}
    if isinstance(value, list) and value and rng.random() < 0.5:
        i = rng.randrange(len(value))
        return value[:i] + [_mutate_json(rng, value[i], depth + 1)] + value[i + 1:]
    return rng.choice(HOSTILE)


def _mutate_text(rng, text: str, json_lines: bool) -> str:
    lines = text.splitlines()
    roll = rng.random()
    if json_lines and roll < 0.55:  # a record of the log, changed as JSON
        candidates = [i for i, ln in enumerate(lines) if ln.startswith(":::MLLOG ")]
        i = rng.choice(candidates)
        rec = _mutate_json(rng, json.loads(lines[i][len(":::MLLOG "):]))
        lines[i] = ":::MLLOG " + json.dumps(rec)
    elif roll < 0.65 and lines:
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        op = rng.choice(["delete", "duplicate", "swap"])
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(j, lines[i])
        else:
            lines[i], lines[j] = lines[j], lines[i]
    elif roll < 0.75:
        return text[: rng.randrange(len(text) + 1)]
    else:  # characters replaced: brackets, quotes, digits, controls, bytes that are not UTF-8
        chars = list(text)
        for _ in range(rng.randint(1, 6)):
            chars[rng.randrange(len(chars))] = rng.choice(['"', "{", "}", "[", "]", ",", ":", "0", "9", "-", "e",
                                                          "\x00", "\x1b", "\n", "\udcff", "\\", " ", "a"])
        return "".join(chars)
    return "\n".join(lines) + "\n"


def _one_line(exc: SpecError) -> None:
    from trainperf.core.untrusted import printable

    msg = str(exc)
    assert msg and "\n" not in msg and printable(msg, limit=10 ** 6) == msg, repr(msg)


def _fuzz(tmp_path, cases: int, target, read) -> dict:
    """Run ``read`` on ``cases`` mutations of ``target(round)`` (cycling over the seed rounds)."""
    import random

    rng = random.Random(FUZZ_SEED)
    rounds = _seed_inputs(tmp_path)
    originals = {r: target(r).read_text() for r in rounds}
    outcome = {"ok": 0, "refused": 0}
    for case in range(cases):
        root = rounds[case % len(rounds)]
        path = target(root)
        text = _mutate_text(rng, originals[root], json_lines=path.suffix == ".txt")
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
        try:
            read(root, path)
            outcome["ok"] += 1
        except SpecError as exc:
            _one_line(exc)
            outcome["refused"] += 1
        except Exception as exc:  # noqa: BLE001 -- the point: nothing else may come out
            pytest.fail(f"case {case}: {type(exc).__name__}: {exc!r} from\n{text[:3000]}")
    path.write_text(originals[root])
    return outcome


def _read_log_pipeline(root: Path, path: Path) -> None:
    from trainperf.mlperf.log import check_log_names, read_log
    from trainperf.mlperf.score import run_from_log

    log = read_log(path, "4.1.0", root=root)
    check_log_names(log, [BENCHMARK])
    run = run_from_log(log)
    stats = published.tracked_stats(log.loglines, "log", log.file_lines)
    published.step_seconds_from_stats(stats, 8)
    published.step_seconds_from_blocks(log.loglines, 8, 8192)
    assert run.benchmark == BENCHMARK


def _log_of(root: Path) -> Path:
    return next(root.rglob("result_0.txt"))


def test_fuzz_log_lines(tmp_path):
    outcome = _fuzz(tmp_path, 400, _log_of, _read_log_pipeline)
    assert outcome["ok"] > 40 and outcome["refused"] > 40, outcome


def _problems_are_lines(root: Path, path: Path) -> None:
    runs, problems = read_submissions([str(root)], "6.0.0")
    for line in problems:
        assert "\n" not in line and "\x1b" not in line, line
    for r in runs:
        assert r.row["step_time_s"] > 0 and 0 < r.row["mfu"] <= published.MAX_MFU


def test_fuzz_log_lines_through_the_whole_import(tmp_path):
    outcome = _fuzz(tmp_path, 60, _log_of, _problems_are_lines)
    assert outcome["ok"] > 10 and outcome["refused"] > 5, outcome


def _system_of(root: Path) -> Path:
    return next(root.glob("*/systems/*.json"))


def _read_system(root: Path, path: Path) -> None:
    got, why = published.read_system(path, root, "where")
    assert (got is None) != (why == "")
    if got is not None:
        assert all(isinstance(got[k], str) for k in published.SYSTEM_TEXT if k in got)
        assert 1 <= got["number_of_nodes"] * got["accelerators_per_node"] <= 100_000 * 1024


def _mutated_system_json(rng, text):
    return json.dumps(_mutate_json(rng, json.loads(text)), indent=2) if rng.random() < 0.6 else None


def test_fuzz_system_json(tmp_path, monkeypatch):
    # JSON-aware mutations of the whole description most of the time, text mutations otherwise
    real_mutate = _mutate_text

    def mutate(rng, text, json_lines):
        return _mutated_system_json(rng, text) or real_mutate(rng, text, json_lines)
    monkeypatch.setattr(sys.modules[__name__], "_mutate_text", mutate)
    outcome = _fuzz(tmp_path, 300, _system_of, _read_system)
    assert outcome["ok"] > 30 and outcome["refused"] > 30, outcome


def _config_of(root: Path) -> Path:
    return next(p for p in root.rglob("config_*.sh") if "common" not in p.name)


def _read_config(root: Path, path: Path) -> None:
    org = next(p for p in root.iterdir() if p.is_dir())
    configs, commons = published.implementation_configs(org, BENCHMARK)
    config, lay, why = published.matching_config(configs, commons, SYSTEM, 8, 1, 8, 8, "NVIDIA H200", root=root)
    assert (config is None) == bool(why) and "\n" not in why
    if config is not None:
        assert lay["dp"] >= 1 and lay["tp"] >= 1 and published.layout_label(lay)


CONFIG_VALUES = ["inf", "-2", "1e400", "nan", "0", "3", "", "$((1/0))", "x" * 5000, "99999999999", "2.5", "'4'",
                 '"${TP:=8}"', "\x1b[2J"]


def test_fuzz_config_scripts(tmp_path, monkeypatch):
    real_mutate = _mutate_text

    def mutate(rng, text, json_lines):  # a variable's value, a sourced file or a long line most of the time
        lines = text.splitlines()
        roll = rng.random()
        if roll < 0.5:
            exports = [i for i, ln in enumerate(lines) if ln.startswith("export ")] or [0]
            i = rng.choice(exports)
            name = rng.choice(["TP", "CP", "PP", "MINIBS", "MBS", "DGXNNODES", "DGXNGPU", "SP", "FP8",
                               lines[i].split("=")[0].removeprefix("export ")])
            lines[i] = f"export {name}={rng.choice(CONFIG_VALUES)}"
        elif roll < 0.6:
            lines.insert(rng.randrange(len(lines) + 1), "source $(dirname ${BASH_SOURCE[0]})/" + rng.choice(
                ["config_common.sh", "../../../../etc/passwd.sh", "..sh", "missing.sh",
                 "config_DGXH200_1x8x2xtp1pp1cp2.sh"]))
        elif roll < 0.65:
            lines.append("export X=" + "y" * rng.choice([100, 5000]))
        else:
            return real_mutate(rng, text, json_lines)
        return "\n".join(lines) + "\n"
    monkeypatch.setattr(sys.modules[__name__], "_mutate_text", mutate)
    outcome = _fuzz(tmp_path, 300, _config_of, _read_config)
    assert outcome["ok"] > 30 and outcome["refused"] > 3, outcome


@needs_proc
def test_score_refuses_the_traversal_log_before_its_checkers(tmp_path, monkeypatch, capsys, checker_spy):
    """`score` reads logs through the same reader: the traversal never reaches the RCP checker."""
    root = fixture_round(tmp_path / "r")
    _edit_log(root, "submission_division", _set_value("", DEEP_TRAVERSAL))
    monkeypatch.chdir(tmp_path)
    marker = _evil_rules(tmp_path)
    rc, out, err = _cli(capsys, "score", str(_log(root)), "--ruleset", "4.1.0")
    assert rc == 2 and len(err.splitlines()) == 1 and "is not one of closed, open" in err, err
    assert not marker.exists() and checker_spy == []
