"""One process, LoRA, bf16 base: the engine runs without FSDP2 (parallelize.runs_without_fsdp) and must
train exactly as it does under FSDP2's mixed precision."""

from __future__ import annotations

from unittest.mock import patch

import torch

from tests.fixtures.training import two_adamw_steps
from trainperf.parallel import parallelize as par
from trainperf.core.layout import resolve_layout
from trainperf.core.resolve import resolve_spec
from trainperf.train.engine import Engine
from trainperf.workloads.mini import mini_lora_defaults


def _two_steps(*overrides: str, fsdp: bool | None = None):
    """Losses and final adapter weights of two AdamW steps (2 micro-batches each) on the mini LoRA model.
    ``fsdp``: force the FSDP2 path (True) or leave the engine's choice (None)."""
    spec = resolve_spec(mini_lora_defaults(), None, ["train.seed=3", "lora.dropout=0", *overrides])
    resolve_layout(spec, 1)
    mesh = par.build_mesh(spec.parallel, "cpu")
    choice = (lambda *a: False) if fsdp else par.runs_without_fsdp
    with patch.object(par, "runs_without_fsdp", choice):
        engine = Engine(spec, mesh, torch.device("cpu"), torch.bfloat16)
    model = engine.parts[0][1]
    losses = two_adamw_steps(engine, spec.model.vocab_size)
    from torch.distributed.tensor import DTensor

    adapters = {n: (q.full_tensor() if isinstance(q, DTensor) else q).detach().clone()
                for n, q in model.named_parameters() if q.requires_grad}
    return model, losses, adapters


def test_one_process_lora_with_a_bf16_base_skips_fsdp_and_trains_identically(gloo_group):
    from torch.distributed.fsdp import FSDPModule

    plain, losses, adapters = _two_steps()
    sharded, ref_losses, ref_adapters = _two_steps(fsdp=True)
    assert not isinstance(plain, FSDPModule) and isinstance(sharded, FSDPModule)
    assert all(q.dtype == torch.float32 for q in adapters.values())  # fp32 masters either way
    assert losses == ref_losses and losses[1] != losses[0]
    for name, ref in ref_adapters.items():
        torch.testing.assert_close(adapters[name], ref, rtol=0, atol=0)


def test_full_training_and_fp32_bases_keep_fsdp(gloo_group):
    from torch.distributed.fsdp import FSDPModule

    full, _, _ = _two_steps("lora.rank=0")  # every parameter trains in fp32 masters: FSDP2 casts them
    fp32_base, _, _ = _two_steps("hardware.frozen_dtype=fp32")
    assert isinstance(full, FSDPModule) and isinstance(fp32_base, FSDPModule)
    # fp32 compute (CPU's default, param_dtype None): FSDP2 stays, whatever the base is stored in
    spec = resolve_spec(mini_lora_defaults(), None, [])
    resolve_layout(spec, 1)
    from trainperf.model.llama import build_on_meta
    from trainperf.model.lora import apply_lora

    model = build_on_meta(spec.model)
    apply_lora(model, spec.lora)
    assert par.runs_without_fsdp(model, par.build_mesh(spec.parallel, "cpu"), None) is False


def test_one_process_with_a_float8_stored_base_skips_fsdp_and_trains_like_it_under_fsdp(gloo_group):
    """hardware.frozen_dtype=fp8 (emulated float8 GEMMs on CPU): the matmul takes the float8 weights as
    stored, so one process skips FSDP2 here too, and trains exactly as under FSDP2 (which gathers the
    float8 shards as bf16)."""
    import pytest
    from torch.distributed.fsdp import FSDPModule

    pytest.importorskip("torchao")
    fp8 = ("hardware.fp8=tensorwise", "hardware.frozen_dtype=fp8")
    plain, losses, adapters = _two_steps(*fp8)
    sharded, ref_losses, ref_adapters = _two_steps(*fp8, fsdp=True)
    assert not isinstance(plain, FSDPModule) and isinstance(sharded, FSDPModule)
    assert any(q.dtype == torch.float8_e4m3fn for q in plain.parameters())
    assert losses == ref_losses and losses[1] != losses[0]
    for name, ref in ref_adapters.items():
        torch.testing.assert_close(adapters[name], ref, rtol=0, atol=0)


def test_full_training_with_autocast_skips_fsdp_and_trains_like_fsdp_mixed_precision(gloo_group):
    """hardware.mixed_precision=autocast (full training, one process): no FSDP2, fp32 parameters with
    fp32 gradients, bf16 GEMMs under torch.autocast; two steps give FSDP2's losses to 1% (bf16 rounding:
    the residual stream stays fp32 under autocast, bf16 under FSDP2's cast parameters)."""
    from torch.distributed.fsdp import FSDPModule

    plain, losses, _ = _two_steps("lora.rank=0", "hardware.mixed_precision=autocast")
    sharded, ref_losses, _ = _two_steps("lora.rank=0")
    assert not isinstance(plain, FSDPModule) and isinstance(sharded, FSDPModule)
    assert all(q.dtype == torch.float32 and type(q) is torch.nn.Parameter for q in plain.parameters())
    assert losses != ref_losses  # not the FSDP2 path in disguise
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-2, atol=0)
    assert losses[1] != losses[0]


def test_autocast_mixed_precision_is_refused_with_lora_or_more_than_one_process():
    import pytest

    from trainperf.core.errors import SpecError
    from trainperf.core.validate import check_mixed_precision

    spec = resolve_spec(mini_lora_defaults(), None, ["hardware.mixed_precision=autocast"])
    resolve_layout(spec, 1)
    with pytest.raises(SpecError, match="for full training"):
        check_mixed_precision(spec)
    spec = resolve_spec(mini_lora_defaults(), None, ["lora.rank=0", "hardware.mixed_precision=autocast"])
    resolve_layout(spec, 2)
    with pytest.raises(SpecError, match="for one process; this layout has 2"):
        check_mixed_precision(spec)
    with pytest.raises(SpecError, match="valid values are fsdp, autocast"):
        resolve_spec(mini_lora_defaults(), None, ["hardware.mixed_precision=amp"])
