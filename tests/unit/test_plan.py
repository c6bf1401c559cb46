"""The planner's cost model and search (CPU only: no GPU needed to plan)."""

from __future__ import annotations

import json

import pytest
from trainperf.plan.costs import activation_bytes_per_token_layer, estimate
from trainperf.plan.hardware import PRESETS, load_gpu
from trainperf.plan.search import candidate_layouts, plan
from trainperf.core.spec import ModelSpec
from trainperf.core.resolve import resolve_spec
from trainperf.core.errors import SpecError
from trainperf.core import flops as metrics
from trainperf.workloads.mini import synthetic_lora_defaults

from tests.fixtures.specs import spec_for
LLAMA3_8B = ModelSpec(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8)
LLAMA2_70B = ModelSpec(vocab_size=32000, hidden_size=8192, intermediate_size=28672, num_layers=80, num_heads=64, num_kv_heads=8)


def test_parameter_counts_of_known_models():
    assert metrics.total_params(LLAMA3_8B) == 8_030_261_248
    assert metrics.total_params(LLAMA2_70B) == 68_976_648_192


def _saved_bytes_per_token_layer(model_kw: dict, lora: dict | None, mode: str, tokens: int = 256,
                                 compiled: bool = False) -> float:
    """What one decoder layer of our model keeps for backward, per token: the CPU profiler's net
    allocations over a bf16 forward of 4 layers minus 2 layers (embedding, head and logits cancel).
    ``compiled``: per-layer torch.compile with Inductor's partitioner (min-cut rematerialisation and
    its decompositions, no code generation), compiled by a forward and backward before the window."""
    import gc

    import torch

    from torch.profiler import ProfilerActivity, profile

    from trainperf.model.llama import LlamaForCausalLM
    from trainperf.model.lora import apply_lora
    from trainperf.parallel.parallelize import apply_activation_checkpointing, apply_compile
    from trainperf.core.spec import LoRASpec, ModelSpec

    held = []
    for layers in (2, 4):
        torch.manual_seed(0)
        model = LlamaForCausalLM(ModelSpec(vocab_size=64, num_layers=layers, max_position_embeddings=tokens, **model_kw))
        if lora:
            apply_lora(model, LoRASpec(**lora))
        model.to(torch.bfloat16)
        apply_activation_checkpointing(model, mode)
        model.train()
        ids = torch.randint(0, 64, (1, tokens))
        if compiled:
            torch._dynamo.reset()
            apply_compile(model, backend="aot_eager_decomp_partition")
            model(ids).float().sum().backward()
        gc.collect()
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = model(ids)
        held.append(sum(e.self_cpu_memory_usage for e in prof.key_averages()))
        del out
    return (held[1] - held[0]) / 2 / tokens


@pytest.mark.parametrize("shape,lora,mode", [
    ({"hidden_size": 256, "intermediate_size": 688, "num_heads": 4, "num_kv_heads": 4}, None, "none"),
    ({"hidden_size": 256, "intermediate_size": 688, "num_heads": 4, "num_kv_heads": 4}, None, "selective"),
    ({"hidden_size": 384, "intermediate_size": 512, "num_heads": 6, "num_kv_heads": 2},
     {"rank": 16, "dropout": 0.0}, "none"),
    ({"hidden_size": 384, "intermediate_size": 512, "num_heads": 6, "num_kv_heads": 2},
     {"rank": 16, "dropout": 0.1}, "none"),
    ({"hidden_size": 256, "intermediate_size": 688, "num_heads": 4, "num_kv_heads": 4},
     {"rank": 32, "dropout": 0.1, "target_modules": ["q_proj", "v_proj", "down_proj"]}, "none"),
    ({"hidden_size": 384, "intermediate_size": 512, "num_heads": 6, "num_kv_heads": 2},
     {"rank": 16, "dropout": 0.1}, "selective"),
    ({"hidden_size": 256, "intermediate_size": 688, "num_heads": 4, "num_kv_heads": 4},
     {"rank": 16, "dropout": 0.1}, "full"),
])
def test_activation_bytes_are_what_the_layer_saves(shape, lora, mode):
    """The planner's activation bytes, tensor by tensor, against what our layer really keeps for
    backward (measured with the CPU profiler; CPU's F.dropout keeps a 2-byte mask, CUDA's a 1-byte one)."""
    from trainperf.core.spec import LoRASpec, ModelSpec

    measured = _saved_bytes_per_token_layer(shape, lora, mode)
    spec = spec_for()
    spec.model = ModelSpec(**shape)
    spec.lora = LoRASpec(**(lora or {"rank": 0}))
    predicted = activation_bytes_per_token_layer(spec, mode, mask_bytes=2.0)
    # abs: a checkpointed layer with dropout also keeps the CPU RNG state (~5 KB a layer, not per token)
    assert predicted == pytest.approx(measured, rel=0.01, abs=24)


