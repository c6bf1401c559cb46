"""Two real Slurm nodes on one machine (tests/fixtures/slurm_two_nodes.py: a network namespace each,
gloo across real interfaces with distinct addresses): trainperf's multi-node path for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.fixtures.cli import trainperf_cmd
from tests.fixtures.slurm_two_nodes import NODES, TwoNodeCluster, address
from tests.fixtures.slurm_cluster import SlurmUnavailable
from trainperf.runner import slurm

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture(scope="module")
def two_nodes():
    cluster = TwoNodeCluster()
    try:
        cluster.ensure_installed()
        cluster.start()
    except SlurmUnavailable as exc:
        pytest.skip(f"no two-node Slurm cluster here: {exc}")
    print(f"\ntwo-node slurm: up in {cluster.start_s:.1f} s {cluster.node_states()}")
    yield cluster
    cluster.stop()


SHORT = ["--set", "train.max_steps=3", "--set", "train.log_every=1", "--set", "train.micro_batch_size=4",
         "--set", "train.seed=1", "--set", "eval.every_samples=1000000", "--set", "hardware.device=cpu"]
LAYOUTS = {  # 4 ranks, 2 per node: ranks 0,1 on node1 and 2,3 on node2 (the mesh is replicate-major, tp innermost)
    "fsdp": ["--set", "parallel.dp_shard=4"],
    "hsdp": ["--set", "parallel.dp_replicate=2", "--set", "parallel.dp_shard=2"],  # replicate across the nodes
    "tp": ["--set", "parallel.tp=2", "--set", "parallel.dp_shard=2"],  # tp inside a node
}


def _losses(summary: dict) -> list[float]:
    lines = open(summary["mllog"]).read().splitlines()
    return [json.loads(ln.split(":::MLLOG ", 1)[1])["value"] for ln in lines if '"key": "train_loss"' in ln]


def _run(cmd, tmp_path, env=None, timeout=240) -> dict:
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=timeout, env=env)
    summary = slurm.last_json(out.stdout)
    assert summary and summary.get("run_id"), (out.returncode, out.stdout[-2000:], out.stderr[-3000:])
    return summary


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_four_ranks_on_two_nodes_match_one_node(two_nodes, tmp_path, layout):
    db, out = ["--db", str(tmp_path / "t.db")], ["--out", str(tmp_path / "runs")]
    args = ["run", "mini-lora", *SHORT, *LAYOUTS[layout], *db, *out, "--json"]
    t0 = time.perf_counter()
    two = _run(["srun", "-N", "2", "--ntasks-per-node", "2", "-t", "5", "--kill-on-bad-exit=1",
                sys.executable, "-m", "trainperf", *args], tmp_path, env=two_nodes.env())
    t_two = time.perf_counter() - t0
    one = _run(trainperf_cmd(*args[:2], "--nproc-per-node", "4", *args[2:]), tmp_path)
    assert two["world_size"] == one["world_size"] == 4
    # placement: the layout's groups as the run saw the nodes (2 ranks per node)
    if layout == "hsdp":
        assert two["placement"]["dp_replicate"] == "crosses nodes" and two["placement"]["dp_shard"] == "intra-node", two
    if layout == "tp":
        assert two["placement"]["tp"] == "intra-node", two
    l2, l1 = _losses(two), _losses(one)
    print(f"\n{layout}: two nodes {[round(x, 6) for x in l2]} ({t_two:.1f} s)  one node {[round(x, 6) for x in l1]}")
    assert len(l2) == len(l1) == 3
    assert l2 == pytest.approx(l1, rel=1e-6, abs=1e-6)
    assert all(two_nodes.node_pids(n) == [] for n in NODES), {n: two_nodes.node_pids(n) for n in NODES}


def test_the_nodes_are_two_hosts(two_nodes, tmp_path):
    """Each task sees its own node's name and address (what gloo binds), not the machine's."""
    out = subprocess.run(["srun", "-N", "2", "--ntasks-per-node", "1", "-t", "1", sys.executable, "-c",
                          "import socket; h = socket.gethostname(); print(h, socket.gethostbyname(h))"],
                         capture_output=True, text=True, timeout=60, env=two_nodes.env())
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.split("\n")[:2]) == [f"{n} {address(n)}" for n in NODES], out.stdout


def test_sweep_across_two_nodes_submits_resumes_and_reports(two_nodes, tmp_path, monkeypatch):
    """`trainperf sweep` with slurm.nodes: 2: one batch job, srun starting torchrun on each node with
    a c10d rendezvous on the first; a second invocation submits nothing, a third collects."""
    import uuid

    import yaml

    from trainperf.store.db import Store

    monkeypatch.setenv("SLURM_CONF", str(two_nodes.conf))  # slurm.job_info here asks this cluster
    name = f"two-{uuid.uuid4().hex[:6]}"

    def write(wait: bool) -> None:
        (tmp_path / "s.yaml").write_text(yaml.safe_dump({
            "name": name, "backend": "slurm",
            "slurm": {"partition": "two", "nodes": 2, "gpus_per_node": 0, "time": "00:05:00", "wait": wait,
                      "poll_seconds": 1, "rdzv_port": 29531},
            "runs": [{"workload": "mini-pretrain", "nproc_per_node": 2,
                      "set": {"train.max_steps": 3, "train.micro_batch_size": 4, "hardware.device": "cpu", "eval.every_samples": 1,
                              "eval.target": 100.0}}]}, sort_keys=False))

    def sweep(*args):
        out = subprocess.run(trainperf_cmd("sweep", *args, "--db", str(tmp_path / "t.db"), "--out",
                                           str(tmp_path / "runs"), "--json"),
                             cwd=tmp_path, capture_output=True, text=True, timeout=240, env=two_nodes.env())
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout), out.stderr

    write(wait=False)
    counts, err = sweep("s.yaml")
    assert err.count("submitted slurm job") == 1 and sum(counts[name].values()) == 1, (counts, err)
    job = slurm.parse_reason(Store(tmp_path / "t.db").sweep_items(name)[0]["reason"])[0]
    _, err = sweep("s.yaml")  # queued or running: nothing submitted again
    assert "submitted" not in err
    write(wait=True)
    done, err = sweep("s.yaml")
    assert done[name] == {"pending": 0, "running": 0, "success": 1, "failed": 0}, (done, err)
    item = Store(tmp_path / "t.db").sweep_items(name)[0]
    assert slurm.parse_reason(item["reason"])[0] == job and "submitted" not in err
    info = slurm.job_info(job)
    assert (info.state, info.exit_code, info.nodes) == ("COMPLETED", 0, "node[1-2]"), info
    run = Store(tmp_path / "t.db").get_run(item["run_id"])
    assert run["status"] == "success" and run["world_size"] == 4
    final, err = sweep("s.yaml")
    assert final == done and "submitted" not in err and len(Store(tmp_path / "t.db").list_runs()) == 1
    lines = slurm.status_lines(Store(tmp_path / "t.db"), name)
    assert any(f"slurm job {job} COMPLETED" in ln for ln in lines), lines
    print(f"\nsweep on two nodes: {lines}")
    assert all(two_nodes.node_pids(n) == [] for n in NODES)


def _wait_steps(summary_dir, pattern: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any('"key": "train_loss"' in p.read_text() for p in summary_dir.glob(pattern)):
            return
        time.sleep(0.3)
    raise AssertionError(f"no training step within {timeout:.0f} s")


GONE_BOUND_S = 30  # srun --kill-on-bad-exit ends the other node's ranks at once; KillWait=5 then SIGKILL


def test_ranks_of_one_node_killed(two_nodes, tmp_path):
    _kill_node2_ranks(two_nodes, tmp_path)


def _kill_node2_ranks(two_nodes, tmp_path) -> dict:
    """SIGKILL to node2's ranks mid-run: srun ends node1's ranks too, no process is left on either
    node within GONE_BOUND_S, and srun exits non-zero."""
    import signal

    proc = subprocess.Popen(["srun", "-N", "2", "--ntasks-per-node", "2", "-t", "5", "--kill-on-bad-exit=1",
                             sys.executable, "-m", "trainperf", "run", "mini-lora", *SHORT[2:], "--set",
                             "train.max_steps=400", "--set", "parallel.dp_shard=4", "--db", str(tmp_path / "t.db"),
                             "--out", str(tmp_path / "runs"), "--json"],
                            cwd=tmp_path, env=two_nodes.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_steps(tmp_path / "runs", "*/mllog.txt")
        ranks = [p for p in two_nodes.node_pids("node2") if "python" in _cmdline(p) and "trainperf" in _cmdline(p)]
        assert len(ranks) == 2, [(p, _cmdline(p)) for p in two_nodes.node_pids("node2")]
        t0 = time.monotonic()
        for pid in ranks:
            os.kill(pid, signal.SIGKILL)
        while time.monotonic() - t0 < GONE_BOUND_S and any(two_nodes.node_pids(n) for n in NODES):
            time.sleep(0.2)
        gone_s = time.monotonic() - t0
        left = {n: [(p, _cmdline(p)) for p in two_nodes.node_pids(n)] for n in NODES}
        assert not any(left.values()), left
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"\nranks of node2 SIGKILLed: all ranks gone on both nodes in {gone_s:.1f} s, srun exit {rc}")
    assert rc != 0
    from trainperf.store.db import Store

    rows = Store(tmp_path / "t.db").list_runs()
    assert len(rows) == 1 and rows[0]["status"] == "failed", rows
    assert address("node2") in (rows[0]["status_reason"] or ""), rows[0]["status_reason"]  # gloo names the peer
    return rows[0]


def _cmdline(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""



@pytest.mark.xfail(strict=True, reason="the row's reason is gloo's 'Connection closed by peer [10.231.7.12]:port': "
                   "the rank's failure record (runner/local.py) does not yet name the lost node nor the cause")
def test_ranks_of_one_node_killed_reason_names_the_node(two_nodes, tmp_path):
    reason = _kill_node2_ranks(two_nodes, tmp_path)["status_reason"]
    assert "node2" in reason and "lost" in reason, reason
