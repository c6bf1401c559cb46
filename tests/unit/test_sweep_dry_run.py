"""`sweep --dry-run` prints every item and each Slurm script; one run goes to Slurm without a file."""

from __future__ import annotations

import json

from trainperf.cli.main import main


def test_dry_run_of_a_slurm_sweep_file_prints_each_exact_script(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text("name: night\nbackend: slurm\nslurm: {partition: h200, gpus_per_node: 8}\n"
                                     "runs:\n  - workload: mini-pretrain\n    nproc_per_node: [1, 2]\n")
    assert main(["sweep", "s.yaml", "--dry-run", "--json"]) == 0
    items = json.loads(capsys.readouterr().out)["items"]
    assert [i["nproc"] for i in items] == [1, 2]
    assert all("#SBATCH --partition=h200" in i["script"] and "--nproc-per-node " + str(i["nproc"]) in i["script"]
               for i in items)
    assert not (tmp_path / "trainperf.db").exists()  # nothing stored, nothing written


def test_one_run_to_slurm_without_a_sweep_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "--workload", "mini-pretrain", "--nproc-per-node", "2", "--slurm", "partition=gpu",
                 "--slurm", "time=01:00:00", "--dry-run", "--set", "train.seed=3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("sweep mini-pretrain-x2: 1 item (dry run")
    assert "#SBATCH --time=01:00:00" in out and "--set train.seed=3" in out
    assert main(["sweep", "--workload", "mini-pretrain", "--slurm", "partiton=gpu", "--dry-run"]) == 2
    assert "unknown keys ['partiton']" in capsys.readouterr().err