@pytest.mark.parametrize("shape,lora,mode", [  # (also held, not kept for CI time: LoRA without dropout, full training selective)
    ({"hidden_size": 256, "intermediate_size": 688, "num_heads": 4, "num_kv_heads": 4}, {"rank": 16, "dropout": 0.1}, "none"),
    ({"hidden_size": 256, "intermediate_size": 688, "num_heads": 4, "num_kv_heads": 4}, None, "none"),
    ({"hidden_size": 384, "intermediate_size": 512, "num_heads": 6, "num_kv_heads": 2}, {"rank": 16, "dropout": 0.1}, "selective"),
])
@pytest.mark.slow
def test_compiled_activation_bytes_are_what_the_partitioner_keeps(shape, lora, mode):
    """train.compile: what the compiled layer keeps (norms their bf16 input only, SiLU recomputed,
    bool masks, selective without down_proj's output) -- the rule that also matches the H200 runs
    (docs/PLANNER.md), measured here on CPU with the same partitioner. Eager keeps more, so the two
    predictions must differ by what the partitioner drops."""
    from trainperf.core.spec import LoRASpec, ModelSpec

    measured = _saved_bytes_per_token_layer(shape, lora, mode, compiled=True)
    spec = spec_for("train.compile=true")
    spec.model = ModelSpec(**shape)
    spec.lora = LoRASpec(**(lora or {"rank": 0}))
    predicted = activation_bytes_per_token_layer(spec, mode)
    assert predicted < activation_bytes_per_token_layer(spec, mode, mask_bytes=2.0, compiled=False)
    assert predicted == pytest.approx(measured, rel=0.02, abs=24)


def test_activation_formulas_under_tensor_parallel():
    h, f = 4096, 11008
    none = activation_bytes_per_token_layer(spec_for("lora.rank=0"))
    sp = activation_bytes_per_token_layer(spec_for("lora.rank=0", "parallel.tp=4", "parallel.sp=true"))
    tp = activation_bytes_per_token_layer(spec_for("lora.rank=0", "parallel.tp=4"))
    assert none / 4 < sp < tp < none  # SP splits the norms too; gathered projection inputs stay whole
    assert tp - sp == pytest.approx(2 * 6 * h * (1 - 1 / 4))  # two norms' fp32 input + bf16 output
    full = activation_bytes_per_token_layer(spec_for("lora.rank=0", "train.recompute=full"))
    assert full == 2 * h
    sel = activation_bytes_per_token_layer(spec_for("lora.rank=0", "train.recompute=selective"))
    assert full < sel < none
    lora = activation_bytes_per_token_layer(spec_for())  # dropout 0.1 on q/k/v/o: x_drop + mask per module
    no_drop = activation_bytes_per_token_layer(spec_for("lora.dropout=0"))
    assert lora - no_drop == pytest.approx(3 * 4 * h - 2 * h)  # 4 x (mask + copy); the shared input goes


# What 2 x H200 measured on 2026-11-30 (docs/PERFORMANCE.md): tokens/s per GPU and peak GiB of the
# 7B-shape LoRA at seq 8192, GBS 4. The model's three fitted constants come from these runs, so this
# is an in-sample regression guard for the formulas, not an accuracy claim. Those runs kept fp32
# masters of the frozen base (before hardware.frozen_dtype existed), hence frozen_dtype=fp32 below.
MEASURED = {
    "1gpu": (1, ["parallel.dp_shard=1"], 11778, 73.2),
    "ddp": (2, ["parallel.dp_replicate=2", "parallel.dp_shard=1"], 11850, 73.2),
    "fsdp": (2, ["parallel.dp_shard=2"], 11492, 60.5),
    "tp_sp": (2, ["parallel.tp=2", "parallel.sp=true", "parallel.dp_shard=1"], 3868, 41.6),
    "cp": (2, ["parallel.cp=2", "parallel.dp_shard=1"], 8493, 36.8),
    "pp": (2, ["parallel.pp=2", "parallel.pp_schedule=1F1B", "parallel.dp_shard=1"], 9821, 63.7),
}


# The TP2+SP constants were refitted jointly with the 12 TP layouts of the 1B host-bound grid
# (bench/data/grid_1b_lora_2xh200.json): one pair of constants cannot hold both, and this run is now
# reproduced within 25% (docs/PLANNER.md says so); the others keep 8%.
TOLERANCE = {"tp_sp": 0.25}


@pytest.mark.parametrize("name", list(MEASURED))
def test_reproduces_the_measured_h200_layouts(name):
    gpus, overrides, tps, mem = MEASURED[name]
    est = estimate(spec_for(*overrides, "hardware.frozen_dtype=fp32"), PRESETS["h200"], 8)
    assert abs(est.tokens_per_s_per_gpu / tps - 1) < TOLERANCE.get(name, 0.08)
    assert abs(est.allocated_gib / mem - 1) < 0.04


def test_bf16_frozen_base_saves_two_bytes_per_frozen_parameter():
    from trainperf.core.flops import lora_params

    spec = spec_for("parallel.dp_shard=1")
    fp32 = estimate(spec_for("parallel.dp_shard=1", "hardware.frozen_dtype=fp32"), PRESETS["h200"], 8)
    bf16 = estimate(spec, PRESETS["h200"], 8)  # auto: bf16 compute on GPU -> bf16 base
    all_params = fp32.memory["weights_sharded"] / 4  # one GPU: every parameter at 4 bytes
    frozen = all_params - lora_params(spec.model, spec.lora)
    saved = fp32.memory["weights_sharded"] - bf16.memory["weights_sharded"]
    assert saved == pytest.approx(2 * frozen)
    assert fp32.tokens_per_s_per_gpu == bf16.tokens_per_s_per_gpu  # same compute either way


def test_more_sharding_never_raises_memory():
    for extra in ([], ["train.recompute=full"], ["lora.rank=0"]):
        mems = [estimate(spec_for(f"parallel.dp_shard={d}", "train.global_batch_size=8", *extra), PRESETS["h200"], 8).allocated_gib
                for d in (1, 2, 4, 8)]
        assert mems == sorted(mems, reverse=True), (extra, mems)
        tps = [estimate(spec_for(f"parallel.tp={t}", "parallel.sp=true", "parallel.dp_shard=1", *extra), PRESETS["h200"], 8).allocated_gib
               for t in (1, 2, 4, 8)]
        assert tps == sorted(tps, reverse=True), (extra, tps)


