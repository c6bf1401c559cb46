"""gpt3 and llama31_405b: the hyperparameters a closed run logs pass the official checkers (4.1.0 for
gpt3; 5.1.0 and 6.0.0 for llama31_405b). A 175B / 405B run does not fit in CI and neither does the
closed GBS on a CPU (1536 x 2048 tokens per step), so the run's events around the recipe's own
hyperparameter events are written by hand, as the real loop writes them (epoch_num in tokens for gpt3)."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from trainperf.core.layout import resolve_layout
from trainperf.mlperf import recipes


def write_closed_log(path, spec, eval_loss: float) -> None:
    from mlperf_logging.mllog.mllog import MLLogger

    logger = logging.getLogger(f"closed-{spec.workload}-{path.name}")
    logger.propagate = False
    handler = logging.FileHandler(str(path), mode="w")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    log = MLLogger(logger=logger)
    log.event("cache_clear", True)
    log.start("init_start")
    for key, value in (("submission_benchmark", spec.mlperf.benchmark), ("submission_division", "closed"),
                       ("submission_org", "trainperf"), ("submission_platform", "test"), ("submission_status", "onprem"),
                       ("seed", 1), ("train_samples", 10**9),
                       ("eval_samples", recipes.GPT3_EVAL_TOKENS if spec.workload == "gpt3" else spec.data.eval_samples),
                       *recipes.hyperparameter_events(spec)):
        log.event(key, value)
    log.end("init_stop")
    log.start("run_start")
    samples = (spec.eval.skip_first + 1) * spec.eval.every_samples
    meta = {"samples_count": samples, "epoch_num": recipes.progress_count(spec, samples, 10**9)}
    log.start("block_start", metadata={"samples_count": 0, "epoch_num": 0.0})
    log.end("block_stop", metadata=meta)
    log.start("eval_start", metadata=meta)
    log.event("eval_accuracy", eval_loss, metadata=meta)
    log.end("eval_stop", metadata=meta)
    log.end("run_stop", eval_loss, metadata={**meta, "status": "success"})
    handler.close()


@pytest.mark.parametrize("workload, gbs, eval_loss, rulesets", [
    ("gpt3", 2048, 2.68, ("4.1.0",)),
    ("llama31_405b", 1152, 5.59, ("5.1.0", "6.0.0")),
    ("llama31_405b", 4608, 5.59, ("6.0.0",)),  # a table GBS other than the default: the derived schedule
])
def test_closed_log_passes_the_official_checker(tmp_path, workload, gbs, eval_loss, rulesets):
    defaults = recipes.RECIPES[workload]()
    spec = recipes.RECIPES[workload]()
    spec.train.global_batch_size = gbs
    recipes.apply_gbs_schedule(spec, defaults)
    spec.model.path, spec.data.path = "ckpt", "c4"
    recipes.check_closed_rules(spec, architecture=True)
    resolve_layout(spec, 512)
    write_closed_log(tmp_path / "log.txt", spec, eval_loss)
    for ruleset in rulesets:
        out = subprocess.run([sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
                              "--ruleset", ruleset, str(tmp_path / "log.txt")], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "SUCCESS" in out.stdout + out.stderr, out.stdout[-2000:] + out.stderr[-2000:]
