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
from tests.fixtures.slurm_two_nodes import NODES, TwoNodeCluster, address, one_line
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
        pytest.skip(f"no two-node Slurm cluster here: {one_line(exc)}")
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


# -- faults -----------------------------------------------------------------------------------------
# Each fault hits a run of its own across the two nodes: 4 ranks (2 a node) for the SIGKILL of one
# node's ranks, 2 (one a node) for the others, to start fewer processes on the two cores. The last rank
# (on node2) holds step 2 (TRAINPERF_TEST_STALL), so every run idles in a known collective once step 1
# is done: the four runs share the two cores (srun --oversubscribe) and the faults whose waits are
# Slurm's own (its 30 s time-limit check, SlurmdTimeout) overlap, in one cluster bring-up.

STALL = "{rank}:2:{secs}"  # the last rank sleeps before step 2; its peers wait for it in a collective
PER_NODE = {"sigkill": 2}  # ranks a node; 1 for the others
# The slurmd run trains on after 20 s: Slurm's SIGTERM must find rank 0 in Python, not blocked in a
# collective for a peer that will never come (a signal handler runs only between bytecodes).
STALL_S = {"slurmd": 20}
KILL_WAIT_S = 10  # the fixture's KillWait: SIGTERM, then SIGKILL
BOUND_S = {  # from the fault to every rank gone on both nodes; the collective timeout (600 s) is never reached
    "sigkill": KILL_WAIT_S + 10,  # gloo sees node2's sockets close at once; srun --kill-on-bad-exit ends the rest
    "scancel": KILL_WAIT_S + 10,  # SIGTERM to every task, SIGKILL after KillWait
    "timelimit": 30 + KILL_WAIT_S + 10,  # slurmctld tests time limits every 30 s
    "slurmd": 60 + KILL_WAIT_S,  # SlurmdTimeout=10 and its ping rounds (~25 s seen), then KillWait; node2's own
                                 # ranks end when its slurmd is back and Slurm ends the job there
}
CAUSE = {  # what the row's reason must say, besides the node
    "sigkill": ("node2 lost", "ranks 2-3 at 10.231.7.12 closed their connections"),
    "scancel": ("cancelled (scancel", "rank 0 on node1"),
    "timelimit": ("reached its time limit", "rank 0 on node1"),
    "slurmd": ("node2 lost: Slurm set it down (Not responding)", "NODE_FAIL"),
}


