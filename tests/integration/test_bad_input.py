"""Bad input: a clear one-line error, exit code 2, nothing launched, nothing stored.

Three levels:

* unit tests of ``trainperf.core.spec`` (coercion, config layering, validation, derived quantities);
* in-process tests of ``trainperf.runner.local.prepare`` for extra dataset/checkpoint problems;
* the CLI as a user runs it: a few cases in a fresh interpreter (the real entry point), the rest forked
  from a warm interpreter (tests.fixtures.cli_server), the same process minus ~2.5 s of start-up.

The module runs all the invocations the selected tests need once, in a module-scoped pool; each
parametrized test then checks its own result. None of the bad inputs may get as far as building the
mini-lora base checkpoint or generating a dataset.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from tests.fixtures.cli import run_cli, trainperf_cmd

from tests.fixtures.inputs import make_checkpoint, make_dataset, garbage


# ---------------------------------------------------------------------------------------------
# 2-4. The CLI, one fresh interpreter per invocation, all run concurrently once per module.


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]  # "{in}" is replaced by the case's input directory
    expect: tuple[str, ...] = ()  # substrings of the error line (or of stdout for non-error cases)
    setup: Callable[[Path], None] | None = None  # builds inputs in the input directory
    bug: str | None = None  # a known bug: the test is xfail(strict=True) with this reason


def _ckpt_garbage(d: Path) -> None:
    ck = make_checkpoint(d / "ck")
    garbage(ck / "model.safetensors")


def _ckpt_bad_json(d: Path) -> None:
    ck = make_checkpoint(d / "ck")
    (ck / "config.json").write_text('{"hidden_size": 64,')


def _ckpt_config_not_object(d: Path) -> None:
    ck = make_checkpoint(d / "ck")
    (ck / "config.json").write_text("[1, 2]")


def _ckpt_index_not_mapping(d: Path) -> None:
    ck = make_checkpoint(d / "ck")
    (ck / "model.safetensors.index.json").write_text(json.dumps({"weight_map": ["model.safetensors"]}))


def _data_garbage(d: Path) -> None:
    garbage(d / "ds" / "train.safetensors")
    garbage(d / "ds" / "validation.safetensors")


def _configs(d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "unk.yaml").write_text("bogus:\n  x: 1\n")
    (d / "bad.yaml").write_text("train:\n  lr: [1\n  x: : :\n")
    (d / "bad.toml").write_text("[train\nlr = \n")
    (d / "fp8.yaml").write_text("hardware:\n  fp8: bogus\n")


BAD = [
    Case("unknown-workload", ("run", "nope"), ("'nope'", "mini-lora", "mini-pretrain")),
    Case("unknown-key", ("run", "mini-pretrain", "--set", "train.bogus=1"),
         ("train.bogus", "valid keys", "global_batch_size")),
    Case("unknown-section", ("run", "mini-pretrain", "--set", "foo.bar=1"), ("'foo'", "valid sections", "train")),
    Case("wrong-type-int", ("run", "mini-pretrain", "--set", "train.global_batch_size=abc"),
         ("train.global_batch_size", "integer", "'abc'")),
    Case("wrong-type-float", ("run", "mini-pretrain", "--set", "train.lr=fast"), ("train.lr", "number", "'fast'")),
    Case("unknown-optimizer", ("run", "mini-pretrain", "--set", "train.optimizer=sgd"),
         ("train.optimizer='sgd'", "adamw, adamw8bit")),
    Case("closed-8bit-optimizer", ("run", "llama31_8b", "--set", "train.optimizer=adamw8bit"),
         ("train.optimizer='adamw8bit'", "closed division", "mlperf.division=open")),
    Case("wrong-type-bool", ("run", "mini-pretrain", "--set", "parallel.sp=maybe"),
         ("parallel.sp", "true or false", "'maybe'")),
    Case("gbs-not-divisible", ("run", "mini-pretrain", "--set", "train.global_batch_size=12"),
         ("train.global_batch_size=12", "micro_batch_size 8", "multiple of 8")),
    Case("gbs-not-divisible-dp", ("run", "mini-pretrain", "--nproc-per-node", "2", "--set", "train.global_batch_size=24"),
         ("train.global_batch_size=24", "data-parallel size 2", "multiple of 16")),
    Case("hidden-not-divisible-by-heads", ("run", "mini-pretrain", "--set", "model.num_heads=3"),
         ("model.hidden_size=64", "model.num_heads=3")),
    Case("heads-not-divisible-by-kv-heads", ("run", "mini-lora", "--set", "model.num_kv_heads=3"),
         ("model.num_heads=4", "model.num_kv_heads=3")),
    Case("checkpoint-missing", ("run", "mini-lora", "--set", "model.path={in}/no-such-ckpt"),
         ("model.path", "no-such-ckpt", "not a directory")),
    Case("checkpoint-corrupt-safetensors", ("run", "mini-lora", "--set", "model.path={in}/ck"),
         ("model.path", "model.safetensors", "not a readable safetensors"), _ckpt_garbage),
    Case("checkpoint-corrupt-config", ("run", "mini-lora", "--set", "model.path={in}/ck"),
         ("model.path", "config.json", "not valid JSON"), _ckpt_bad_json),
    Case("checkpoint-shape-mismatch", ("run", "mini-lora", "--set", "model.path={in}/ck"),
         ("model.embed_tokens.weight", "[64, 64]", "[64, 128]", "config.json"),
         lambda d: make_checkpoint(d / "ck", hidden_size=128)),
    # control for the checkpoint cases: the same builder, unedited, passes the checkpoint checks
    Case("checkpoint-good-then-dataset-missing",
         ("run", "mini-lora", "--set", "model.path={in}/ck", "--set", "data.path={in}/no-such-data"),
         ("data.path", "no-such-data", "not a directory"), lambda d: make_checkpoint(d / "ck")),
    Case("dataset-missing", ("run", "mini-pretrain", "--set", "data.path=/nonexistent"),
         ("data.path", "'/nonexistent'", "not a directory")),
    Case("dataset-corrupt", ("run", "mini-pretrain", "--set", "data.path={in}/ds"),
         ("data.path", "train.safetensors", "not a readable safetensors"), _data_garbage),
    Case("layout-tp-heads", ("run", "mini-pretrain", "--nproc-per-node", "2", "--set", "parallel.tp=2",
                             "--set", "model.num_kv_heads=1"), ("model.num_kv_heads=1", "parallel.tp=2")),
    Case("layout-cp-cpu", ("run", "mini-pretrain", "--nproc-per-node", "2", "--set", "parallel.cp=2",
                           "--set", "hardware.device=cpu"), ("parallel.cp > 1", "CUDA")),
    Case("layout-pp-layers", ("run", "mini-pretrain", "--nproc-per-node", "2", "--set", "parallel.pp=2",
                              "--set", "model.num_layers=3"), ("model.num_layers=3", "pipeline stages")),
    Case("layout-pp-micro", ("run", "mini-pretrain", "--nproc-per-node", "2", "--set", "parallel.pp=2",
                             "--set", "train.micro_batch_size=16"), ("micro-batches", "pipeline stages")),
    Case("layout-sp-without-tp", ("run", "mini-pretrain", "--set", "parallel.sp=true"), ("parallel.sp=true", "tp > 1")),
    Case("grad-sync-every-under-pp", ("run", "mini-pretrain", "--nproc-per-node", "2", "--set", "parallel.pp=2",
                                      "--set", "train.grad_sync=every"),
         ("train.grad_sync=every", "parallel.pp=1", "train.grad_sync=last")),
    Case("grad-sync-unknown", ("run", "mini-pretrain", "--set", "train.grad_sync=sometimes"),
         ("train.grad_sync", "'sometimes'", "last, every")),
    Case("layout-product-not-world", ("run", "mini-pretrain", "--nproc-per-node", "2", "--set", "parallel.dp_shard=3"),
         ("dp_shard=3", "= 3 processes", "world size is 2")),
    Case("config-unknown-section", ("run", "mini-pretrain", "--config", "{in}/unk.yaml"),
         ("unk.yaml", "unknown section 'bogus'", "train"), _configs),
    Case("config-unparsable-yaml", ("run", "mini-pretrain", "--config", "{in}/bad.yaml"),
         ("bad.yaml", "could not be parsed"), _configs),
    Case("config-unparsable-toml", ("run", "mini-pretrain", "--config", "{in}/bad.toml"),
         ("bad.toml", "could not be parsed"), _configs),
    Case("config-missing", ("run", "mini-pretrain", "--config", "{in}/missing.yaml"), ("missing.yaml", "does not exist")),
    Case("set-without-equals", ("run", "mini-pretrain", "--set", "train.lr"), ("train.lr", "section.key=value")),
    Case("bad-recompute", ("run", "mini-pretrain", "--set", "train.recompute=sometimes"),
         ("train.recompute='sometimes'", "none, selective, full")),
    Case("nproc-zero", ("run", "mini-pretrain", "--nproc-per-node", "0"), ("--nproc-per-node=0", ">= 1")),
    # plan and tune price a spec without validate(): resolve_spec's named-choice check stops them
    Case("plan-bad-fp8", ("plan", "mini-lora", "--gpus", "2", "--set", "hardware.fp8=bogus"),
         ("hardware.fp8='bogus'", "valid values are none, tensorwise, rowwise")),
    Case("plan-bad-frozen-dtype", ("plan", "mini-lora", "--gpus", "2", "--set", "hardware.frozen_dtype=bogus"),
         ("hardware.frozen_dtype='bogus'", "auto, fp32, bf16, fp8")),
    Case("plan-bad-recompute", ("plan", "mini-lora", "--gpus", "2", "--set", "train.recompute=bogus"),
         ("train.recompute='bogus'", "none, selective, full")),
    Case("plan-bad-fp8-config", ("plan", "mini-lora", "--gpus", "2", "--config", "{in}/fp8.yaml"),
         ("hardware.fp8='bogus'", "none, tensorwise, rowwise"), _configs),
    Case("tune-bad-recompute", ("tune", "mini-lora", "--gpus", "1", "--set", "train.recompute=bogus"),
         ("train.recompute='bogus'", "none, selective, full")),
    Case("nproc-not-int", ("run", "mini-pretrain", "--nproc-per-node", "two"), ("--nproc-per-node", "'two'")),
    Case("unknown-command", ("bogus",), ("'bogus'", "run", "workloads")),
    # once bugs, now fixed
    Case("checkpoint-config-non-numeric", ("run", "mini-lora", "--set", "model.path={in}/ck"),
         ("model.path", "hidden_size"), lambda d: make_checkpoint(d / "ck", hidden_size="abc")),
    Case("checkpoint-config-zero-heads", ("run", "mini-lora", "--set", "model.path={in}/ck"),
         ("num_attention_heads",), lambda d: make_checkpoint(d / "ck", num_attention_heads=0)),
    Case("checkpoint-config-not-object", ("run", "mini-lora", "--set", "model.path={in}/ck"),
         ("model.path", "config.json"), _ckpt_config_not_object),
    Case("checkpoint-index-not-mapping", ("run", "mini-lora", "--set", "model.path={in}/ck"),
         ("model.path", "index"), _ckpt_index_not_mapping),
    Case("dataset-train-samples-zero", ("run", "mini-pretrain", "--set", "data.train_samples=0"),
         ("data.train_samples",), None),
    Case("dataset-token-ids-outside-vocab",
         ("run", "mini-pretrain", "--set", "data.path={in}/ds", "--set", "eval.target=1.0",
          "--set", "train.max_steps=2"),
         ("data.path", "vocabulary"), lambda d: make_dataset(d / "ds", high=1000)),
]


def _store_garbage(d: Path) -> None:
    garbage(d / "g.db")


def _store_under_a_file(d: Path) -> None:
    (d / "afile").write_text("x")


def _store_damaged_page(d: Path) -> None:
    from trainperf.store.db import Store

    store = Store(d / "damaged.db")
    for i in range(30):
        store.create_run(f"r{i}", "mini", {"x": "y" * 2000}, "dp", 1, "open", False, 1.0, "/tmp", pid=1)
    store.close()  # the last connection folds the WAL into the file
    with open(d / "damaged.db", "r+b") as fh:  # zero the second page: the open's checks pass, a query does not
        fh.seek(4096)
        fh.write(bytes(4096))


def _empty_store(path: Path) -> None:
    from trainperf.store.db import Store

    Store(path).close()


STORE_BAD = [
    Case("report-missing-store", ("report", "--db", "{in}/typo.db"), ("no results store at", "typo.db", "--db")),
    Case("sweep-status-missing-store", ("sweep", "status", "--db", "{in}/typo.db"), ("no results store at", "typo.db")),
    Case("store-garbage-run", ("run", "mini-pretrain", "--db", "{in}/g.db"), ("g.db", "not a usable SQLite database"),
         _store_garbage),
    Case("store-garbage-trace", ("trace", "mini-pretrain", "--db", "{in}/g.db"), ("g.db", "not a usable SQLite"),
         _store_garbage),
    Case("store-garbage-preflight", ("preflight", "--device", "cpu", "--quick", "--db", "{in}/g.db"),
         ("g.db", "not a usable SQLite"), _store_garbage),
    Case("store-under-a-file", ("plan", "mini-lora", "--gpus", "1", "--db", "{in}/afile/sub/t.db"),
         ("cannot create its folder", "--db"),
         _store_under_a_file),
    Case("store-damaged-page", ("report", "--db", "{in}/damaged.db"), ("damaged.db", "is damaged", "malformed"),
         _store_damaged_page),
    Case("report-negative-limit", ("report", "--limit", "-5"), ("--limit -5", ">= 1")),
    Case("report-html-missing-folder", ("report", "--html", "{in}/nodir/r.html", "--db", "{in}/e.db"),
         ("--html", "nodir", "does not exist"), lambda d: _empty_store(d / "e.db")),
]

JSON_BAD = [
    Case("json-unknown-workload", ("run", "nope", "--json"), ("'nope'", "mini-pretrain")),
    Case("json-wrong-type", ("run", "mini-pretrain", "--json", "--set", "train.lr=fast"), ("train.lr", "'fast'")),
    Case("json-unparsable-config", ("run", "mini-pretrain", "--json", "--config", "{in}/bad.yaml"),
         ("bad.yaml", "could not be parsed"), _configs),
    Case("json-argparse-error", ("run", "mini-pretrain", "--json", "--nproc-per-node", "two"),
         ("--nproc-per-node", "'two'"), None),
    Case("json-plan-bad-fp8", ("plan", "mini-lora", "--gpus", "2", "--json", "--set", "hardware.fp8=bogus"),
         ("hardware.fp8='bogus'", "none, tensorwise, rowwise")),
]

OTHER = [
    Case("workloads-json", ("workloads", "--json")),
    Case("run-help", ("run", "--help")),
    Case("report-json-empty", ("report", "--json", "--db", "{in}/empty.db"), (), lambda d: _empty_store(d / "empty.db")),
    Case("plan-good-fp8", ("plan", "mini-lora", "--gpus", "2", "--json", "--set", "hardware.fp8=tensorwise")),
]

CASES = {c.id: c for c in BAD + STORE_BAD + JSON_BAD + OTHER}
assert len(CASES) == len(BAD) + len(STORE_BAD) + len(JSON_BAD) + len(OTHER), "duplicate case ids"


# `python -m trainperf` itself: argparse's refusal, a refusal of the run command, --help, a JSON listing
FRESH_INTERPRETER = {"unknown-command", "unknown-workload", "run-help", "workloads-json"}


@dataclass
class Result:
    proc: subprocess.CompletedProcess
    tmp: Path  # cwd of the invocation; --db tmp/t.db, --out tmp/runs, inputs under tmp/in


def _invoke(case: Case, tmp: Path) -> Result:
    inputs = tmp / "in"
    inputs.mkdir()
    if case.setup:
        case.setup(inputs)
    args = [a.replace("{in}", str(inputs)) for a in case.args]
    if case.id != "unknown-command" and "--help" not in args and "--db" not in args:
        args += ["--db", str(tmp / "t.db")]
        if args[0] == "run":
            args += ["--out", str(tmp / "runs")]
    env = dict(os.environ)
    env.pop("CI", None)
    for k in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "SLURM_NTASKS", "SLURM_PROCID"):
        env.pop(k, None)  # never look like one rank of an external launcher
    if case.id in FRESH_INTERPRETER:
        proc = subprocess.run(trainperf_cmd(*args), cwd=tmp, env=env, capture_output=True, text=True, timeout=180)
    else:
        proc = run_cli(*args, cwd=tmp, env=env, timeout=180)
    return Result(proc, tmp)


@pytest.fixture(scope="module")
def cli(request, tmp_path_factory) -> dict[str, Future]:
    """Start every invocation the selected tests of this module need, concurrently; id -> Future[Result]."""
    wanted = []
    for item in request.session.items:
        cs = getattr(item, "callspec", None)
        if cs is not None and item.module is request.module and cs.params.get("case_id") in CASES:
            if cs.params["case_id"] not in wanted:
                wanted.append(cs.params["case_id"])
    workers = max(2, min(8, os.cpu_count() or 2))
    pool = ThreadPoolExecutor(max_workers=workers)
    futures = {}
    # the slowest (it launches a run) first, so it overlaps with the rest
    wanted.sort(key=lambda cid: cid != "dataset-token-ids-outside-vocab")
    for cid in wanted:
        futures[cid] = pool.submit(_invoke, CASES[cid], tmp_path_factory.mktemp(cid))
    yield futures
    pool.shutdown(wait=True)


def _params(cases: list[Case]):
    return [pytest.param(c.id, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=c.bug)] if c.bug else [])
            for c in cases]


def _diag(p: subprocess.CompletedProcess) -> str:
    return f"exit {p.returncode}\n--- stdout ---\n{p.stdout[-3000:]}\n--- stderr ---\n{p.stderr[-3000:]}"


def assert_one_line_error(p: subprocess.CompletedProcess, expect: tuple[str, ...]) -> str:
    assert p.returncode == 2, _diag(p)
    assert "Traceback" not in p.stderr, _diag(p)
    lines = p.stderr.strip("\n").splitlines()
    assert len(lines) == 1, _diag(p)
    line = lines[0]
    assert line.startswith("trainperf: error: "), _diag(p)
    assert len(line) > len("trainperf: error: ") + 10, line
    for s in expect:
        assert s in line, f"{s!r} not in {line!r}"
    return line


def assert_nothing_written(tmp: Path) -> None:
    db = tmp / "t.db"
    if db.exists():
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
    assert not (tmp / "runs").exists(), sorted(p.name for p in (tmp / "runs").iterdir())
    # nothing else either (no default ./trainperf.db, ./runs, ...): only the inputs and maybe an empty store
    extra = sorted(p.name for p in tmp.iterdir() if p.name != "in" and not p.name.startswith("t.db"))
    assert extra == [], extra


@pytest.mark.parametrize("case_id", _params(BAD))
def test_cli_bad_input(cli, case_id):
    case = CASES[case_id]
    res = cli[case_id].result()
    assert_one_line_error(res.proc, case.expect)
    assert res.proc.stdout.strip() == "", _diag(res.proc)
    assert_nothing_written(res.tmp)


@pytest.mark.parametrize("case_id", _params(STORE_BAD))
def test_cli_unusable_store(cli, case_id):
    """A --db that cannot hold results (garbage, under a file, a damaged page) or a report that cannot be
    written: one line, before any run, trace or preflight work (no run folder, nothing measured)."""
    res = cli[case_id].result()
    assert_one_line_error(res.proc, CASES[case_id].expect)
    assert res.proc.stdout.strip() == "", _diag(res.proc)
    assert_nothing_written(res.tmp)
    assert not (res.tmp / "in" / "typo.db").exists()


@pytest.mark.parametrize("case_id", ["checkpoint-good-then-dataset-missing"])
def test_cli_checkpoint_control_gets_past_model_path(cli, case_id):
    """The control case fails on data.path, i.e. after the unedited checkpoint was accepted, so the
    checkpoint cases above fail because of their edits, not because of the builder."""
    line = cli[case_id].result().proc.stderr
    assert line.startswith("trainperf: error: data.path "), line
    assert "model.path" not in line, line


@pytest.mark.parametrize("case_id", _params(JSON_BAD))
def test_cli_json_bad_input(cli, case_id):
    case = CASES[case_id]
    res = cli[case_id].result()
    p = res.proc
    assert p.returncode == 2, _diag(p)
    try:
        obj = json.loads(p.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"stdout is not one JSON object\n{_diag(p)}")
    assert isinstance(obj, dict) and isinstance(obj.get("error"), str), obj
    for s in case.expect:
        assert s in obj["error"], obj
    assert obj.get("exit_code", 2) == 2, obj
    line = assert_one_line_error(p, case.expect)  # the human line still goes to stderr
    assert line == f"trainperf: error: {obj['error']}"
    assert_nothing_written(res.tmp)


@pytest.mark.parametrize("case_id", ["workloads-json"])
def test_cli_workloads_json(cli, case_id):
    p = cli[case_id].result().proc
    assert p.returncode == 0, _diag(p)
    rows = json.loads(p.stdout)
    by_name = {r["name"]: r for r in rows}
    assert {"mini-pretrain", "mini-lora"} <= set(by_name), rows
    for name in ("mini-pretrain", "mini-lora"):
        desc = by_name[name]["description"]
        assert isinstance(desc, str) and len(desc) > 10 and "\n" not in desc, by_name[name]


@pytest.mark.parametrize("case_id", ["run-help"])
def test_cli_run_help(cli, case_id):
    p = cli[case_id].result().proc
    assert p.returncode == 0, _diag(p)
    assert "--set" in p.stdout and "--config" in p.stdout and "--nproc-per-node" in p.stdout, p.stdout


@pytest.mark.parametrize("case_id", ["report-json-empty"])
def test_cli_report_json_empty_db(cli, case_id):
    res = cli[case_id].result()
    p = res.proc
    assert p.returncode == 0, _diag(p)
    assert json.loads(p.stdout) == []
    assert_nothing_written(res.tmp)


@pytest.mark.parametrize("case_id", ["plan-good-fp8"])
def test_cli_plan_accepts_a_valid_fp8_recipe(cli, case_id):
    """The control for the plan-bad-* cases: a valid hardware.fp8 still plans (exit 0, layouts ranked)."""
    p = cli[case_id].result().proc
    assert p.returncode == 0, _diag(p)
    out = json.loads(p.stdout)
    assert out["fitting"] > 0 and out["ranked"], out
    assert p.stderr.strip() == "", _diag(p)
