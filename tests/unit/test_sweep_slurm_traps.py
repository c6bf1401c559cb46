"""What a Slurm sweep must not let slip: --slurm beside a sweep file, a one-run job with no GPU request,
closed-division paths found wrong only after the queue wait, progress in .err, a store on NFS."""

from __future__ import annotations

import json

import pytest

from trainperf.cli.main import main
from trainperf.runner import slurm

LOCAL_FILE = "name: night\nruns:\n  - workload: mini-pretrain\n    nproc_per_node: 2\n"


def _scripts(capsys) -> list[str]:
    return [i["script"] for i in json.loads(capsys.readouterr().out)["items"]]


def test_slurm_options_beside_a_sweep_file_send_it_to_slurm_over_its_own_keys(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "local.yaml").write_text(LOCAL_FILE)
    assert main(["sweep", "local.yaml", "--slurm", "partition=h200", "--slurm", "time=01:00:00", "--dry-run",
                 "--json"]) == 0
    (script,) = _scripts(capsys)
    assert "#SBATCH --partition=h200" in script and "#SBATCH --time=01:00:00" in script
    (tmp_path / "slurm.yaml").write_text("name: n\nbackend: slurm\nslurm: {partition: a100, gpus_per_node: 8, "
                                         "account: perf}\nruns:\n  - workload: mini-pretrain\n")
    assert main(["sweep", "slurm.yaml", "--slurm", "partition=h200", "--dry-run", "--json"]) == 0
    (script,) = _scripts(capsys)
    assert "#SBATCH --partition=h200" in script and "a100" not in script  # the command line wins
    assert "#SBATCH --account=perf" in script and "#SBATCH --gpus-per-node=8" in script  # the file's others stay
    assert main(["sweep", "local.yaml", "--slurm", "partiton=h200", "--dry-run"]) == 2
    assert "unknown keys ['partiton']" in capsys.readouterr().err


def test_one_run_to_slurm_asks_for_its_gpus_unless_on_cpu(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = ["sweep", "--workload", "mini-pretrain", "--nproc-per-node", "4", "--slurm", "partition=h200", "--dry-run",
            "--json"]
    assert main(base) == 0
    assert "#SBATCH --gpus-per-node=4" in _scripts(capsys)[0]
    assert main([*base, "--set", "hardware.device=cpu"]) == 0
    assert "--gpus-per-node" not in _scripts(capsys)[0]
    assert main([*base, "--slurm", "gpus_per_node=8"]) == 0  # told: as told
    assert "#SBATCH --gpus-per-node=8" in _scripts(capsys)[0]


def test_closed_division_paths_are_checked_before_the_job_queues(tmp_path, capsys, monkeypatch):
    """The README's example: without the checkpoint and data, or with a path that is not there, the
    sweep refuses at once (exit 2, one line) instead of a job failing after its queue wait."""
    monkeypatch.chdir(tmp_path)
    readme = ["sweep", "--workload", "llama2_70b_lora", "--nproc-per-node", "8", "--slurm", "partition=h200",
              "--slurm", "time=02:00:00", "--dry-run"]
    assert main(readme) == 2
    err = capsys.readouterr().err
    assert "give model.path=DIR" in err and "checked before the job queues" in err and len(err.splitlines()) == 1
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "data").mkdir()
    typo = [*readme, "--set", f"model.path={tmp_path / 'ckpt'}", "--set", f"data.path={tmp_path / 'dta'}"]
    assert main(typo) == 2
    err = capsys.readouterr().err
    assert f"data.path='{tmp_path / 'dta'}' does not exist on this host" in err and len(err.splitlines()) == 1
    good = [*readme, "--set", f"model.path={tmp_path / 'ckpt'}", "--set", f"data.path={tmp_path / 'data'}", "--json"]
    assert main(good) == 0
    script = _scripts(capsys)[0]
    assert "#SBATCH --gpus-per-node=8" in script and "--partition=h200" in script
    assert not (tmp_path / "trainperf.db").exists()
    # a path inside a container is looked for at its host side
    (tmp_path / "c.yaml").write_text(f"name: c\nbackend: slurm\nslurm: {{container_image: img, container_mounts: "
                                     f"['{tmp_path}:/mnt']}}\nruns:\n  - workload: mini-pretrain\n    set: "
                                     "{data.path: /mnt/data}\n")
    assert main(["sweep", "c.yaml", "--dry-run"]) == 0
    (tmp_path / "c.yaml").write_text((tmp_path / "c.yaml").read_text().replace("/mnt/data", "/mnt/nothing"))
    assert main(["sweep", "c.yaml", "--dry-run"]) == 2
    assert f"(host side of the container mount: '{tmp_path}/nothing')" in capsys.readouterr().err