def test_a_bigger_gpu_never_flips_fit_to_oom():
    base = spec_for("model.num_layers=80", "model.hidden_size=8192", "model.intermediate_size=28672",
                    "model.num_heads=64", "model.num_kv_heads=8", "train.global_batch_size=8")
    h100_fits, _ = plan(base, PRESETS["h100"], 8, 8, objective="throughput")
    h200_fits, _ = plan(base, PRESETS["h200"], 8, 8, objective="throughput")
    assert h100_fits
    # every layout that fits the smaller GPU fits the bigger one (a partial-recompute variant is checked
    # directly: on the bigger GPU plan offers a variant with fewer recomputed layers instead)
    assert all(estimate(c.spec, PRESETS["h200"], 8).fits for c in h100_fits)
    plain = {c.set_line for c in h200_fits}
    assert {c.set_line for c in h100_fits if "train.recompute_layers" not in c.overrides} <= plain


def test_candidates_respect_the_engine_rules():
    base = spec_for("train.global_batch_size=8")
    cands = list(candidate_layouts(base, 16, 8))
    assert cands
    for o in cands:
        assert o["parallel.tp"] <= 8  # TP inside a node
        assert o["parallel.tp"] * o["parallel.cp"] * o["parallel.pp"] * o["parallel.dp_replicate"] * o["parallel.dp_shard"] == 16
        assert not (o["parallel.cp"] > 1 and o["parallel.pp"] > 1)


def test_ranked_best_first_and_explained():
    fits, oom = plan(spec_for(), PRESETS["h200"], 2, 2, objective="throughput")
    speeds = [c.est.tokens_per_s_per_gpu for c in fits]
    assert speeds == sorted(speeds, reverse=True)
    assert all(c.est.fits for c in fits) and all(not c.est.fits for c in oom)
    assert fits[0].id == "P1" and "--set parallel.dp_shard=" in fits[0].set_line


def test_bad_planner_inputs():
    with pytest.raises(SpecError, match="not a preset"):
        load_gpu("tpu-v9")
    with pytest.raises(SpecError, match="whole number of nodes"):
        plan(spec_for(), PRESETS["h200"], 12, 8)


def test_gpu_yaml_file(tmp_path):
    f = tmp_path / "gpu.yaml"
    f.write_text("base: h100\nname: my H100\nhbm_gib: 90\n")
    gpu = load_gpu(str(f))
    assert gpu.name == "my H100" and gpu.hbm_gib == 90 and gpu.bf16_tflops == 989
    f.write_text("base: h100\nwarp_speed: 9\n")
    with pytest.raises(SpecError, match="unknown fields"):
        load_gpu(str(f))


def test_predicted_oom_is_refused_before_launch():
    from trainperf.plan.costs import check_memory

    seventy = spec_for("model.num_layers=80", "model.hidden_size=8192", "model.intermediate_size=28672",
                       "model.num_heads=64", "model.num_kv_heads=8", "parallel.dp_shard=1", "train.global_batch_size=1")
    with pytest.raises(SpecError, match="predicted peak memory .* exceeds the 79 GiB") as info:
        check_memory(seventy, PRESETS["h100"], 8)
    assert "\n" not in str(info.value) and "hardware.memory_check=false" in str(info.value)
    seven = spec_for("parallel.dp_shard=1", "train.global_batch_size=1")
    assert check_memory(seven, PRESETS["h200"], 8).fits  # measured 73.2 GiB on an H200: it fits


def test_eight_bit_adamw_is_what_fits_llama3_8b_pretraining_on_one_h200():
    """The 8B shape's fp32 masters, gradients and AdamW moments (16 B per parameter, 120 GiB) leave no
    room for seq-8192 activations on one H200; 8-bit moments (~2 B) do, and the refusal says so."""
    import copy

    from trainperf.plan.costs import (OPTIMIZER_SECONDS_PER_TENSOR, OPTIMIZER_STATE_BYTES, OPTIMIZER_STEP_BYTES,
                                      check_memory, eight_bit_optimizer_hint, estimate, trained_tensors)
    from trainperf.mlperf.recipes import llama2_70b_lora_defaults, llama31_8b_defaults

    spec = resolve_spec(llama31_8b_defaults(), None, ["mlperf.division=open", "train.global_batch_size=4",
                                                      "train.recompute=full", "parallel.dp_shard=1"])
    with pytest.raises(SpecError, match="predicted peak memory") as info:
        check_memory(spec, PRESETS["h200"], 1)
    assert "train.optimizer=adamw8bit" in str(info.value) and "\n" not in str(info.value)
    eight = copy.deepcopy(spec)
    eight.train.optimizer = "adamw8bit"
    full, small = estimate(spec, PRESETS["h200"], 1), check_memory(eight, PRESETS["h200"], 1)
    assert small.fits
    ratio = small.memory["optimizer_states"] / full.memory["optimizer_states"]
    assert ratio == pytest.approx(OPTIMIZER_STATE_BYTES["adamw8bit"] / 8.0) and ratio < 0.26
    assert full.memory["optimizer_states"] / 2**30 == pytest.approx(8.03e9 * 8 / 2**30, rel=0.01)
    # the 8-bit step: re-quantising kernels (87 B per parameter at HBM rate) and host time per tensor
    # (291 here) -- the longer step (measured 0.42-0.47 s per step on one H200)
    assert trained_tensors(spec) == 32 * 9 + 3
    hbm = PRESETS["h200"].hbm_tbps * 1e12
    assert full.time["optimizer"] == pytest.approx(28 * 8.03e9 / hbm, rel=0.01)
    assert small.time["optimizer"] == pytest.approx(
        OPTIMIZER_STEP_BYTES["adamw8bit"] * 8.03e9 / hbm + 291 * OPTIMIZER_SECONDS_PER_TENSOR["adamw8bit"], rel=0.01)
    assert 0.3 < small.time["optimizer"] < 0.6
    # a layout that fits, or that 8-bit moments would not rescue, gets no hint; nor does one already 8-bit
    assert eight_bit_optimizer_hint(eight, PRESETS["h200"], 1, PRESETS["h200"].hbm_gib) == ""
    assert eight_bit_optimizer_hint(spec, PRESETS["h200"], 1, 60.0) == ""
    # what the optimizer steps: every tensor of a fully trained model, LoRA's A and B per adapted projection
    seventy = resolve_spec(llama2_70b_lora_defaults(), None, [])
    assert trained_tensors(seventy) == 2 * 2 * 80  # qkv_proj and o_proj adapted in 80 layers
    seventy.lora.rank = 0
    assert trained_tensors(seventy) == 80 * (2 + 1 + 1 + 3) + 3  # fused qkv: one tensor


