"""A disk that fills while a run trains: one line and a failed row (when the store can still be written),
never a traceback; the run's summary is printed whatever could not be written."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

# progress.json is written after every step: the first write after step 1 finds the disk full
_DISK_FILLS_AFTER_STEP_1 = """
import errno, sys
from trainperf.train import loop
real, calls = loop.atomic_write_text, []
def write(path, text):
    calls.append(path)
    if len(calls) > 1:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    return real(path, text)
loop.atomic_write_text = write
from trainperf.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_disk_that_fills_mid_run_ends_in_one_line_and_a_failed_row(tmp_path):
    db = tmp_path / "t.db"
    proc = subprocess.run([sys.executable, "-c", _DISK_FILLS_AFTER_STEP_1, "run", "mini-pretrain", "--set",
                           "hardware.device=cpu", "--set", "train.max_steps=5", "--set", "eval.every_samples=100000",
                           "--db", str(db), "--out", str(tmp_path / "runs")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    with sqlite3.connect(db) as c:
        status, reason, out_dir = c.execute("SELECT status, status_reason, out_dir FROM runs").fetchone()
    assert status == "failed" and reason.startswith("the disk is full") and "progress.json" in reason, reason
    assert "FAILED mini-pretrain run" in proc.stdout and "the disk is full" in proc.stdout  # the summary
