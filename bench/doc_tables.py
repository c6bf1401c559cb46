"""Write the tables of the reference pages (docs/PERFORMANCE.md, docs/PLANNER.md) from bench/data/.

Each table sits between ``<!-- table:NAME begin -->`` and ``<!-- table:NAME end -->`` in a doc; only
the text between the markers is rewritten, so running this twice changes nothing.

    python bench/doc_tables.py            # rewrite the tables in place
    python bench/doc_tables.py --check    # exit 1 (naming the docs) when a table is out of date

The figures come from dated JSON lines (``bench/data/performance.jsonl``, ``planner.jsonl``): one
object per measurement with ``id`` (the metric's name), ``metric`` (what was measured), ``value``
(the figure with its units), ``date``, ``hardware``, ``command``, and optionally ``commit`` (shown
beside the date) and ``note``. A table shows the latest measurement of each id (by ``date``; the later
line wins a tie), in the order the ids first appear. A new measurement is a new line with the same
id: the old line stays as history. ``performance_targets.jsonl`` holds ``id``, ``target``, ``best``
and ``status`` per goal, the latest line of each id shown the same way.
The dated write-ups behind them are kept verbatim in ``bench/data/PERFORMANCE_LOG.md`` and
``bench/data/PLANNER_LOG.md``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from trainperf.core.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, SpecError

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench" / "data"
DOCS = ("docs/PERFORMANCE.md", "docs/PLANNER.md")
MARKER = re.compile(r"<!-- table:([a-z0-9-]+) begin -->\n(.*?)<!-- table:\1 end -->", re.S)


def read_lines(path: Path) -> list[dict]:
    """The JSON objects of a .jsonl file, one a line; a bad line is a SpecError naming it."""
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpecError(f"{path.name} line {n}: not JSON ({exc.msg}); one JSON object a line") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("id"), str):
            raise SpecError(f"{path.name} line {n}: needs a JSON object with a string 'id'")
        out.append(obj)
    return out


def latest(rows: list[dict]) -> list[dict]:
    """The latest row of each id (by date, then by position), in the order the ids first appear."""
    best: dict[str, dict] = {}
    for row in rows:
        old = best.get(row["id"])
        if old is None or str(row.get("date", "")) >= str(old.get("date", "")):
            best[row["id"]] = row
    return list(best.values())


def cell(value: object) -> str:
    """One markdown table cell: a '|' inside is escaped; a newline is refused (it would end the row)."""
    text = "" if value is None else str(value)
    if "\n" in text:
        raise SpecError(f"table cell {text[:40]!r}... holds a newline; cells are one line")
    return text.replace("|", "\\|")


def markdown(header: list[str], align: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def dated(row: dict) -> str:
    """The date cell: the date, and the commit when the line names one."""
    return f"{row['date']} ({row['commit']})" if row.get("commit") else str(row["date"])


FIGURE_FIELDS = ("metric", "value", "date", "hardware", "command")


def figure_lines(name: str) -> list[dict]:
    """A figures file's lines; each must carry what the table shows (a figure never loses its date)."""
    rows = read_lines(DATA / name)
    for n, row in enumerate(rows, 1):
        missing = [f for f in FIGURE_FIELDS if not isinstance(row.get(f), str) or not row[f].strip()]
        if missing:
            raise SpecError(f"{name} entry {n} ({row['id']}): needs non-empty {', '.join(missing)}")
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", row["date"]):
            raise SpecError(f"{name} entry {n} ({row['id']}): date {row['date']!r} is not YYYY-MM-DD")
    return rows


def figures_table(name: str) -> Callable[[], str]:
    def render() -> str:
        rows = latest(figure_lines(name))
        return markdown(["figure", "value", "date", "hardware", "command"], ["---"] * 5,
                        [[r["metric"], r["value"], dated(r), r["hardware"], r["command"]] for r in rows])
    return render


def targets_table() -> str:
    rows = latest(read_lines(DATA / "performance_targets.jsonl"))
    return markdown(["target", "best measured", "status"], ["---"] * 3,
                    [[r["target"], r["best"], r["status"]] for r in rows])


def pct(x: float) -> str:
    return f"{x * 100:+.1f}%".replace("-", "−")


def planner_cases_table() -> str:
    """The out-of-sample layouts as `bench/planner_accuracy.py` stored them (prediction made before each run)."""
    data = json.loads((DATA / "h200x2_2026-11-30_planner_accuracy.json").read_text(encoding="utf-8"))
    rows = [[c["name"], c["gpus"], f"{c['step_s']:.3f}", f"{c['pred_step_s']:.3f}", pct(c["step_err"]),
             f"{c['peak_gib']:.1f} → {c['pred_peak_gib']:.1f}", pct(c["mem_err"]),
             f"{c['tokens_per_s_per_gpu']:,.0f}", f"{c['mfu'] * 100:.1f}%"] for c in data["cases"]]
    rows.append(["**median / max |error|**", "", "", "",
                 f"{data['median_abs_step_err'] * 100:.1f}% / {data['max_abs_step_err'] * 100:.1f}%", "",
                 f"{data['median_abs_mem_err'] * 100:.1f}% / {data['max_abs_mem_err'] * 100:.1f}%",
                 f"Spearman {data['spearman_throughput']:.3f}", ""])
    return markdown(["case", "GPUs", "step s measured", "predicted before the run", "error",
                     "peak GiB measured → predicted", "error", "tokens/s/GPU", "MFU"],
                    ["---", "---:", "---:", "---:", "---:", "---", "---:", "---:", "---:"], rows)


@dataclass(frozen=True)
class Table:
    name: str
    render: Callable[[], str]


TABLES = {t.name: t for t in (
    Table("performance-current", figures_table("performance.jsonl")),
    Table("performance-targets", targets_table),
    Table("planner-current", figures_table("planner.jsonl")),
    Table("planner-accuracy-cases", planner_cases_table),
)}


def rewrite(text: str, doc: str) -> str:
    """``text`` with every marked table regenerated; an unknown table name is a SpecError."""
    def sub(m: re.Match) -> str:
        table = TABLES.get(m.group(1))
        if table is None:
            raise SpecError(f"{doc}: unknown table {m.group(1)!r}; known: {', '.join(sorted(TABLES))}")
        return f"<!-- table:{m.group(1)} begin -->\n{table.render()}<!-- table:{m.group(1)} end -->"
    return MARKER.sub(sub, text)


def run(root: Path, check: bool) -> list[str]:
    """The docs under ``root`` whose tables are (or were, before rewriting) out of date."""
    changed = {}
    for doc in DOCS:  # every doc rendered before any is written: a bad table leaves all as they were
        old = (root / doc).read_text(encoding="utf-8")
        new = rewrite(old, doc)
        if new != old:
            changed[doc] = new
    if not check:
        for doc, new in changed.items():
            (root / doc).write_text(new, encoding="utf-8")
    return list(changed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when a doc's tables are out of date")
    ap.add_argument("--root", type=Path, default=ROOT, help="repository root holding docs/ (default: this one)")
    args = ap.parse_args(argv)
    try:
        stale = run(args.root, args.check)
    except (SpecError, OSError, KeyError, json.JSONDecodeError) as exc:
        print(f"doc_tables: {exc}".splitlines()[0], file=sys.stderr)
        return EXIT_BAD_INPUT
    for doc in stale:
        print(f"{doc}: tables out of date; run python bench/doc_tables.py" if args.check else f"{doc}: rewritten")
    return EXIT_FAILED if args.check and stale else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