def test_calibration_recovers_the_elementwise_factor(tmp_path):
    """Runs whose step times were produced with known factors (GPU-side elementwise work, and a host
    1.5x slower than the preset's): the least-squares fit finds both again."""
    import dataclasses

    from trainperf.plan.calibrate import calibrate, with_host_scale, write_gpu_yaml
    from trainperf.store.db import Store

    truth = with_host_scale(dataclasses.replace(PRESETS["h200"], other_s_per_token_layer_h=4.0e-10), 1.5)
    small = ["model.hidden_size=1024", "model.intermediate_size=2816", "model.num_layers=16", "model.num_heads=8",
             "model.num_kv_heads=8", "data.seq_len=2048"]  # host-bound: pins the host scale
    store = Store(tmp_path / "t.db")
    for i, extra in enumerate((["parallel.dp_shard=1"], ["parallel.dp_shard=1", "train.recompute=full"],
                               ["parallel.dp_shard=1", "data.seq_len=4096"], ["parallel.dp_shard=1", *small])):
        spec = spec_for(*extra)
        est = estimate(spec, truth, 1)
        store.create_run(f"r{i}", spec.workload, spec.to_dict(), "x", 1, "open", False, 0.0, str(tmp_path))
        store.update_run_info(f"r{i}", hardware_json=json.dumps({"device": "cuda", "gpu": "NVIDIA H200", "gpus": 1}))
        store.finish_run(f"r{i}", status="failed", step_time_s=est.step_time_s, peak_mem_gib=est.allocated_gib)
    fitted, report = calibrate(store, "h200")
    assert fitted.other_s_per_token_layer_h == pytest.approx(4.0e-10, rel=1e-3)
    assert fitted.host_s_per_layer == pytest.approx(1.5 * PRESETS["h200"].host_s_per_layer, rel=1e-3)
    assert all(abs(r["step_error"]) < 1e-6 for r in report if r["which"] == "calibrated")
    assert any(abs(r["step_error"]) > 0.05 for r in report if r["which"] == "preset")
    write_gpu_yaml(fitted, str(tmp_path / "gpu.yaml"), "h200")
    assert load_gpu(str(tmp_path / "gpu.yaml")).other_s_per_token_layer_h == pytest.approx(4.0e-10, rel=1e-3)
    with pytest.raises(SpecError, match="no measured GPU runs"):
        calibrate(store, "b200")


def test_rcp_samples_follow_the_rcp_checker_including_interpolation():
    from trainperf.plan.search import rcp_samples
    from trainperf.mlperf.recipes import llama2_70b_lora_defaults

    spec = llama2_70b_lora_defaults()
    assert rcp_samples(spec) == pytest.approx(3178.67, abs=0.01)  # GBS 8: olympic mean of its RCP
    spec.train.global_batch_size = 32  # pruned RCP: interpolated between GBS 16 and 128 (spec 1.9)
    assert rcp_samples(spec) == pytest.approx(5065.14, abs=0.01)
    spec.mlperf.division, spec.mlperf.comparable = "open", False
    assert rcp_samples(spec) is None  # open runs have no RCP to converge to


def test_gpt3_is_planned_with_its_last_rulesets_rcps_in_sequences():
    """gpt3's RCPs are 4.1.0's (it left the rules after v4.1) and count tokens: samples = tokens / 2048."""
    from trainperf.mlperf.recipes import RECIPES
    from trainperf.plan.search import rcp_batch_sizes, rcp_samples

    spec = RECIPES["gpt3"]()
    spec.train.global_batch_size = 2048
    assert rcp_samples(spec) == pytest.approx(1_177_760_563.2 / 2048)  # gpt3_ref_2048's mean, in sequences
    assert rcp_batch_sizes(spec)[:2] == [1536, 2048]


