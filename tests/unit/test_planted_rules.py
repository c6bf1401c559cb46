"""Four rules a planted bug once got past the suite: each test here fails when its rule is broken.

* MFU and model TFLOP/s per GPU come from tokens/s per GPU, not the job's total (trainer and planner);
* the pipeline bubble of an interleaved schedule is (pp - 1) / (v * m) of the compute, v its stages per rank;
* a multi-node (and a one-node) Slurm script hands every path and value to the run as one argument,
  whatever blanks, quotes or ``$`` they hold;
* the loss scale counts context-parallel ranks: gradients averaged over dp x cp ranks make the global
  token mean's gradient.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from trainperf.core.layout import Layout
from trainperf.core.spec import ParallelSpec
from trainperf.model.loss import masked_loss_sum
from trainperf.workloads import get_workload

# -- MFU from per-GPU tokens/s -------------------------------------------------------------------------


@pytest.mark.parametrize("world", [2, 8])
def test_a_runs_mfu_is_from_tokens_per_second_per_gpu(tmp_path, world):
    from trainperf.train import loop

    spec = get_workload("mini-pretrain").defaults()
    spec.hardware.device = "cpu"
    tokens_per_step, flops_per_token, peak = 4096, 3.0e9, 50e12
    run = SimpleNamespace(
        spec=spec, ctx=loop.RunContext(run_id="r", out_dir=tmp_path), world=world, device_type="cpu",
        tokens_per_step=tokens_per_step, flops_per_token=flops_per_token, peak=peak, hw={}, run_start=0.0,
        memory_peaks=lambda: (1.0, 0.5, (0.0, 0)), export=lambda: (None, None), offloaded_before=0, kept_before=0,
        clock=SimpleNamespace(times=lambda: [9.0, 0.5, 0.5, 0.5]),  # the first step (warm-up) is left out
        engine=SimpleNamespace(load_s=0.0, load_bytes=0, offloaded_bytes=lambda kept_subclasses=False: 0))
    summary = loop._Run.summarize(run, loop._Outcome(status="success", stop_time=10.0, last_step=4))
    total = tokens_per_step / 0.5
    assert summary.tokens_per_s == pytest.approx(total)
    assert summary.tokens_per_s_per_gpu == pytest.approx(total / world)
    assert summary.mfu == pytest.approx(flops_per_token * total / world / peak)
    assert summary.model_tflops_per_gpu == pytest.approx(flops_per_token * total / world / 1e12)


def test_the_planners_mfu_is_from_tokens_per_second_per_gpu():
    from trainperf.core.flops import train_flops_per_token
    from trainperf.plan.costs import estimate
    from trainperf.plan.hardware import PRESETS

    spec = get_workload("llama31_8b").defaults()
    spec.parallel = ParallelSpec(dp_shard=8)
    gpu = PRESETS["h200"]
    est = estimate(spec, gpu, 8)
    tokens_per_step = spec.train.global_batch_size * spec.data.seq_len
    assert est.tokens_per_s_per_gpu == pytest.approx(tokens_per_step / est.step_time_s / 8)
    flops = train_flops_per_token(spec.model, spec.lora, spec.data.seq_len)
    assert est.mfu == pytest.approx(flops * est.tokens_per_s_per_gpu / gpu.peak_flops)
    assert 0 < est.mfu < 1


# -- the pipeline bubble's interleaving factor -------------------------------------------------------

COMPUTE_TERMS = ("gemm", "attention", "elementwise", "recompute", "offload_exposed", "tp_exposed", "cp_exposed")


@pytest.mark.parametrize("schedule, v", [("1F1B", 1), ("Interleaved1F1B", 2), ("Interleaved1F1B", 4)])
def test_the_pipeline_bubble_is_pp_minus_1_over_v_times_m_of_the_compute(schedule, v):
    from trainperf.plan.costs import estimate
    from trainperf.plan.hardware import PRESETS

    spec = get_workload("llama31_8b").defaults()
    pp, m = 4, 8  # m micro-batches per step on each pipeline
    spec.parallel = ParallelSpec(dp_shard=2, pp=pp, pp_schedule=schedule, pp_stages_per_rank=v if v > 1 else 0)
    spec.train.micro_batch_size = 1
    spec.train.global_batch_size = 2 * m
    assert Layout.of(spec.parallel).stages_per_rank == v
    est = estimate(spec, PRESETS["h200"], 8)
    compute = sum(est.time[k] for k in COMPUTE_TERMS)  # m micro-batches of the slowest stage
    assert est.time["pp_bubble"] == pytest.approx((pp - 1) / (v * m) * compute)


# -- shell quoting in Slurm scripts ------------------------------------------------------------------

ODD = "a b'c$HOME\"d"  # a blank, a single quote, a dollar; the double quote only where no #SBATCH line carries it


def _stub_bin(folder: Path) -> Path:
    """srun writes each argument it is given on a line of its own (NUL-free); scontrol names one host."""
    folder.mkdir()
    (folder / "srun").write_text('#!/bin/bash\nfor a in "$@"; do printf "%s\\0" "$a"; done > "$ARGV_FILE"\n')
    (folder / "scontrol").write_text("#!/bin/bash\necho node1\n")
    for f in folder.iterdir():
        f.chmod(0o755)
    return folder


@pytest.mark.parametrize("nodes", [2, 1])
def test_a_slurm_script_passes_every_path_and_value_as_one_argument(tmp_path, nodes):
    from trainperf.runner import slurm
    from trainperf.runner.sweep import expand

    folder = tmp_path / "scripts a b'c$X"  # the script folder: no double quote (an #SBATCH line cannot carry one)
    folder.mkdir()
    db, out = tmp_path / ODD / "t.db", tmp_path / f"out {ODD}"
    value = f"{ODD} $(touch {tmp_path}/pwned) `touch {tmp_path}/pwned2`"
    data = {"name": "q", "backend": "slurm", "slurm": {"nodes": nodes, "gpus_per_node": 0, "python": "py thon"},
            "runs": [{"workload": "mini-pretrain", "set": {"data.path": value}}]}
    item = expand(data, "f")[1][0]
    script = slurm.render_script(item, item["slurm"], sweep_id="q", db=str(db), out=str(out), extra_sets=[f"x.y={ODD}"],
                                 directory=folder, workdir=str(tmp_path))
    path = folder / "job.sbatch"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    argv_file = tmp_path / "argv"
    env = {**os.environ, "PATH": f"{_stub_bin(tmp_path / 'bin')}:{os.environ['PATH']}", "ARGV_FILE": str(argv_file),
           "SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": str(nodes), "SLURM_JOB_ID": "77"}
    ran = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=30)
    assert ran.returncode == 0, ran.stderr
    argv = argv_file.read_text().split("\0")[:-1]
    after = argv[argv.index("trainperf") + 1:]
    assert after[after.index("--db") + 1] == str(db.resolve())
    assert after[after.index("--out") + 1] == str(out.resolve())
    assert f"data.path={value}" in after and f"x.y={ODD}" in after
    assert "py thon" in argv  # the interpreter, one argument too
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()
    assert (folder / f"{item['item_id']}-77.rc").read_text().strip() == "0"
    if nodes > 1:
        assert argv[argv.index("--rdzv-endpoint") + 1] == "node1:29500"


# -- context parallel in the loss scale --------------------------------------------------------------


@pytest.mark.parametrize("dp_replicate, dp_shard, cp, tp", [(1, 2, 2, 1), (2, 1, 2, 2), (1, 1, 4, 1), (2, 2, 1, 1),
                                                           (1, 2, 1, 2)])
def test_the_loss_scale_makes_dp_x_cp_averaged_gradients_the_global_token_means(dp_replicate, dp_shard, cp, tp):
    """Each rank trains a (batch shard x sequence chunk) slice; its loss is its slice's token-loss sum
    over the global token count, times ``Layout.loss_scale`` (the engine's arithmetic); FSDP averages
    the gradients over the ranks holding different slices. That average must be the gradient of the
    global mean token loss, whatever the dp and cp degrees."""
    gen = torch.Generator().manual_seed(0)
    batch, seq, vocab = 4 * dp_replicate * dp_shard, 8 * cp, 11
    w = torch.randn(vocab, vocab, generator=gen, requires_grad=True)
    x = torch.randn(batch, seq, vocab, generator=gen)
    labels = torch.randint(0, vocab, (batch, seq), generator=gen)
    mask = (torch.rand(batch, seq, generator=gen) > 0.2).float()
    tokens = float(mask.sum())
    (reference,) = torch.autograd.grad(masked_loss_sum(x @ w, labels, mask) / tokens, w)

    scale = Layout.of(ParallelSpec(dp_replicate=dp_replicate, dp_shard=dp_shard, cp=cp, tp=tp)).loss_scale
    grads = []
    for rows in torch.arange(batch).chunk(dp_replicate * dp_shard):  # the data-parallel batch shards
        for cols in torch.arange(seq).chunk(cp):  # each shard's sequence, split over the cp ranks
            sl = (rows[:, None], cols[None, :])
            loss = masked_loss_sum(x[sl] @ w, labels[sl], mask[sl]) / tokens
            grads.append(torch.autograd.grad(loss * scale, w)[0])
    # tp ranks of one slice hold the same gradient and do not average: the group is the slices
    averaged = torch.stack(grads).mean(0)
    assert torch.allclose(averaged, reference, rtol=1e-5, atol=1e-7)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
