"""GPU tests (marked `gpu`, skipped where no CUDA device is visible; CI has none).

Run on a GPU machine with `python -m pytest -m gpu tests/gpu/test_gpu.py`; results go in the closing notes
and docs/PERFORMANCE.md.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess

import pytest
import torch

from tests.fixtures.cli import trainperf_cmd

pytestmark = pytest.mark.gpu


def gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run(tmp, *args, timeout=600):
    out = subprocess.run(trainperf_cmd(*args, "--json", "--db", str(tmp / "t.db"), "--out", str(tmp / "runs")),
                         cwd=tmp, capture_output=True, text=True, timeout=timeout)
    s = json.loads(out.stdout) if out.stdout.strip().startswith("{") else {}
    if s.get("run_id"):
        with sqlite3.connect(tmp / "t.db") as c:
            s["losses"] = [r[0] for r in c.execute("SELECT loss FROM steps WHERE run_id = ? ORDER BY step", (s["run_id"],))]
    return out, s


def test_mini_lora_to_target_on_one_gpu(tmp_path):
    out, s = run(tmp_path, "run", "mini-lora")
    assert out.returncode == 0, out.stderr[-3000:]
    assert s["status"] == "success" and s["mfu"] is not None and s["peak_mem_gib"] > 0


@pytest.mark.skipif(gpus() < 2, reason="needs 2 GPUs")
def test_mini_lora_to_target_with_tp2(tmp_path):
    out, s = run(tmp_path, "run", "mini-lora", "--nproc-per-node", "2", "--set", "parallel.tp=2",
                 "--set", "parallel.sp=true", "--set", "parallel.dp_shard=1")
    assert out.returncode == 0, out.stderr[-3000:]
    assert s["status"] == "success"


# bf16: context parallel with fp32 attention hangs in torch 2.11 (specs.py refuses it)
THREE_STEPS = ["--set", "train.max_steps=3", "--set", "train.log_every=1", "--set", "train.seed=7",
               "--set", "eval.every_samples=100000"]


@pytest.mark.skipif(gpus() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("workload, extra", [("mini-pretrain", []), ("mini-lora", ["--set", "lora.dropout=0"]),
                                             ("mini-gpt-pretrain", [])])
def test_context_parallel_matches_one_gpu(tmp_path, workload, extra):
    """CP=2 (load-balanced ring attention over the sequence) vs CP=1, bf16: same three losses
    (measured on 2 x H200, torch 2.11: |diff| <= 4e-5 for mini-pretrain)."""
    out1, ref = run(tmp_path, "run", workload, *THREE_STEPS, *extra)
    assert out1.returncode == 1, out1.stderr[-3000:]
    out2, cp = run(tmp_path, "run", workload, "--nproc-per-node", "2", "--set", "parallel.cp=2",
                   "--set", "parallel.dp_shard=1", *THREE_STEPS, *extra)
    assert out2.returncode == 1, out2.stderr[-3000:]
    assert len(cp["losses"]) == 3
    assert max(abs(a - b) for a, b in zip(cp["losses"], ref["losses"])) < 1e-3, (cp["losses"], ref["losses"])


@pytest.mark.skipif(gpus() < 2, reason="needs 2 GPUs")
def test_context_parallel_eval_reaches_target(tmp_path):
    out, s = run(tmp_path, "run", "mini-lora", "--nproc-per-node", "2", "--set", "parallel.cp=2", "--set", "parallel.dp_shard=1")
    assert out.returncode == 0, out.stderr[-3000:]
    assert s["status"] == "success"


def test_per_layer_compile_matches_eager(tmp_path):
    """train.compile=true (torch.compile per decoder layer) trains the same as eager, bf16 tolerance."""
    _, eager = run(tmp_path, "run", "mini-lora", *THREE_STEPS, "--set", "lora.dropout=0")
    out, compiled = run(tmp_path, "run", "mini-lora", *THREE_STEPS, "--set", "lora.dropout=0", "--set", "train.compile=true")
    assert out.returncode == 1, out.stderr[-3000:]
    assert max(abs(a - b) for a, b in zip(compiled["losses"], eager["losses"])) < 1e-2


def test_compiled_layers_draw_eagers_dropout_masks():
    """apply_compile runs random ops through eager's kernels (Inductor's fallback_random): with the
    same seed a compiled LoRA model drops what the eager one drops. fp32, adapters' B non-zero, so a
    different mask moves the logits by O(0.1), far above compile's own rounding."""
    from trainperf.model.llama import LlamaForCausalLM
    from trainperf.model.lora import apply_lora
    from trainperf.parallel.parallelize import apply_compile
    from trainperf.core.spec import LoRASpec, ModelSpec

    torch.manual_seed(0)
    cfg = ModelSpec(vocab_size=256, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4,
                    num_kv_heads=4, max_position_embeddings=128)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    apply_lora(model, LoRASpec(rank=8, alpha=16, dropout=0.5))
    for n, q in model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(q, std=0.5)
    model.train()
    tokens = torch.randint(0, 256, (2, 128), device="cuda")
    torch.manual_seed(1)
    eager = model(tokens).float()
    torch.manual_seed(2)
    other_mask = model(tokens).float()
    apply_compile(model)
    torch.manual_seed(1)
    compiled = model(tokens).float()
    assert (other_mask - eager).abs().max() > 0.1  # the masks do matter
    assert (compiled - eager).abs().max() < 1e-3


