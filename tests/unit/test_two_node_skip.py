"""Where the two-node Slurm cluster cannot be made (not root, namespaces or links refused), its tests
skip with a one-line reason instead of failing (tests/fixtures/slurm_two_nodes.py)."""

from __future__ import annotations

import subprocess

import pytest

from tests.fixtures import slurm_two_nodes as two
from tests.fixtures.slurm_cluster import SlurmUnavailable


def _refused(cmd, timeout=60, **kw):
    return subprocess.CompletedProcess(cmd, 1, "", "mount --make-shared /run/netns failed:\n  Operation not permitted\n")


@pytest.mark.parametrize("case, said", [
    ("not root", "network namespaces need root; the tests run as uid 1000"),
    ("netns refused", "network namespaces are not permitted here: mount --make-shared /run/netns failed: Operation not "
                      "permitted"),
    ("bridge refused", "network namespaces cannot be linked here: ip link add tp2-br0 type bridge: RTNETLINK answers: "
                       "Operation not permitted"),
])
def test_a_cluster_that_cannot_be_made_is_one_skip_line(tmp_path, monkeypatch, case, said):
    cluster = two.TwoNodeCluster(state=tmp_path)
    monkeypatch.setattr(two.os, "geteuid", lambda: 1000 if case == "not root" else 0)
    monkeypatch.setattr(cluster.one, "missing", lambda: [])
    if case == "netns refused":
        monkeypatch.setattr(two, "_run", _refused)
    if case == "bridge refused":
        monkeypatch.setattr(two, "_run", lambda cmd, timeout=60, **kw: subprocess.CompletedProcess(cmd, 0, "", ""))

        def ip(self, *args, ns=None):
            raise RuntimeError(f"ip {' '.join(args)}: RTNETLINK answers:\nOperation not permitted")
        monkeypatch.setattr(two.TwoNodeCluster, "_ip", ip)
    with pytest.raises(SlurmUnavailable) as err:
        cluster.start()
    assert str(err.value) == said
    assert "\n" not in str(err.value) and cluster.made == [] and cluster.started == {}
