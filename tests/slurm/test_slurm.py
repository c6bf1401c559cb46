"""The Slurm backend of `trainperf sweep`: the batch script it writes, and a real one-node Slurm
cluster (slurm-wlm + munge, installed and started by tests/fixtures/slurm_cluster.py) running a sweep."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.fixtures.cli import trainperf_cmd
from trainperf.runner import slurm
from trainperf.store.db import Store

from tests.fixtures.slurm_cluster import SlurmCluster, SlurmUnavailable


# -- a real cluster ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def slurm_cluster():
    cluster = SlurmCluster()
    t0 = time.perf_counter()
    try:
        cluster.ensure_installed()
    except SlurmUnavailable as exc:
        print(f"\nSlurm tests skipped: {exc}")
        pytest.skip(f"no Slurm here and it cannot be installed: {exc}")
    cluster.start()
    print(f"\nslurm: install {cluster.install_s:.1f} s, start {cluster.start_s:.1f} s "
          f"({'reused running daemons' if cluster.reused else 'started ' + str(cluster.started)}), "
          f"fixture {time.perf_counter() - t0:.1f} s")
    yield cluster
    cluster.stop()


SHORT = {"train.max_steps": 3, "hardware.device": "cpu", "eval.every_samples": 1, "eval.target": 100.0}


def _sweep_file(path: Path, name: str, wait: bool, runs: list | None = None, **slurm_keys) -> None:
    import yaml

    path.write_text(yaml.safe_dump({
        "name": name, "backend": "slurm",
        "slurm": {"partition": "debug", "nodes": 1, "gpus_per_node": 0, "time": "00:10:00",
                  "extra_sbatch": ["--comment=trainperf-test"], "wait": wait, "poll_seconds": 1, **slurm_keys},
        "runs": runs or [{"workload": "mini-pretrain", "nproc_per_node": 2, "set": dict(SHORT)},  # torchrun under srun
                         {"workload": "mini-pretrain", "set": {**SHORT, "parallel.tp": 3}}],  # invalid layout: exit 2
    }, sort_keys=False))


def _sweep(tmp_path, *args, timeout=240, rc=(0,)):
    """``rc``: the exit codes allowed (1 once an item of the sweep is known failed)."""
    out = subprocess.run(trainperf_cmd("sweep", *args, "--db", str(tmp_path / "t.db"), "--out", str(tmp_path / "runs"),
                                       "--json"), cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
    assert out.returncode in rc, out.stderr[-3000:]
    return json.loads(out.stdout), out.stderr


def _jobs_named(prefix: str) -> list[str]:
    out = subprocess.run(["scontrol", "show", "job", "-o"], capture_output=True, text=True, timeout=30)
    return [ln for ln in out.stdout.splitlines() if f"JobName={prefix}" in ln]


@pytest.mark.slow
def test_sweep_on_a_real_slurm_cluster(slurm_cluster, tmp_path):
    tmp_path = tmp_path / "sweep runs #1"  # sbatch must read the quoted --output/--chdir with a blank and a '#'
    tmp_path.mkdir()
    name = f"slurm-{uuid.uuid4().hex[:6]}"
    _sweep_file(tmp_path / "s.yaml", name, wait=False)
    t0 = time.perf_counter()
    counts, err = _sweep(tmp_path, "s.yaml")  # submits and returns
    assert sum(counts[name].values()) == 2 and counts[name]["pending"] == 0, (counts, err)
    assert err.count("submitted slurm job") == 2
    store = Store(tmp_path / "t.db")
    ids = {r["item_id"]: slurm.parse_reason(r["reason"])[0] for r in store.sweep_items(name)}
    assert all(ids.values()), ids
    scripts = sorted((tmp_path / "runs" / f"sweep-{name}").glob("*.sbatch"))
    assert len(scripts) == 2 and all("#SBATCH --comment=trainperf-test" in s.read_text() for s in scripts)

    _, err = _sweep(tmp_path, "s.yaml", rc=(0, 1))  # queued or running (or the bad one failed): nothing submitted
    assert "submitted" not in err
    assert {r["item_id"]: slurm.parse_reason(r["reason"])[0] for r in Store(tmp_path / "t.db").sweep_items(name)} == ids

    _sweep_file(tmp_path / "s.yaml", name, wait=True)  # same items; now wait for the jobs to end
    done, err = _sweep(tmp_path, "s.yaml", rc=(1,))  # one item failed: exit 1
    elapsed = time.perf_counter() - t0
    assert done[name] == {"pending": 0, "running": 0, "success": 1, "failed": 1}, (done, err)
    assert "submitted" not in err
    items = {r["nproc"]: r for r in Store(tmp_path / "t.db").sweep_items(name)}
    good, bad = items[2], items[1]
    assert slurm.parse_reason(good["reason"])[0] == ids[good["item_id"]]  # the same jobs, never resubmitted
    # both ran under Slurm: the controller knows them and how they ended
    info_good, info_bad = slurm.job_info(ids[good["item_id"]]), slurm.job_info(ids[bad["item_id"]])
    assert (info_good.state, info_good.exit_code) == ("COMPLETED", 0), info_good
    assert (info_bad.state, info_bad.exit_code) == ("FAILED", 2), info_bad
    run = Store(tmp_path / "t.db").get_run(good["run_id"])
    assert good["status"] == "success" and run["status"] == "success" and run["world_size"] == 2
    assert bad["status"] == "failed" and bad["run_id"] is None
    assert "FAILED exit 2" in bad["reason"] and "not divisible" in bad["reason"]
    assert len(_jobs_named(f"tp-{name}-")) == 2

    # a last invocation: everything finished, nothing submitted, nothing run twice
    final, err = _sweep(tmp_path, "s.yaml", rc=(1,))
    assert final == done and "submitted" not in err and len(_jobs_named(f"tp-{name}-")) == 2
    assert len(Store(tmp_path / "t.db").list_runs()) == 1
    status, _ = _sweep(tmp_path, "status")
    assert status[name] == done[name]
    lines = slurm.status_lines(Store(tmp_path / "t.db"), name)
    assert any(f"slurm job {ids[good['item_id']]} COMPLETED" in ln for ln in lines), lines
    print(f"\nslurm sweep: submit + 2 jobs + collect {elapsed:.1f} s")


@pytest.mark.slow
def test_rendezvous_form_on_a_real_slurm_cluster(slurm_cluster, tmp_path):
    """The several-node command line (srun per node, torchrun with a c10d rendezvous on the head
    node, every rank an external rank of `trainperf run`), on the one node there is."""
    name = f"rdzv-{uuid.uuid4().hex[:6]}"
    _sweep_file(tmp_path / "s.yaml", name, wait=True, launcher="torchrun", rdzv_port=29517,
                runs=[{"workload": "mini-pretrain", "nproc_per_node": 2, "set": dict(SHORT)}])
    done, err = _sweep(tmp_path, "s.yaml")
    assert done[name]["success"] == 1, (done, err)
    item = Store(tmp_path / "t.db").sweep_items(name)[0]
    script = (tmp_path / "runs" / f"sweep-{name}" / f"{item['item_id']}.sbatch").read_text()
    assert '--rdzv-endpoint "$head:29517"' in script and "torch.distributed.run" in script
    run = Store(tmp_path / "t.db").get_run(item["run_id"])
    assert run["status"] == "success" and run["world_size"] == 2
    assert slurm.job_info(slurm.parse_reason(item["reason"])[0]).state == "COMPLETED"