@pytest.mark.skipif(gpus() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_compiled_tp2_with_lora_dropout_reaches_target(tmp_path, recompute):
    """Compiled tensor parallel with LoRA dropout (refused before the mask moved off DTensor's RNG);
    selective recompute saves the mask (parallelize._selective_policy)."""
    out, s = run(tmp_path, "run", "mini-lora", "--nproc-per-node", "2", "--set", "parallel.tp=2",
                 "--set", "parallel.sp=true", "--set", "parallel.dp_shard=1", "--set", "train.compile=true",
                 "--set", f"train.recompute={recompute}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert s["status"] == "success"


def test_bf16_frozen_base_trains_identically_with_less_memory(tmp_path):
    """hardware.frozen_dtype auto (bf16 on GPU) vs fp32 masters of the frozen base: FSDP2 computes in
    bf16 copies either way, so the losses are bit-identical; the bf16 base holds half the bytes."""
    out32, fp32 = run(tmp_path, "run", "mini-lora", *THREE_STEPS, "--set", "hardware.frozen_dtype=fp32")
    out16, bf16 = run(tmp_path, "run", "mini-lora", *THREE_STEPS)
    assert out32.returncode == 1 and out16.returncode == 1, out16.stderr[-3000:]
    assert bf16["losses"] == fp32["losses"]
    assert bf16["peak_mem_gib"] < fp32["peak_mem_gib"]


@pytest.mark.skipif(gpus() < 2, reason="needs 2 GPUs")
def test_closed_recipe_schedule_on_two_gpus(tmp_path):
    """The llama2_70b_lora recipe (shrunken, open) on fabricated GovReport parquet with FSDP over 2 GPUs:
    the first eval after skipping 3 (1536 samples) meets the target."""
    from trainperf.workloads import fabricate

    ck = fabricate.write_base_checkpoint(tmp_path / "ck")
    data = fabricate.write_govreport_like(tmp_path / "d", 400, 173, 512, fmt="parquet")
    out, s = run(tmp_path, "run", "llama2_70b_lora", "--nproc-per-node", "2", "--set", f"model.path={ck}",
                 "--set", f"data.path={data}", "--set", "data.seq_len=512", "--set", "mlperf.division=open")
    assert out.returncode == 0, out.stderr[-3000:]
    assert s["status"] == "success" and s["samples_to_target"] == 1536


SMALL_7B_LIKE = ["--set", "model.hidden_size=1024", "--set", "model.intermediate_size=2816", "--set",
                 "model.num_layers=8", "--set", "model.num_heads=8", "--set", "model.num_kv_heads=8",
                 "--set", "data.seq_len=2048", "--set", "train.max_steps=6", "--set", "train.seed=3"]


def test_fp8_lora_on_gpu_trains_close_to_bf16(tmp_path):
    """hardware.fp8=tensorwise on a real Hopper GPU (torchao's scaled matmuls, our frozen-base matmul):
    losses within float8 rounding of bf16's. Speed is the benchmarks' business (docs/PERFORMANCE.md:
    eager float8 is slower than bf16 at these and at 7B shapes)."""
    pytest.importorskip("torchao")
    out_bf16, bf16 = run(tmp_path, "run", "synthetic-lora", *SMALL_7B_LIKE)
    out_fp8, fp8 = run(tmp_path, "run", "synthetic-lora", *SMALL_7B_LIKE, "--set", "hardware.fp8=tensorwise")
    assert bf16.get("losses") and fp8.get("losses"), (out_bf16.stderr[-2000:], out_fp8.stderr[-2000:])
    assert all(abs(a / b - 1) < 0.03 for a, b in zip(fp8["losses"], bf16["losses"]))
    assert fp8["losses"] != bf16["losses"]  # float8 really ran: its rounding shows in the losses


def test_float8_stored_frozen_base_on_gpu_trains_like_the_dynamic_cast_in_less_memory(tmp_path):
    """hardware.frozen_dtype=fp8 on a Hopper GPU, eager and compiled: the same losses as the dynamic
    float8 cast (bit-identical on CPU; on GPU to float8 GEMM determinism), less peak memory."""
    pytest.importorskip("torchao")
    for compiled in ("false", "true"):
        common = [*SMALL_7B_LIKE, "--set", "hardware.fp8=tensorwise", "--set", f"train.compile={compiled}"]
        out_d, dynamic = run(tmp_path, "run", "synthetic-lora", *common)
        out_s, stored = run(tmp_path, "run", "synthetic-lora", *common, "--set", "hardware.frozen_dtype=fp8")
        assert dynamic.get("losses") and stored.get("losses"), (out_d.stderr[-2000:], out_s.stderr[-2000:])
        assert stored["losses"] == pytest.approx(dynamic["losses"], rel=1e-3)
        assert stored["peak_mem_gib"] < dynamic["peak_mem_gib"]


def test_partial_recompute_sits_between_none_and_full_on_gpu(tmp_path):
    """train.recompute_layers=4 of 8: peak memory between no recompute and full, same losses; with the
    other 4 layers selective (recompute_others) less memory than with them plain, same losses."""
    res = {}
    half = ["--set", "train.recompute=full", "--set", "train.recompute_layers=4"]
    for name, extra in (("none", []), ("full", ["--set", "train.recompute=full"]), ("half", half),
                        ("half_sel", [*half, "--set", "train.recompute_others=selective"])):
        out, s = run(tmp_path, "run", "synthetic-lora", *SMALL_7B_LIKE, *extra, "--set", "lora.dropout=0")
        assert s.get("losses"), out.stderr[-2000:]
        res[name] = s
    assert res["full"]["peak_mem_gib"] < res["half"]["peak_mem_gib"] < res["none"]["peak_mem_gib"]
    assert res["full"]["peak_mem_gib"] < res["half_sel"]["peak_mem_gib"] < res["half"]["peak_mem_gib"]
    assert res["half"]["losses"] == pytest.approx(res["none"]["losses"], rel=1e-3)
    assert res["half_sel"]["losses"] == pytest.approx(res["none"]["losses"], rel=1e-3)


@pytest.mark.parametrize("compiled", ["false", "true"])
def test_activation_offload_on_gpu_trains_like_keeping_activations_in_less_memory(tmp_path, compiled):
    """train.offload_layers=4 of 8 (pinned host memory, side streams): the same losses as keeping every
    activation, a lower peak, and the saved activations really crossed to the host (the summary's
    activation_offload_gib_per_step against the planner's per-layer set); with the other four
    recomputed in full, offload spread between them."""
    res = {}
    common = [*SMALL_7B_LIKE, "--set", "lora.dropout=0", "--set", f"train.compile={compiled}"]
    for name, extra in (("none", []), ("offload", ["--set", "train.offload_layers=4"]),
                        ("offload_full", ["--set", "train.offload_layers=4", "--set", "train.recompute=full"])):
        out, s = run(tmp_path, "run", "synthetic-lora", *common, *extra)
        assert s.get("losses"), out.stderr[-3000:]
        res[name] = s
    assert res["offload"]["losses"] == pytest.approx(res["none"]["losses"], rel=1e-3)
    assert res["offload_full"]["losses"] == pytest.approx(res["none"]["losses"], rel=1e-3)
    assert res["offload_full"]["peak_mem_gib"] < res["offload"]["peak_mem_gib"] < res["none"]["peak_mem_gib"]
    assert res["none"]["activation_offload_gib_per_step"] == 0
    # 4 layers x GBS micro-batches of 2048 tokens; the planner's compiled/eager per-token set within 25%
    from trainperf.plan.costs import activation_bytes_per_token_layer
    from trainperf.core.resolve import resolve_spec
    from trainperf.workloads import get_workload

    spec = resolve_spec(get_workload("synthetic-lora").defaults(), None,
                        [a for a in common[1::2]])
    tokens = spec.data.seq_len * spec.train.global_batch_size
    expected = 4 * activation_bytes_per_token_layer(spec, "none") * tokens / 2**30
    assert res["offload"]["activation_offload_gib_per_step"] == pytest.approx(expected, rel=0.25)


def test_preflight_measures_the_host_link_alone_and_together(tmp_path):
    """`trainperf preflight --quick` on every visible GPU: pinned copies each way, each GPU alone and
    all at once, judged against the preset; the planner gets pcie_gbps and host_link_gpus from it."""
    n = gpus()
    out = subprocess.run(trainperf_cmd("preflight", "--quick", "--kernels", "no", "--json", "--nproc-per-node", str(n),
                                       "--db", str(tmp_path / "t.db"), "--out", str(tmp_path / "runs")),
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    res = json.loads(out.stdout)
    rows = res["host_link"]
    assert {(r["direction"], r["mode"]) for r in rows} == {(d, m) for d in ("d2h", "h2d") for m in ("alone", "together")}
    assert sorted({r["rank"] for r in rows}) == list(range(n))
    assert all(10 < r["gbps"] < 80 for r in rows), rows  # PCIe Gen4/Gen5 x16, pinned
    ov = res["measured_overrides"]
    assert ov["pcie_gbps"] > 10 and 1 <= ov["host_link_gpus"] <= n


@pytest.mark.parametrize("nproc", [1, 2])
def test_expandable_segments_reach_the_workers_and_train_alike(tmp_path, nproc):
    """hardware.expandable_segments: the allocator setting is what ran (the summary reads it back in
    the worker), in-process and under torchrun, and the losses match the default allocator's."""
    if gpus() < nproc:
        pytest.skip(f"needs {nproc} GPUs")
    extra = ["--nproc-per-node", str(nproc)] + THREE_STEPS
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    out_ref, ref = run(ref_dir, "run", "mini-pretrain", *extra)
    out, s = run(tmp_path, "run", "mini-pretrain", *extra, "--set", "hardware.expandable_segments=true")
    assert out.returncode == out_ref.returncode, out.stderr[-3000:]
    assert "expandable_segments:True" in (s.get("cuda_alloc_conf") or "")
    if "PYTORCH_CUDA_ALLOC_CONF" not in os.environ:
        assert ref.get("cuda_alloc_conf") is None
    assert s["losses"] and s["losses"] == pytest.approx(ref["losses"], abs=1e-5)


def test_eight_bit_adamw_on_gpu_reaches_the_target_as_adamw_does(tmp_path):
    """train.optimizer=adamw8bit on CUDA (FSDP2 on one GPU, torchao's compiled 8-bit step): mini-pretrain
    reaches its target, the first step's loss is AdamW's (nothing has stepped yet), and the moments take
    well under fp32 AdamW's bytes."""
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    out_ref, ref = run(ref_dir, "run", "mini-pretrain", "--set", "train.seed=7")
    out, s = run(tmp_path, "run", "mini-pretrain", "--set", "train.seed=7", "--set", "train.optimizer=adamw8bit")
    assert out.returncode == 0 and out_ref.returncode == 0, out.stderr[-3000:]
    assert s["status"] == ref["status"] == "success" and s["optimizer"] == "adamw8bit"
    assert s["losses"][0] == pytest.approx(ref["losses"][0], abs=1e-5)  # same seed, nothing stepped yet
    assert s["samples_to_target"] <= 2 * ref["samples_to_target"]
    assert 0.2 * ref["optimizer_state_gib"] < s["optimizer_state_gib"] < 0.6 * ref["optimizer_state_gib"]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_flash4_attention_trains_like_sdpa(tmp_path, compiled):
    """hardware.attention=flash4 (FlashAttention-4's CuTe-DSL kernels behind our custom op) trains
    within bf16 rounding of SDPA (cuDNN), eager and inside per-layer torch.compile, with GQA heads."""
    from trainperf.model.flash4 import available

    if available():
        pytest.skip(available())
    shape = SMALL_7B_LIKE + ["--set", "model.num_kv_heads=2", "--set", "lora.dropout=0",
                             "--set", f"train.compile={str(compiled).lower()}"]
    out_sdpa, sdpa = run(tmp_path, "run", "synthetic-lora", *shape)
    out_fa4, fa4 = run(tmp_path, "run", "synthetic-lora", *shape, "--set", "hardware.attention=flash4")
    assert sdpa.get("losses") and fa4.get("losses"), (out_sdpa.stderr[-2000:], out_fa4.stderr[-2000:])
    assert len(fa4["losses"]) == len(sdpa["losses"])
    assert all(abs(a / b - 1) < 0.01 for a, b in zip(fa4["losses"], sdpa["losses"]))


@pytest.mark.parametrize("adapters", [1, 3])
def test_fused_lora_kernel_matches_the_philox_reference(adapters):
    """The Triton kernel (hardware.lora_kernel=fused) draws exactly the PyTorch Philox reference's
    masks: its output and both gradients, from the op and from each of the two backwards, agree with
    the CPU implementation of the op to bf16 rounding, on a 7B-wide input whose row count is not a
    multiple of any block."""
    from trainperf.model.lora_kernel import lora_dropout_a

    torch.manual_seed(0)
    x = torch.randn(1000, 4100, dtype=torch.bfloat16)  # ragged: 4100 is no multiple of a column group
    a = torch.randn(16 * adapters, 4100, dtype=torch.bfloat16) * 0.02
    dh = torch.randn(1000, 16 * adapters, dtype=torch.bfloat16)
    seed = torch.tensor([2**40 + 12345], dtype=torch.int64)
    got, want = {}, {}
    # the reference in fp32 from the same bf16 values: the kernel's only roundings are its outputs'
    for device, dtype, into in (("cuda", torch.bfloat16, got), ("cpu", torch.float32, want)):
        xg = x.to(device, dtype).requires_grad_()
        ag = a.to(device, dtype).requires_grad_()
        h, bits = lora_dropout_a(xg, ag, seed.to(device), 0.1, adapters)
        h.backward(dh.to(device, dtype))
        into.update(h=h.float().cpu(), dx=xg.grad.float().cpu(), da=ag.grad.float().cpu(), bits=bits.cpu())
    assert torch.equal(got["bits"], want["bits"])  # Triton's Philox draws the reference's masks
    from trainperf.model import lora_triton

    # the op's backward is whichever of the two ran faster here; each must match the reference
    for variant, backward in lora_triton.BACKWARDS.items():
        dx, da = backward(dh.cuda(), x.cuda(), a.cuda(), got["bits"].cuda(), 0.1, adapters)
        got[f"dx {variant}"], got[f"da {variant}"] = dx.float().cpu(), da.float().cpu()
        want[f"dx {variant}"], want[f"da {variant}"] = want["dx"], want["da"]
    for name in got.keys() - {"bits"}:
        err = ((got[name] - want[name]).abs().max() / want[name].abs().max()).item()
        assert err < 1e-2, (name, err)
    for name in ("dx", "dx one-pass", "dx split"):
        assert torch.equal(got[name] == 0, want["dx"] == 0), name  # dropped by every adapter: no gradient


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_fused_lora_kernel_trains_like_the_torch_path(tmp_path, compiled):
    """hardware.lora_kernel=fused on a 7B-like model with dropout 0.1: losses within 2% of F.dropout's
    (other masks, same distribution), eager and inside per-layer torch.compile."""
    shape = SMALL_7B_LIKE + ["--set", f"train.compile={str(compiled).lower()}"]
    out_torch, plain = run(tmp_path, "run", "synthetic-lora", *shape)
    out_fused, fused = run(tmp_path, "run", "synthetic-lora", *shape, "--set", "hardware.lora_kernel=fused")
    assert plain.get("losses") and fused.get("losses"), (out_torch.stderr[-2000:], out_fused.stderr[-2000:])
    assert len(fused["losses"]) == len(plain["losses"])
    assert all(abs(a / b - 1) < 0.02 for a, b in zip(fused["losses"], plain["losses"]))
    assert fused["peak_mem_gib"] < plain["peak_mem_gib"]  # no masks, no dropped copies kept


def test_the_backward_pick_times_gpu_work_not_the_hosts_launches():
    """lora_triton._time_ms (which picks the fused backward's form) times a call's GPU work: a call that
    spends 0.2 ms on the host around one tiny kernel (as a Triton launcher's Python does, at a larger
    scale) is timed at the kernel's few microseconds, not the host's 0.2 ms; a call of known GPU length
    is timed at that length."""
    import time

    from trainperf.model import lora_triton

    x = torch.zeros(1, device="cuda")

    def slow_host_call():
        x.add_(1)
        t = time.perf_counter()
        while time.perf_counter() - t < 2e-4:
            pass

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(50):
        slow_host_call()
    host_ms = (time.perf_counter() - t0) * 1e3 / 50
    torch.cuda.synchronize()
    gpu_ms = lora_triton._time_ms(slow_host_call)
    assert host_ms > 0.2 and gpu_ms < 0.25 * host_ms, (gpu_ms, host_ms)
    # a call of one GPU sleep is timed at the sleep's own length, as events around it alone measure it
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(2_000_000)
    end.record()
    end.synchronize()
    slept = lora_triton._time_ms(lambda: torch.cuda._sleep(2_000_000))
    assert abs(slept / start.elapsed_time(end) - 1) < 0.2, (slept, start.elapsed_time(end))


def test_the_lagged_log_reads_a_finished_step_without_waiting_for_the_next():
    """LaggedLog reads a logged step's values one step late without draining the queue: with about a
    second of the next step's GPU work queued, reading the finished step returns at once (a float() of
    the device tensor would wait for the whole queue), and the next step's value follows on flush."""
    import time

    from trainperf.train.clock import LaggedLog

    out = []
    log = LaggedLog(out.append)
    loss = torch.full((), 2.0, device="cuda")
    log.add({"step": 1, "loss": loss})
    torch.cuda.synchronize()  # step 1 is done on the GPU
    torch.cuda._sleep(2_000_000_000)  # step 2's work: about 1 s at the H200's clock
    log.add({"step": 2, "loss": loss * 3})
    t0 = time.perf_counter()
    log.lag()
    waited = time.perf_counter() - t0
    assert out == [{"step": 1, "loss": 2.0}] and waited < 0.1, waited
    log.flush()
    assert out[1] == {"step": 2, "loss": 6.0}