def test_every_gbs_the_rcp_list_offers_has_samples_to_converge():
    """gpt3's RCP at GBS 1536 is pruned from the checker's set (2048 converges in fewer samples), yet it
    was measured at 1536: plan prices 1536 with it rather than refusing the recipe's own GBS."""
    from trainperf.mlperf.recipes import RECIPES
    from trainperf.mlperf.score import rcp_reference_samples
    from trainperf.plan.search import rcp_batch_sizes, rcp_samples

    spec = RECIPES["gpt3"]()
    for gbs in rcp_batch_sizes(spec):
        spec.train.global_batch_size = gbs
        assert rcp_samples(spec), gbs
    samples, how = rcp_reference_samples("gpt3", 1536, "4.1.0")
    assert how == "rcp gpt3_ref_1536 (pruned)" and samples > rcp_reference_samples("gpt3", 2048, "4.1.0")[0]
    assert rcp_reference_samples("gpt3", 1024, "4.1.0") is None  # below every RCP: none to price it with


def test_time_to_train_counts_the_evals_on_the_way():
    from trainperf.plan.search import time_to_train
    from trainperf.core.layout import resolve_layout
    from trainperf.mlperf.recipes import llama2_70b_lora_defaults

    spec = resolve_spec(llama2_70b_lora_defaults(), None, ["hardware.device=cuda"])
    resolve_layout(spec, 2)
    est = estimate(spec, PRESETS["h200"], 8)
    # 3200 samples at GBS 8: 400 steps; evals every 384 samples -> ceil(3200/384) = 9, minus 3 skipped = 6,
    # each over ceil(173 / 2 data-parallel ranks) = 87 rows
    expected = 400 * est.step_time_s + 6 * 87 * est.eval_seconds_per_row
    assert time_to_train(spec, est, 3200) == pytest.approx(expected)
    assert 0 < est.eval_seconds_per_row < est.step_time_s / 4  # a forward is cheaper than a training sample


def test_full_training_holds_unsharded_grads_while_micro_batches_accumulate():
    """FSDP2 over 2 GPUs, 7B full training. One micro-batch: gradients are reduce-scattered at once,
    each rank holds its shard. Two: the first runs without gradient sync, so every rank holds the
    whole unsharded fp32 gradient until the last one reduce-scatters it. Fused AdamW adds nothing."""
    from trainperf.plan.costs import layer_params

    common = ["lora.rank=0", "data.seq_len=4096", "train.recompute=full", "parallel.dp_shard=2"]
    one = estimate(spec_for(*common, "train.global_batch_size=2"), PRESETS["h200"], 8)
    two = estimate(spec_for(*common, "train.global_batch_size=4"), PRESETS["h200"], 8)
    assert two.memory["grads_fp32"] == pytest.approx(2 * one.memory["grads_fp32"])  # unsharded: both halves
    assert two.allocated_gib - one.allocated_gib > 0.9 * one.memory["grads_fp32"] / 2**30
    assert one.memory["grads_fp32"] > 4 * 32 * layer_params(spec_for()) / 2 * 0.99  # 4 B x half the params
    assert "optimizer_step_transient" not in one.memory


def test_grads_reduce_scattered_every_micro_batch_stay_sharded_at_more_traffic():
    """train.grad_sync=every: the two-micro-batch run holds only its gradient shard, and reduce-scatters
    twice per step where =last reduce-scatters once."""
    common = ["lora.rank=0", "data.seq_len=4096", "train.recompute=full", "parallel.dp_shard=2",
              "train.global_batch_size=4"]
    last = estimate(spec_for(*common), PRESETS["h200"], 8)
    every = estimate(spec_for(*common, "train.grad_sync=every"), PRESETS["h200"], 8)
    assert every.memory["grads_fp32"] == pytest.approx(last.memory["grads_fp32"] / 2)
    rs = last.memory["grads_fp32"] / 2  # (d - 1) / d of the unsharded fp32 gradient, d = 2
    assert every.comm["fsdp"] - last.comm["fsdp"] == pytest.approx(rs)  # one more reduce-scatter
    assert every.reserved_gib < last.reserved_gib and every.step_time_s >= last.step_time_s


@pytest.mark.slow  # the whole 512-GPU search: seconds
def test_llama31_405b_fits_80_gb_h100s_by_reduce_scattering_every_micro_batch():
    """405B on 512 H100s: with whole fp32 gradients held across micro-batches no layout fits (the smallest
    needs over twice the device); the plan ranks layouts that reduce-scatter every micro-batch."""
    from trainperf.mlperf.recipes import llama31_405b_defaults

    fits, oom = plan(llama31_405b_defaults(1152), load_gpu("h100"), 512, 8)
    assert fits and all(c.est.reserved_gib <= 80 for c in fits[:10])
    assert fits[0].spec.train.grad_sync == "every" and fits[0].spec.parallel.pp == 1
    assert all(c.spec.train.grad_sync == "last" for c in oom if c.spec.parallel.pp > 1)


def test_attention_pads_odd_head_dims_and_compile_shrinks_elementwise():
    import dataclasses

    shape = ["model.hidden_size=3200", "model.intermediate_size=8640", "parallel.dp_shard=1"]
    flat = dataclasses.replace(PRESETS["h200"], kernel_table="")  # one attention rate for every shape
    for gpu in (flat, PRESETS["h200"]):
        hd100 = estimate(spec_for(*shape, "model.num_heads=32", "model.num_kv_heads=32"), gpu, 8)
        hd128 = estimate(spec_for(*shape, "model.num_heads=25", "model.num_kv_heads=25"), gpu, 8)
        assert hd100.time["attention"] > 0
        if gpu is flat:  # 32 heads of 100 cost like 32 of 128; 25 heads of 128 do 25/32 of that
            assert hd128.time["attention"] == pytest.approx(hd100.time["attention"] * 25 / 32)
        else:  # measured: 100-wide heads have no cuDNN kernel and run at a third of the rate
            assert hd100.time["attention"] > 2.5 * hd128.time["attention"]
    eager = estimate(spec_for("parallel.dp_shard=1"), PRESETS["h200"], 8)
    compiled = estimate(spec_for("train.compile=true", "parallel.dp_shard=1"), PRESETS["h200"], 8)
    assert eager.time["elementwise"] > 0
    assert compiled.time["elementwise"] == pytest.approx(eager.time["elementwise"] * PRESETS["h200"].compile_other_factor)
    assert compiled.time["gemm"] == eager.time["gemm"]


