"""The GPT family (model/gpt.py) computes the same training under the engine's layouts as in one
process (gloo, fp32): the first 3 losses (and the eval after step 2) within 1e-4 of a reference run
in this process, under every CPU layout the Llama family is checked under (tests/integration/test_layouts.py):
HSDP, TP, TP + SP, FSDP x TP + SP, GPipe, PP x FSDP, PP x TP + SP, interleaved virtual stages, and FSDP
run on to mini-gpt-pretrain's target. What the family adds is on these paths: the vocabulary-parallel
tied embedding, the TP plan of the GPT block, SP's scatter of word + position embeddings, and the tied
embedding split over the first and last pipeline stage, whose (TP-sharded) gradients sum across the
pipeline. No layout may make torch warn. CP needs CUDA (tests/gpu)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.fixtures.cli import run_cli, warning_lines

pytestmark = pytest.mark.slow

# the model, seed and data order every run shares (the first steps' rate is the warm-up's, whatever max_steps)
SHARED = ["train.log_every=1", "train.seed=7", "hardware.device=cpu"]
COMMON = SHARED + ["train.max_steps=3", "eval.every_samples=32", "eval.skip_first=0"]
LAYOUTS = {  # FSDP alone: the run to the target below
    "hsdp": (4, ["parallel.dp_replicate=2", "parallel.dp_shard=2", "train.micro_batch_size=4"]),
    "tp": (2, ["parallel.tp=2", "parallel.dp_shard=1"]),
    "tp_sp": (2, ["parallel.tp=2", "parallel.sp=true", "parallel.dp_shard=1"]),
    "fsdp_x_tp_sp": (4, ["parallel.tp=2", "parallel.sp=true", "parallel.dp_shard=2"]),
    "pp_gpipe": (2, ["parallel.pp=2", "parallel.pp_schedule=GPipe", "parallel.dp_shard=1"]),
    "pp_x_fsdp": (4, ["parallel.pp=2", "parallel.pp_schedule=1F1B", "parallel.dp_shard=2", "train.micro_batch_size=4"]),
    "pp_x_tp_sp": (4, ["parallel.pp=2", "parallel.pp_schedule=1F1B", "parallel.tp=2", "parallel.sp=true",
                       "parallel.dp_shard=1"]),
}


def run_gpt(tmp: Path, nproc: int, overrides: list[str], timeout: int = 300) -> tuple[int, dict]:
    sets = [x for o in overrides for x in ("--set", o)]
    out = run_cli("run", "mini-gpt-pretrain", "--nproc-per-node", str(nproc), "--json", *sets,
                  "--db", str(tmp / "t.db"), "--out", str(tmp / "runs"), cwd=tmp, timeout=timeout)
    summary = json.loads(out.stdout) if out.stdout.strip().startswith("{") else {"stderr": out.stderr[-3000:]}
    summary["warnings"] = warning_lines(out.stderr)
    if "run_id" in summary:
        with sqlite3.connect(tmp / "t.db") as c:
            summary["losses"] = [r[0] for r in c.execute(
                "SELECT loss FROM steps WHERE run_id = ? ORDER BY step", (summary["run_id"],))]
    return out.returncode, summary


def one_process_run(tmp: Path, overrides: list[str]) -> dict:
    """The one-process run, in this process (no interpreter to start)."""
    from trainperf.runner import local

    spec, _ = local.prepare("mini-gpt-pretrain", None, overrides, 1)
    s = local.launch(spec, str(tmp / "runs"), str(tmp / "t.db"), 1, progress=False)
    assert s["status"] != "success" and "not reached" in (s.get("status_reason") or ""), s
    with sqlite3.connect(tmp / "t.db") as c:
        s["losses"] = [r[0] for r in c.execute("SELECT loss FROM steps WHERE run_id = ? ORDER BY step", (s["run_id"],))]
    assert len(s["losses"]) == 3 and s["losses"][0] > s["losses"][2]  # it learns
    return s


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return one_process_run(tmp_path_factory.mktemp("ref"), COMMON)


def assert_same_training(run: dict, ref: dict, layout: str) -> None:
    diff = max(abs(a - b) for a, b in zip(run["losses"], ref["losses"]))
    assert len(run["losses"]) == 3 and diff < 1e-4, (layout, run["losses"], ref["losses"])
    assert abs(run["evals"][0]["eval_loss"] - ref["evals"][0]["eval_loss"]) < 1e-4


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_gpt_layout_matches_single_process(tmp_path, reference, layout):
    nproc, overrides = LAYOUTS[layout]
    rc, run = run_gpt(tmp_path, nproc, COMMON + overrides)
    assert rc == 1 and run["world_size"] == nproc, run
    assert not run["warnings"], run["warnings"][:4]  # torch warns of nothing our layout code does
    assert_same_training(run, reference, layout)


def test_interleaved_virtual_stages(tmp_path):
    """Two virtual stages per rank: 4 layers over 2 ranks, the tied embedding on stages 0 and 3."""
    four = ["model.num_layers=4", "train.micro_batch_size=4"]
    ref = one_process_run(tmp_path / "ref", COMMON + four)
    rc, run = run_gpt(tmp_path, 2, COMMON + four + ["parallel.pp=2", "parallel.pp_schedule=Interleaved1F1B",
                                                     "parallel.dp_shard=1"])
    assert rc == 1 and "pp_schedule=Interleaved1F1B" in run["layout"] and not run["warnings"], run
    assert_same_training(run, ref, "interleaved")


def test_mini_gpt_pretrain_under_fsdp_matches_then_reaches_its_target(tmp_path, reference):
    rc, s = run_gpt(tmp_path, 2, SHARED + ["parallel.dp_shard=2"])
    assert rc == 0 and s["status"] == "success", s
    diff = max(abs(a - b) for a, b in zip(s["losses"][:3], reference["losses"]))
    assert diff < 1e-4, (s["losses"][:3], reference["losses"])
    assert s["final_eval_loss"] <= s["target"] and s["time_to_train_s"] < 60
