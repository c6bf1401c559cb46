"""CPU tests of the Llama model, LoRA and the checkpoint code against Hugging Face / PEFT.

Tiny shapes (vocab 128, hidden 64, 2 layers, 4 heads, 2 kv heads, intermediate 96, seq 16), fp32.
Weights are re-drawn with a larger spread than HF's init (std 0.02) so that the logits are O(1)
and a 1e-4 tolerance actually discriminates (wrong RoPE, wrong eps, wrong q/k/v order, ...).
Non-default rope_theta and rms_norm_eps are used so that config plumbing mistakes show up.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from unittest.mock import patch

import pytest
import torch
import torch.nn.functional as F
from torch import nn

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from safetensors.torch import load_file, save_file  # noqa: E402

from trainperf.model.checkpoint import (  # noqa: E402
    check_checkpoint,
    gather_full_state,
    hf_config_to_model_fields,
    inspect_checkpoint,
    load_checkpoint_into,
    save_hf_checkpoint,
    save_peft_adapter,
)
from trainperf.model.llama import build_on_meta, init_full_tensor  # noqa: E402
from trainperf.model.lora import apply_lora, is_adapter_param  # noqa: E402
from trainperf.core.spec import LoRASpec, ModelSpec
from trainperf.core.errors import SpecError

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, INTER, SEQ, BATCH = 128, 64, 2, 4, 2, 96, 16, 2
ROPE_THETA, EPS, MAX_POS = 500.0, 1e-6, 64
TOL = 1e-4
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def make_spec(**overrides) -> ModelSpec:
    fields = dict(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER, num_layers=LAYERS, num_heads=HEADS,
        num_kv_heads=KV_HEADS, rope_theta=ROPE_THETA, rms_norm_eps=EPS, max_position_embeddings=MAX_POS,
    )
    fields.update(overrides)
    return ModelSpec(**fields)


def hf_config(**overrides):
    kw = dict(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, rope_theta=ROPE_THETA, rms_norm_eps=EPS,
        max_position_embeddings=MAX_POS, tie_word_embeddings=False, attn_implementation="eager",
        hidden_act="silu", attention_bias=False, mlp_bias=False,
    )
    kw.update(overrides)
    return transformers.LlamaConfig(**kw)


def randomize_(model: torch.nn.Module, seed: int) -> None:
    """Weights with enough spread that the logits are O(1): norms ~ 1 + noise, linears ~ N(0, 0.1^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * noise)
            elif "embed_tokens" in name:
                p.copy_(noise)
            else:
                p.copy_(0.1 * noise)


def random_ids(seed: int, batch: int = BATCH, seq: int = SEQ) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def hf_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def our_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).float()


def load_ours(path, spec: ModelSpec):
    index = inspect_checkpoint(str(path))
    check_checkpoint(index, spec)
    model = build_on_meta(spec).to_empty(device="cpu")
    nbytes = load_checkpoint_into(model, index)
    model.eval()
    return model, index, nbytes


