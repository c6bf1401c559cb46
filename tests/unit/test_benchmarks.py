"""The `Benchmark` registry against the installed mlperf_logging, and the two MLPerf Training 6.0 MoE
benchmarks (gpt_oss_20b, deepseekv3_671b) from their 6.0.0 rules: closed rules, GBS schedule, log events,
and fabricated logs of each that the package's own compliance checker accepts and `score` scores
through its RCP checker."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from trainperf.core.errors import SpecError
from trainperf.mlperf import recipes
from trainperf.mlperf.benchmarks import BENCHMARKS, benchmark, dropped_runs, of_run, rcp_unit
from tests.fixtures.score import run_cli, write_pretrain_log


def test_every_benchmark_is_one_of_the_rulesets_it_names_and_no_other():
    from mlperf_logging.benchmark_meta import _ALL_ALLOWED_BENCHMARKS, get_result_file_counts

    allowed = _ALL_ALLOWED_BENCHMARKS["training"]
    counts = get_result_file_counts("training")
    for b in BENCHMARKS.values():
        assert b.name in counts, b.name
        assert sorted(b.rulesets) == sorted(f"{v}.0" for v, names in allowed.items() if b.name in names), b.name
        assert (b.rcp_ruleset or "6.0.0") in b.rulesets  # its RCPs are read from a ruleset that has it
        assert b.rcp_unit in ("samples", "tokens") and b.target > 0 and b.eval_rows > 0
        spec = b.defaults()
        assert (spec.workload, spec.mlperf.benchmark, spec.mlperf.division) == (b.name, b.name, "closed")
        assert (spec.eval.target, spec.data.eval_samples or b.eval_rows) == (b.target, b.eval_rows)
        for dotted, value, _why in b.fixed:  # the recipe keeps its own closed rules
            section, key = dotted.split(".")
            assert getattr(getattr(spec, section), key) == pytest.approx(value) if isinstance(value, float) \
                else getattr(getattr(spec, section), key) == value, (b.name, dotted)


def test_the_views_other_packages_read_follow_the_registry():
    assert list(recipes.RECIPES) == ["llama2_70b_lora", "llama31_8b", "gpt3", "llama31_405b"]  # a model to run
    assert list(BENCHMARKS)[4:] == ["gpt_oss_20b", "deepseekv3_671b"]
    assert recipes.RCP_UNIT == {n: ("tokens" if n == "gpt3" else "samples") for n in BENCHMARKS}
    assert recipes.RCP_RULESET == {"gpt3": "4.1.0"} and recipes.EVAL_ROWS["deepseekv3_671b"] == 1024
    assert (rcp_unit("gpt3"), rcp_unit("resnet"), rcp_unit(None)) == ("tokens", "samples", "samples")
    assert (dropped_runs("llama31_405b"), dropped_runs("unet3d"), dropped_runs("bert")) == (1, 4, 1)
    with pytest.raises(SpecError, match="unknown MLPerf benchmark 'llama4'; known: llama2_70b_lora, "):
        benchmark("llama4")
    mini = recipes.BENCHMARKS["llama31_8b"].defaults()
    mini.workload = "mini-pretrain"  # a mini workload borrowing the benchmark's log name
    assert of_run(mini) is None and of_run(recipes.llama31_8b_defaults()).name == "llama31_8b"


# ---------------------------------------------------------------------------------------------
# The 6.0.0 MoE benchmarks


def _closed(name: str, gbs: int | None = None, *overrides: tuple[str, object]):
    b = benchmark(name)
    defaults, spec = b.defaults(), b.defaults()
    if gbs:
        spec.train.global_batch_size = gbs
        recipes.apply_gbs_schedule(spec, defaults)
    for dotted, value in overrides:
        section, key = dotted.split(".")
        setattr(getattr(spec, section), key, value)
    return spec


def test_gpt_oss_20b_recipe_and_rules_are_the_6_0_0_checkers():
    b = benchmark("gpt_oss_20b")
    assert not b.runnable and b.architecture is None  # the model comes with the MoE family
    spec = _closed("gpt_oss_20b")
    assert (spec.data.seq_len, spec.train.eps, spec.eval.every_samples, spec.eval.target) == (8192, 1e-5, 12_288, 3.34)
    recipes.check_closed_rules(spec)
    ev = dict(recipes.hyperparameter_events(spec))
    assert ev["opt_learning_rate_decay_steps"] == 1_200_000 - ev["opt_learning_rate_warmup_steps"] == 1_200_000 - 128
    assert (ev["max_steps"], ev["opt_name"], ev["opt_base_learning_rate"]) == (1_200_000, "adamw", 4e-4)
    for dotted, value, message in (("train.eps", 1e-8, r"train.eps=1e-08 is not allowed .*1e-05"),
                                   ("data.seq_len", 4096, "max_sequence_length is fixed to 8192"),
                                   ("train.decay_steps", 1000, r"fixes it to 1,200,000 - warmup_steps = 1199872"),
                                   ("eval.every_samples", 16_384, "every 12,288 samples")):
        with pytest.raises(SpecError, match=message):
            recipes.check_closed_rules(_closed("gpt_oss_20b", None, (dotted, value)))
    with pytest.raises(SpecError, match="validation has 100 sequences .* evaluates on the first 1024"):
        recipes.check_closed_rules(spec, {"train": 10**6, "validation": 100})


@pytest.mark.parametrize("gbs, lr", [(15_360, 0.000023238), (16_384, 0.000024), (18_432, 0.000025456)])
def test_deepseekv3_671b_rate_follows_the_gbs_as_its_rcps_do(gbs, lr):
    spec = _closed("deepseekv3_671b", gbs)
    assert spec.train.lr == lr  # the rcps_deepseekv3_671b.json hyperparameters at that GBS
    assert abs(spec.train.lr - 2.4e-05 * (gbs / 16384) ** 0.5) < 1e-9  # the checker's own test
    assert (spec.train.warmup_steps, spec.train.decay_steps, spec.eval.every_samples) == (4, 11_996, gbs)
    assert spec.train.lr * spec.train.min_lr_ratio == pytest.approx(1e-8)
    recipes.check_schedule_for_gbs(spec)


def test_deepseekv3_671b_closed_rules_refuse_a_gbs_below_its_floor_and_a_rate_off_its_rule(tmp_path):
    b = benchmark("deepseekv3_671b")
    with pytest.raises(SpecError, match="global_batch_size=8192: the deepseekv3_671b rules allow GBS 15360 or more "
                                        "only; choose a GBS in it or set mlperf.division=open"):
        _closed("deepseekv3_671b", 8192)
    with pytest.raises(SpecError, match=r"train.lr=3e-05 is not allowed .* GBS 16384 \(2.4e-5 x sqrt"):
        recipes.check_closed_rules(_closed("deepseekv3_671b", None, ("train.lr", 3e-5)))
    with pytest.raises(SpecError, match=r"eval.every_samples=12288 .*an eval after every step: GBS samples = 16384"):
        recipes.check_closed_rules(_closed("deepseekv3_671b", None, ("eval.every_samples", 12_288)))
    with pytest.raises(SpecError, match="starts from the MLCommons DeepSeek-V3 671B checkpoint"):
        recipes.check_closed_rules(_closed("deepseekv3_671b"))
    recipes.check_closed_rules(_closed("deepseekv3_671b", None, ("model.path", str(tmp_path)),
                                       ("data.path", str(tmp_path))))
    ev = dict(recipes.hyperparameter_events(_closed("deepseekv3_671b")))
    assert (ev["moe_aux_loss_coeff"], ev["opt_adamw_epsilon"], ev["max_sequence_length"]) == (0.01, 1e-8, 4096)
    assert b.layout_variables["ep"] == ("EXPERT_MODEL_PARALLEL", "EP")


def test_a_moe_config_gives_its_expert_parallel_degree_to_the_importer():
    from trainperf.mlperf.published import config_layout

    env = {"TP": "1", "PP": "4", "EP": "64", "MINIBS": "1", "DGXNNODES": "64"}
    lay = config_layout(env, 256, benchmark("deepseekv3_671b").layout_variables)
    assert (lay["pp"], lay["dp"], lay["ep"]) == (4, 64, 64)
    assert "ep" not in config_layout(env, 256)  # the dense benchmarks' layouts are as before


# (benchmark, GBS, GPUs, evals to the target, samples at that eval): gpt_oss_20b evaluates every 12,288
# samples (the 16th: 196,608, about its GBS-16 RCP mean); deepseekv3_671b after every step of GBS
# 16,384 (the 47th: 770,048, an RCP value)
MOE_SETS = [("gpt_oss_20b", 16, 8, 16, 196_608), ("deepseekv3_671b", 16_384, 1024, 47, 770_048)]


@pytest.mark.parametrize("name, gbs, gpus, evals, converged", MOE_SETS)
def test_a_moe_set_passes_the_6_0_0_checker_and_scores_through_its_rcps(tmp_path, capsys, name, gbs, gpus, evals,
                                                                        converged):
    from mlperf_logging.benchmark_meta import get_result_file_counts

    from trainperf.mlperf.log import read_log
    from trainperf.mlperf.published import compliance_failure

    required = get_result_file_counts("training")[name]
    minutes = [100.0 + 3 * i for i in range(required)]
    src = tmp_path / name
    logs = [write_pretrain_log(src / f"result_{i}.txt", name, m, seed=3000 + i, evals_to_target=evals, gbs=gbs,
                               gpus=gpus, platform=f"{gpus}xH100") for i, m in enumerate(minutes)]
    assert compliance_failure(read_log(logs[0], "6.0.0"), "6.0.0") is None  # the package's own closed rules
    rc, out, _ = run_cli(capsys, "score", str(src), "--ruleset", "6.0.0", "--json")
    d = json.loads(out)
    assert rc == 0 and d["valid"], d["reason"]
    assert (d["benchmark"], d["required_runs"], d["convergence_unit"]) == (name, required, "samples")
    assert [r["samples_to_converge"] for r in d["runs"]] == [converged] * required
    assert d["rcp"]["passed"] and d["rcp"]["submission_mean"] == pytest.approx(converged)
    # the olympic mean drops the fastest and the slowest
    assert d["olympic_mean_minutes"] == pytest.approx(sum(sorted(minutes)[1:-1]) / (required - 2))
    assert d["score_minutes"] == pytest.approx(d["olympic_mean_minutes"] * d["scaling_factor"])
    assert math.isfinite(d["rcp"]["rcp_mean"])


def test_a_moe_set_converging_faster_than_its_rcps_fails_the_rcp_check(tmp_path, capsys):
    """deepseekv3_671b at GBS 16,384 on target after 40 steps: far below every RCP run (46 to 48)."""
    src = tmp_path / "fast"
    for i in range(3):
        write_pretrain_log(src / f"result_{i}.txt", "deepseekv3_671b", 90.0 + i, seed=4000 + i, evals_to_target=40,
                           gbs=16_384, gpus=1024)
    rc, out, _ = run_cli(capsys, "score", str(src), "--ruleset", "6.0.0", "--json")
    d = json.loads(out)
    assert not d["valid"] and d["score_minutes"] is None and not d["rcp"]["passed"]
    assert "RCP check failed" in d["reason"]


def test_a_stand_in_architecture_is_registered_as_a_copy_of_the_benchmark(monkeypatch):
    """How a test stands in an architecture the closed rules hold a run to: the registry holds a copy of
    the benchmark with it (the recipe is the benchmark's own)."""
    from trainperf.core.spec import ModelSpec

    moe = ModelSpec(name="tiny-moe", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=4)
    monkeypatch.setitem(BENCHMARKS, "gpt_oss_20b", dataclasses.replace(benchmark("gpt_oss_20b"), architecture=moe))
    assert benchmark("gpt_oss_20b").runnable
    spec = _closed("gpt_oss_20b")
    spec.model = ModelSpec(**moe.__dict__)
    recipes.check_closed_rules(spec)
    spec.model.num_layers = 3
    with pytest.raises(SpecError, match="model.num_layers=3 is not the tiny-moe architecture"):
        recipes.check_closed_rules(spec)


def test_no_module_outside_the_benchmarks_compares_a_benchmark_name():
    """A comparison (==, !=, in, not in) with a benchmark's name as a literal belongs in that benchmark's
    own module (the report finds a benchmark's published table by the benchmark, not by its name)."""
    import ast
    from pathlib import Path

    src = Path(recipes.__file__).resolve().parents[1]
    names, found = set(BENCHMARKS), []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        if rel.startswith("mlperf/benchmarks/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                literals = [n for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in names]
                found += [f"{rel}:{node.lineno}" for _ in literals[:1]]
    assert found == []