def test_gbs_search_ranks_by_rcp_time_to_train():
    from trainperf.plan.search import rcp_batch_sizes
    from trainperf.mlperf.recipes import llama2_70b_lora_defaults

    base = llama2_70b_lora_defaults()
    assert rcp_batch_sizes(base) == [8, 16, 32, 128]
    fits, _ = plan(base, PRESETS["h100"], 64, 8, gbs_values=[8, 24])
    seen = {c.spec.train.global_batch_size for c in fits}
    assert seen == {8, 24}  # 24 is interpolated between the 16 and 128 RCPs
    with pytest.raises(SpecError, match=r"--gbs 256: no MLPerf RCP .* span GBS 8 to 128"):  # beyond every RCP: unrankable
        plan(base, PRESETS["h100"], 64, 8, gbs_values=[8, 24, 256])
    assert fits == sorted(fits, key=lambda c: (c.time_to_train_s, c.est.reserved_gib))
    with pytest.raises(SpecError, match="--gbs"):
        plan(base, PRESETS["h100"], 64, 8, samples=3000, gbs_values=[8, 16])


def test_chunked_loss_trades_logit_memory_for_one_more_head_forward():
    base = estimate(spec_for("model.vocab_size=128256", "parallel.dp_shard=1"), PRESETS["h200"], 8)
    chunked = estimate(spec_for("model.vocab_size=128256", "train.loss_chunk_tokens=1024", "parallel.dp_shard=1"),
                       PRESETS["h200"], 8)
    assert chunked.memory["logits_and_loss"] == pytest.approx(base.memory["logits_and_loss"] / 8)  # 8192 -> 1024 tokens
    assert chunked.step_time_s > base.step_time_s


# The out-of-sample set (2 x H200, 2026-11-30, `python bench/planner_accuracy.py`; docs/PLANNER.md):
# measured step s, peak GiB, tokens/s per GPU. A guard on the accuracy reached, not a claim beyond it.
OUT_OF_SAMPLE = {
    "7b-lora-s4096-1gpu": (1.307, 36.9, 12532),
    "7b-lora-s8192-selective-1gpu": (3.083, 49.5, 10627),
    "7b-lora-s2048-mb2-gbs8-1gpu": (1.302, 36.9, 12586),
    "3b-lora-s8192-1gpu": (2.050, 38.6, 15988),
    "3b-full-s4096-selective-1gpu": (1.494, 64.3, 10963),
    "7b-full-s4096-full-fsdp2": (1.232, 66.6, 6651),
    "8b-lora-s8192-fsdp2": (1.501, 68.3, 10915),
    "8b-lora-s8192-tp2sp": (3.188, 44.5, 5140),
    "8b-lora-s8192-cp2-full": (2.510, 16.6, 6529),
    "7b-lora-s4096-pp2-gpipe-gbs8": (1.446, 108.7, 11327),
    "7b-lora-s4096-mb2-ddp": (1.250, 60.6, 13105),
    "1b-full-s2048-mb4-ddp": (0.438, 40.9, 37370),
}


def _kept_then_gib(spec, est) -> float:
    """What the engine of these twelve measurements kept that today's does not: selective recompute
    kept the adapters' GEMM outputs (A's r and B's projection-wide output per adapted projection), and
    AdamW ran with foreach, whose step allocates sqrt(exp_avg_sq) (4 B per local trainable parameter,
    beyond what the backward had freed). Both changed on 2026-11-30; the memory of that engine
    is today's prediction plus these bytes."""
    from trainperf.plan.costs import _projections

    extra = 0.0
    if spec.train.recompute == "selective" and spec.lora.enabled:
        proj = _projections(spec.model)
        per_token = sum(2.0 * (spec.lora.rank + proj[n][1]) for n in spec.lora.target_modules)
        extra += per_token * spec.train.micro_batch_size * spec.data.seq_len * spec.model.num_layers
    mem = est.memory
    sharded = mem["optimizer_states"] / 2  # 4 B per local trainable parameter (AdamW's 8 B of moments / 2)
    backward = sum(mem.get(k, 0.0) for k in ("grads_fp32", "activations", "recompute_transient", "logits_and_loss"))
    extra += max(0.0, 2 * sharded - backward)
    return extra / 2**30


