"""Activation offload (train.offload_layers, parallel/offload.py) on CPU: which layers, what moves and
what stays, views restored exactly, training unchanged (eager and compiled), the planner's trade.
The GPU side (pinned memory, side streams) is in tests/gpu/test_gpu.py; the layouts (FSDP2, PP) in
tests/integration/test_layouts.py."""

from __future__ import annotations

import pytest
import torch

from tests.fixtures.training import two_adamw_steps


def test_plan_command_shows_the_offload_pick_and_its_host_memory(tmp_path):
    import json
    import subprocess

    from tests.fixtures.cli import trainperf_cmd

    out = subprocess.run(trainperf_cmd("plan", "llama2_70b_lora", "--gpus", "2", "--gpu", "h200", "--datasheet", "--json",
                                       "--objective", "throughput", "--top", "3", "--db", str(tmp_path / "t.db"),
                                       "--set", "train.compile=true", "--set", "hardware.host_mem_gib=256",
                                       "--set", "hardware.fp8=tensorwise", "--set", "hardware.frozen_dtype=fp8"),
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    best = json.loads(out.stdout)["ranked"][0]
    assert "train.offload_layers=" in best["set"]
    assert 0 < best["host_offload_gib"] <= 0.5 * 256 / 2
    assert 0 <= best["time"]["offload_exposed"] < 0.02 * best["step_time_s"]  # the pick hides its copies


def _two_steps(*overrides: str):
    from trainperf.parallel import parallelize as par
    from trainperf.core.layout import resolve_layout
    from trainperf.core.resolve import resolve_spec
    from trainperf.train.engine import Engine
    from trainperf.workloads.mini import mini_lora_defaults

    spec = resolve_spec(mini_lora_defaults(), None, ["train.seed=3", "lora.dropout=0", "model.num_layers=4", *overrides])
    resolve_layout(spec, 1)
    engine = Engine(spec, par.build_mesh(spec.parallel, "cpu"), torch.device("cpu"), torch.float32)
    losses = two_adamw_steps(engine, spec.model.vocab_size)
    model = engine.parts[0][1]
    for offloader in engine.offloaders:  # the top offloaded layer was fetched ahead, from a layer above it
        assert offloader.stats.fetched_on_demand == 0
    return losses, [x.memory_mode for x in model.model.layers.values()], engine.offloaded_bytes()


@pytest.mark.parametrize("compiled", [False, True])
def test_offloaded_layers_train_exactly_like_kept_activations(gloo_group, compiled):
    extra = ["train.compile=true"] if compiled else []
    ref, _, none_moved = _two_steps(*extra)
    plain, modes, moved = _two_steps("train.offload_layers=2", *extra)
    mixed, mixed_modes, mixed_moved = _two_steps("train.offload_layers=2", "train.recompute=full",
                                                 "train.recompute_layers=1", "train.recompute_others=selective", *extra)
    assert modes == ["offload", "offload", "none", "none"]
    assert mixed_modes == ["offload", "offload", "full", "selective"]
    assert none_moved == 0 and moved > 0 and mixed_moved == moved  # same two layers, same saved tensors
    assert plain == ref and mixed == ref and ref[1] != ref[0]
