"""The Slurm backend of `trainperf sweep`: the batch script it writes, and a real one-node Slurm
cluster (slurm-wlm + munge, installed and started by tests/fixtures/slurm_cluster.py) running a sweep."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from trainperf.runner import slurm
from trainperf.runner.sweep import expand
from trainperf.core.errors import SpecError


def test_four_node_gpu_script_uses_torchrun_rendezvous_on_the_head_node(tmp_path):
    data = {"name": "scale", "backend": "slurm",
            "slurm": {"partition": "gpu", "nodes": 4, "gpus_per_node": 8, "time": "01:30:00", "account": "proj",
                      "exclusive": True, "extra_sbatch": ["--qos=high", "#SBATCH --mem=0"], "setup": ["module load cuda"],
                      "container_image": "nvcr.io#nvidia/pytorch:25.01-py3",
                      "container_mounts": ["/lustre:/lustre", "/scratch:/scratch"]},
            "runs": [{"workload": "llama31_8b", "set": {"parallel.tp": 2, "train.global_batch_size": 64}}]}
    name, items = expand(data, "f")
    item = items[0]
    assert item["nproc"] == 8  # nproc_per_node defaults to the GPUs per node
    text = slurm.render_script(item, item["slurm"], sweep_id=name, db="t.db", out="runs", extra_sets=["train.max_steps=9"],
                               directory=tmp_path, workdir="/work")
    lines = text.splitlines()
    for want in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --partition=gpu", "#SBATCH --account=proj", "#SBATCH --time=01:30:00", "#SBATCH --exclusive",
                 "#SBATCH --qos=high", "#SBATCH --mem=0", '#SBATCH --chdir="/work"', "module load cuda",
                 f"#SBATCH --job-name=tp-scale-{item['item_id']}",
                 f'#SBATCH --output="{tmp_path / item["item_id"]}-%j.out"',
                 'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)'):
        assert want in lines, want
    srun = next(ln for ln in lines if ln.startswith("srun "))
    assert "--ntasks-per-node=1" in srun and "--container-image=nvcr.io#nvidia/pytorch:25.01-py3" in srun
    assert "--container-mounts=/lustre:/lustre,/scratch:/scratch" in srun
    assert " python -m torch.distributed.run " in srun  # in a container: its python, not ours
    assert '--nnodes "$SLURM_NNODES" --nproc-per-node 8' in srun
    assert '--rdzv-backend c10d --rdzv-endpoint "$head:29500" --rdzv-id "$SLURM_JOB_ID"' in srun
    tail = srun.split(" -m trainperf ", 1)[1]
    assert tail.startswith("run llama31_8b --json --db " + str(Path("t.db").resolve()))
    assert "--set parallel.tp=2" in tail and "--set train.max_steps=9" in tail and "--nproc-per-node" not in tail
    assert lines.index(srun) < lines.index("rc=$?")  # the exit code is kept beside the logs
    # one node: srun starts one task that runs torchrun itself
    data["slurm"].update(nodes=1, container_image=None)
    item = expand(data, "f")[1][0]
    one = slurm.render_script(item, item["slurm"], sweep_id=name, db="t.db", out="runs", extra_sets=[],
                              directory=tmp_path, workdir="/work")
    srun = next(ln for ln in one.splitlines() if ln.startswith("srun "))
    assert srun.startswith(f"srun --ntasks=1 {sys.executable} -m trainperf run llama31_8b --nproc-per-node 8 --json")
    assert "container" not in srun and "head=" not in one


@pytest.mark.parametrize("slurm_section, words", [
    ({"partitions": "x"}, "unknown keys"),
    ({"nodes": "4"}, "must be an integer"),
    ({"nodes": 0}, "nodes must be >= 1"),
    ({"wait": "yes"}, "true or false"),
    ({"launcher": "mpirun"}, "must be auto"),
    ({"gpus_per_node": 2}, "exceeds slurm.gpus_per_node"),
    ({"extra_sbatch": ["--qos=high\nrm -rf ~"]}, "one sbatch option on one line"),
    ({"extra_sbatch": ["--qos high\n"]}, "one sbatch option on one line"),
    ({"extra_sbatch": ["--comment=\x1b[2J"]}, "one sbatch option on one line"),
    ({"setup": ["module load cuda\ncurl x | sh"]}, "line break or control character"),
    ({"extra_srun": ["--mpi=none\r"]}, "line break or control character"),
    ({"python": "python\x00"}, "line break or control character"),
])
def test_malformed_slurm_sections_are_refused(slurm_section, words):
    data = {"name": "s", "backend": "slurm", "slurm": slurm_section, "runs": [{"workload": "x", "nproc_per_node": 4}]}
    with pytest.raises(SpecError, match=words):
        expand(data, "f")


def test_paths_with_spaces_and_hashes_are_quoted_and_unsayable_paths_refused(tmp_path):
    data = {"name": "s", "backend": "slurm", "slurm": {}, "runs": [{"workload": "mini-lora"}]}
    item = expand(data, "f")[1][0]
    odd = tmp_path / "my runs #2"
    text = slurm.render_script(item, item["slurm"], sweep_id="s", db="t.db", out="runs", extra_sets=[],
                               directory=odd, workdir=str(odd))
    lines = text.splitlines()
    # sbatch splits an #SBATCH line at blanks and ends it at an unquoted '#' unless the value is quoted
    assert f'#SBATCH --output="{odd}/{item["item_id"]}-%j.out"' in lines
    assert f'#SBATCH --chdir="{odd}"' in lines
    for bad in ('a"b', "a\\b", "a\nb", "a\x1bb"):
        with pytest.raises(SpecError, match="an #SBATCH line cannot carry"):
            slurm.render_script(item, item["slurm"], sweep_id="s", db="t.db", out="runs", extra_sets=[],
                                directory=tmp_path / bad, workdir="/work")


def test_backend_is_checked_and_ids_do_not_depend_on_it():
    runs = [{"workload": "x", "nproc_per_node": 2, "seeds": [1, 2]}]
    with pytest.raises(SpecError, match="not one of"):
        expand({"name": "s", "backend": "k8s", "runs": runs}, "f")
    with pytest.raises(SpecError, match="needs backend: slurm"):
        expand({"name": "s", "slurm": {}, "runs": runs}, "f")
    local = [i["item_id"] for i in expand({"name": "s", "runs": runs}, "f")[1]]
    assert [i["item_id"] for i in expand({"name": "s", "backend": "slurm", "runs": runs}, "f")[1]] == local


def test_finished_job_outcomes(tmp_path):
    (tmp_path / "abc-7.out").write_text('noise\n{\n  "run_id": "r1",\n  "status": "failed",\n'
                                        '  "status_reason": "target not reached"\n}\n')
    status, run_id, detail = slurm.outcome(slurm.JobInfo("7", "FAILED", 1, 0, "NonZeroExitCode"), tmp_path, "abc")
    assert (status, run_id, detail) == ("failed", "r1", "FAILED exit 1: target not reached")
    (tmp_path / "abc-8.err").write_text("trainperf: error: bad layout\nsrun: error: vm: task 0: Exited with exit code 2\n")
    assert slurm.outcome(slurm.JobInfo("8", "FAILED", 2, 0), tmp_path, "abc")[2] == "FAILED exit 2: trainperf: error: bad layout"
    assert slurm.outcome(slurm.JobInfo("9", "TIMEOUT", 0, 15, "TimeLimit"), tmp_path, "abc")[2].startswith("TIMEOUT (TimeLimit)")
    assert slurm.outcome(slurm.JobInfo("9", "GONE"), tmp_path, "abc")[0] == "failed"
    script = tmp_path / "abc.sbatch"
    assert slurm.parse_reason(slurm.reason_text("12", "FAILED exit 2: x; y", script)) == ("12", script)
    assert slurm.parse_reason("slurm job 12 PENDING") == ("12", None)
    assert slurm.parse_reason("sbatch failed: no partition") == (None, None)


def test_job_state_sources(tmp_path, monkeypatch):
    answers = {}
    monkeypatch.setattr(slurm, "_cmd", lambda args, timeout=60: answers.get(args[0]))
    monkeypatch.setattr(slurm.shutil, "which", lambda name: f"/usr/bin/{name}")
    answers["scontrol"] = subprocess.CompletedProcess([], 0, "JobId=5 JobName=x JobState=RUNNING Reason=None "
                                                         "ExitCode=0:0 NodeList=n[1-4]\n", "")
    info = slurm.job_info("5")
    assert (info.state, info.nodes, info.in_flight) == ("RUNNING", "n[1-4]", True)
    # the controller forgot the job and accounting is off: the job's own .rc file answers
    answers["scontrol"] = subprocess.CompletedProcess([], 1, "", "slurm_load_jobs error: Invalid job id specified")
    answers["sacct"] = subprocess.CompletedProcess([], 1, "", "Slurm accounting storage is disabled")
    (tmp_path / "abc-5.rc").write_text("0\n")
    assert (slurm.job_info("5", tmp_path / "abc-5.rc").state, slurm.job_info("5").state) == ("COMPLETED", "GONE")
    answers["sacct"] = subprocess.CompletedProcess([], 0, "5|CANCELLED by 0|0:15|None|n1\n", "")
    assert (slurm.job_info("5").state, slurm.job_info("5").signal) == ("CANCELLED", 15)
    # a controller that does not answer is not a finished job: ask again later
    answers["scontrol"] = subprocess.CompletedProcess([], 1, "", "Unable to contact slurm controller (connect failure)")
    info = slurm.job_info("5", tmp_path / "abc-5.rc")
    assert info.state == "UNREACHABLE" and info.in_flight and "connect failure" in info.reason