def test_out_of_sample_accuracy_does_not_regress():
    import statistics
    from bench.planner_accuracy import CASES, SHAPES, spearman
    from trainperf.core.layout import resolve_layout

    step_err, mem_err, measured_tps, predicted_tps = [], [], [], []
    for name, gpus, shape, extra in CASES:
        step, peak, tps = OUT_OF_SAMPLE[name]
        spec = resolve_spec(synthetic_lora_defaults(), None, ["hardware.device=cuda", *SHAPES[shape], *extra])
        resolve_layout(spec, gpus)
        est = estimate(spec, PRESETS["h200"], 8)
        step_err.append(abs(est.step_time_s / step - 1))
        mem_err.append(abs((est.allocated_gib + _kept_then_gib(spec, est)) / peak - 1))
        measured_tps.append(tps)
        predicted_tps.append(est.tokens_per_s_per_gpu)
        assert est.fits, f"{name} ran on an H200 but is predicted not to fit"
    assert statistics.median(step_err) < 0.075 and max(step_err) < 0.17
    assert statistics.median(mem_err) < 0.02 and max(mem_err) < 0.09
    assert spearman(measured_tps, predicted_tps) >= 0.95


# ---------------------------------------------------------------------------------------------
# The host-bound regime: every layout `plan` enumerates for a 1B-shape LoRA (llama2_70b_lora recipe,
# open, seq 4096, GBS 2) on 2 x H200, measured one by one (`python bench/tune_vs_grid.py grid`,
# 2026-11-30). MFU 3-19%: the host, not the GPU, sets the step time. The host constants are fitted to
# these layouts, so this is an in-sample guard, not an accuracy claim.

def _grid(name: str = "grid_1b_lora_2xh200.json"):
    import re
    from pathlib import Path

    from trainperf.core.layout import resolve_layout
    from trainperf.workloads import get_workload

    from bench.tune_vs_grid import DEFAULT_ID, PROBLEM, WORKLOAD

    bench = Path(__file__).resolve().parents[2] / "bench"

    grid = json.loads((bench / "data" / name).read_text())["grid"]
    rows = []
    for key, v in grid.items():
        if key == DEFAULT_ID:
            continue
        spec = resolve_spec(get_workload(WORKLOAD).defaults(), None,
                            ["hardware.device=cuda", *PROBLEM, *re.findall(r"--set (\S+)", key)])
        resolve_layout(spec, 2)
        rows.append((key, spec, v))
    return grid, rows


def test_host_bound_grid_is_reproduced():
    import statistics

    from scipy.stats import spearmanr

    _, rows = _grid()
    assert len(rows) == 33
    pred = [estimate(spec, PRESETS["h200"], 2).step_time_s for _, spec, _ in rows]
    meas = [v["step_time_s"] for _, _, v in rows]
    err = [abs(p / m - 1) for p, m in zip(pred, meas)]
    assert statistics.median(err) < 0.08
    assert spearmanr(pred, meas).statistic > 0.9
    # without the host term the same layouts were predicted 1.1-7.6x too fast
    assert all(estimate(spec, PRESETS["h200"], 2).time["host_wait"] > 0 for _, spec, _ in rows)


def test_host_time_grows_with_what_adds_ops():
    from trainperf.plan.costs import host_seconds_per_step

    gpu = PRESETS["h200"]
    plain = host_seconds_per_step(spec_for("lora.rank=0"), gpu, 1, 32)
    lora = host_seconds_per_step(spec_for(), gpu, 1, 32)
    sel = host_seconds_per_step(spec_for("train.recompute=selective"), gpu, 1, 32)
    tp = host_seconds_per_step(spec_for("parallel.tp=2", "parallel.dp_shard=1"), gpu, 1, 32)
    compiled = host_seconds_per_step(spec_for("train.compile=true"), gpu, 1, 32)
    assert plain < lora < sel and lora < tp and compiled < lora
    assert host_seconds_per_step(spec_for(), gpu, 4, 32) == pytest.approx(4 * lora)
    # a GPU-bound step (7B, seq 8192) hardly notices its host time; the k-norm never undercuts the max
    est = estimate(spec_for("parallel.dp_shard=1"), gpu, 8)
    assert 0 < est.time["host_wait"] < 0.05 * est.step_time_s


def test_tune_replayed_on_the_grid_finds_its_best_cheaply():
    """`trainperf tune`'s search replayed on the measured grid of the engine as it is (no host sync in
    the step; each trial answers with the layout's measured step time and wall time, less the steps it
    does not run): it must land within 3% of the grid's best for at most a quarter of the grid's trial
    time, and beat the default layout by 1.2x. The real run on 2 x H200 (docs/TUNE.md) is the claim;
    this guards the search logic and the planner's ranking against regressions."""
    from trainperf.runner.tune import Trial, successive_halving

    grid, rows = _grid("grid_1b_lora_2xh200_v2.json")
    from bench.tune_vs_grid import PROBLEM, planned

    fits = planned(2, PROBLEM)
    spent = []

    def replay(workload, gpus, cand, steps, db, out, extra, left):
        m = grid[cand.set_line]
        spent.append(m["wall_s"] - (10 - steps) * m["step_time_s"])
        return Trial(cand, steps, step_time_s=m["step_time_s"])

    res = successive_halving("llama2_70b_lora", 2, fits[:8], "db", "out", [], 3600, first_steps=4,
                             echo=lambda s: None, run=replay)
    best = min(v["step_time_s"] for _, _, v in rows)
    won = grid[res.winner.set_line]["step_time_s"]
    assert won <= 1.03 * best
    assert sum(spent) <= 0.25 * sum(v["wall_s"] for _, _, v in rows)
    assert grid["default"]["step_time_s"] / won >= 1.2


