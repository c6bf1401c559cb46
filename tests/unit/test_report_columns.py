"""The runs listing's columns are defined once (report/columns.py): the terminal table, `report --json`
and the page's runs table read the same definitions."""

from __future__ import annotations

import dataclasses
import io

from rich.console import Console

from trainperf.report import columns
from trainperf.report.columns import COLUMNS, DERIVED_FIELDS, KEEP_ORDER, PAGE, STORED_FIELDS, TERMINAL, json_row

RUN = {"run_id": "r1", "workload": "mini-lora", "status": "success", "world_size": 2, "layout": "dp_shard=2",
       "spec_json": "{}", "time_to_train_s": 120.0, "tokens_per_s_per_gpu": 1234.5, "mfu": 0.42, "target": 3.3,
       "final_eval_loss": 3.2, "division": "open", "comparable": 0, "purpose": "run"}


def test_every_view_names_defined_columns_and_json_carries_what_they_show():
    assert set(TERMINAL) <= set(COLUMNS) and set(PAGE) <= set(COLUMNS)
    assert sorted(KEEP_ORDER) == sorted(TERMINAL)  # every terminal column has a rank for narrow terminals
    assert all(COLUMNS[c].cell for c in TERMINAL) and all(COLUMNS[c].page for c in PAGE)
    row = json_row(RUN)
    assert list(row) == list(dict.fromkeys([*STORED_FIELDS, *DERIVED_FIELDS]))
    shown = {f for c in {*TERMINAL, *PAGE} for f in COLUMNS[c].fields}
    assert shown <= set(row), shown - set(row)  # --json has every field a table shows


def test_a_header_changed_in_the_definition_changes_the_terminal_and_the_page(monkeypatch):
    from trainperf.report import html, table

    changed = dict(COLUMNS, gpus=dataclasses.replace(COLUMNS["gpus"], header="ranks"))
    monkeypatch.setattr(columns, "COLUMNS", changed)
    buf = io.StringIO()
    table.print_table([RUN], console=Console(file=buf, width=250), wide=True)
    assert "ranks" in buf.getvalue() and "GPUs" not in buf.getvalue()
    page = html._runs_section([RUN], 1)
    assert "<th>ranks</th>" in page and "<th>GPUs</th>" not in page