def _cmdline(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _until(pred, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.2)
    return time.monotonic() - t0


class FaultRun:
    """One `trainperf run` of 4 ranks on the two nodes under srun, its output in ROOT/NAME."""

    def __init__(self, cluster: TwoNodeCluster, root, name: str, per_node: int, stall_s: int):
        self.cluster, self.name, self.out, self.db, self.per_node = cluster, name, root / name, root / "t.db", per_node
        self.out.mkdir()
        cmd = ["srun", "-J", f"tp-{name}", "-N", "2", "--ntasks-per-node", str(per_node), "--oversubscribe", "-t", "5",
               "--kill-on-bad-exit=1", sys.executable, "-m", "trainperf", "run", "mini-lora", *SHORT[2:],
               "--set", "train.max_steps=100000", "--set", f"parallel.dp_shard={2 * per_node}",
               "--set", "train.collective_timeout_s=600", "--db", str(self.db), "--out", str(self.out / "runs"),
               "--json"]
        self.log = open(self.out / "srun.txt", "w")
        self.proc = subprocess.Popen(cmd, cwd=root, env=cluster.env(TRAINPERF_TEST_STALL=STALL.format(rank=2 * per_node - 1, secs=stall_s)),
                                     stdout=self.log, stderr=subprocess.STDOUT, text=True)
        self.job = None

    def _job_id(self) -> str | None:
        out = subprocess.run(["squeue", "-h", "-n", f"tp-{self.name}", "-o", "%i"], capture_output=True, text=True,
                             timeout=15, env=self.cluster.env())
        return out.stdout.split()[0] if out.stdout.split() else None

    def ranks(self, node: str) -> list[int]:
        return [p for p in self.cluster.job_pids(node, self.job) if "trainperf" in _cmdline(p)]

    def all_ranks_gone(self) -> bool:
        return not any(self.ranks(n) for n in NODES)

    def run_dir(self):
        dirs = list((self.out / "runs").glob("*"))
        return dirs[0] if len(dirs) == 1 else None

    def step(self) -> int:
        d = self.run_dir()
        try:
            return json.loads((d / "progress.json").read_text())["step"] if d else 0
        except (OSError, ValueError):
            return 0

    def stalled(self) -> bool:
        """Step 1 done, every rank there, for a second now: the last rank asleep, its peers in step 2's
        first collective."""
        self.job = self.job or self._job_id()
        if not (self.job and self.step() >= 1 and all(len(self.ranks(n)) == self.per_node for n in NODES)):
            return False
        self.since = getattr(self, "since", None) or time.monotonic()
        return time.monotonic() - self.since >= 1

    def row(self) -> dict:
        from trainperf.store.db import Store

        store = Store(self.db)
        try:
            return next(r for r in store.list_runs() if str(r.get("out_dir", "")).startswith(str(self.out)))
        finally:
            store.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            subprocess.run(["scancel", str(self.job or "")], env=self.cluster.env(), timeout=15, capture_output=True)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def _earlier_row(db) -> dict:
    """A finished run already in the store, which no fault may change."""
    from trainperf.store.db import Store

    store = Store(db)
    try:
        store.create_run("earlier-run", "mini-lora", {"workload": "mini-lora"}, "dp_shard=1", 1, "open", False, 3.5,
                         str(db.parent / "earlier"))
        store.finish_run("earlier-run", status="success", status_reason=None)
        return store.get_run("earlier-run")
    finally:
        store.close()


@pytest.fixture(scope="module")
def faults(two_nodes, tmp_path_factory) -> dict:
    """Four runs started at once, each hit by its fault once it idles at step 2: {fault: what was seen}."""
    import signal

    root = tmp_path_factory.mktemp("faults")
    earlier = _earlier_row(root / "t.db")
    runs = {name: FaultRun(two_nodes, root, name, PER_NODE.get(name, 1), STALL_S.get(name, 600)) for name in BOUND_S}
    seen: dict = {"earlier": earlier, "db": root / "t.db"}
    hit: dict[str, float] = {}  # when each fault was made
    t_start = time.monotonic()

    def ready(name: str) -> bool:
        r = runs[name]
        if name == "slurmd":  # trained past its stall, and the others over: Slurm's NODE_FAIL ends every job on node2
            return r.stalled() and r.step() >= 2 and all(n in seen for n in BOUND_S if n != "slurmd")
        return r.stalled()

    def strike(name: str) -> None:
        r = runs[name]
        if name == "sigkill":
            for pid in r.ranks("node2"):
                os.kill(pid, signal.SIGKILL)
        elif name == "scancel":
            subprocess.run(["scancel", r.job], env=two_nodes.env(), check=True, timeout=15)
        elif name == "timelimit":  # its time limit brought forward: Slurm ends it as a job reaching its -t
            subprocess.run(["scontrol", "update", f"jobid={r.job}", "EndTime=now+1"], env=two_nodes.env(),
                           check=True, timeout=15)
        else:
            two_nodes.kill_slurmd("node2")
        hit[name] = time.monotonic() + (1 if name == "timelimit" else 0)

    try:
        while len(seen) < 2 + len(BOUND_S):  # each fault as soon as its run idles at step 2
            assert time.monotonic() - t_start < 300, {n: (r.job, r.step()) for n, r in runs.items()}
            for name, r in runs.items():
                if name not in hit:
                    if ready(name):
                        strike(name)
                    continue
                if name in seen:
                    continue
                assert time.monotonic() - hit[name] < BOUND_S[name] + 30, f"{name}: ranks left {r.job}"
                if name == "slurmd" and "slurmd-node2" not in two_nodes.started and not r.ranks("node1"):
                    two_nodes.restart_slurmd("node2")  # node2's ranks end once Slurm can reach it again
                if r.all_ranks_gone():
                    seen[name] = {"gone_s": time.monotonic() - hit[name], "at_s": hit[name] - t_start}
            time.sleep(0.2)
        for name, r in runs.items():
            seen[name].update(rc=r.proc.wait(timeout=60), row=r.row(), run_dir=r.run_dir(),
                              srun=(r.out / "srun.txt").read_text())
        _until(lambda: not any(two_nodes.node_pids(n) for n in NODES), 60, "every process gone on both nodes")
        seen["left"] = {n: [(p, _cmdline(p)) for p in two_nodes.node_pids(n)] for n in NODES}
    finally:
        for r in runs.values():
            r.close()
        if "slurmd-node2" not in two_nodes.started:
            two_nodes.restart_slurmd("node2")
    print("\nfaults: " + "; ".join(f"{n} at {seen[n]['at_s']:.1f} s, all ranks gone {seen[n]['gone_s']:.1f} s later"
                                   for n in BOUND_S if n in seen))
    return seen


@pytest.mark.parametrize("fault", list(BOUND_S))
def test_a_fault_ends_every_rank_and_names_the_node(faults, fault):
    """Every rank on both nodes gone within the bound, none left after, the row failed with the node
    and the cause, rank 0's Flight Recorder dump at the collective it waited in, the earlier row as it was."""
    import pickle

    from trainperf.store.db import Store

    seen = faults[fault]
    reason = seen["row"]["status_reason"] or ""
    print(f"\n{fault}: all ranks gone in {seen['gone_s']:.1f} s (bound {BOUND_S[fault]} s), srun exit {seen['rc']}, "
          f"row {seen['row']['status']}: {reason}")
    assert seen["gone_s"] <= BOUND_S[fault], seen
    assert faults["left"] == {n: [] for n in NODES}, faults["left"]
    assert seen["rc"] != 0, seen["srun"][-2000:]
    assert seen["row"]["status"] == "failed", (reason, seen["srun"][-3000:])
    assert all(c in reason for c in CAUSE[fault]), reason
    fr = seen["run_dir"] / "flight_recorder"
    dumps = {int(p.name.split("_")[1]): pickle.loads(p.read_bytes())["entries"] for p in fr.glob("rank_*")}
    assert 0 in dumps and dumps[0], sorted(dumps)
    last = {rank: (e[-1]["collective_seq_id"], e[-1]["profiling_name"]) for rank, e in sorted(dumps.items()) if e}
    print(f"  flight recorder, each rank's last collective: {last}")
    assert last[0][1].startswith("gloo:")
    stalled = 2 * PER_NODE.get(fault, 1) - 1
    if fault in ("scancel", "timelimit"):  # rank 0 waited in the collective the stalled rank never entered
        assert last[0][0] == last[stalled][0] + 1, last
    store = Store(faults["db"])
    try:
        assert store.get_run("earlier-run") == faults["earlier"]
    finally:
        store.close()