def test_partial_recompute_trades_memory_for_time():
    """train.recompute_layers=k: memory and time move monotonically between no recompute and full."""
    gpu = PRESETS["h200"]
    none = estimate(spec_for("parallel.dp_shard=1"), gpu, 8)
    full = estimate(spec_for("parallel.dp_shard=1", "train.recompute=full"), gpu, 8)
    partial = [estimate(spec_for("parallel.dp_shard=1", "train.recompute=full", f"train.recompute_layers={k}"), gpu, 8)
               for k in (0, 8, 16, 32)]
    assert partial[0].memory["activations"] == pytest.approx(none.memory["activations"])
    assert partial[-1].allocated_gib == pytest.approx(full.allocated_gib)
    mems = [e.memory["activations"] for e in partial]
    times = [e.step_time_s for e in partial]
    assert mems == sorted(mems, reverse=True) and times == sorted(times)
    assert none.step_time_s <= times[1] < full.step_time_s


def test_plan_offers_the_partial_recompute_that_just_fits():
    """The 70B recipe on 2 H200s: no-recompute does not fit, full does; plan adds the variants that
    recompute the fewest layers and still fit -- the others keeping everything, or recomputing only
    their pointwise ops (recompute_others=selective: more layers spared) -- each faster than full."""
    from trainperf.workloads import get_workload

    base = resolve_spec(get_workload("llama2_70b_lora").defaults(), None, ["mlperf.division=open"])
    fits, _ = plan(base, PRESETS["h200"], 2, 2, objective="throughput")
    layout = {"parallel.cp": 1, "parallel.dp_shard": 2, "train.micro_batch_size": 1}
    mine = [c for c in fits if all(c.overrides.get(k) == v for k, v in layout.items())]
    full = next(c for c in mine if "train.recompute_layers" not in c.overrides and c.overrides["train.recompute"] == "full")
    plain = next(c for c in mine if "train.recompute_layers" in c.overrides and "train.recompute_others" not in c.overrides)
    sel = next(c for c in mine if c.overrides.get("train.recompute_others") == "selective")
    k_plain, k_sel = plain.overrides["train.recompute_layers"], sel.overrides["train.recompute_layers"]
    assert 0 < k_sel < k_plain < 80 and plain.est.fits and sel.est.fits
    assert sel.est.step_time_s < plain.est.step_time_s < full.est.step_time_s
    for c, k in ((plain, k_plain), (sel, k_sel)):
        assert not estimate(_apply_k(base, c.overrides, k - 1), PRESETS["h200"], 2).fits  # the fewest that fit


def _apply_k(base, overrides, k):
    from trainperf.plan.search import _apply

    return _apply(base, overrides | {"train.recompute_layers": k})


def test_fp8_changes_only_the_decoder_gemms_and_their_casts():
    """hardware.fp8: the decoder GEMMs at the fp8 rate plus the casts of every operand; eager pays
    the casts as separate kernels and the tensor subclass's Python dispatch (the measured 7B run was
    1.5x slower than bf16), compiled fuses them (then fp8 pays)."""
    from trainperf.plan.costs import fp8_cast_elements

    gpu = PRESETS["h200"]
    runs = {}
    for compiled in ("false", "true"):
        for fp8 in ("none", "tensorwise"):
            runs[compiled, fp8] = estimate(spec_for("parallel.dp_shard=1", f"train.compile={compiled}",
                                                    f"hardware.fp8={fp8}"), gpu, 8)
    for compiled in ("false", "true"):
        bf16, fp8 = runs[compiled, "none"], runs[compiled, "tensorwise"]
        for term in ("attention", "elementwise", "recompute"):
            assert fp8.time[term] == pytest.approx(bf16.time[term])
        assert fp8.allocated_gib == pytest.approx(bf16.allocated_gib)  # the bf16 weights stay
    assert runs["false", "tensorwise"].step_time_s > 1.3 * runs["false", "none"].step_time_s
    assert runs["true", "tensorwise"].step_time_s < runs["true", "none"].step_time_s
    # the LM head and the adapters stay in bf16: the GEMM term never falls by the whole rate ratio
    ratio = (gpu.bf16_tflops * gpu.gemm_eff) / (gpu.fp8_tflops * gpu.fp8_gemm_eff)
    assert runs["true", "tensorwise"].time["gemm"] > ratio * runs["true", "none"].time["gemm"]
    # casts per projection: LoRA casts x, W, dy, W; full training also x and dy for the weight gradient
    lora = fp8_cast_elements(spec_for(), 8192, 1)
    full = fp8_cast_elements(spec_for("lora.rank=0"), 8192, 1)
    assert full > lora and fp8_cast_elements(spec_for(), 8192, 2) == pytest.approx(lora / 2)


def test_float8_stored_frozen_base_takes_a_byte_per_decoder_projection_weight():
    """hardware.frozen_dtype=fp8: the sharded frozen decoder projections at 1 byte instead of the bf16
    base's 2 (norms, embedding and LM head unchanged); step time unchanged."""
    from trainperf.plan.costs import layer_params

    gpu = PRESETS["h200"]
    sets = ("parallel.dp_shard=2", "hardware.fp8=tensorwise", "train.compile=true")
    dynamic, stored = (estimate(spec_for(*sets, *extra), gpu, 8) for extra in ((), ("hardware.frozen_dtype=fp8",)))
    spec = spec_for(*sets)
    m = spec.model
    projections = m.num_layers * (layer_params(spec) - 2 * m.hidden_size)  # minus the two norms per layer
    saved = dynamic.memory["weights_sharded"] - stored.memory["weights_sharded"]
    assert saved == pytest.approx((2.0 - 1.0) * projections / 2)  # a byte less per weight, over 2 shards
    assert stored.step_time_s == pytest.approx(dynamic.step_time_s)
