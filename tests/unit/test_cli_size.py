"""Each command-line module parses options, calls the package below it and prints: none grows past
200 lines (policy belongs in plan/, preflight/, runner/)."""

from __future__ import annotations

from pathlib import Path

CLI = Path(__file__).resolve().parents[2] / "src" / "trainperf" / "cli"
MAX_LINES = 200


def test_no_cli_module_holds_more_than_200_lines():
    sizes = {p.name: len(p.read_text().splitlines()) for p in CLI.glob("*.py")}
    assert len(sizes) > 10
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}