def load_hf(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = transformers.LlamaForCausalLM.from_pretrained(str(path), attn_implementation="eager")
    return m.eval()


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


@pytest.fixture(scope="module")
def hf_ckpt(tmp_path_factory):
    """A random GQA HF LlamaForCausalLM saved as safetensors; returns (dir, model)."""
    torch.manual_seed(0)
    cfg = hf_config()
    model = transformers.LlamaForCausalLM(cfg)
    randomize_(model, seed=1)
    model.eval()
    d = tmp_path_factory.mktemp("hf_llama")
    model.save_pretrained(str(d), safe_serialization=True)
    assert list(d.glob("*.safetensors")), "save_pretrained wrote no safetensors"
    return d, model


# ---------------------------------------------------------------------------------------------
# 1. HF -> ours: logits parity


def test_config_json_maps_to_spec(hf_ckpt):
    d, _ = hf_ckpt
    index = inspect_checkpoint(str(d))
    fields = hf_config_to_model_fields(index.config, str(d))
    spec = make_spec()
    for key, value in fields.items():
        assert getattr(spec, key) == pytest.approx(value), key
    assert set(fields) >= {"vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                           "num_kv_heads", "rope_theta", "rms_norm_eps"}
    assert not index.fused_qkv


@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused_qkv"])
def test_hf_logits_parity_gqa(hf_ckpt, fused):
    d, hf_model = hf_ckpt
    spec = make_spec(fused_qkv=fused)
    assert spec.num_kv_heads < spec.num_heads
    ours, index, nbytes = load_ours(d, spec)
    # every checkpoint byte was read (fused: q,k,v are read once each, concatenated)
    assert nbytes == sum(p.numel() * 4 for p in hf_model.parameters())
    names = {n for n, _ in ours.named_parameters()}
    if fused:
        assert "model.layers.0.self_attn.qkv_proj.weight" in names
        assert "model.layers.0.self_attn.q_proj.weight" not in names
    else:
        assert names == set(hf_model.state_dict())
    ids = random_ids(seed=2)
    ref, got = hf_logits(hf_model, ids), our_logits(ours, ids)
    assert ref.abs().max() > 0.5, "logits too small for the tolerance to mean anything"
    assert max_diff(ref, got) < TOL


def test_hf_sharded_checkpoint_parity(hf_ckpt, tmp_path):
    """Sharded HF save (model.safetensors.index.json + several shards) loads identically."""
    _, hf_model = hf_ckpt
    hf_model.save_pretrained(str(tmp_path), safe_serialization=True, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    ours, index, _ = load_ours(tmp_path, make_spec())
    assert len({f for f, _, _ in index.tensors.values()}) > 1
    ids = random_ids(seed=3)
    assert max_diff(hf_logits(hf_model, ids), our_logits(ours, ids)) < TOL


def test_parity_is_sensitive_to_rope_theta(hf_ckpt):
    """Guard on the parity test: a different rope_theta must visibly change the logits."""
    d, hf_model = hf_ckpt
    ours, _, _ = load_ours(d, make_spec(rope_theta=10000.0))
    ids = random_ids(seed=2)
    assert max_diff(hf_logits(hf_model, ids), our_logits(ours, ids)) > 1e-2


# ---------------------------------------------------------------------------------------------
# 2. ours -> HF


def test_save_hf_checkpoint_loads_in_transformers(tmp_path):
    spec = make_spec(init_std=0.1)
    ours = build_on_meta(spec).to_empty(device="cpu")
    with torch.no_grad():
        for name, p in ours.named_parameters():
            p.copy_(init_full_tensor(name, p.shape, spec, seed=7, device="cpu"))
            if name.endswith("norm.weight"):  # not all ones, so a dropped norm weight would show
                p.add_(0.2 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
    ours.eval()
    dest = tmp_path / "ours_ckpt"
    save_hf_checkpoint(gather_full_state(ours), spec, str(dest))
    assert (dest / "config.json").is_file() and (dest / "model.safetensors").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temp dir left behind"

    hf_model = load_hf(dest)
    assert hf_model.config.num_key_value_heads == KV_HEADS
    assert hf_model.config.rms_norm_eps == pytest.approx(EPS)
    assert hf_model.config.rope_parameters["rope_theta"] == pytest.approx(ROPE_THETA)
    assert not hf_model.config.tie_word_embeddings
    assert next(hf_model.parameters()).dtype == torch.float32
    # every HF weight is exactly ours (nothing silently re-initialised as "missing")
    ours_sd = ours.state_dict()
    for name, t in hf_model.state_dict().items():
        assert torch.equal(t, ours_sd[name]), name
    ids = random_ids(seed=4)
    ref = our_logits(ours, ids)
    assert ref.abs().max() > 0.5
    assert max_diff(hf_logits(hf_model, ids), ref) < TOL

    # and it loads back into ours through the same path as an HF checkpoint
    again, _, _ = load_ours(dest, spec)
    assert max_diff(our_logits(again, ids), ref) == 0.0


# ---------------------------------------------------------------------------------------------
# 3. PEFT adapter round trip


def randomize_adapters_(model: torch.nn.Module, seed: int, scale: float = 0.1) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if is_adapter_param(name):
                p.copy_(scale * torch.randn(p.shape, generator=g))


def test_peft_adapter_round_trip(hf_ckpt, tmp_path):
    d, hf_base = hf_ckpt
    spec = make_spec()
    lora = LoRASpec(rank=4, alpha=8, dropout=0.0, target_modules=list(TARGETS))
    ours, _, _ = load_ours(d, spec)
    ids = random_ids(seed=5)
    base_logits = our_logits(ours, ids)

    wrapped = apply_lora(ours, lora)
    assert len(wrapped) == LAYERS * len(TARGETS)
    randomize_adapters_(ours, seed=6)
    ours.eval()
    mine = our_logits(ours, ids)

    adapter_state = gather_full_state(ours, only_adapters=True)
    assert len(adapter_state) == 2 * LAYERS * len(TARGETS)
    assert all(is_adapter_param(k) for k in adapter_state)
    adapter_dir = tmp_path / "adapter"
    save_peft_adapter(adapter_state, lora, str(adapter_dir), base_model_path=str(d))
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert cfg["r"] == 4 and cfg["lora_alpha"] == 8 and sorted(cfg["target_modules"]) == sorted(TARGETS)
    saved = load_file(str(adapter_dir / "adapter_model.safetensors"))
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in saved

    hf_model = load_hf(d)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        peft_model = peft.PeftModel.from_pretrained(hf_model, str(adapter_dir))
    assert not [w for w in caught if "missing adapter keys" in str(w.message)], [str(w.message) for w in caught]
    peft_model.eval()
    # PEFT holds exactly our adapter tensors, no more and no fewer
    theirs_adapters = {
        n.removeprefix("base_model.model.").replace(".default.", "."): p
        for n, p in peft_model.named_parameters() if ".lora_" in n
    }
    assert set(theirs_adapters) == set(adapter_state)
    for n, t in adapter_state.items():
        assert torch.equal(theirs_adapters[n].detach(), t), n
    assert peft_model.base_model.model.model.layers[0].self_attn.v_proj.scaling["default"] == pytest.approx(2.0)
    theirs = hf_logits(peft_model, ids)

    assert max_diff(theirs, mine) < TOL
    # the adapter really did something, on both sides
    assert max_diff(mine, base_logits) > 1e-2
    assert max_diff(theirs, hf_logits(hf_base, ids)) > 1e-2


# ---------------------------------------------------------------------------------------------
# 4. LoRA freezing and one optimiser step


def test_lora_freezing_and_step(hf_ckpt):
    d, _ = hf_ckpt
    torch.manual_seed(11)
    lora = LoRASpec(rank=4, alpha=8, dropout=0.1, target_modules=list(TARGETS))
    model, _, _ = load_ours(d, make_spec())
    apply_lora(model, lora)
    randomize_adapters_(model, seed=12)

    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    adapters = {n for n, _ in model.named_parameters() if is_adapter_param(n)}
    assert trainable == adapters
    assert len(adapters) == 2 * LAYERS * len(TARGETS)
    assert all(n.endswith((".lora_A.weight", ".lora_B.weight")) for n in trainable)

    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if not is_adapter_param(n)}
    adapters_before = {n: p.detach().clone() for n, p in model.named_parameters() if is_adapter_param(n)}

    ids = random_ids(seed=13, seq=SEQ + 1)
    inputs, targets = ids[:, :-1], ids[:, 1:]

    # dropout is live in train mode and off in eval mode
    model.train()
    with torch.no_grad():
        a, b = model(inputs), model(inputs)
    assert not torch.equal(a, b), "lora dropout=0.1 had no effect in train mode"
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(inputs), model(inputs))

    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2)
    logits = model(inputs)
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
    assert torch.isfinite(loss)
    loss.backward()
    opt.step()

    for n, p in model.named_parameters():
        if is_adapter_param(n):
            assert p.grad is not None, f"{n} received no gradient"
            assert p.grad.abs().sum() > 0, f"{n} gradient is all zero"
            if ".lora_B." in n:
                assert not torch.equal(p.detach(), adapters_before[n]), f"{n} did not change"
        else:
            assert p.grad is None, f"frozen {n} has a gradient"
            assert torch.equal(p.detach(), base_before[n]), f"frozen {n} changed"


# ---------------------------------------------------------------------------------------------
# 5. Bad checkpoints are SpecErrors


def copy_ckpt(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_wrong_tensor_shape_names_tensor(hf_ckpt, tmp_path):
    d, _ = hf_ckpt
    bad = copy_ckpt(d, tmp_path / "bad")
    tensors = load_file(str(bad / "model.safetensors"))
    victim = "model.layers.1.mlp.up_proj.weight"
    tensors[victim] = torch.zeros(INTER - 1, HIDDEN)
    save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    index = inspect_checkpoint(str(bad))
    with pytest.raises(SpecError, match=r"model\.layers\.1\.mlp\.up_proj\.weight") as exc:
        check_checkpoint(index, make_spec())
    assert str([INTER - 1, HIDDEN]) in str(exc.value)


def test_config_mismatch_names_tensor(hf_ckpt, tmp_path):
    """config.json says a different intermediate size than the tensors have."""
    d, _ = hf_ckpt
    bad = copy_ckpt(d, tmp_path / "bad")
    cfg = json.loads((bad / "config.json").read_text())
    cfg["intermediate_size"] = INTER * 2
    (bad / "config.json").write_text(json.dumps(cfg))
    index = inspect_checkpoint(str(bad))
    spec = make_spec(**hf_config_to_model_fields(index.config, str(bad)))
    assert spec.intermediate_size == INTER * 2
    with pytest.raises(SpecError, match=r"tensor 'model\.layers\.0\.mlp\.(gate|up|down)_proj\.weight'"):
        check_checkpoint(index, spec)


def test_missing_tensor_names_tensor(hf_ckpt, tmp_path):
    d, _ = hf_ckpt
    bad = copy_ckpt(d, tmp_path / "bad")
    tensors = load_file(str(bad / "model.safetensors"))
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(SpecError, match=r"model\.layers\.1\.self_attn\.k_proj\.weight"):
        check_checkpoint(inspect_checkpoint(str(bad)), make_spec())


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_safetensors_is_spec_error(hf_ckpt, tmp_path, damage):
    d, _ = hf_ckpt
    bad = copy_ckpt(d, tmp_path / "bad")
    f = bad / "model.safetensors"
    data = f.read_bytes()
    if damage == "truncate":
        f.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        f.write_bytes(b"\xde\xad\xbe\xef not a safetensors file" * 100)
    else:
        f.write_bytes(b"")
    with pytest.raises(SpecError, match="model.safetensors"):
        inspect_checkpoint(str(bad))


def test_missing_config_json_is_spec_error(hf_ckpt, tmp_path):
    d, _ = hf_ckpt
    bad = copy_ckpt(d, tmp_path / "bad")
    (bad / "config.json").unlink()
    with pytest.raises(SpecError, match="config.json"):
        inspect_checkpoint(str(bad))


def test_not_a_directory_and_no_shards_are_spec_errors(hf_ckpt, tmp_path):
    with pytest.raises(SpecError):
        inspect_checkpoint(str(tmp_path / "does_not_exist"))
    d, _ = hf_ckpt
    bad = copy_ckpt(d, tmp_path / "bad")
    (bad / "model.safetensors").unlink()
    with pytest.raises(SpecError, match="safetensors"):
        inspect_checkpoint(str(bad))


# ---------------------------------------------------------------------------------------------
# Fused-QKV checkpoints (the MLPerf Llama-2-70B layout) in both directions.


def _fused_model(seed: int = 3):
    spec = make_spec(fused_qkv=True, init_std=0.1)
    model = build_on_meta(spec).to_empty(device="cpu")
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(init_full_tensor(name, p.shape, spec, seed=seed, device="cpu"))
    model.eval()
    return spec, model


def test_fused_checkpoint_into_unfused_model(tmp_path):
    import json

    from safetensors.torch import save_file

    from trainperf.model.checkpoint import model_fields_to_hf_config

    spec_f, fused = _fused_model()
    dest = tmp_path / "fused"
    dest.mkdir()
    (dest / "config.json").write_text(json.dumps(model_fields_to_hf_config(spec_f)))
    save_file({k: v.contiguous() for k, v in gather_full_state(fused).items()}, str(dest / "model.safetensors"))
    index = inspect_checkpoint(str(dest))
    assert index.fused_qkv
    spec = make_spec(init_std=0.1)
    check_checkpoint(index, spec)
    ours = build_on_meta(spec).to_empty(device="cpu")
    load_checkpoint_into(ours, index)
    ours.eval()
    ids = random_ids(seed=8)
    assert max_diff(our_logits(ours, ids), our_logits(fused, ids)) < TOL


def test_fused_model_saves_a_transformers_loadable_checkpoint(tmp_path):
    _, fused = _fused_model()
    save_hf_checkpoint(gather_full_state(fused), fused.cfg, str(tmp_path / "fused"))
    assert not inspect_checkpoint(str(tmp_path / "fused")).fused_qkv  # split into q/k/v on save
    hf_model = load_hf(tmp_path / "fused")
    ids = random_ids(seed=9)
    assert max_diff(hf_logits(hf_model, ids), our_logits(fused, ids)) < TOL


def test_frozen_float8_matmul_is_torchaos_forward_and_input_gradient_without_the_weight_gradient():
    """hardware.fp8 for a frozen LoRA base: the same float8 forward and input gradient as torchao's
    Float8Linear (bit for bit), close to the high-precision matmul, and no weight-gradient GEMM."""
    pytest.importorskip("torchao")
    from torchao.float8 import convert_to_float8_training

    from trainperf.model.float8 import float8_config, frozen_linear, linear_mm_config

    torch.manual_seed(0)
    for recipe in ("tensorwise", "rowwise"):
        config = float8_config(recipe)
        ref = nn.Sequential(nn.Linear(64, 96, bias=False))
        convert_to_float8_training(ref, config=config)
        weight = ref[0].weight.detach().clone()
        x = torch.randn(2, 48, 64, requires_grad=True)
        x_ref = x.detach().clone().requires_grad_(True)
        y = frozen_linear(x, weight, (linear_mm_config(config), config))
        y_ref = ref(x_ref)
        g = torch.randn_like(y)
        y.backward(g)
        y_ref.backward(g)
        assert torch.equal(y, y_ref) and torch.equal(x.grad, x_ref.grad)
        exact = x.detach() @ weight.t()
        assert (y - exact).norm() / exact.norm() < 0.1  # float8 rounding, not a different function
        assert weight.grad is None and ref[0].weight.grad is not None  # torchao computes it; we do not


def test_frozen_float8_matmul_compiles_in_one_graph_and_matches_eager():
    """train.compile=true with hardware.fp8: the frozen-base float8 matmul (an autograd.Function over
    torchao's tensor subclass) traces into one graph (fullgraph: a graph break would raise) and gives
    eager's forward and input gradient -- the compiled float8 path the planner credits."""
    pytest.importorskip("torchao")
    from trainperf.model.float8 import float8_config, frozen_linear, linear_mm_config

    torch.manual_seed(0)
    config = float8_config("tensorwise")
    f8 = (linear_mm_config(config), config)
    weight = torch.randn(96, 64)
    x = torch.randn(2, 48, 64, requires_grad=True)
    x_c = x.detach().clone().requires_grad_(True)
    torch._dynamo.reset()
    # aot_eager: dynamo's capture and AOT autograd as under Inductor (graph breaks, subclass tracing),
    # without the CPU code generation that would add ~15 s to CI and says nothing about GPUs
    compiled = torch.compile(lambda a: frozen_linear(a, weight, f8).relu(), fullgraph=True, backend="aot_eager")
    y, y_c = frozen_linear(x, weight, f8).relu(), compiled(x_c)
    g = torch.randn_like(y)
    y.backward(g)
    y_c.backward(g)
    assert torch.allclose(y, y_c, rtol=1e-3, atol=1e-3) and torch.allclose(x.grad, x_c.grad, rtol=1e-3, atol=1e-3)
    assert (y - (x.detach() @ weight.t()).relu()).abs().max() > 0  # float8 rounding: not the plain matmul


def test_compiled_float8_matmul_keeps_no_float8_weight_for_backward():
    """Compiled, the frozen float8 GEMM's forward and backward weight casts must not be merged into one
    whose float8 output is kept from forward to backward: under FSDP2 that holds a float8 copy of every
    unsharded layer (the 70B recipe ran out of memory in its first forward on 2 x H200). The weight is
    a plain graph input here, as FSDP2's unsharded parameters can be, with the partitioner told so."""
    pytest.importorskip("torchao")
    import torch._functorch.config as functorch_config

    from trainperf.model.float8 import float8_config, frozen_linear, linear_mm_config

    torch.manual_seed(0)
    config = float8_config("tensorwise")
    f8 = (linear_mm_config(config), config)
    weight = torch.randn(96, 64, dtype=torch.bfloat16)
    x = torch.randn(2, 48, 64, dtype=torch.bfloat16, requires_grad=True)
    saved = []

    def pack(t):
        saved.append((t.dtype, t.numel()))
        return t

    torch._dynamo.reset()
    compiled = torch.compile(lambda a, w: frozen_linear(a, w, f8), fullgraph=True,
                             backend="aot_eager_decomp_partition")  # Inductor's partitioner, no codegen
    with patch.object(functorch_config, "treat_parameters_as_free_to_save", False):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = compiled(x, weight)
        y.float().sum().backward()
    assert saved, "the compiled graph saved nothing: the hook did not see it"
    assert not [s for s in saved if s[0] == torch.float8_e4m3fn and s[1] == weight.numel()], saved
    assert x.grad is not None and torch.isfinite(x.grad.float()).all()


def test_float8_full_training_swaps_the_decoder_linears_only():
    """hardware.fp8 without LoRA: torchao's Float8Linear in the decoder layers (weights train in float8
    GEMMs), the LM head and embedding untouched; a step's loss and gradients stay close to bf16's."""
    pytest.importorskip("torchao")

    from torchao.float8.float8_linear import Float8Linear

    from trainperf.model.llama import LlamaForCausalLM
    from trainperf.model.options import ModelOptions
    from trainperf.core.spec import ModelSpec

    torch.manual_seed(0)
    cfg = ModelSpec(vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=4)
    model = LlamaForCausalLM(cfg)
    with torch.device("meta"):  # built as float8 (draws nothing), then the same weights
        fp8 = LlamaForCausalLM(cfg, ModelOptions(fp8="tensorwise"))
    fp8.load_state_dict({k: v.clone() for k, v in model.state_dict().items()}, assign=True)
    assert sum(isinstance(m, Float8Linear) for m in fp8.model.layers.modules()) == 14  # 7 Linears per layer
    assert all(isinstance(m, Float8Linear) for n, m in fp8.model.layers.named_modules() if isinstance(m, nn.Linear))
    assert type(fp8.lm_head) is nn.Linear
    ids = torch.randint(0, 64, (2, 32))
    losses, grads = [], []
    for m in (model, fp8):
        logits = m(ids)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, 64), ids[:, 1:].reshape(-1))
        loss.backward()
        losses.append(loss.item())
        grads.append(m.model.layers["0"].mlp.up_proj.weight.grad)
    assert abs(losses[1] / losses[0] - 1) < 0.02 and losses[1] != losses[0]
    assert (grads[1] - grads[0]).norm() / grads[0].norm() < 0.15


