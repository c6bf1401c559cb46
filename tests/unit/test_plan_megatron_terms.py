"""The cost model's terms for a Megatron / Transformer Engine engine (NeMo): the CP ring's per-step
cost, the attention rate at a CP rank's local query length, the ring's slowest hop across nodes,
overlapped pipeline sends, FP8 storage of the MLP's up-projection outputs, the embedding and loss
counted as pipeline layers, TP only inside the NVLink domain, float8 GEMMs priced by shape from a
measured grid. In-process, no GPU."""

from __future__ import annotations

import dataclasses
import json

import pytest

from trainperf.mlperf.recipes import llama2_70b_lora_defaults, llama31_405b_defaults
from trainperf.plan.costs import (asymmetric_stage_layers, attention_length_efficiency, estimate,
                                  megatron_activation_bytes_per_token_layer)
from trainperf.plan.engines import FACTORS, FIXED_FOR_FITTED, EngineProfile, apply_profile
from trainperf.plan.hardware import PRESETS
from trainperf.plan.search import megatron_layouts


def _nemo_gpu(name: str = "h100", **fields):
    gpu = apply_profile(PRESETS[name], EngineProfile("nemo", {k: v[1] for k, v in FACTORS.items()}))
    return dataclasses.replace(gpu, **fields)


def _lora_70b(tp: int = 1, cp: int = 1, dp: int = 8, pp: int = 1, vp: int = 0):
    spec = llama2_70b_lora_defaults()
    p = spec.parallel
    p.tp, p.sp, p.cp, p.pp, p.dp_shard, p.dp_replicate = tp, tp > 1, cp, pp, dp, 1
    p.pp_schedule, p.pp_stages_per_rank = ("Interleaved1F1B", vp) if vp > 1 else ("1F1B", 0)
    spec.hardware.device, spec.hardware.fp8, spec.hardware.frozen_dtype = "cuda", "tensorwise", "fp8"
    spec.train.recompute = "none"
    return spec


def test_fitted_engines_carry_the_megatron_terms_and_this_engine_does_not():
    nemo, ours = _nemo_gpu(), PRESETS["h100"]
    assert nemo.cp_ring_step_s == FIXED_FOR_FITTED["cp_ring_step_s"] > 0
    assert nemo.attn_half_rate_tokens > 0 and nemo.pp_p2p_overlapped == 1 and nemo.asymmetric_stages == 1
    assert nemo.fp8_activation_storage == 1
    assert (ours.cp_ring_step_s, ours.attn_half_rate_tokens, ours.pp_p2p_overlapped, ours.fp8_activation_storage,
            ours.asymmetric_stages) == (0, 0, 0, 0, 0)


def test_cp_ring_costs_a_fixed_time_per_step_and_layer():
    spec = _lora_70b(cp=4, dp=2)
    without = estimate(spec, _nemo_gpu(cp_ring_step_s=0.0), 8).time["cp_exposed"]
    with_steps = estimate(spec, _nemo_gpu(cp_ring_step_s=1e-4), 8).time["cp_exposed"]
    micro_batches = spec.train.global_batch_size // 2
    assert with_steps - without == pytest.approx(1e-4 * 4 * 80 * micro_batches)  # c steps x 80 layers


