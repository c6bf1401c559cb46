"""bench/throughput_matrix.py and the side-by-side scripts' shared pieces, on CPU: which cell runs
first, how a cell that does not fit is shown, and that one side's OOM leaves the other side's figures."""

from __future__ import annotations

import json
import os

import pytest
import torch

from bench import lora_throughput, throughput_matrix


def test_grid_runs_the_biggest_shapes_and_longest_sequences_first():
    grid = throughput_matrix.cells(["1b", "13b", "7b"], [4096, 8192], ["none", "full"])
    assert len(grid) == 12
    assert grid[0] == ("13b", 8192, "full") and grid[-1] == ("1b", 4096, "none")
    assert [c[0] for c in grid] == ["13b"] * 4 + ["7b"] * 4 + ["1b"] * 4


def test_table_shows_a_side_that_does_not_fit_and_no_ratio_for_it(tmp_path):
    lines = [
        {"shape": "7b", "seq": 8192, "recompute": "none", "ratio": 1.65,
         "trainperf": {"tokens_per_s": 15680.0, "mfu": 0.523, "peak_gib": 50.5},
         "hf_peft": {"tokens_per_s": 9520.0, "mfu": 0.317, "peak_gib": 68.0}},
        {"shape": "7b", "seq": 8192, "recompute": "selective",
         "trainperf": {"tokens_per_s": 3000.0, "mfu": 0.41, "peak_gib": 120.0, "recompute": "selective"},
         "eager": {"oom": "CUDA out of memory. Tried to allocate 2.00 GiB", "recompute": "none"}},
    ]
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    rows = throughput_matrix.table([str(path)]).splitlines()
    lora = next(r for r in rows if r.startswith("| lora"))
    pretrain = next(r for r in rows if r.startswith("| pretrain"))
    assert "15,680 / 52.3% / 50.5" in lora and "9,520 / 31.7% / 68.0" in lora and lora.endswith("| 1.65x |")
    assert "selective / none" in pretrain and "does not fit" in pretrain and pretrain.endswith("| - |")
    assert rows.index(lora) < rows.index(pretrain)  # LoRA rows first


def test_one_side_out_of_memory_is_reported_not_raised():
    def too_big(**_):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB\nmore detail")

    assert lora_throughput.run_side(too_big, seq=1) == {"oom": "CUDA out of memory. Tried to allocate 9.00 GiB"}
    assert lora_throughput.run_side(lambda **kw: {"step_s": kw["seq"]}, seq=2) == {"step_s": 2}
    with pytest.raises(ValueError):  # anything else is a bug and must surface
        lora_throughput.run_side(lambda **_: (_ for _ in ()).throw(ValueError("bad")))


def test_each_gpu_cell_gets_its_own_share_of_the_cores():
    shares = [throughput_matrix.cpu_share(slot, 2) for slot in range(2)]
    cores = os.sched_getaffinity(0)
    assert all(share <= cores and share for share in shares)
    if len(cores) >= 2:
        assert not shares[0] & shares[1]  # disjoint: one cell's compile cannot slow the other's timing


def test_side_by_side_reports_both_sides_their_ratio_and_one_json_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    out = tmp_path / "r.jsonl"
    sides = [("trainperf", lambda **kw: {"step_s": 0.5, "peak_gib": 50.0}, {"recompute": "none"}),
             ("hf_peft", lambda **kw: {"step_s": 0.8, "peak_gib": 68.0}, {"recompute": "none"})]
    r = lora_throughput.side_by_side(sides, shape="7b", seq=8192, flops_tok=1e9, ratio_label="a / b",
                                     json_path=str(out), meta={"shape": "7b", "seq": 8192, "recompute": "none"})
    assert r["ratio"] == pytest.approx(0.8 / 0.5)
    assert r["trainperf"]["tokens_per_s"] == pytest.approx(8192 / 0.5)
    assert r["trainperf"]["mfu"] == pytest.approx(1e9 * 8192 / 0.5 / 989e12)
    assert "ratio a / b: 1.60x" in capsys.readouterr().out
    assert json.loads(out.read_text())["hf_peft"]["peak_gib"] == 68.0
    # the second side out of memory: reported, no ratio, still one more line in the file
    sides[1] = ("hf_peft", lambda **kw: (_ for _ in ()).throw(torch.OutOfMemoryError("CUDA out of memory.")),
                {"recompute": "full"})
    r = lora_throughput.side_by_side(sides, shape="7b", seq=8192, flops_tok=1e9, ratio_label="a / b",
                                     json_path=str(out), meta={})
    assert "ratio" not in r and r["hf_peft"] == {"oom": "CUDA out of memory.", "recompute": "full"}
    assert "does not fit this GPU" in capsys.readouterr().out
    assert len(out.read_text().splitlines()) == 2