@pytest.mark.slow
def test_compiled_layers_share_one_graph_with_fp8_and_hybrid_recompute():
    """train.compile with hardware.fp8 and train.recompute=full for some layers, selective for the rest
    (what plan picks for the 70B recipe): every decoder layer compiles (fullgraph) and the layers reuse
    the same few graphs -- more layers than dynamo's recompile limit (8), so a per-layer guard (a
    per-instance forward, a per-layer policy function) fails here as it did on the GPU. Loss and
    adapter gradients match the eager model's."""
    pytest.importorskip("torchao")
    import copy

    from trainperf.model.float8 import float8_frozen_linears
    from trainperf.model.llama import LlamaForCausalLM
    from trainperf.model.options import ModelOptions
    from trainperf.parallel.parallelize import apply_activation_checkpointing, apply_compile
    from trainperf.core.spec import LoRASpec, ModelSpec

    torch.manual_seed(0)
    model = LlamaForCausalLM(ModelSpec(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=11,
                                       num_heads=2, num_kv_heads=2), ModelOptions(fp8="tensorwise", emulate_fp8=True),
                             lora=LoRASpec(rank=4, alpha=8.0, dropout=0.0))
    for p in model.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.02)  # lora_B starts at zero: give its gradient path some signal
    frozen = float8_frozen_linears(model)
    assert len(frozen) == 11 * 7 and all(m.float8_gemm is not None for m in frozen)
    apply_activation_checkpointing(model, "full", 4, others="selective")
    eager = copy.deepcopy(model)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # graphs compiled by earlier tests are counted there too
    apply_compile(model, backend="aot_eager")
    ids = torch.randint(0, 64, (2, 24))
    losses = []
    for m in (eager, model):
        logits = m(ids)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), ids.flatten())
        loss.backward()
        losses.append(loss.detach())
    assert torch.allclose(losses[0], losses[1], rtol=1e-4)
    for (name, p), q in zip(eager.named_parameters(), model.parameters()):
        if p.requires_grad:
            assert torch.allclose(p.grad, q.grad, rtol=1e-3, atol=1e-5), name
    # one graph for the full-recompute layers, one for the selective ones (a frame may be counted
    # once more for its first guard failure); per-layer guards would give 8+ and fail fullgraph first
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] <= 4


