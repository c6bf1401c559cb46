"""The GPT family (model/gpt.py) computes the same training under the engine's layouts as in one
process (gloo, fp32): the first 3 losses and the eval after step 2 within 1e-4. One 4-layer reference
run is shared; the two layouts below cover FSDP x TP + SP with the tied, vocabulary-padded embedding
on one stage, and interleaved PP x TP + SP, where the embedding and its tied copy live on different
stages and sum their gradients. (The full table of CPU layouts is in docs/; CP needs CUDA.)"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.cli import trainperf_cmd

pytestmark = pytest.mark.slow

COMMON = ["train.max_steps=3", "train.log_every=1", "train.seed=7", "eval.every_samples=32", "eval.skip_first=0",
          "hardware.device=cpu", "model.num_layers=4", "train.micro_batch_size=4"]
LAYOUTS = {
    "fsdp_x_tp_sp": (4, ["parallel.tp=2", "parallel.sp=true", "parallel.dp_shard=2"]),
    "pp_interleaved_x_tp_sp": (4, ["parallel.pp=2", "parallel.pp_schedule=Interleaved1F1B", "parallel.tp=2",
                                   "parallel.sp=true", "parallel.dp_shard=1"]),
}


def run_gpt(tmp: Path, nproc: int, overrides: list[str], timeout: int = 300) -> tuple[int, dict]:
    sets = [x for o in overrides for x in ("--set", o)]
    out = subprocess.run(trainperf_cmd("run", "mini-gpt-pretrain", "--nproc-per-node", str(nproc), "--json", *sets,
                                       "--db", str(tmp / "t.db"), "--out", str(tmp / "runs")),
                         cwd=tmp, capture_output=True, text=True, timeout=timeout)
    summary = json.loads(out.stdout) if out.stdout.strip().startswith("{") else {"stderr": out.stderr[-3000:]}
    if "run_id" in summary:
        with sqlite3.connect(tmp / "t.db") as c:
            summary["losses"] = [r[0] for r in c.execute(
                "SELECT loss FROM steps WHERE run_id = ? ORDER BY step", (summary["run_id"],))]
    return out.returncode, summary


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    rc, s = run_gpt(tmp_path_factory.mktemp("ref"), 1, COMMON)
    assert rc == 1 and "not reached" in (s.get("status_reason") or ""), s
    assert len(s["losses"]) == 3 and s["losses"][0] > s["losses"][2]  # it learns
    return s


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_gpt_layout_matches_single_process(tmp_path, reference, layout):
    nproc, overrides = LAYOUTS[layout]
    rc, run = run_gpt(tmp_path, nproc, COMMON + overrides)
    assert rc == 1 and run["world_size"] == nproc, run
    diff = max(abs(a - b) for a, b in zip(run["losses"], reference["losses"]))
    assert len(run["losses"]) == 3 and diff < 1e-4, (layout, run["losses"], reference["losses"])
    assert abs(run["evals"][0]["eval_loss"] - reference["evals"][0]["eval_loss"]) < 1e-4


def test_mini_gpt_pretrain_reaches_its_target_on_two_processes(tmp_path):
    rc, s = run_gpt(tmp_path, 2, ["hardware.device=cpu", "parallel.dp_shard=2"])
    assert rc == 0 and s["status"] == "success", s
    assert s["final_eval_loss"] <= s["target"] and s["time_to_train_s"] < 60
