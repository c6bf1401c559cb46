"""bench/throughput_matrix.py and the side-by-side scripts' shared pieces, on CPU: which cell runs
first, how a cell that does not fit is shown, and that one side's OOM leaves the other side's figures."""

from __future__ import annotations

from bench import throughput_matrix


FAKE_CELL = """
import argparse, json, sys, time
ap = argparse.ArgumentParser()
for a in ("--shape", "--seq", "--recompute", "--json", "--steps", "--warmup"):
    ap.add_argument(a)
ap.add_argument("--compile", action="store_true")
a = ap.parse_args()
if a.shape == "13b":
    time.sleep(60)  # overruns its share
print("x" * 200_000)  # more than a pipe holds
r = {"bench": "pretrain", "shape": a.shape, "seq": int(a.seq), "recompute": a.recompute, "ratio": 2.0,
     "trainperf": {"tokens_per_s": 1000.0, "mfu": 0.5, "peak_gib": 10.0}}
open(a.json, "a").write(json.dumps(r) + "\\n")
print("trainperf done: 1,000 tokens/s")
"""


def test_grid_survives_a_chatty_cell_and_kills_one_that_overruns(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "fake_cell.py"
    fake.write_text(FAKE_CELL)
    monkeypatch.setitem(throughput_matrix.SCRIPTS, "pretrain", fake)
    out = tmp_path / "grid.jsonl"
    missed = throughput_matrix.run_grid("pretrain", [("13b", 4096, "none"), ("1b", 4096, "none")], ["0", "1"], out,
                                        [], deadline_s=600, cell_timeout_s=8)
    assert missed == ["13b seq 4096 recompute none: killed after its time share"]
    assert "trainperf done" in capsys.readouterr().out
    rows = throughput_matrix.table([str(out)]).splitlines()
    assert len(rows) == 3 and rows[2].startswith("| pretrain | 1b |")  # kind from the line, no baseline needed
