"""`trainperf import`'s reader of MLPerf submission folders, the store's imported runs, engine-profile
fits, and the planner at cluster scale (Megatron layouts, hierarchical collectives, nearest counts).
In-process; the published folders are the trimmed copies in tests/fixtures/published."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.published import one_h200_submission
from trainperf.core.errors import SpecError
from trainperf.mlperf.published import config_layout, read_config_script, read_submissions
from trainperf.mlperf.recipes import llama2_70b_lora_defaults, llama31_8b_defaults, llama31_405b_defaults
from trainperf.plan.engines import (
    FACTORS,
    EngineProfile,
    EngineRun,
    apply_profile,
    engine_runs,
    fit_profile,
    group_points,
)
from trainperf.plan.costs import Estimate, estimate, group_busbw
from trainperf.plan.hardware import PRESETS
from trainperf.plan.search import megatron_layout_ok, nearest_valid_counts, plan, valid_batch_sizes
from trainperf.store.db import Store



def test_import_reads_layout_throughput_and_engine_of_a_published_run(tmp_path):
    runs, problems = read_submissions([str(one_h200_submission(tmp_path))], "6.0.0")
    assert problems == [] and len(runs) == 1
    r = runs[0]
    spec = json.loads(r.row["spec_json"])
    hw = json.loads(r.row["hardware_json"])
    assert r.engine == "nemo" and r.row["engine"] == "nemo"
    assert (spec["parallel"]["tp"], spec["parallel"]["cp"], spec["parallel"]["dp_shard"]) == (1, 2, 4)
    assert spec["train"]["global_batch_size"] == 8 and spec["hardware"]["fp8"] != "none"
    assert hw["gpus"] == 8 and "H200" in hw["gpu"]
    # README: 2,531 tokens/s per GPU (tracked_stats throughput, median of the runs); this run's median
    assert r.row["tokens_per_s_per_gpu"] == pytest.approx(2531, rel=0.02)
    assert r.row["status"] == "success" and 20 * 60 < r.row["time_to_train_s"] < 30 * 60
    assert 0.5 < r.row["mfu"] < 1.0  # FP8 run against the bf16 peak


def test_import_says_what_is_missing_and_stores_nothing_half_written(tmp_path):
    root = one_h200_submission(tmp_path, runs=3)
    logs = sorted(root.rglob("result_*.txt"))
    logs[0].write_text("".join(line for line in logs[0].read_text().splitlines(True) if "tracked_stats" not in line))
    logs[2].write_text("".join(line for line in logs[2].read_text().splitlines(True) if "submission_org" not in line))
    (tmp_path / "stray").mkdir()
    runs, problems = read_submissions([str(root), str(tmp_path / "stray")], "6.0.0")
    assert [Path(r.path).name for r in runs] == ["result_1.txt"]
    assert any("result_0.txt: no throughput" in p for p in problems)
    assert any("result_2.txt: fails the 4.1.0 compliance checker: Required EXACTLY_ONE occurrence of "
               "'submission_org'" in p for p in problems)
    assert any("stray: not an MLPerf submission folder" in p for p in problems)
    config = next(root.rglob("config_DGXH200*.sh"))
    config.write_text(config.read_text().replace("MINIBS=2", "MINIBS=3"))
    runs, problems = read_submissions([str(root)], "6.0.0")
    assert runs == [] and any("the log's global_batch_size is 8" in p for p in problems)
    db = tmp_path / "t.db"
    store = Store(db)
    assert store.list_runs() == []  # nothing was written for the runs that could not be read
    store.close()


def test_config_scripts_follow_sourced_files_and_defaults(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "config_common.sh").write_text("export FP8=True\nexport MBS=1\nexport SP=1\n")
    script = tmp_path / "a" / "config_X_4x8x2.sh"
    script.write_text('source $(dirname ${BASH_SOURCE[0]})/config_common.sh\nexport TP=4  # tensor\n'
                      ': "${MINIBS:=16}"\nexport INTERLEAVED_PIPELINE=3\nexport PIPELINE_MODEL_PARALLEL=2\n')
    env = read_config_script(script, [tmp_path / "common" / "config_common.sh"])
    lay = config_layout(env, 32)
    assert (lay["tp"], lay["pp"], lay["vp"], lay["dp"], lay["local_batch"], lay["fp8"], lay["sp"]) == \
        (4, 2, 3, 4, 16, True, True)


def test_store_imports_runs_once_in_one_transaction(tmp_path):
    store = Store(tmp_path / "t.db")
    row = {"run_id": "imp-1", "created_at": 1.0, "workload": "llama2_70b_lora", "status": "success", "comparable": 0,
           "spec_json": json.dumps(llama2_70b_lora_defaults().to_dict()), "layout": "DP8", "world_size": 8,
           "hardware_json": "{}", "tokens_per_s_per_gpu": 100.0, "engine": "nemo"}
    assert store.import_runs([row]) == ["imp-1"]
    assert store.import_runs([row]) == []
    with pytest.raises(ValueError):
        store.import_runs([row | {"run_id": "imp-2"}, {k: v for k, v in row.items() if k != "engine"} | {"run_id": "imp-3"}])
    assert [r["run_id"] for r in store.list_runs()] == ["imp-1"]  # the bad batch wrote nothing
    assert store.get_run("imp-1")["engine"] == "nemo"
    store.close()


def _points_from(profile: EngineProfile) -> list[EngineRun]:
    """Synthetic runs whose throughput is what ``profile`` predicts: a fit must recover them."""
    out = []
    for gpus, tp, cp, gpu in ((8, 4, 1, "h100"), (8, 1, 2, "h200"), (64, 4, 2, "h100"), (16, 2, 1, "h100")):
        spec = llama2_70b_lora_defaults()
        p = spec.parallel
        p.tp, p.sp, p.cp, p.dp_shard = tp, tp > 1, cp, gpus // (tp * cp)
        spec.hardware.device, spec.hardware.fp8, spec.hardware.frozen_dtype = "cuda", "tensorwise", "fp8"
        spec.train.recompute = "none"
        est = estimate(spec, apply_profile(PRESETS[gpu], profile), 8)
        out.append(EngineRun(f"r{gpus}{tp}{cp}", spec, PRESETS[gpu], 8, est.tokens_per_s_per_gpu, None,
                             f"llama2@{gpus} TP{tp} CP{cp} {gpu}"))
    return out


def test_fit_recovers_throughput_and_needs_enough_points():
    truth = EngineProfile("x", {k: v[1] * (1.15 if k == "gemm_eff" else 1.0) for k, v in FACTORS.items()})
    points = _points_from(truth)
    fitted = fit_profile("x", points)
    for p in points:
        est = estimate(p.spec, apply_profile(p.gpu, fitted), 8)
        assert est.tokens_per_s_per_gpu == pytest.approx(p.tokens_per_s_per_gpu, rel=0.03)
    assert fitted.factors["gemm_eff"] > FACTORS["gemm_eff"][1]  # moved towards the truth from its prior
    with pytest.raises(SpecError, match="a fit needs at least 3"):
        fit_profile("x", points[:2])
    with pytest.raises(SpecError, match="this engine's own profile"):
        fit_profile("trainperf", points)


def test_engine_runs_come_from_the_store_by_engine(tmp_path):
    store = Store(tmp_path / "t.db")
    spec = llama2_70b_lora_defaults()
    base = {"created_at": 1.0, "workload": "llama2_70b_lora", "status": "success", "comparable": 0,
            "spec_json": json.dumps(spec.to_dict()), "layout": "DP8", "world_size": 8,
            "hardware_json": json.dumps({"gpu": "NVIDIA H100-SXM5-80GB", "gpus": 8, "gpus_per_node": 8})}
    store.import_runs([base | {"run_id": f"a{i}", "tokens_per_s_per_gpu": 100.0 + i, "engine": "nemo"} for i in range(3)]
                      + [base | {"run_id": "b", "tokens_per_s_per_gpu": 5.0, "engine": "other"}])
    runs = engine_runs(store, "nemo")
    assert sorted(r.run_id for r in runs) == ["a0", "a1", "a2"]
    assert [r.tokens_per_s_per_gpu for r in group_points(runs)] == [101.0]  # one point: the median run
    store.close()


def test_hierarchical_busbw_across_nodes():
    gpu = PRESETS["h100"]
    intra, inter = gpu.intra_busbw_gbps * 1e9, gpu.inter_busbw_gbps * 1e9
    assert group_busbw(gpu, 8, 8, 8) == intra
    one_per_node = group_busbw(gpu, 8, 64, 8)  # strided: one rank per node, each on its own NIC
    eight_per_node = group_busbw(gpu, 8, 64, 64)  # 8 per node: NVLink first, 1/8 of the data over the NICs
    assert one_per_node == pytest.approx(inter)
    assert inter < eight_per_node < intra


def _nemo_like() -> EngineProfile:
    return EngineProfile("nemo", {k: v[1] for k, v in FACTORS.items()})


def test_nvidia_405b_layout_is_valid_and_fits_80gb_under_megatron():
    spec = llama31_405b_defaults(1152)
    p = spec.parallel
    p.tp, p.sp, p.pp, p.cp, p.dp_shard = 8, True, 8, 2, 4
    p.pp_schedule, p.pp_stages_per_rank = "Interleaved1F1B", 8
    spec.hardware.device, spec.hardware.fp8, spec.train.recompute = "cuda", "tensorwise", "none"
    assert megatron_layout_ok(spec)  # 126 layers + embedding and loss = 128 = 8 x 8 x 2
    est = estimate(spec, apply_profile(PRESETS["h100"], _nemo_like()), 8)
    assert est.fits and est.reserved_gib < 79


def test_interleaved_chunks_widen_the_distributed_optimizers_overlap_window():
    """Under the interleaved schedule each model chunk reduces its gradients after its own last
    backward: the data-parallel traffic hides under 1 + (v - 1) p / v micro-batches, not one."""
    from trainperf.plan.costs import distributed_optimizer_seconds, rank_shape

    gpu = apply_profile(PRESETS["h100"], _nemo_like())
    exposed = {}
    for v in (1, 8):
        spec = llama31_405b_defaults(1152)
        p = spec.parallel
        p.tp, p.sp, p.pp, p.cp, p.dp_shard = 8, True, 8, 1, 64
        p.pp_schedule, p.pp_stages_per_rank = ("Interleaved1F1B", 8) if v > 1 else ("1F1B", 0)
        spec.hardware.device, spec.hardware.fp8, spec.train.recompute = "cuda", "tensorwise", "none"
        s = rank_shape(spec)
        assert s.v == v
        t_micro = 0.05
        exposed[v] = distributed_optimizer_seconds(spec, s, gpu, 8, t_micro, Estimate())
        traffic = exposed[1] + gpu.comm_overlap * t_micro  # exposed + hidden, one micro-batch window
    assert exposed[1] > 0
    assert exposed[8] == pytest.approx(max(0.0, traffic - gpu.comm_overlap * 0.05 * (1 + 7 * 8 / 8)))
    assert exposed[8] < exposed[1]


def test_megatron_lora_layouts_keep_micro_batch_one_and_pretraining_may_raise_it():
    """NeMo fine-tunes on packed sequences and refuses a micro-batch above 1 there; pretraining takes MBS 2."""
    lora = llama2_70b_lora_defaults()
    lora.parallel.tp, lora.parallel.sp, lora.parallel.dp_shard = 4, True, 2
    lora.hardware.device = "cuda"
    assert megatron_layout_ok(lora)
    lora.train.micro_batch_size = 2
    assert not megatron_layout_ok(lora)
    fits, _ = plan(llama2_70b_lora_defaults(), apply_profile(PRESETS["h200"], _nemo_like()), 32, 8,
                   gbs_values=[8, 16], megatron=True)
    assert fits and {c.spec.train.micro_batch_size for c in fits} == {1}
    pre = llama31_405b_defaults(1152)
    p = pre.parallel
    p.tp, p.sp, p.pp, p.cp, p.dp_shard = 8, True, 8, 2, 4
    p.pp_schedule, p.pp_stages_per_rank = "Interleaved1F1B", 8
    pre.train.micro_batch_size = 2
    assert megatron_layout_ok(pre)


def test_search_at_scale_names_nearest_counts_and_covers_megatron_layouts():
    spec = llama2_70b_lora_defaults()
    spec.hardware.fp8, spec.hardware.frozen_dtype = "tensorwise", "fp8"
    with pytest.raises(SpecError, match=r"nearest counts that have one: 16 GPUs \(GBS 8\); 32 GPUs \(GBS 8\)"):
        plan(spec, apply_profile(PRESETS["h100"], _nemo_like()), 24, 8, megatron=True)  # 3 divides nothing
    assert valid_batch_sizes(spec, 1024, 8, [8, 128], megatron=True) == [8, 128]
    assert nearest_valid_counts(spec, 1024 + 8, 8, [8], megatron=True, max_nodes_away=2) == \
        "the nearest counts that have one: 1024 GPUs (GBS 8)"


def test_cluster_presets_and_yaml_network(tmp_path):
    from trainperf.plan.hardware import load_gpu, preset_for_device

    assert preset_for_device("NVIDIA H200 NVL").nvlink_domain == 4
    assert preset_for_device("NVIDIA H200-SXM5-141GB").name == "NVIDIA H200 SXM"
    assert load_gpu("h100-sxm").inter_busbw_gbps == pytest.approx(40.0)
    roce = tmp_path / "roce.yaml"
    roce.write_text("base: h100-sxm\nnic_gbps: 50\nnic_efficiency: 0.6\ndata_parallel: distributed_optimizer\n")
    gpu = load_gpu(str(roce))
    assert gpu.inter_busbw_gbps == pytest.approx(30.0) and gpu.data_parallel == "distributed_optimizer"
    roce.write_text("base: h100-sxm\ndata_parallel: zero9\n")
    with pytest.raises(SpecError, match="data_parallel 'zero9'"):
        load_gpu(str(roce))


def test_speed_options_are_search_dimensions():
    from trainperf.plan.search import option_overrides

    lora = llama2_70b_lora_defaults()
    combos = option_overrides(lora, ["compile", "fp8", "frozen_dtype"])
    assert len(combos) == 6  # 2 x 2 x 2 less the fp8 base without fp8 compute
    assert all(c["hardware.fp8"] == "tensorwise" for c in combos if c["hardware.frozen_dtype"] == "fp8")
    assert len(option_overrides(llama31_405b_defaults(), ["fp8", "frozen_dtype"])) == 2  # no LoRA: no frozen base
    with pytest.raises(SpecError, match="valid: compile, fp8"):
        option_overrides(lora, ["turbo"])
    spec = llama31_8b_defaults()
    spec.hardware.device = "cuda"
    fits, _ = plan(spec, PRESETS["h200"], 2, 2, options=option_overrides(spec, ["compile", "fp8"]))
    plain, _ = plan(spec, PRESETS["h200"], 2, 2)
    assert fits[0].est.step_time_s < plain[0].est.step_time_s
    assert any(k in fits[0].overrides for k in ("train.compile", "hardware.fp8"))


def test_throughput_from_training_blocks_when_the_log_tracks_none():
    """Logs before v4.1 track no throughput: a step lasts a block's time over its steps, the block's
    epoch_count in tokens where it is whole GBS x seq multiples (gpt3), else in sequences; the first
    block (compilation, warm-up) is left out."""
    from types import SimpleNamespace

    from trainperf.mlperf.published import step_seconds_from_blocks

    def blocks(counts_and_seconds):
        lines, t, first = [], 0.0, 0
        for count, seconds in counts_and_seconds:
            meta = {"metadata": {"first_epoch_num": first, "epoch_count": count}}
            lines.append(SimpleNamespace(key="block_start", value=meta, timestamp=t))
            t += seconds * 1000
            lines.append(SimpleNamespace(key="block_stop", value=meta, timestamp=t))
            lines.append(SimpleNamespace(key="eval_accuracy", value={"value": 3.0}, timestamp=t))
            first += count
        return lines

    tokens = blocks([(10 * 4 * 8, 20.0), (10 * 4 * 8, 10.0), (10 * 4 * 8, 12.0)])  # 10 steps of GBS 4 x seq 8
    assert step_seconds_from_blocks(tokens, gbs=4, seq_len=8)[0] == pytest.approx(1.1)
    sequences = blocks([(40, 9.0), (40, 5.0), (40, 5.0), (40, 6.0)])  # 10 steps of GBS 4
    step_s, basis = step_seconds_from_blocks(sequences, gbs=4, seq_len=8192)
    assert step_s == pytest.approx(0.5) and "3 blocks, the first left out" in basis
    assert step_seconds_from_blocks(blocks([(40, 9.0)]), gbs=4, seq_len=8192) == (None, "")
    assert step_seconds_from_blocks(blocks([(42, 9.0), (42, 9.0)]), gbs=4, seq_len=8192) == (None, "")  # no whole steps


def test_the_matching_config_is_a_launch_config_for_this_gpu_generation(tmp_path):
    """Fragments (config_fp8.sh: no DGXNNODES / DGXNGPU) and *common* files are never a run's config; a
    config written for another GPU generation is refused with its reason; the system's own is taken."""
    from trainperf.mlperf.published import implementation_configs, matching_config

    org = tmp_path / "Dell"
    impl = org / "benchmarks" / "llama2_70b_lora" / "implementations" / "nemo" / "configs"
    impl.mkdir(parents=True)
    (impl / "config_fp8.sh").write_text("export FP8=True\n")
    (impl / "config_XE9680_common.sh").write_text("export DGXNGPU=8\nexport DGXNNODES=1\n")
    (impl / "config_XE9680L_B200.sh").write_text("export DGXNNODES=1\nexport DGXNGPU=8\nexport MINIBS=1\n")
    configs, commons = implementation_configs(org, "llama2_70b_lora")
    assert [c.name for c in configs] == ["config_XE9680L_B200.sh", "config_fp8.sh"]
    assert [c.name for c in commons] == ["config_XE9680_common.sh"]
    path, _, why = matching_config(configs, commons, "XE9680x8H200-SXM-141GB", 8, 1, 8, 8, "NVIDIA H200-SXM5-141GB")
    assert path is None and why == "config_XE9680L_B200.sh: written for blackwell GPUs, the system has NVIDIA H200-SXM5-141GB"
    (impl / "config_XE9680_1x8x2xtp1pp1cp2.sh").write_text("export DGXNNODES=1\nexport DGXNGPU=8\nexport CP=2\n"
                                                            "export MINIBS=2\n")
    configs, commons = implementation_configs(org, "llama2_70b_lora")
    path, lay, _ = matching_config(configs, commons, "XE9680x8H200-SXM-141GB", 8, 1, 8, 8, "NVIDIA H200-SXM5-141GB")
    assert path.name == "config_XE9680_1x8x2xtp1pp1cp2.sh" and (lay["cp"], lay["dp"]) == (2, 4)
    path, _, why = matching_config(configs, commons, "XE9680x4H200", 4, 1, 8, 4, "NVIDIA H200-SXM5-141GB")
    assert path is None and "DGXNGPU=8, the system has 4 GPUs per node" in why