def test_an_out_of_memory_wrapped_by_the_compiler_counts_as_not_fitting():
    def wrapped(**_):
        raise RuntimeError("BackendCompilerFailed: backend='inductor' raised:\nCUDA out of memory. Tried to allocate 2 GiB")

    assert lora_throughput.run_side(wrapped) == {"oom": "CUDA out of memory. Tried to allocate 2 GiB"}
    with pytest.raises(RuntimeError):  # a compiler error that is not memory still surfaces
        lora_throughput.run_side(lambda **_: (_ for _ in ()).throw(RuntimeError("InductorError: bad graph")))


def test_side_by_side_puts_each_of_our_sides_against_the_last(tmp_path, monkeypatch, capsys):
    """--attention sdpa,flash4: two of our sides, one baseline; each gets its ratio to the baseline."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    sides = [("trainperf", lambda **kw: {"step_s": 0.5, "peak_gib": 50.0}, {"recompute": "none"}),
             ("trainperf_flash4", lambda **kw: {"step_s": 0.4, "peak_gib": 50.0}, {"recompute": "none"}),
             ("hf_peft", lambda **kw: {"step_s": 0.8, "peak_gib": 68.0}, {"recompute": "none"})]
    r = lora_throughput.side_by_side(sides, shape="7b", seq=8192, flops_tok=1e9, ratio_label="a / b",
                                     json_path=None, meta={})
    assert r["ratio"] == pytest.approx(0.8 / 0.5)  # the first side's, as with two sides
    assert r["ratios"] == pytest.approx({"trainperf": 0.8 / 0.5, "trainperf_flash4": 0.8 / 0.4})
    printed = capsys.readouterr().out
    assert "ratio a / b: 1.60x" in printed and "ratio a / b (trainperf_flash4): 2.00x" in printed


def test_our_first_side_meets_every_peer_and_the_fastest(monkeypatch, capsys):
    """--hf-sides: several HF-based peers; each of ours against plain HF + PEFT (the first peer), our
    first against each peer and the fastest; a peer that fails to run is reported, not ranked."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")

    def broken(**_):
        raise RuntimeError("Unsupported: triton kernel")

    sides = [("trainperf", lambda **kw: {"step_s": 0.5, "peak_gib": 50.0}, {"recompute": "none"}),
             ("hf_peft", lambda **kw: {"step_s": 0.8, "peak_gib": 68.0}, {"recompute": "none"}),
             ("hf_peft_liger", lambda **kw: {"step_s": 0.64, "peak_gib": 60.0}, {"recompute": "none"}),
             ("hf_peft_liger_compiled", lora_throughput.reporting_errors(broken), {"recompute": "none"})]
    r = lora_throughput.side_by_side(sides, shape="7b", seq=8192, flops_tok=1e9, ratio_label="a / b",
                                     json_path=None, meta={}, peers=3)
    assert r["ratio"] == pytest.approx(0.8 / 0.5) and r["ratios"] == pytest.approx({"trainperf": 0.8 / 0.5})
    assert r["ratios_by_peer"] == pytest.approx({"hf_peft": 0.8 / 0.5, "hf_peft_liger": 0.64 / 0.5})
    assert r["fastest_peer"] == "hf_peft_liger" and r["ratio_to_fastest_peer"] == pytest.approx(1.28)
    assert r["hf_peft_liger_compiled"]["error"] == "RuntimeError: Unsupported: triton kernel"
    printed = capsys.readouterr().out
    assert "ratio trainperf / fastest peer (hf_peft_liger): 1.28x" in printed and "did not run" in printed


