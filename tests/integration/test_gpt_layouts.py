"""The GPT family (model/gpt.py) computes the same training under the engine's layouts as in one
process (gloo, fp32): the first 3 losses (and the eval after step 2) within 1e-4 of a shared reference
run (in this process). Two runs cover every gradient path the family adds, at one 4-process run:

* PP x TP + SP (4 processes): the vocabulary-parallel tied embedding, the TP plan of the GPT block and
  SP's scatter of word + position embeddings, and the tied embedding split over the first and last
  pipeline stage, whose TP-sharded gradients sum across the pipeline;
* FSDP over 2 processes, run on to mini-gpt-pretrain's target: the tied embedding kept in FSDP's root
  group, and the family learning end to end (under a minute).

(The full table of CPU layouts, interleaved virtual stages, FSDP x TP + SP and PP x FSDP among them, is
in docs/GPT.md; CP needs CUDA.)"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.fixtures.cli import run_cli

pytestmark = pytest.mark.slow

# the model, seed and data order every run shares (the first steps' rate is the warm-up's, whatever max_steps)
SHARED = ["train.log_every=1", "train.seed=7", "hardware.device=cpu"]
COMMON = SHARED + ["train.max_steps=3", "eval.every_samples=32", "eval.skip_first=0"]
LAYOUTS = {
    "pp_x_tp_sp": (4, ["parallel.pp=2", "parallel.pp_schedule=1F1B", "parallel.tp=2", "parallel.sp=true",
                       "parallel.dp_shard=1"]),
}


def run_gpt(tmp: Path, nproc: int, overrides: list[str], timeout: int = 300) -> tuple[int, dict]:
    sets = [x for o in overrides for x in ("--set", o)]
    out = run_cli("run", "mini-gpt-pretrain", "--nproc-per-node", str(nproc), "--json", *sets,
                  "--db", str(tmp / "t.db"), "--out", str(tmp / "runs"), cwd=tmp, timeout=timeout)
    summary = json.loads(out.stdout) if out.stdout.strip().startswith("{") else {"stderr": out.stderr[-3000:]}
    summary["warnings"] = [line for line in out.stderr.splitlines() if "Warning:" in line or "]:W" in line]
    if "run_id" in summary:
        with sqlite3.connect(tmp / "t.db") as c:
            summary["losses"] = [r[0] for r in c.execute(
                "SELECT loss FROM steps WHERE run_id = ? ORDER BY step", (summary["run_id"],))]
    return out.returncode, summary


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The one-process run, in this process (no interpreter to start)."""
    from trainperf.runner import local

    tmp = tmp_path_factory.mktemp("ref")
    spec, _ = local.prepare("mini-gpt-pretrain", None, COMMON, 1)
    s = local.launch(spec, str(tmp / "runs"), str(tmp / "t.db"), 1, progress=False)
    assert s["status"] != "success" and "not reached" in (s.get("status_reason") or ""), s
    with sqlite3.connect(tmp / "t.db") as c:
        s["losses"] = [r[0] for r in c.execute("SELECT loss FROM steps WHERE run_id = ? ORDER BY step", (s["run_id"],))]
    assert len(s["losses"]) == 3 and s["losses"][0] > s["losses"][2]  # it learns
    return s


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_gpt_layout_matches_single_process(tmp_path, reference, layout):
    nproc, overrides = LAYOUTS[layout]
    rc, run = run_gpt(tmp_path, nproc, COMMON + overrides)
    assert rc == 1 and run["world_size"] == nproc, run
    assert not run["warnings"], run["warnings"][:4]  # torch warns of nothing our layout code does
    diff = max(abs(a - b) for a, b in zip(run["losses"], reference["losses"]))
    assert len(run["losses"]) == 3 and diff < 1e-4, (layout, run["losses"], reference["losses"])
    assert abs(run["evals"][0]["eval_loss"] - reference["evals"][0]["eval_loss"]) < 1e-4


def test_mini_gpt_pretrain_under_fsdp_matches_then_reaches_its_target(tmp_path, reference):
    rc, s = run_gpt(tmp_path, 2, SHARED + ["parallel.dp_shard=2"])
    assert rc == 0 and s["status"] == "success", s
    diff = max(abs(a - b) for a, b in zip(s["losses"][:3], reference["losses"]))
    assert diff < 1e-4, (s["losses"][:3], reference["losses"])
    assert s["final_eval_loss"] <= s["target"] and s["time_to_train_s"] < 60