def test_wider_cp_runs_shorter_attention_kernels_at_a_lower_rate():
    gpu = _nemo_gpu(attn_half_rate_tokens=256.0)
    assert attention_length_efficiency(gpu, 8192) == pytest.approx(8192 / (8192 + 256))
    assert attention_length_efficiency(_nemo_gpu(attn_half_rate_tokens=0.0), 512) == 1.0
    att = {c: estimate(_lora_70b(cp=c, dp=8 // c), gpu, 8).time["attention"] for c in (1, 2, 8)}
    # the same attention FLOPs per GPU at every CP: only the kernel's rate at S/c queries differs
    assert att[1] < att[2] < att[8]
    assert att[8] / att[1] == pytest.approx((8192 / (8192 + 256)) / (1024 / (1024 + 256)))


def test_cp_ring_across_nodes_runs_at_the_nic_not_hierarchically():
    gpu = _nemo_gpu(cp_ring_step_s=0.0, comm_overlap=0.0)
    inside = estimate(_lora_70b(tp=1, cp=8, dp=8), gpu, 8)  # the ring within one node: NVLink
    across = estimate(_lora_70b(tp=2, cp=8, dp=4), gpu, 8)  # TP2 x CP8 spans two nodes
    bytes_inside = inside.comm["cp"] / inside.time["cp_exposed"]
    bytes_across = across.comm["cp"] / across.time["cp_exposed"]
    assert bytes_inside == pytest.approx(gpu.intra_busbw_gbps * 1e9)
    assert bytes_across == pytest.approx(gpu.inter_busbw_gbps * 1e9)


def test_pipeline_sends_are_overlapped_by_the_engine_that_overlaps_them():
    spec = _lora_70b(tp=4, pp=2, vp=4, dp=1)
    blocking = estimate(spec, _nemo_gpu(pp_p2p_overlapped=0.0), 8).time["pp_p2p"]
    overlapped = estimate(spec, _nemo_gpu(pp_p2p_overlapped=1.0), 8).time["pp_p2p"]
    assert overlapped == pytest.approx(blocking * (1 - _nemo_gpu().comm_overlap))


def test_fp8_activation_storage_saves_a_byte_per_up_projection_output():
    spec = _lora_70b(cp=2, dp=4)
    m = spec.model
    saved = megatron_activation_bytes_per_token_layer(spec) - megatron_activation_bytes_per_token_layer(
        spec, fp8_mlp_outputs=True)
    assert saved == 2 * m.intermediate_size  # gate and up, one byte each instead of two
    spec.hardware.fp8, spec.hardware.frozen_dtype = "none", "bf16"
    assert megatron_activation_bytes_per_token_layer(spec, fp8_mlp_outputs=True) == \
        megatron_activation_bytes_per_token_layer(spec)  # only an FP8 run stores FP8
    # NVIDIA's 8 x H200 layout (CP2 x DP4, FP8 activations) fits the 139 GiB it ran in, and DP8 on 8 x B200
    # (seven submitters, v5.0) the 178 GiB
    h200, b200 = _nemo_gpu("h200"), _nemo_gpu("b200")
    assert estimate(_lora_70b(cp=2, dp=4), h200, 8).reserved_gib < h200.hbm_gib
    assert estimate(_lora_70b(dp=8), b200, 8).reserved_gib < b200.hbm_gib


def test_frozen_gemms_keep_no_input_and_adapters_keep_their_own():
    """Transformer Engine saves a linear's input only for its weight gradient: a LoRA run's frozen GEMMs
    keep none; an adapter keeps a bf16 copy of its GEMM's input (o_proj's is the attention output, kept)."""
    lora = _lora_70b(tp=1, dp=8)  # adapters on qkv_proj and o_proj, FP8 GEMMs
    full = dataclasses.replace(lora, lora=dataclasses.replace(lora.lora, rank=0))
    m = lora.model
    h, f, q = m.hidden_size, m.intermediate_size, m.num_heads * m.head_dim
    # fully trained: qkv, o, fc1, fc2 inputs at a byte each; LoRA: qkv's adapter copy at two, the rest none
    assert megatron_activation_bytes_per_token_layer(full) - megatron_activation_bytes_per_token_layer(lora) \
        == pytest.approx((h + q + h + f) - 2 * h)
    mlp_adapted = dataclasses.replace(lora, lora=dataclasses.replace(lora.lora, target_modules=["down_proj"]))
    assert megatron_activation_bytes_per_token_layer(mlp_adapted) - megatron_activation_bytes_per_token_layer(lora) \
        == pytest.approx(2 * f - 2 * h)  # down_proj's adapter copy instead of qkv's


def test_embedding_and_loss_count_as_pipeline_layers_when_the_layers_alone_do_not_split():
    spec = llama31_405b_defaults(1152)
    p = spec.parallel
    p.tp, p.sp, p.pp, p.cp, p.dp_shard, p.pp_schedule, p.pp_stages_per_rank = 8, True, 8, 2, 4, "Interleaved1F1B", 8
    spec.hardware.device, spec.hardware.fp8, spec.train.recompute = "cuda", "tensorwise", "none"
    assert asymmetric_stage_layers(spec) == 16  # (126 + 2) / 8
    uniform = estimate(spec, _nemo_gpu(asymmetric_stages=0.0), 8)
    balanced = estimate(spec, _nemo_gpu(asymmetric_stages=1.0), 8)
    # 16 layers on a middle stage instead of 15.75 layers + the LM head on the last
    assert balanced.time["gemm"] < uniform.time["gemm"]
    even = _lora_70b(tp=4, pp=2, vp=4, dp=1)  # 80 layers split evenly over 2 x 4: not asymmetric
    assert asymmetric_stage_layers(even) == 0


def test_megatron_tp_stays_inside_the_nvlink_domain():
    spec = _lora_70b()
    tps = {o["parallel.tp"] for o in megatron_layouts(spec, 16, 8, nvlink_domain=4)}
    assert max(tps) == 4
    assert max(o["parallel.tp"] for o in megatron_layouts(spec, 16, 8)) == 8


def _flat_grid(path, rate: float = 1000.0, sizes=(1024, 4096)):
    path.write_text(json.dumps({"sizes": list(sizes), "gemm_fp8_tflops": {
        f"{m}x{k}x{n}": rate for m in sizes for k in sizes for n in sizes}}))
    return str(path)


def test_fp8_grid_is_exact_on_its_points_log_linear_between_and_held_at_its_edges(tmp_path):
    from trainperf.plan.kernels import Fp8GemmGrid

    sizes = (1024, 4096)
    rates = {f"{m}x{k}x{n}": (500.0 if m == 1024 else 1000.0) for m in sizes for k in sizes for n in sizes}
    grid = Fp8GemmGrid({"sizes": list(sizes), "gemm_fp8_tflops": rates})
    assert grid.relative(1024, 4096, 4096) == pytest.approx(0.5)
    assert grid.relative(4096, 1024, 1024) == pytest.approx(1.0)
    assert grid.relative(2048, 4096, 4096) == pytest.approx(0.75)  # halfway in log2 between 1024 and 4096
    assert grid.relative(64, 4096, 4096) == pytest.approx(0.5) and grid.relative(1 << 20, 1024, 1024) == 1.0
    del rates["4096x4096x1024"]
    with pytest.raises(ValueError, match="1 missing"):
        Fp8GemmGrid({"sizes": list(sizes), "gemm_fp8_tflops": rates})


def test_fp8_grid_prices_the_same_flops_as_the_flat_rate_when_its_rates_are_flat(tmp_path):
    """The per-GEMM sum over layer_gemms counts the FLOPs the flat rate prices, so a flat grid changes nothing."""
    spec = _lora_70b(tp=4, cp=2, dp=1)
    nemo = _nemo_gpu(fp8_gemm_grid="")
    flat = estimate(spec, nemo, 8)
    gridded = estimate(spec, dataclasses.replace(nemo, fp8_gemm_grid=_flat_grid(tmp_path / "g.json")), 8)
    assert gridded.time["gemm"] == pytest.approx(flat.time["gemm"], rel=1e-9)


def test_fitted_engines_price_float8_gemms_by_shape_from_the_h200_grid():
    """Measured on an H200 (bench/fp8_gemm_grid.py): gpt3's TP4 projections over 4,096 tokens (MBS 2) run
    faster per FLOP than over 2,048 (their weight gradients reduce over twice the tokens)."""
    from trainperf.mlperf.recipes import RECIPES

    assert _nemo_gpu().fp8_gemm_grid == "h200" and PRESETS["h100"].fp8_gemm_grid == ""
    assert _nemo_gpu("h200-nvl").fp8_gemm_grid == "h200" and _nemo_gpu("b200").fp8_gemm_grid == ""  # other SMs
    nemo = _nemo_gpu()
    per_sequence = {}
    for mbs in (1, 2):
        spec = RECIPES["gpt3"]()
        p = spec.parallel
        p.tp, p.sp, p.pp, p.pp_schedule, p.pp_stages_per_rank, p.dp_shard, p.dp_replicate = 4, True, 8, "Interleaved1F1B", 6, 16, 1
        spec.train.global_batch_size, spec.train.micro_batch_size = 2048, mbs
        spec.hardware.device, spec.hardware.fp8 = "cuda", "tensorwise"
        per_sequence[mbs] = estimate(spec, nemo, 8).time["gemm"]
    assert per_sequence[2] < per_sequence[1] * 0.98  # same FLOPs per step, 2-5% fewer seconds


def test_yaml_gpu_file_can_name_an_fp8_grid(tmp_path):
    from trainperf.core.errors import SpecError
    from trainperf.plan.hardware import load_gpu

    _flat_grid(tmp_path / "g.json")
    (tmp_path / "gpu.yaml").write_text("base: h100\nfp8_gemm_grid: g.json\n")
    assert load_gpu(str(tmp_path / "gpu.yaml")).fp8_gemm_grid == str(tmp_path / "g.json")
    own = apply_profile(load_gpu(str(tmp_path / "gpu.yaml")), EngineProfile("nemo", {k: v[1] for k, v in FACTORS.items()}))
    assert own.fp8_gemm_grid == str(tmp_path / "g.json")  # a fitted engine keeps the GPU's own grid
    (tmp_path / "bad.yaml").write_text("base: h100\nfp8_gemm_grid: missing.json\n")
    with pytest.raises(SpecError, match="not a readable float8 grid"):
        load_gpu(str(tmp_path / "bad.yaml"))