@pytest.mark.slow
def test_compiled_full_recompute_layers_checkpoint_around_the_compiled_forward():
    """A fully recomputed layer is checkpoint(compiled forward), not compile(checkpoint(forward)): traced
    inside, the checkpoint of a float8 layer kept 1.16 GiB of float8 copies per 70B layer on the H200
    (0.125 GiB eager); with the checkpoint outside, the only tensors the layer keeps for backward are its
    inputs, whatever the compiled graph saves (measured on the H200: 0.125 GiB per layer, as eager).
    Selective layers keep their checkpoint inside the compiled graph (the policy must see its ops)."""
    pytest.importorskip("torchao")
    from trainperf.model.llama import LlamaForCausalLM
    from trainperf.model.options import ModelOptions
    from trainperf.parallel.layer_wrapper import LayerWrapper
    from trainperf.parallel.parallelize import apply_activation_checkpointing, apply_compile
    from trainperf.core.spec import LoRASpec, ModelSpec

    torch.manual_seed(0)
    model = LlamaForCausalLM(ModelSpec(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=3,
                                       num_heads=2, num_kv_heads=2), ModelOptions(fp8="tensorwise", emulate_fp8=True),
                             lora=LoRASpec(rank=4, alpha=8.0, dropout=0.0))
    apply_activation_checkpointing(model, "full", 2, others="selective")
    torch._dynamo.reset()
    apply_compile(model, backend="aot_eager")
    full, selective = [model.model.layers[str(i)] for i in (0, 2)]
    # compiled inside the checkpoint: the compiled part is the plain layer forward
    assert full.body._torchdynamo_orig_callable.__func__ is LayerWrapper.layer_forward
    assert not hasattr(full.forward, "_torchdynamo_orig_callable")
    # checkpoint inside the compiled graph
    assert selective.body._torchdynamo_orig_callable.__func__ is LayerWrapper.selective_forward
    saved: list[tuple] = []
    h = model.model.embed_tokens(torch.randint(0, 64, (2, 24)))
    from trainperf.model.llama import rope_cos_sin

    cos, sin = rope_cos_sin(24, 16, 10000.0, h.device, torch.float32)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        out = full(h.detach().requires_grad_(), cos, sin)
    out.sum().backward()
    # what the checkpoint keeps: the layer's arguments (hidden states, cos, sin), nothing from inside
    assert sorted(saved) == sorted([(2, 24, 32), (24, 16), (24, 16)]), saved


