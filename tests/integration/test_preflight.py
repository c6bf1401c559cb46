"""`trainperf preflight` on CPU (gloo): the arithmetic, the verdicts, and real multi-process runs.

* busbw factors and message bytes per collective against hand values (nccl-tests conventions);
* groups (intra-node, rails) and every-pair rounds;
* verdicts on synthetic numbers: datasheet thresholds, the slow GPU and the slow pair named, exit code;
* ``measured_overrides`` gives fields the planner's GPU preset takes;
* a real 2-process quick run through the command path, and a 2 "nodes" x 2 run started by external
  torchrun agents (the in-process rank path), with every collective, size and pair present;
* bad input: exit 2, one line, nothing launched.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from trainperf.preflight.checks import COLLECTIVES, NA_CPU, busbw_factor, collective_elems

from tests.fixtures.preflight import preflight_cmd, _env


# -- real runs on CPU -------------------------------------------------------------------------------

def _check_cpu_result(res: dict, world: int) -> None:
    sizes = res["settings"]["sizes"]
    assert res["device"] == "cpu" and res["world_size"] == world and res["exit_code"] == 0
    assert {r["verdict"] for r in res["checks"]} == {NA_CPU}
    assert res["note"] and "not meaningful" in res["note"]
    assert sorted(g["rank"] for g in res["gemm"] if g["dtype"] == "fp32") == list(range(world))
    assert sorted(h["rank"] for h in res["hbm"]) == list(range(world))
    for c in COLLECTIVES:
        rows = {r["size"]: r for r in res["collectives"] if r["collective"] == c and r["group"] == "world"}
        assert sorted(rows) == sizes, c
        for size, r in rows.items():
            assert r["bytes"] == collective_elems(c, size, world, 4)[0]
            assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * busbw_factor(c, world))
            assert r["algbw_gbps"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9)
    want = {(a, b, s) for a in range(world) for b in range(a + 1, world) for s in sizes}
    assert {(*p["ranks"], p["size"]) for p in res["pairs"]} == want
    assert all(p["bytes"] == p["size"] for p in res["pairs"])
    assert {b["check"] for b in res["baseline"]} >= {"gemm fp32", "all_reduce (world)"}
    assert all(b["ratio"] > 0 for b in res["baseline"])
    assert res["measured_overrides"] == {}
    assert res["host_link"] == []  # no device to copy to


def test_two_process_gloo_preflight_via_the_command(tmp_path, capsys):
    out = tmp_path / "runs"
    p = subprocess.run(preflight_cmd("--quick", "--device", "cpu", "--nproc-per-node", "2", "--json", "--out", str(out)),
                       cwd=tmp_path, capture_output=True, text=True, timeout=120, env=_env())
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout)  # one JSON object, nothing else on stdout
    assert res["settings"]["sizes"] == [8, 256, 8192]
    _check_cpu_result(res, 2)
    (run_dir,) = out.iterdir()
    assert run_dir.name.startswith("preflight-") and Path(res["result_path"]) == run_dir / "preflight.json"
    assert json.loads((run_dir / "preflight.json").read_text())["checks"] == res["checks"]
    # the human table, from the same result
    from trainperf.cli.preflight import print_result

    print_result(res)
    table = capsys.readouterr().out
    assert "all_to_all busbw" in table and "pair 0-1" in table and "8 KiB" in table
    assert "not meaningful" in table and str(run_dir / "preflight.json") in table.replace("\n", "")
    # kept in the store (cwd's trainperf.db), checks included; a CPU result never feeds the planner
    import sqlite3

    with sqlite3.connect(tmp_path / "trainperf.db") as c:
        (device, n_checks) = c.execute("SELECT device, (SELECT COUNT(*) FROM preflight_checks) FROM preflights").fetchone()
    assert device == "cpu" and n_checks == len(res["checks"]) and res["stored_as"] == run_dir.name
    from trainperf.store.db import Store

    assert Store(tmp_path / "trainperf.db").latest_preflight() is None


def test_plan_uses_the_newest_gpu_preflight_unless_told_datasheet(tmp_path):
    from trainperf.store.db import Store

    store = Store(tmp_path / "t.db")
    row = {"preflight_id": "pf1", "created_at": 1.0, "hosts": ["h"], "world_size": 2, "device": "cuda",
           "gpu": "NVIDIA H200 SXM", "quick": False, "exit_code": 0, "n_pass": 11, "n_warn": 0, "n_fail": 0,
           "overrides": {"gemm_eff": 0.4, "intra_busbw_gbps": 50.0}, "result_path": None}
    store.save_preflight(row, [{"idx": 0, "check": "gemm bf16", "subject": "rank 0", "size": "8192^3", "value": 396.0,
                                "unit": "TFLOP/s", "datasheet": 989.0, "pct": 40.0, "verdict": "fail", "note": None}])
    assert store.latest_preflight("NVIDIA H200 SXM")["overrides"]["gemm_eff"] == 0.4
    store.close()

    def plan(*extra):
        p = subprocess.run([sys.executable, "-m", "trainperf", "plan", "synthetic-lora", "--gpus", "2", "--gpu", "h200",
                            "--json", "--top", "1", "--db", str(tmp_path / "t.db"), *extra],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    measured, datasheet = plan(), plan("--datasheet")
    assert "pf1" in measured["measured"] and datasheet["measured"] is None
    assert measured["ranked"][0]["step_time_s"] > 1.25 * datasheet["ranked"][0]["step_time_s"]  # half the GEMM rate


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_runs_as_one_rank_under_external_torchrun_on_two_nodes(tmp_path):
    """Two torchrun agents of 2 ranks each (2 "nodes" on one host: LOCAL_WORLD_SIZE=2): every rank
    runs preflight in-process; intra-node groups, rails and pair kinds come from the layout."""
    out, port = tmp_path / "runs", _free_port()
    tail = preflight_cmd("--quick", "--device", "cpu", "--max-bytes", "256", "--json", "--out", str(out))[1:]
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(k),
                               "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port), *tail],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
             for k in (0, 1)]
    results = [p.communicate(timeout=150) for p in procs]
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err[-3000:]
    res = json.loads(results[0][0])
    assert results[1][0].strip() == ""  # only rank 0 reports
    _check_cpu_result(res, 4)
    assert len(res["nodes"]) == 2
    groups = {g["label"]: (g["kind"], g["ranks"]) for g in res["groups"]}
    assert groups["world"] == ("inter", [0, 1, 2, 3])
    assert sorted(v for k, v in groups.items() if k.startswith("node")) == [("intra", [0, 1]), ("intra", [2, 3])]
    assert sorted(v for k, v in groups.items() if k.startswith("rail")) == [("inter", [0, 2]), ("inter", [1, 3])]
    for label in groups:
        for c in COLLECTIVES:
            assert any(r["group"] == label and r["collective"] == c for r in res["collectives"]), (label, c)
    links = {tuple(p["ranks"]): p["link"] for p in res["pairs"]}
    assert links[(0, 1)] == links[(2, 3)] == "intra" and links[(0, 2)] == links[(1, 3)] == "inter"
    assert len(list(out.iterdir())) == 1  # one result directory, written by rank 0


# -- bad input ----------------------------------------------------------------------------------------

BAD = {
    "nproc_zero": (["--nproc-per-node", "0", "--device", "cpu"], "--nproc-per-node=0"),
    "bad_size": (["--max-bytes", "12Q", "--device", "cpu"], "12Q"),
    "bad_gpu": (["--gpu", "h999", "--device", "cpu"], "h999"),
    "cuda_missing": (["--device", "cuda"], "no CUDA device"),
}


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad")

    def one(name):
        args, _ = BAD[name]
        return subprocess.run(preflight_cmd(*args, "--json", "--out", str(tmp / name)), cwd=tmp, capture_output=True,
                              text=True, timeout=60, env=_env()), tmp / name

    with ThreadPoolExecutor(len(BAD)) as pool:
        return dict(zip(BAD, pool.map(one, BAD)))


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_exits_2_with_one_line(bad_runs, name):
    import torch

    if name == "cuda_missing" and torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    p, out = bad_runs[name]
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainperf: error:") and BAD[name][1] in lines[0]
    assert json.loads(p.stdout) == {"error": lines[0].removeprefix("trainperf: error: "), "exit_code": 2}
    assert not out.exists()  # nothing launched, nothing written
