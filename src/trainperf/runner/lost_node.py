"""Naming the node a multi-node run lost, and why, for the run's row.

A rank sees only what its collective library says when a peer goes away: gloo's "Connection closed
by peer [10.0.0.12]:41234", a collective that timed out, or a SIGTERM from Slurm. Each rank records
its node and the address gloo uses at start (``rank_host``, exchanged once by the runner); after a
failure, rank 0 turns what it saw into a cause line (``cause``): the peer address mapped to its node
and ranks, Slurm's verdict on the job (time limit, cancelled, a node set down), or, for a collective
that timed out, which nodes no longer answer on the network.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess

PEER = re.compile(r"\[([0-9A-Fa-f.:]+)\]:\d+")  # how gloo names the peer of a broken connection
PROBE_S = 2.0  # how long a node may take to answer a connection attempt before it counts as unreachable


def rank_host() -> tuple[str, str]:
    """(node name, address) of this rank: Slurm's node name where srun started it, else the host
    name; the address the host name resolves to, which gloo binds (GLOO_SOCKET_IFNAME unset)."""
    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError:
        address = ""
    return os.environ.get("SLURMD_NODENAME") or name, address


def _ranks(ranks: list[int]) -> str:
    """[2, 3] -> 'ranks 2-3'; [2] -> 'rank 2'; [0, 2] -> 'ranks 0,2'."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ",".join(map(str, ranks))


def nodes_of(hosts: list[tuple[str, str]]) -> dict[str, tuple[str, list[int]]]:
    """{node: (address, its ranks)} in the order the nodes first appear."""
    out: dict[str, tuple[str, list[int]]] = {}
    for rank, (node, address) in enumerate(hosts):
        out.setdefault(node, (address, []))[1].append(rank)
    return out


def _slurm_verdict(job_id: str, nodelist: str | None) -> str | None:
    """Why Slurm is ending job ``job_id`` (its Reason while the job completes), naming the nodes it set
    down; None while the job runs on (the step alone was ended) or Slurm does not answer."""
    from trainperf.runner.slurm import job_info  # only in a Slurm job

    info = job_info(job_id)
    state, why = info.state, info.reason or "None"
    if state in ("RUNNING", "UNREACHABLE", "GONE", "UNKNOWN") and why in ("None", ""):
        return None
    if why == "TimeLimit" or state == "TIMEOUT":
        return f"Slurm job {job_id} reached its time limit"
    if why in ("NodeDown", "NodeFail") or state == "NODE_FAIL":
        down = _down_nodes(nodelist)
        if len(down) == 1:
            (node, said), = down.items()
            lost = f"{node} lost: Slurm set it down ({said})"
        else:  # several, or none found down any more
            lost = (f"{' and '.join(down) or 'a node'} lost: Slurm set "
                    f"{'them' if down else 'it'} down ({'; '.join(f'{n}: {r}' for n, r in down.items()) or why})")
        return f"{lost} and ended job {job_id} (NODE_FAIL)"
    if state in ("CANCELLED", "COMPLETING") and why == "None":
        return f"Slurm job {job_id} cancelled (scancel, or its allocation revoked)"
    return f"Slurm is ending job {job_id} ({state}, reason {why})"


def _down_nodes(nodelist: str | None) -> dict[str, str]:
    """{node: Slurm's reason} for the nodes of ``nodelist`` Slurm holds down or failing."""
    if not nodelist or not shutil.which("sinfo"):
        return {}
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-n", nodelist, "-o", "%N|%T|%E"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    down = {}
    for line in out.stdout.splitlines():
        node, state, why = (line.split("|") + ["", ""])[:3]
        if any(w in state for w in ("down", "fail", "not_responding")):
            down[node] = why or state
    return down


def _unreachable(nodes: dict[str, tuple[str, list[int]]], here: str) -> list[str]:
    """The other nodes that do not answer a TCP connection attempt within PROBE_S (a refusal is an
    answer: the host is there)."""
    gone = []
    for node, (address, _) in nodes.items():
        if node == here or not address:
            continue
        try:
            socket.create_connection((address, 9), timeout=PROBE_S).close()  # port 9 (discard): refused or not
        except ConnectionRefusedError:
            continue
        except OSError:
            gone.append(node)
    return gone


def _chain(exc: BaseException, depth: int = 5) -> str:
    """The text of ``exc`` and of the exceptions it was raised from or during: a SIGTERM handled as
    gloo's error unwinds (the rank was blocked in the collective) hides that error in its context."""
    texts, seen = [], set()
    while exc is not None and id(exc) not in seen and len(texts) < depth:
        seen.add(id(exc))
        texts.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    return "\n".join(texts)


def cause(exc: BaseException, hosts: list[tuple[str, str]], rank: int, last_step: int,
          timed_out: bool) -> str | None:
    """One line naming the lost node and the cause, from what rank ``rank`` saw (``exc``; ``timed_out``:
    a collective timed out); None when nothing points at a node or at Slurm."""
    nodes = nodes_of(hosts)
    here = hosts[rank][0]
    after = f"after step {last_step}"
    job = os.environ.get("SLURM_JOB_ID")
    verdict = _slurm_verdict(job, os.environ.get("SLURM_JOB_NODELIST")) if job else None
    if verdict:
        return f"{verdict}, {after} (rank {rank} on {here} was told to stop)"
    for address in PEER.findall(_chain(exc)):
        for node, (addr, ranks) in nodes.items():
            if addr == address and node != here:
                return (f"{node} lost: {_ranks(ranks)} at {address} closed their connections mid-collective "
                        f"(killed, or the node went down), {after}")
    if timed_out and len(nodes) > 1:
        gone = _unreachable(nodes, here)
        if gone:
            return (f"{' and '.join(gone)} lost: unreachable from {here} (no answer within {PROBE_S:g} s: its link "
                    f"is down or the node is gone); a collective hung, {after}")
    return None
