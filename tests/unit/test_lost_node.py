"""runner/lost_node: what rank 0 saw after a multi-node failure, turned into the lost node and the cause."""

from __future__ import annotations

import pytest

from trainperf.runner import lost_node
from trainperf.runner.slurm import JobInfo

HOSTS = [("node1", "10.0.0.11"), ("node1", "10.0.0.11"), ("node2", "10.0.0.12"), ("node2", "10.0.0.12")]
GLOO = ("[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.12]:38577. "
        "This is typically caused by a remote worker crashing.")


@pytest.fixture
def slurm(monkeypatch):
    """A Slurm job whose controller answers ``state`` (its JobState) and ``why`` (its Reason)."""
    answer = {}

    def job_info(job_id):
        return JobInfo(job_id, answer["state"], reason=answer["why"])

    monkeypatch.setattr("trainperf.runner.slurm.job_info", job_info)
    monkeypatch.setattr(lost_node, "_down_nodes", lambda nodelist: {"node2": "Not responding"})
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")

    def set_(state, why):
        answer.update(state=state, why=why)
    return set_


@pytest.mark.parametrize("ranks, text", [([2], "rank 2"), ([2, 3], "ranks 2-3"), ([0, 2, 5], "ranks 0,2,5")])
def test_ranks_are_said_as_ranges(ranks, text):
    assert lost_node._ranks(ranks) == text


def test_a_peer_address_is_its_node_and_ranks(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    why = lost_node.cause(RuntimeError(GLOO), HOSTS, 0, 7, timed_out=False)
    assert why == ("node2 lost: ranks 2-3 at 10.0.0.12 closed their connections mid-collective (killed, or the "
                   "node went down), after step 7")


def test_a_sigterm_during_gloos_error_still_names_the_peer(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    try:
        try:
            raise RuntimeError(GLOO)
        finally:  # srun's SIGTERM, handled while the error unwinds
            raise KeyboardInterrupt("received signal SIGTERM")
    except KeyboardInterrupt as exc:
        why = lost_node.cause(exc, HOSTS, 0, 7, timed_out=False)
    assert why.startswith("node2 lost: ranks 2-3 at 10.0.0.12"), why


def test_nothing_pointing_at_a_node_gives_no_cause(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert lost_node.cause(RuntimeError("CUDA out of memory"), HOSTS, 0, 1, timed_out=False) is None
    own = RuntimeError("Connection closed by peer [10.0.0.11]:4000")  # its own node's address: not a lost node
    assert lost_node.cause(own, HOSTS, 0, 1, timed_out=False) is None


@pytest.mark.parametrize("state, why, said", [
    ("COMPLETING", "TimeLimit", "Slurm job 77 reached its time limit, after step 3 (rank 0 on node1 was told to stop)"),
    ("TIMEOUT", "TimeLimit", "Slurm job 77 reached its time limit"),
    ("COMPLETING", "None", "Slurm job 77 cancelled (scancel, or its allocation revoked), after step 3"),
    ("COMPLETING", "NodeDown", "node2 lost: Slurm set it down (Not responding) and ended job 77 (NODE_FAIL)"),
    ("PREEMPTED", "None", "Slurm is ending job 77 (PREEMPTED, reason None)"),
])
def test_slurms_verdict_comes_first(slurm, state, why, said):
    slurm(state, why)
    assert said in lost_node.cause(RuntimeError("received signal SIGTERM"), HOSTS, 0, 3, timed_out=False)


def test_several_nodes_down_are_all_named(slurm, monkeypatch):
    slurm("COMPLETING", "NodeDown")
    monkeypatch.setattr(lost_node, "_down_nodes", lambda nodelist: {"node2": "Not responding", "node3": "Kill task failed"})
    assert lost_node.cause(RuntimeError("x"), HOSTS, 0, 3, timed_out=False).startswith(
        "node2 and node3 lost: Slurm set them down (node2: Not responding; node3: Kill task failed) and ended job 77")
    monkeypatch.setattr(lost_node, "_down_nodes", lambda nodelist: {})  # back in service already
    assert lost_node.cause(RuntimeError("x"), HOSTS, 0, 3, timed_out=False).startswith(
        "a node lost: Slurm set it down (NodeDown) and ended job 77 (NODE_FAIL)")


def test_a_running_job_leaves_it_to_the_peer_address(slurm):
    slurm("RUNNING", "None")  # srun ended the step, not Slurm the job
    assert lost_node.cause(RuntimeError(GLOO), HOSTS, 0, 2, timed_out=False).startswith("node2 lost: ranks 2-3")
    assert lost_node.cause(RuntimeError("received signal SIGTERM"), HOSTS, 0, 2, timed_out=False) is None


def test_a_timed_out_collective_names_the_nodes_that_do_not_answer(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)

    def connect(address, timeout):
        if address[0] == "10.0.0.12":
            raise TimeoutError("timed out")
        raise ConnectionRefusedError  # there, nothing listening on port 9

    monkeypatch.setattr(lost_node.socket, "create_connection", connect)
    hosts = [*HOSTS, ("node3", "10.0.0.13")]
    assert lost_node.cause(RuntimeError("Timed out waiting 8000ms"), hosts, 0, 4, timed_out=True) == (
        "node2 lost: unreachable from node1 (no answer within 2 s: its link is down or the node is gone); "
        "a collective hung, after step 4")
    assert lost_node.cause(RuntimeError("Timed out"), hosts, 0, 4, timed_out=False) is None


def test_the_host_table_groups_ranks_by_node():
    assert lost_node.nodes_of(HOSTS) == {"node1": ("10.0.0.11", [0, 1]), "node2": ("10.0.0.12", [2, 3])}
