"""ModelFamily: one owner per model family. Llama and GPT are registry entries; a toy family
registered here is built, priced and validated with no other change; no module outside a family's
own tests a family's name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from trainperf.core import families as core_families
from trainperf.core.errors import SpecError
from trainperf.core.families import ModelFamily, family
from trainperf.core.flops import linear_params, total_params, train_flops_per_token
from trainperf.core.spec import LoRASpec, ModelSpec, RunSpec
from trainperf.core.validate import check_choices, check_values, validate
from trainperf.model import families as model_families
from trainperf.model.families import FamilyModules, TPPlan, build_on_meta, init_full_tensor, tp_plan
from trainperf.workloads.mini_specs import mini_pretrain_defaults

SRC = Path(__file__).resolve().parents[2] / "src" / "trainperf"
# the modules a family owns: its torch-free half and its modules
FAMILY_MODULES = {"core/families/__init__.py", "core/families/family.py", "core/families/llama.py",
                  "core/families/gpt.py", "model/llama.py", "model/gpt.py"}
FAMILY_TEST = re.compile(r"""family\s*[!=]=|[!=]=\s*["'](gpt|llama)["']|isinstance\([^)]*(GPTModel|LlamaForCausalLM)""")


class Toy(ModelFamily):
    """Two-GEMM MLP without gate, no LoRA, at most four layers."""
    name = "toy"
    mlp_up_projections = 1

    def check(self, spec: RunSpec) -> None:
        if spec.model.num_layers > 4:
            raise SpecError(f"model.num_layers={spec.model.num_layers}: the toy family has at most 4")

    def projection_shapes(self, m: ModelSpec) -> dict[str, tuple[int, int]]:
        h, f = m.hidden_size, m.intermediate_size
        return {"q_proj": (h, h), "k_proj": (h, h), "v_proj": (h, h), "o_proj": (h, h), "up_proj": (h, f), "down_proj": (f, h)}

    def other_params(self, m: ModelSpec) -> int:
        return m.vocab_size * m.hidden_size


class ToyModel(nn.Module):
    LAYERS = "layers"
    FIRST_STAGE_MODULES = ("embed",)
    LAST_STAGE_MODULES = ("head",)

    def __init__(self, cfg: ModelSpec, options=None, lora=None):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleDict({str(i): nn.Linear(cfg.hidden_size, cfg.hidden_size) for i in range(cfg.num_layers)})
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)


def toy_init(name, shape, cfg, seed, device):
    return torch.full(shape, 0.5, device=device)


def toy_plan(model, tp, sequence_parallel):
    return TPPlan([(model, {})])


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(core_families.FAMILIES, "toy", Toy())
    monkeypatch.setitem(model_families.MODULES, "toy", FamilyModules(ToyModel, toy_init, toy_plan))
    return ModelSpec(name="toy", family="toy", vocab_size=32, hidden_size=16, intermediate_size=64, num_layers=2,
                     num_heads=2, num_kv_heads=2, max_position_embeddings=64)


def cpu_spec(model: ModelSpec) -> RunSpec:
    spec = mini_pretrain_defaults()
    spec.model = model
    spec.hardware.device = "cpu"
    spec.data.seq_len = 32
    return spec


def test_llama_and_gpt_are_registered_in_both_halves():
    assert core_families.names() == ("llama", "gpt", "gpt_oss")
    assert set(model_families.MODULES) == set(core_families.names())
    assert family("gpt").tied_embeddings and family("gpt").pads_vocab and family("gpt").mlp_up_projections == 1
    assert not family("llama").tied_embeddings and family("llama").mlp_up_projections == 2
    with pytest.raises(SpecError, match=r"model.family='moe': valid values are llama, gpt, gpt_oss"):
        family("moe")


def test_a_registered_family_is_validated_priced_and_built_without_other_change(toy):
    spec = cpu_spec(toy)
    check_choices(spec)
    check_values(spec)
    validate(spec, 1, cuda=False)
    spec.model.num_layers = 5
    with pytest.raises(SpecError, match="the toy family has at most 4"):
        check_values(spec)
    spec.model.num_layers = 2
    spec.lora.rank = 4
    with pytest.raises(SpecError, match="model.family=toy has no LoRA"):
        validate(spec, 1, cuda=False)

    # FLOPs and parameters from the toy's own projections: 4 x 16x16 + 2 x 16x64 per layer, head 16x32
    assert linear_params(toy) == {"q_proj": 512, "k_proj": 512, "v_proj": 512, "o_proj": 512, "up_proj": 2048,
                                  "down_proj": 2048, "lm_head": 512}
    assert total_params(toy) == 6656 + 512
    assert train_flops_per_token(toy, LoRASpec(), 32) == 6.0 * 6656 + 3.0 * 2.0 * 32 * 16 * 2
    assert toy.padded_vocab_size(8) == 32

    model = build_on_meta(toy)
    assert isinstance(model, ToyModel) and model.head.weight.is_meta
    assert torch.equal(init_full_tensor("head.weight", torch.Size([2, 2]), toy, 0, "cpu"), torch.full((2, 2), 0.5))
    assert tp_plan(model, 1, False).steps[0][0] is model


def test_the_planner_prices_a_registered_family_by_its_traits(toy, monkeypatch):
    from trainperf.plan.costs import activation_bytes_per_token_layer, megatron_activation_bytes_per_token_layer

    spec = cpu_spec(toy)
    one_up = (activation_bytes_per_token_layer(spec, "selective"), megatron_activation_bytes_per_token_layer(spec))
    monkeypatch.setattr(family("toy"), "mlp_up_projections", 2)
    two_up = (activation_bytes_per_token_layer(spec, "selective"), megatron_activation_bytes_per_token_layer(spec))
    # one more bf16 up-projection output kept per token, in both engines' models
    assert [b - a for a, b in zip(one_up, two_up)] == [2.0 * toy.intermediate_size] * 2


def test_no_module_outside_a_family_tests_a_family_name():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel in FAMILY_MODULES:
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if FAMILY_TEST.search(line):
                found.append(f"{rel}:{i}: {line.strip()}")
    assert not found, "family names tested outside the family modules:\n" + "\n".join(found)


def test_the_family_grep_finds_a_planted_branch():
    assert FAMILY_TEST.search('mlp_outs = 1 if m.family == "gpt" else 2')
    assert FAMILY_TEST.search("if cfg.family != 'llama':")
    assert FAMILY_TEST.search("isinstance(model, gpt.GPTModel)")
    assert not FAMILY_TEST.search('if spec.mlperf.benchmark == "gpt3":')
