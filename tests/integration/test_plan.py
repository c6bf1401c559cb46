"""The planner's cost model and search (CPU only: no GPU needed to plan)."""

from __future__ import annotations

import json
import subprocess
import time

from tests.fixtures.cli import trainperf_cmd


def test_plan_cli_json_and_1024_gpus_in_seconds(tmp_path):
    seventy = ["--set", "model.hidden_size=8192", "--set", "model.intermediate_size=28672", "--set", "model.num_layers=80",
               "--set", "model.num_heads=64", "--set", "model.num_kv_heads=8", "--set", "train.global_batch_size=1024"]
    t0 = time.perf_counter()
    out = subprocess.run(trainperf_cmd("plan", "synthetic-lora", "--gpus", "1024", "--top", "3", "--json", "--explain",
                                       "--db", str(tmp_path / "t.db"), *seventy),
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - t0
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads(out.stdout)
    assert data["gpus_per_node"] == 8 and len(data["ranked"]) == 3 and data["fitting"] > 0
    assert data["ranked"][0]["id"].endswith(":P1") and len(data["explain"]) == 2
    assert data["ranked"][0]["layout"]["grad_sync"] == "last"  # LoRA's few trained weights: nothing to shard
    assert wall < 30
    bad = subprocess.run(trainperf_cmd("plan", "synthetic-lora", "--gpus", "2", "--gpu", "nope"), cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("trainperf: error:")


def test_plan_names_the_eight_bit_optimizer_when_nothing_else_fits(tmp_path):
    out = subprocess.run(trainperf_cmd("plan", "llama31_8b", "--gpus", "1", "--json", "--set", "train.compile=true",
                                       "--db", str(tmp_path / "t.db")),
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    res = json.loads(out.stdout)
    assert out.returncode != 0 and res["fitting"] == 0
    assert "train.optimizer=adamw8bit" in res["hint"] and "GiB" in res["hint"]
    ok = subprocess.run(trainperf_cmd("plan", "llama31_8b", "--gpus", "1", "--json", "--set", "train.compile=true",
                                      "--set", "train.optimizer=adamw8bit", "--db", str(tmp_path / "t.db")),
                        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and json.loads(ok.stdout)["fitting"] > 0


def test_layout_from_plan_runs_the_planned_layout(tmp_path):
    db = ["--db", str(tmp_path / "t.db")]
    out = subprocess.run(trainperf_cmd("plan", "mini-pretrain", "--gpus", "2", "--top", "2", "--json", *db),
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    best = json.loads(out.stdout)["ranked"][0]
    run = subprocess.run(trainperf_cmd("run", "mini-pretrain", "--layout-from-plan", best["id"], "--json", *db,
                                       "--set", "hardware.device=cpu", "--out", str(tmp_path / "runs")),
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads(run.stdout)
    planned_layout = dict(kv.split("=") for kv in best["set"].replace("--set ", "").split())
    assert summary["world_size"] == 2
    for key in ("pp", "dp_shard", "dp_replicate", "tp", "cp"):  # the run used the planned layout
        assert f"{key}={planned_layout['parallel.' + key]}" in summary["layout"], (best["set"], summary["layout"])
    wrong = subprocess.run(trainperf_cmd("run", "mini-lora", "--layout-from-plan", best["id"], *db), cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "planned for 'mini-pretrain'" in wrong.stderr
    missing = subprocess.run(trainperf_cmd("run", "mini-pretrain", "--layout-from-plan", "nope:P1", *db), cwd=tmp_path,
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no such plan" in missing.stderr