def test_float8_stored_base_loads_a_checkpoint_computes_like_the_dynamic_cast_and_exports_in_full(tmp_path, gloo_group):
    """hardware.frozen_dtype=fp8 through the engine (one gloo process, emulated float8 GEMMs): a real
    checkpoint loads into float8 weights (each scaled from its whole tensor), the forward equals the
    dynamic-cast path's to the bit, the frozen decoder weights take a byte each, and a base export
    gives them back in the base's dtype within float8 rounding."""
    pytest.importorskip("torchao")
    from tests.fixtures.inputs import make_checkpoint

    from trainperf.parallel.parallelize import build_mesh
    from trainperf.core.layout import resolve_layout
    from trainperf.core.resolve import resolve_spec
    from trainperf.train.engine import Engine
    from trainperf.workloads.mini import mini_lora_defaults

    ck = make_checkpoint(tmp_path / "ck")

    def engine(extra):
        spec = resolve_spec(mini_lora_defaults(), None, ["hardware.device=cpu", "parallel.dp_shard=1",
                                                         "hardware.fp8=tensorwise", f"model.path={ck}", *extra])
        resolve_layout(spec, 1)
        return Engine(spec, build_mesh(spec.parallel, "cpu"), torch.device("cpu"), None)

    dynamic, stored = engine([]), engine(["hardware.frozen_dtype=fp8"])
    (_, md), (_, ms) = dynamic.parts[0], stored.parts[0]
    f8 = {n for n, q in ms.named_parameters() if q.dtype == torch.float8_e4m3fn}
    projections = {n for n, _ in md.named_parameters() if ".layers." in n and n.endswith("proj.weight")}
    assert f8 == projections  # every frozen decoder projection, nothing else
    assert {n for n, q in md.named_parameters() if q.dtype == torch.float8_e4m3fn} == set()
    ids = torch.randint(0, dynamic.spec.model.vocab_size, (2, 32))
    md.eval()
    ms.eval()
    with torch.no_grad():
        assert torch.equal(md(ids), ms(ids))
    nbytes = lambda m: sum(q.numel() * q.element_size() for n, q in m.named_parameters() if n in f8)  # noqa: E731
    assert nbytes(ms) * 4 == nbytes(md)  # fp32 base on CPU -> 1 byte
    base_d, base_s = dynamic.gather(base_only=True), stored.gather(base_only=True)
    for n in f8:
        assert base_s[n].dtype == base_d[n].dtype
        err = (base_s[n] - base_d[n]).abs().max() / base_d[n].abs().max()
        assert 0 < err < 2 ** -3  # e4m3 keeps 3 mantissa bits
