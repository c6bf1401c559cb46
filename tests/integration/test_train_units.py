"""The training loop end to end on CPU: a diverging run stored as failed, and the chunked loss
training like the unchunked one (whole runs, through the launcher)."""

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


def test_chunked_loss_run_matches_unchunked_run(tmp_path):
    from trainperf.runner import local

    losses = []
    for chunk in (0, 100):
        spec, _ = local.prepare("mini-lora", None, ["hardware.device=cpu", "train.seed=3", "train.max_steps=4",
                                                    "train.log_every=1", f"train.loss_chunk_tokens={chunk}",
                                                    "eval.every_samples=100000"], 1)
        s = local.launch(spec, str(tmp_path / "runs"), str(tmp_path / "t.db"), 1, progress=False)
        import sqlite3

        with sqlite3.connect(tmp_path / "t.db") as c:
            losses.append([r[0] for r in c.execute("SELECT loss FROM steps WHERE run_id=? ORDER BY step", (s["run_id"],))])
    assert len(losses[0]) == 4
    assert max(abs(a - b) for a, b in zip(*losses)) < 1e-5
