"""Bad input for the mixture-of-experts family and expert parallel: one line naming the valid values,
before any process starts (in-process through runner.local.prepare; two cases through the CLI for
exit 2 and one stderr line)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from tests.fixtures.cli import run_cli
from trainperf.core.errors import SpecError
from trainperf.core.families import family
from trainperf.model.families import build
from trainperf.runner import local
from trainperf.workloads.mini_specs import mini_moe_model

CASES = [  # (overrides, processes, message)
    (["model.experts_per_token=5"], 1,
     r"^model.experts_per_token=5: each token's top-k must be 1..4 \(model.num_experts=4\)$"),
    (["model.experts_per_token=0"], 1, r"top-k must be 1..4"),
    (["parallel.ep=3", "parallel.dp_shard=3"], 3,
     r"^parallel.ep=3 does not divide model.num_experts=4 .*; valid: 1, 2, 4 \(and dividing parallel.dp_shard\)$"),
    (["parallel.ep=4"], 2,
     r"^parallel.ep=4: expert parallel borrows its ranks from dp_shard=2, so it must divide it; valid: 1, 2$"),
    (["parallel.ep=0"], 1, r"^parallel.ep=0: must be >= 1 \(1: every rank holds every expert\)$"),
    (["parallel.tp=2", "parallel.dp_shard=1"], 2,
     r"^parallel.tp=2 is not supported for model.family=gpt_oss .*; valid: parallel.tp=1$"),
    (["parallel.pp=2", "parallel.dp_shard=1"], 2, r"^parallel.pp=2 is not supported for model.family=gpt_oss"),
    (["model.num_experts=0"], 1, r"^model.num_experts=0: must be >= 1"),
    (["lora.rank=8"], 1, r"^lora.rank=8 is for model.family=llama"),
    (["model.moe_aux_loss_coeff=-1"], 1, r"^model.moe_aux_loss_coeff=-1.0: must be >= 0.0"),
    (["model.rope_factor=0.5"], 1, r"^model.rope_factor=0.5: must be >= 1.0"),
]


@pytest.mark.parametrize("overrides,world,message", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_moe_input_refused_before_launch(overrides, world, message):
    with pytest.raises(SpecError, match=message) as e:
        local.prepare("mini-moe-pretrain", None, [*overrides, "hardware.device=cpu"], world)
    assert "\n" not in str(e.value)


def test_expert_parallel_on_a_dense_model_is_refused():
    with pytest.raises(SpecError, match=r"^parallel.ep=2 needs a mixture-of-experts model \(model.family=gpt_oss\); "
                                        r"model.family=llama is dense: valid parallel.ep=1$"):
        local.prepare("mini-pretrain", None, ["parallel.ep=2", "hardware.device=cpu"], 2)


@pytest.fixture(scope="module")
def moe_ckpt(tmp_path_factory):
    """mini-moe-pretrain's model as a Hugging Face gpt-oss checkpoint dir: (dir, tensors, config)."""
    m = mini_moe_model()
    torch.manual_seed(0)
    model = build(m)
    tensors = {k: torch.randn(v.shape) for k, v in model.state_dict().items()}
    return tensors, family("gpt_oss").model_fields_to_config(m)


def write_ckpt(path, tensors, config):
    path.mkdir()
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("damage,message", [
    ("missing", r"lacks tensor 'model.layers.1.mlp.experts.down_proj'$"),
    ("misshaped", r"tensor 'model.layers.0.mlp.experts.gate_up_proj' has shape \[2, 64, 128\], "
                  r"config.json implies \[4, 64, 128\]$"),
])
def test_missing_or_misshaped_expert_tensor_is_refused(moe_ckpt, tmp_path, damage, message):
    tensors, config = moe_ckpt
    tensors = dict(tensors)
    if damage == "missing":
        del tensors["model.layers.1.mlp.experts.down_proj"]
    else:
        tensors["model.layers.0.mlp.experts.gate_up_proj"] = tensors["model.layers.0.mlp.experts.gate_up_proj"][:2]
    d = write_ckpt(tmp_path / "ck", tensors, config)
    with pytest.raises(SpecError, match=message) as e:
        local.prepare("mini-moe-pretrain", None, [f"model.path={d}", "hardware.device=cpu"], 1)
    assert "\n" not in str(e.value)


def test_checkpoint_config_round_trips_to_the_spec(moe_ckpt):
    _, config = moe_ckpt
    fields = family("gpt_oss").config_to_model_fields(json.loads(json.dumps(config)), "model.path")
    m = mini_moe_model()
    assert all(getattr(m, k) == v for k, v in fields.items()), fields


@pytest.mark.parametrize("sets,message", [
    (["model.experts_per_token=5"], "model.experts_per_token=5: each token's top-k must be 1..4"),
    (["parallel.tp=2", "parallel.dp_shard=1"], "parallel.tp=2 is not supported for model.family=gpt_oss"),
])
def test_cli_prints_one_line_and_exits_2(tmp_path, sets, message):
    args = [x for s in sets for x in ("--set", s)]
    out = run_cli("run", "mini-moe-pretrain", "--nproc-per-node", "2" if "tp" in sets[0] else "1", *args,
                  "--set", "hardware.device=cpu", "--db", str(tmp_path / "t.db"), "--out", str(tmp_path / "runs"),
                  cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "t.db").exists()