def test_engine_and_submitter_names_of_an_imported_run(tmp_path):
    from trainperf.mlperf.published import engine_name, round_name, round_ruleset, submitter

    assert round_name(tmp_path / "training_results_v4.0" / "NVIDIA") == "v4.0"
    assert round_ruleset(tmp_path / "v5.1" / "Cisco", "6.0.0") == "5.1.0"
    assert round_ruleset(tmp_path / "results_v51" / "Cisco", "6.0.0") == "6.0.0"

    nemo_impl = tmp_path / "benchmarks" / "gpt3" / "implementations" / "eos_n8_ngc24.09_nemo" / "configs" / "config_a.sh"
    assert engine_name(nemo_impl, {}) == "nemo"
    loose = tmp_path / "benchmarks" / "gpt3" / "DGXH100_128x8x64x4x8_mbs2" / "config_a.sh"
    assert engine_name(loose, {"framework": "PyTorch, NeMo, HugeCTR, DGL NVIDIA Release 24.09"}) == "nemo"
    assert engine_name(loose, {"framework": "MXNet NVIDIA Release 24.04 or PyTorch NVIDIA Release 24.04"}) == "pytorch"
    assert engine_name(None, {"framework_name": ""}) == ""
    assert submitter("SUBMISSION_ORG_PLACEHOLDER", "v4.1/Oracle/results/x/gpt3") == "Oracle"
    assert submitter("Dell", "v4.1/Dell/results/x/gpt3") == "Dell"
