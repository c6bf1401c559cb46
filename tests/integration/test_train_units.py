"""Unit tests of the training pieces that decide the reported numbers: the LR schedule, gradient
clipping, the train and eval loss definitions (eval checked by hand with math.log), the data
sampler's layout invariance, the FLOP/MFU accounting and the Markov source's optimal loss."""

from __future__ import annotations


def test_a_run_whose_eval_loss_turns_nan_fails_as_diverged_and_is_stored(tmp_path):
    """A nan eval loss ends the run at once as failed ("diverged"), with its row and evals stored (the
    store's eval_loss is NOT NULL: the nan eval is not written as a row) and the summary valid JSON."""
    import json
    import sqlite3
    import subprocess

    from tests.fixtures.cli import trainperf_cmd

    out = subprocess.run(trainperf_cmd("run", "mini-pretrain", "--json", "--set", "hardware.device=cpu",
                                       "--set", "train.lr=1e30", "--set", "train.grad_clip=0",
                                       "--set", "eval.every_samples=16", "--set", "train.max_steps=50",
                                       "--db", str(tmp_path / "t.db"), "--out", str(tmp_path / "runs")),
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr[-2000:]
    summary = json.loads(out.stdout)
    assert summary["status"] == "failed" and "diverged" in summary["status_reason"]
    assert summary["final_eval_loss"] is None
    with sqlite3.connect(tmp_path / "t.db") as c:
        status, reason, steps = c.execute("SELECT status, status_reason, steps FROM runs").fetchone()
    assert status == "failed" and "nan" in reason and steps < 50  # stopped at the nan, not at max_steps
