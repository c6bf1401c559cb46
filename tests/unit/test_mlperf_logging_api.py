"""The parts of ``mlperf_logging`` that trainperf.mlperf calls but the package does not promise: private
functions (leading underscore), the checkers' module-level functions and the RCP checker's class and
record fields. pyproject.toml pins the one version they were checked against; a new release may
rename, drop or reorder any of them, and then these tests name what moved before a score goes wrong.

Each entry is a call as trainperf.mlperf.score (or .log) makes it: the positional parameters it fills,
by name and in order, and the keywords it passes.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import re
import tomllib
from pathlib import Path

import pytest

# (module, attribute path, positional parameter names in order, keyword names); a method's ``self`` is left out
CALLS = [
    ("mlperf_logging.result_summarizer.result_summarizer", "_compute_olympic_average",
     ["scores", "dropped_scores", "max_dropped_scores"], []),
    ("mlperf_logging.result_summarizer.result_summarizer", "_get_scaling_factor", ["folder"], []),
    ("mlperf_logging.rcp_checker.rcp_checker", "RCP_Checker", ["usage", "ruleset", "benchmark", "verbose"], []),
    ("mlperf_logging.rcp_checker.rcp_checker", "RCP_Checker._get_rcp_data", ["rcp_pass"], []),
    ("mlperf_logging.rcp_checker.rcp_checker", "RCP_Checker._find_rcp", ["bs", "rcp_pass"], []),
    ("mlperf_logging.rcp_checker.rcp_checker", "RCP_Checker._find_top_min_rcp", ["bs", "rcp_pass"], []),
    ("mlperf_logging.rcp_checker.rcp_checker", "RCP_Checker._find_bottom_max_rcp", ["bs", "rcp_pass"], []),
    ("mlperf_logging.rcp_checker.rcp_checker", "RCP_Checker._create_interp_rcp",
     ["target_bs", "low_rcp", "high_rcp"], []),
    ("mlperf_logging.rcp_checker.rcp_checker", "RCP_Checker._find_min_rcp", ["rcp_pass"], []),
    ("mlperf_logging.rcp_checker.rcp_checker", "check_directory",
     ["dir", "usage", "version", "verbose", "bert_train_samples"], ["rcp_file", "rcp_pass", "rcp_bypass", "set_scaling"]),
    ("mlperf_logging.package_checker.package_checker", "check_systems", ["folder", "usage", "ruleset"], []),
    ("mlperf_logging.package_checker.package_checker", "check_training_result_files", ["folder", "usage", "ruleset"],
     ["quiet", "werror", "rcp_bypass", "rcp_bert_train_samples", "seed_checker_bypass"]),
    ("mlperf_logging.compliance_checker.mlp_compliance", "rule_choices", [], []),
    # the submission reader (trainperf.mlperf.published) checks parsed logs in-process
    ("mlperf_logging.compliance_checker.mlp_compliance", "make_checker", ["usage", "ruleset", "quiet", "werror"], []),
    ("mlperf_logging.compliance_checker.mlp_compliance", "ComplianceChecker.check_loglines", ["loglines", "config"], []),
    ("mlperf_logging.compliance_checker.mlp_compliance", "ComplianceChecker.put_message", ["msg"], []),
    ("mlperf_logging.compliance_checker.mlp_compliance", "ComplianceChecker.has_messages", [], []),
    ("mlperf_logging.compliance_checker.mlp_parser", "parse_file", ["filename"], ["ruleset"]),
    # trainperf.mlperf.log reads a log line by line with the ruleset's parser, and keeps the checker to
    # its own rule files by overriding the method that loads one
    ("mlperf_logging.compliance_checker.mlp_parser.ruleset_410", "string_to_logline", ["lineno", "string"], []),
    ("mlperf_logging.compliance_checker.mlp_parser", "parse_file_410", ["filename"], []),
    ("mlperf_logging.compliance_checker.mlp_compliance", "ComplianceChecker.configured_checks",
     ["loglines", "config_file"], []),
    ("mlperf_logging.benchmark_meta", "get_result_file_counts", ["usage"], []),
    ("mlperf_logging.benchmark_meta", "get_allowed_benchmarks", ["usage", "ruleset"], []),
    ("mlperf_logging.mllog.mllog", "MLLogger", [], ["logger", "default_stack_offset", "root_dir"]),
]


def _resolve(module: str, path: str):
    try:
        obj = importlib.import_module(module)
    except ImportError as exc:
        pytest.fail(f"{module}.{path}: module {module} no longer imports ({exc}); trainperf.mlperf calls it")
    for part in path.split("."):
        if not hasattr(obj, part):
            pytest.fail(f"{module}.{path}: gone from mlperf-logging {importlib.metadata.version('mlperf-logging')} "
                        f"(no {part!r}); trainperf.mlperf.score calls it")
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("module, path, positional, keywords", CALLS, ids=[f"{m.rsplit('.', 1)[-1]}.{p}" for m, p, *_ in CALLS])
def test_what_the_scoring_code_calls_still_takes_its_arguments(module, path, positional, keywords):
    target = _resolve(module, path)
    params = list(inspect.signature(target).parameters)
    is_method = "." in path
    if is_method:
        params = params[1:]  # self
    name = f"{module}.{path}{inspect.signature(target)}"
    assert params[:len(positional)] == positional, (
        f"{name}: trainperf.mlperf passes {positional} positionally; the parameters now start {params[:len(positional)]}")
    missing = [k for k in keywords if k not in params]
    assert not missing, f"{name}: no longer takes the keyword(s) {missing} that trainperf.mlperf passes"
    try:
        inspect.signature(target).bind(*([None] if is_method else []), *positional, **{k: None for k in keywords})
    except TypeError as exc:
        pytest.fail(f"{name}: the call trainperf.mlperf makes no longer binds ({exc})")


def test_olympic_average_drops_the_fastest_and_slowest():
    average = _resolve("mlperf_logging.result_summarizer.result_summarizer", "_compute_olympic_average")
    assert average([1.0, 2.0, 3.0, 4.0, 10.0], 0, 1) == pytest.approx(3.0), "_compute_olympic_average changed meaning"


def test_rcp_records_carry_the_fields_the_reference_is_read_from():
    checker_cls = _resolve("mlperf_logging.rcp_checker.rcp_checker", "RCP_Checker")
    checker = checker_cls("training", "6.0.0", "llama2_70b_lora", False)
    records = checker._get_rcp_data("pruned_rcps")
    assert records, "RCP_Checker._get_rcp_data('pruned_rcps') holds no RCPs for llama2_70b_lora, training 6.0.0"
    for record in records.values():
        missing = {"BS", "RCP Mean", "Max Speedup"} - set(record)
        assert not missing, f"RCP_Checker records lack {missing} (rcp_reference_samples and rcp_check read them)"
    lo, hi = checker._find_top_min_rcp(12, "pruned_rcps"), checker._find_bottom_max_rcp(12, "pruned_rcps")
    interp = checker._create_interp_rcp(12, lo, hi)
    assert isinstance(interp, tuple) and len(interp) == 2 and "RCP Mean" in interp[1], \
        "RCP_Checker._create_interp_rcp no longer returns (name, record)"


def test_the_installed_version_is_the_pinned_one():
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    pins = [d for d in pyproject["project"]["dependencies"] if re.match(r"mlperf[-_]logging\b", d)]
    assert len(pins) == 1 and "==" in pins[0], f"pyproject.toml should pin mlperf-logging with ==, has {pins}"
    pinned = pins[0].split("==", 1)[1].strip()
    installed = importlib.metadata.version("mlperf-logging")
    assert installed == pinned, (f"mlperf-logging {installed} is installed but {pinned} is pinned: run these tests "
                                 "against the new version, then move the pin")
