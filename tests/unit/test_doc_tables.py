"""bench/doc_tables.py: the reference pages' tables are current, rewriting touches only the marked
text, running twice changes nothing, and --check fails on a stale doc."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import doc_tables as dt
from trainperf.core.errors import SpecError

ROOT = Path(__file__).resolve().parents[2]


def _copy_docs(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    for doc in dt.DOCS:
        shutil.copy(ROOT / doc, tmp_path / doc)
    return tmp_path


def test_repository_docs_are_current(capsys):
    assert dt.main(["--check"]) == 0, capsys.readouterr().out


def test_every_table_is_marked_in_a_doc():
    text = "".join((ROOT / doc).read_text(encoding="utf-8") for doc in dt.DOCS)
    for name in dt.TABLES:
        assert f"<!-- table:{name} begin -->" in text and f"<!-- table:{name} end -->" in text


def test_stale_table_is_found_and_rewritten_once(tmp_path, capsys):
    root = _copy_docs(tmp_path)
    doc = root / "docs/PERFORMANCE.md"
    good = doc.read_text(encoding="utf-8")
    head, rest = good.split("<!-- table:performance-current begin -->\n", 1)
    stale = head + "<!-- table:performance-current begin -->\n| old |\n" + rest.split("\n", 3)[3]
    doc.write_text(stale, encoding="utf-8")
    assert dt.main(["--check", "--root", str(root)]) == 1
    assert "docs/PERFORMANCE.md" in capsys.readouterr().out
    assert doc.read_text(encoding="utf-8") == stale  # --check writes nothing
    assert dt.main(["--root", str(root)]) == 0
    assert doc.read_text(encoding="utf-8") == good
    assert dt.run(root, check=False) == []  # a second run changes nothing
    assert (root / "docs/PLANNER.md").read_text(encoding="utf-8") == (ROOT / "docs/PLANNER.md").read_text(encoding="utf-8")


def test_only_marked_text_changes():
    text = "before\n<!-- table:performance-targets begin -->\nstale\n<!-- table:performance-targets end -->\nafter | x\n"
    out = dt.rewrite(text, "doc")
    assert out.startswith("before\n<!-- table:performance-targets begin -->\n| target | best measured | status |\n")
    assert out.endswith("<!-- table:performance-targets end -->\nafter | x\n")
    assert dt.rewrite(out, "doc") == out


def test_latest_line_of_each_id_wins_in_first_seen_order():
    rows = [{"id": "a", "date": "2026-11-30", "v": 1}, {"id": "b", "date": "2026-12-01", "v": 2},
            {"id": "a", "date": "2026-12-03", "v": 3}, {"id": "b", "date": "2026-11-01", "v": 4},
            {"id": "a", "date": "2026-12-03", "v": 5}]
    assert [r["v"] for r in dt.latest(rows)] == [5, 2]


def test_cells_escape_bars_and_refuse_newlines():
    assert dt.cell("median |error|") == "median \\|error\\|"
    assert dt.cell(None) == ""
    with pytest.raises(SpecError, match="newline"):
        dt.cell("two\nlines")


def test_bad_data_line_is_a_one_line_spec_error(tmp_path):
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"id": "a"}\n{not json\n', encoding="utf-8")
    with pytest.raises(SpecError, match=r"x.jsonl line 2: not JSON"):
        dt.read_lines(bad)
    bad.write_text('["a"]\n', encoding="utf-8")
    with pytest.raises(SpecError, match="string 'id'"):
        dt.read_lines(bad)


def test_unknown_table_exits_2_with_one_line(tmp_path):
    root = _copy_docs(tmp_path)
    doc = root / "docs/PLANNER.md"
    before = doc.read_text(encoding="utf-8") + "<!-- table:nope begin -->\n<!-- table:nope end -->\n"
    doc.write_text(before, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(ROOT / "bench/doc_tables.py"), "--root", str(root)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "unknown table 'nope'" in proc.stderr
    assert doc.read_text(encoding="utf-8") == before


def test_every_figure_keeps_its_date_hardware_and_command(tmp_path, monkeypatch):
    for name in ("performance.jsonl", "planner.jsonl"):
        assert dt.figure_lines(name)  # the repository's lines all pass
    table = dt.figures_table("performance.jsonl")()
    assert "2026-12-03 (13b748e)" in table and "4c58eaa" not in table  # the GPU suite's later line wins
    (tmp_path / "f.jsonl").write_text('{"id": "x", "metric": "m", "value": "1 s", "date": "Dec 3", '
                                      '"hardware": "1x H200", "command": "c"}\n'
                                      '{"id": "y", "metric": "m", "value": "1 s", "date": "2026-12-03"}\n',
                                      encoding="utf-8")
    monkeypatch.setattr(dt, "DATA", tmp_path)
    with pytest.raises(SpecError, match="date 'Dec 3' is not YYYY-MM-DD"):
        dt.figure_lines("f.jsonl")
    (tmp_path / "f.jsonl").write_text('{"id": "y", "metric": "m", "value": "1 s", "date": "2026-12-03"}\n',
                                      encoding="utf-8")
    with pytest.raises(SpecError, match="needs non-empty hardware, command"):
        dt.figure_lines("f.jsonl")