def test_liger_sides_run_after_the_plain_ones_and_unknown_sides_are_refused():
    sides = lora_throughput.hf_sides("hf_peft_liger,hf_peft_compiled,hf_peft", {"recompute": "none"})
    assert [n for n, _, _ in sides] == ["hf_peft_compiled", "hf_peft", "hf_peft_liger"]
    assert [(kw["liger"], kw["hf_compile"], kw["hf_fp8"]) for _, _, kw in sides] == [
        (False, True, False), (False, False, False), (True, False, False)]
    (fp8,) = lora_throughput.hf_sides("hf_peft_fp8_compiled", {})
    assert (fp8[2]["hf_fp8"], fp8[2]["hf_compile"], fp8[2]["liger"], fp8[2]["cudnn"]) == (True, True, False, False)
    (fp8_cudnn,) = lora_throughput.hf_sides("hf_peft_fp8_compiled_cudnn", {})
    assert (fp8_cudnn[2]["hf_fp8"], fp8_cudnn[2]["cudnn"]) == (True, True)
    with pytest.raises(ValueError, match="valid: hf_peft,"):
        lora_throughput.hf_sides("hf_peft,hf_fast", {})


def test_each_hf_decoder_layer_is_compiled_inside_peft():
    """The compiled HF sides compile what train.compile=true compiles of ours: every decoder layer."""
    from peft import LoraConfig, get_peft_model

    from trainperf.core.spec import ModelSpec

    spec = ModelSpec(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=2,
                     num_kv_heads=2, max_position_embeddings=64)
    model = get_peft_model(lora_throughput.hf_llama(spec, 64, "cpu"),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    assert lora_throughput.compile_decoder_layers(model) == 3
    layers = [m for m in model.modules() if type(m).__name__ == "LlamaDecoderLayer"]
    assert all(layer._compiled_call_impl is not None for layer in layers)


def test_the_cudnn_hf_side_runs_transformers_sdpa_under_trainperfs_backend_order(monkeypatch):
    """*_cudnn: the HF model's attention is its own SDPA function, entered under attention_backends
    inside each call (where a compiled layer traces it): same loss as plain "sdpa", same weights."""
    import contextlib

    from trainperf.core.spec import ModelSpec
    from trainperf.model import llama

    entered = []

    def counting_backends(device_type):
        entered.append(device_type)
        return contextlib.nullcontext()

    monkeypatch.setattr(llama, "attention_backends", counting_backends)
    spec = ModelSpec(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                     num_kv_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    plain = lora_throughput.hf_llama(spec, 64, "cpu").float()
    cudnn = lora_throughput.hf_llama(spec, 64, "cpu", attention="sdpa_cudnn").float()
    cudnn.load_state_dict(plain.state_dict())
    ids = torch.randint(0, 64, (1, 16))
    assert cudnn.config._attn_implementation == "sdpa_cudnn"
    assert cudnn(input_ids=ids, labels=ids).loss.item() == pytest.approx(plain(input_ids=ids, labels=ids).loss.item(),
                                                                           rel=1e-6)
    assert entered == ["cuda", "cuda"]  # once per layer, only on the cudnn model's forward


def test_the_fp8_hf_side_swaps_every_decoder_base_linear_and_no_adapter():
    """hf_peft_fp8_compiled: torchao's Float8Linear for q/k/v/o's frozen base and the MLP of each layer;
    PEFT's lora_A / lora_B and the LM head stay as they are."""
    from peft import LoraConfig, get_peft_model
    from torchao.float8.float8_linear import Float8Linear

    from trainperf.core.spec import ModelSpec

    spec = ModelSpec(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                     num_kv_heads=2, max_position_embeddings=64)
    model = get_peft_model(lora_throughput.hf_llama(spec, 64, "cpu"),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                      task_type="CAUSAL_LM"))
    assert lora_throughput.float8_base_linears(model) == 2 * 7  # 4 attention bases + 3 MLP per layer
    swapped = {n for n, m in model.named_modules() if isinstance(m, Float8Linear)}
    assert len(swapped) == 14 and all(n.endswith(("base_layer", "_proj")) for n in swapped)
    assert not any("lora_" in n or "lm_head" in n for n in swapped)
    assert not any(m.weight.requires_grad for n, m in model.named_modules() if n in swapped)  # still frozen


def test_the_70b_bench_plans_again_with_more_headroom_when_a_run_dies(monkeypatch, tmp_path):
    """mlperf_lora_70b --plan: the first headroom's layout dies before a timed step, the next is planned
    and run; a planner refusal stops it with exit 2 and no run."""
    import argparse

    from bench import mlperf_lora_70b as bench70

    planned, ran = [], []

    def plan(nproc, overrides, db, headroom, gpu):
        planned.append(headroom)
        return {"id": f"p{len(planned)}:P1", "set": "--set train.recompute_layers=48", "step_time_s": 30.6,
                "memory_gib": 127.0 - 10 * len(planned)}

    def run(args, overrides, plan_id):
        ran.append(plan_id)
        return (1, {"status": "failed", "status_reason": "CUDA out of memory"}) if len(ran) == 1 else \
               (0, {"step_time_s": 31.0, "status": "failed"})

    monkeypatch.setattr(bench70, "plan_layout", plan)
    monkeypatch.setattr(bench70, "run_recipe", run)
    args = argparse.Namespace(nproc=1, overrides=["hardware.fp8=tensorwise"], out=str(tmp_path), headroom=[0.08, 0.15],
                              gpu=None)
    code, result = bench70.run_planned(args)
    assert code == 0 and planned == [0.08, 0.15] and ran == ["p1:P1", "p2:P1"]
    assert result["plan"]["id"] == "p2:P1" and result["plan"]["memory_gib"] == 107.0
    assert result["step_time_s"] == 31.0
    monkeypatch.setattr(bench70, "plan_layout", lambda *a: {"error": "hardware.fp8='x': valid values are none"})
    ran.clear()
    code, result = bench70.run_planned(args)
    assert code == 2 and not ran and "valid values" in result["plan"]["error"]


def test_the_hf_peers_train_without_filling_a_kv_cache():
    """A training forward of the HF sides builds no DynamicCache (its per-layer guard would stop the
    compiled sides' decoder layers from compiling past dynamo's recompile limit)."""
    from trainperf.core.spec import ModelSpec

    spec = ModelSpec(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                     num_kv_heads=2, max_position_embeddings=64)
    model = lora_throughput.hf_llama(spec, 64, "cpu")
    model.train()
    out = model(input_ids=torch.randint(0, 64, (1, 16)))
    assert out.past_key_values is None and out.logits.shape == (1, 16, 64)


def test_the_published_check_summary_counts_only_multi_node_ranks(capsys):
    from bench.engine_profile_check import print_check_rows

    def row(label, err, ttt_err, multi, rank):
        return {"label": label, "engine": "nemo", "layout": "TP4 DP2 MBS 1 H100", "published_tps": 100.0,
                "predicted_tps": 100.0 * (1 + err), "tps_error": err, "published_min": 10.0,
                "predicted_min": 10.0 * (1 + ttt_err), "ttt_error": ttt_err, "multi_node": multi, "rank": rank,
                "layouts": 50, "gap": 0.019 if rank and rank > 1 else None,
                "minutes_basis": "score" if multi else "median run"}

    print_check_rows([row("a@8", 0.02, -0.10, False, None), row("b@64", -0.04, 0.05, True, 2),
                      row("c@512", 0.20, 0.30, True, 9), row("d@1024", -0.06, 0.01, True, None)])
    out = capsys.readouterr().out
    assert "| a@8 | nemo | TP4 DP2 MBS 1 H100 | 100 | 102 | +2.0% | 10.00 (median run) | 9.00 | -10.0% | (one node) |" in out
    assert "| b@64 | nemo | TP4 DP2 MBS 1 H100 | 100 | 96 | -4.0% | 10.00 | 10.50 | +5.0% | 2 of 50 (+1.9%) |" in out
    assert "not ranked (of 50)" in out and "| 9 of 50 (+1.9%) |" in out
    assert ("checked configurations: 4; tokens/s per GPU median |error| 5.0%, max 20.0%; time to train median "
            "|error| 7.5%, max 30.0%; multi-node configurations with the published layout in the top 3: 1 of 3") in out