def test_progress_goes_to_the_jobs_out_and_a_failure_is_read_from_it(tmp_path):
    from trainperf.runner.sweep import expand

    data = {"name": "s", "backend": "slurm", "slurm": {"nodes": 1}, "runs": [{"workload": "mini-pretrain"}]}
    for nodes in (1, 2):
        data["slurm"]["nodes"] = nodes
        item = expand(data, "f")[1][0]
        text = slurm.render_script(item, item["slurm"], sweep_id="s", db="t.db", out="runs", extra_sets=[],
                                   directory=tmp_path, workdir="/work")
        (srun,) = [ln for ln in text.splitlines() if ln.startswith("srun ")]
        assert srun.endswith(" 2>&1"), srun  # the run's stderr (progress with --json) joins .out
    (tmp_path / "abc-5.out").write_text("step 3 loss 4.1\ntrainperf: error: data.path '/x' is gone\n")
    (tmp_path / "abc-5.err").write_text("")
    assert slurm.outcome(slurm.JobInfo("5", "FAILED", 2, 0), tmp_path, "abc")[2] == \
        "FAILED exit 2: trainperf: error: data.path '/x' is gone"


def test_a_store_on_nfs_is_warned_about_when_a_slurm_sweep_submits(tmp_path, monkeypatch):
    assert slurm.file_system_type(tmp_path / "no" / "such" / "t.db") is not None  # found from /proc/mounts
    monkeypatch.setattr(slurm, "file_system_type", lambda path: "nfs4")
    note = slurm.network_store_note(str(tmp_path / "t.db"))
    assert note.startswith("warning: the results store") and "is on nfs4" in note and "README.md" in note
    monkeypatch.setattr(slurm, "file_system_type", lambda path: "ext4")
    assert slurm.network_store_note(str(tmp_path / "t.db")) is None


@pytest.mark.parametrize("mounts, fs", [("ext4", "ext4"), ("nfs4", "nfs4")])
def test_file_system_type_takes_the_deepest_mount(tmp_path, monkeypatch, mounts, fs):
    from pathlib import Path

    text = f"/dev/sda1 / ext4 rw 0 0\nserver:/x {tmp_path} {mounts} rw 0 0\n"
    real = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: text if str(self) == "/proc/mounts" else real(self, *a, **k))
    assert slurm.file_system_type(tmp_path / "t.db") == fs
    assert slurm.file_system_type("/elsewhere/t.db") == "ext4"


def test_retry_resubmits_only_the_failed_slurm_items(tmp_path, monkeypatch):
    from trainperf.runner import sweep
    from trainperf.store.db import Store

    submitted: list[str] = []

    def submit(script):
        submitted.append(script.stem)
        return str(100 + len(submitted))

    monkeypatch.setattr(slurm, "available", lambda: True)
    monkeypatch.setattr(slurm, "submit", submit)
    monkeypatch.setattr(slurm, "queued_job_ids_by_name", dict)
    monkeypatch.setattr(slurm, "refresh", lambda store, sweep_id=None, echo=None: [])  # no Slurm to ask here
    data = {"name": "r", "backend": "slurm", "slurm": {"gpus_per_node": 0},
            "runs": [{"workload": "mini-pretrain", "seeds": [1, 2]}]}
    _, items = sweep.checked_sweep(data, "f")
    store = Store(tmp_path / "t.db")
    lines: list[str] = []
    sweep.run_sweep(store, "r", items, str(tmp_path / "t.db"), str(tmp_path / "runs"), [], echo=lines.append)
    assert sorted(submitted) == sorted(i["item_id"] for i in items)
    good, bad = items
    store.set_sweep_item("r", good["item_id"], "success", None, "slurm job 101 COMPLETED")
    store.set_sweep_item("r", bad["item_id"], "failed", None, "slurm job 102 FAILED exit 1: x; /s/a.sbatch")
    counts = sweep.run_sweep(store, "r", items, str(tmp_path / "t.db"), str(tmp_path / "runs"), [], echo=lines.append)
    assert len(submitted) == 2 and counts["r"]["failed"] == 1  # without retry nothing is submitted again
    sweep.run_sweep(store, "r", items, str(tmp_path / "t.db"), str(tmp_path / "runs"), [], echo=lines.append,
                    retry_failed=True)
    assert submitted[2:] == [bad["item_id"]]  # the failed item alone, once
    assert "sweep r: 1 failed item put back to run" in lines
    assert any(ln.startswith("submitted slurm job 103: mini-pretrain x1 train.seed=2 (") for ln in lines), lines
