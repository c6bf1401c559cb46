"""Sweeps: many runs queued from one file, resumable, a failed run never stops the rest.

A sweep file (YAML or TOML):

    name: overnight
    runs:
      - workload: mini-lora
        nproc_per_node: [1, 2]          # a list spans a grid dimension
        seeds: [1, 2, 3]
        set:
          parallel.dp_shard: -1
          train.global_batch_size: [16, 32]

expands to the cartesian product of its lists. Each item is registered in the store (table
``sweep_items``) under a stable id derived from what it runs, so running the same file again skips
every item that already finished and only runs what is pending (or was interrupted).

``backend: local`` (the default): items run one after another through `trainperf run` in their own
process tree, so an OOM or a crash is recorded against that item and the queue goes on. An item is
claimed in the store before it runs (two sweep processes never run one item twice); a SIGTERM to the
sweep reaches the run, and the item goes back to pending for the next invocation. Each item's output
(its progress lines, errors and JSON summary) is kept in ``<out>/sweep-<name>/<item_id>.log``, one
section per attempt, and a line is printed as each item starts and as it ends. A failed item stays
failed until ``trainperf sweep retry FILE`` (``--retry-failed``) puts it back to run; an item that
succeeded is never run again.
``backend: slurm`` with a ``slurm:`` mapping (partition, nodes, gpus_per_node, time, account,
extra_sbatch, setup, container_image, container_mounts, ...; see runner/slurm.py): one sbatch job per
unfinished item, its job id recorded on the item; re-running the file collects finished jobs and
submits only what is neither finished nor queued. With a slurm backend, a run block without
nproc_per_node uses slurm.gpus_per_node (or 1 on CPU nodes).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import shlex
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from trainperf.core.errors import SpecError
from trainperf.core.resolve import parse_error_text, resolve_spec
from trainperf.core.untrusted import MAX_JSON_DEPTH, parse_untrusted_yaml, printable, read_untrusted_text
from trainperf.parallel.launcher import Interrupted, run_passing_signals


def _as_list(v) -> list:
    return list(v) if isinstance(v, (list, tuple)) else [v]


BACKENDS = ("local", "slurm")


SCALARS = (str, int, float, bool)
MAX_NAME_CHARS = 200


def _name(data: dict, where: str) -> str:
    """The sweep's name (the key its progress is stored under): one line of printable text."""
    name = data.get("name")
    if name is None or name == "":
        raise SpecError(f"{where}: a sweep needs a name (the key its progress is stored under)")
    if isinstance(name, bool) or not isinstance(name, (str, int)):
        raise SpecError(f"{where}: name must be a word or a number, not {type(name).__name__}")
    name = str(name)
    if printable(name, MAX_NAME_CHARS + 1) != name or len(name) > MAX_NAME_CHARS or not name.strip():
        raise SpecError(f"{where}: name {printable(name, 60)!r} must be one line of printable text of at most "
                        f"{MAX_NAME_CHARS} characters")
    return name


def _check_block(block, i: int, where: str) -> None:
    """SpecError unless runs[i] is a {workload, nproc_per_node, seeds, set} mapping of plain values."""
    if not isinstance(block, dict) or "workload" not in block:
        raise SpecError(f"{where}: runs[{i}] needs a workload")
    bad = set(block) - {"workload", "nproc_per_node", "seeds", "set"}
    if bad:
        shown = sorted(printable(k, 40) for k in bad)
        raise SpecError(f"{where}: runs[{i}] has unknown keys {shown}; valid: workload, nproc_per_node, seeds, set")
    if not isinstance(block["workload"], str) or not block["workload"]:
        raise SpecError(f"{where}: runs[{i}].workload must be a workload name (see `trainperf workloads`)")
    sets = block.get("set") or {}
    if not isinstance(sets, dict) or not all(isinstance(k, str) for k in sets):
        raise SpecError(f"{where}: runs[{i}].set must map section.key to a value or a list of values")
    for k, v in sets.items():
        values = v if isinstance(v, (list, tuple)) else [v]
        if not values:  # the grid would span nothing: the block would silently run no item
            raise SpecError(f"{where}: runs[{i}].set.{printable(k, 60)} is an empty list; give at least one value")
        if not all(isinstance(x, SCALARS) for x in values):
            raise SpecError(f"{where}: runs[{i}].set.{printable(k, 60)} must be a value (text, number, true/false) "
                            "or a list of them")


def _count_items(runs: list, where: str) -> int:
    """How many items the blocks span, from the lengths of their lists, before any item is built."""
    total = 0
    for block in runs:
        sets = block.get("set") or {}
        dims = [block.get("nproc_per_node", 1), block.get("seeds", None), *sets.values()]
        total += math.prod(len(d) if isinstance(d, (list, tuple)) else 1 for d in dims)
    if total > MAX_SWEEP_ITEMS:
        raise SpecError(f"{where}: runs span {total:,} items, more than the {MAX_SWEEP_ITEMS:,} one sweep may hold; "
                        "split it into several sweeps or give shorter lists")
    return total


def expand(data: dict, where: str) -> tuple[str, list[dict]]:
    """(sweep name, items) from a parsed sweep file; SpecError on a malformed one. Items of a slurm
    sweep also carry ``backend: 'slurm'`` and ``slurm`` (its SlurmConfig); they do not enter the id."""
    if not isinstance(data, dict):
        raise SpecError(f"{where}: top level must be a mapping (name, runs, backend, slurm)")
    runs = data.get("runs")
    backend = data.get("backend") or "local"
    if backend not in BACKENDS:
        raise SpecError(f"{where}: backend {printable(backend, 60)!r} is not one of {', '.join(BACKENDS)}")
    slurm_cfg = None
    if backend == "slurm":
        from trainperf.runner.slurm import parse_config

        slurm_cfg = parse_config(data.get("slurm"), where)
    elif data.get("slurm") is not None:
        raise SpecError(f"{where}: a 'slurm' section needs backend: slurm")
    default_nproc = (slurm_cfg.gpus_per_node or 1) if slurm_cfg else 1
    name = _name(data, where)
    if not isinstance(runs, list) or not runs:
        raise SpecError(f"{where}: 'runs' must be a non-empty list of {{workload, nproc_per_node, seeds, set}}")
    for i, block in enumerate(runs):
        _check_block(block, i, where)
    _count_items(runs, where)
    items = []
    for i, block in enumerate(runs):
        sets = block.get("set") or {}
        keys = sorted(sets)
        nprocs = _as_list(block.get("nproc_per_node", default_nproc))
        bad_nproc = [n for n in nprocs if isinstance(n, bool) or not isinstance(n, int) or n < 1]
        if bad_nproc or not nprocs:
            raise SpecError(f"{where}: runs[{i}].nproc_per_node must be a whole number >= 1 or a list of them "
                            f"(got {printable(repr(block.get('nproc_per_node')), 60)})")
        seeds = _as_list(block.get("seeds", [None]))
        if not seeds or any(x is not None and (isinstance(x, bool) or not isinstance(x, int)) for x in seeds):
            raise SpecError(f"{where}: runs[{i}].seeds must be a whole number or a list of them "
                            f"(got {printable(repr(block.get('seeds')), 60)})")
        for nproc, seed, *values in itertools.product(nprocs, seeds, *[_as_list(sets[k]) for k in keys]):
            overrides = dict(zip(keys, values))
            if seed is not None:
                overrides["train.seed"] = seed
            key = json.dumps({"w": block["workload"], "n": nproc, "o": overrides}, sort_keys=True)
            item = {"item_id": hashlib.sha256(key.encode()).hexdigest()[:12], "workload": str(block["workload"]),
                    "nproc": int(nproc), "overrides": overrides}
            if slurm_cfg:
                if slurm_cfg.gpus_per_node and item["nproc"] > slurm_cfg.gpus_per_node:
                    raise SpecError(f"{where}: runs[{i}] nproc_per_node={nproc} exceeds slurm.gpus_per_node="
                                    f"{slurm_cfg.gpus_per_node}")
                item.update(backend="slurm", slurm=slurm_cfg)
            items.append(item)
    return name, items


MAX_SWEEP_FILE_BYTES = 1 << 20  # a sweep file is a short list of grids; anything larger is not one
MAX_SWEEP_ITEMS = 10_000  # items one sweep may span (each is resolved before the first runs)


def read_sweep_file(path: str) -> dict:
    """The parsed sweep file (YAML or TOML), read as untrusted input: a regular file of at most
    ``MAX_SWEEP_FILE_BYTES``, UTF-8, YAML aliases counted on the node graph before anything is expanded
    (at most ``MAX_YAML_NODES`` values), no recursive anchor, nesting bounded. SpecError otherwise."""
    where = f"sweep file {printable(path)!r}"
    suffix = Path(path).suffix.lower()
    if suffix not in (".yaml", ".yml", ".toml"):
        raise SpecError(f"{where}: expected a .yaml, .yml or .toml file")
    text = read_untrusted_text(path, max_bytes=MAX_SWEEP_FILE_BYTES, what="sweep file")
    if suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise SpecError(f"{where} could not be parsed: {printable(parse_error_text(exc), 160)}") from None
        except RecursionError:
            raise SpecError(f"{where}: values nested more than {MAX_JSON_DEPTH} deep") from None
    else:
        data = parse_untrusted_yaml(text, where=where) or {}
    if not isinstance(data, dict):
        raise SpecError(f"{where}: top level must be a mapping (name, runs, backend, slurm)")
    return data


def load_sweep(path: str, extra_sets: list[str] = ()) -> tuple[str, list[dict]]:
    """(name, items) of a sweep file; each item's spec resolved with the command line's ``--set`` (names,
    types and ranges), so a typo in item 7 stops the sweep now, not after six runs."""
    return checked_sweep(read_sweep_file(path), f"sweep file {printable(path)!r}", extra_sets)


def checked_sweep(data: dict, where: str, extra_sets: list[str] = ()) -> tuple[str, list[dict]]:
    """(name, items) of a parsed sweep (a file's, or one run's from the command line), every item's
    spec resolved with ``extra_sets``."""
    name, items = expand(data, where)
    for item in items:
        _item_spec(item, where, extra_sets)
    return name, items


def item_label(item: dict) -> str:
    """'mini-lora x2 train.seed=1 parallel.tp=2': what an item runs, as a line of a sweep's output."""
    sets = " ".join(_set_args(item["overrides"])[1::2])
    return printable(f"{item['workload']} x{item['nproc']}" + (f" {sets}" if sets else ""), 300)


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "sweep"


def sweep_folder(sweep_id: str, out: str) -> Path:
    """Where a sweep keeps its items' logs (local) or batch scripts and job output (Slurm)."""
    return (Path(out) / f"sweep-{slug(sweep_id)}").resolve()


def item_log(sweep_id: str, item_id: str, out: str) -> Path:
    """The log of a local item: every attempt's stderr (progress lines, errors) and JSON summary."""
    return sweep_folder(sweep_id, out) / f"{item_id}.log"


def _item_spec(item: dict, where: str, extra_sets: list[str] = ()):
    from trainperf.workloads import get_workload  # the workloads import torch: not for `sweep status`

    try:
        return resolve_spec(get_workload(item["workload"]).defaults(), None,
                            [*_set_args(item["overrides"])[1::2], *extra_sets])
    except SpecError as exc:
        raise SpecError(f"{where}: {item_label(item)}: {exc}") from None


def check_paths_before_queueing(items: list[dict], extra_sets: list[str] = ()) -> None:
    """SpecError, before a Slurm job queues, for what its run would refuse at once after the queue wait:
    a closed-division rule (the benchmark's checkpoint and data not given, a fixed value changed) and a
    data.path or model.path this host does not see. A path inside a container is checked at its host
    side (slurm.container_mounts SRC:DST)."""
    from trainperf.mlperf.recipes import check_closed_rules  # the MLPerf rules: only for a Slurm sweep

    for item in items:
        spec = _item_spec(item, "sweep", extra_sets)
        try:
            check_closed_rules(spec, architecture=False)
        except SpecError as exc:
            raise SpecError(f"{item_label(item)}: {exc} (checked before the job queues)") from None
        mounts = [m.split(":")[:2] for m in item["slurm"].container_mounts if ":" in m]
        for key in ("data.path", "model.path"):
            path = getattr(spec.data if key == "data.path" else spec.model, "path")
            if not path:
                continue
            here = next((src + path[len(dst):] for src, dst in mounts
                         if path == dst or path.startswith(dst.rstrip("/") + "/")), path)
            if not Path(here).exists():
                seen = "" if here == path else f" (host side of the container mount: {printable(here, 200)!r})"
                raise SpecError(f"{item_label(item)}: {key}={printable(path, 200)!r} does not exist on this host"
                                f"{seen}; the job would fail after its queue wait: give a path on the file system "
                                "the nodes share")


def layout_problem(item: dict, extra_sets: list[str] = ()) -> str | None:
    """Why the item's layout cannot run on its process count (a grid may span combinations that do not
    divide: those are recorded as failed at once, the rest run), or None."""
    from trainperf.runner.checks import (
        validate_run,  # torch: only once items are checked, not for `sweep status`
    )

    try:
        validate_run(_item_spec(item, "sweep", extra_sets), item["nproc"])
    except SpecError as exc:
        return str(exc)
    return None


def _set_args(overrides: dict) -> list[str]:
    out = []
    for k, v in overrides.items():
        out += ["--set", f"{k}={str(v).lower() if isinstance(v, bool) else v}"]
    return out


def run_sweep(store, sweep_id: str, items: list[dict], db: str, out: str, extra_sets: list[str],
              echo=print, wait: bool | None = None, take_over: bool = False, retry_failed: bool = False) -> dict:
    """Run (local) or submit (slurm) every unfinished item with the file's backend; counts by status.
    wait (slurm only): block until the submitted jobs end (None: the file's slurm.wait).
    retry_failed: the items that failed are put back to run first (those that succeeded never are)."""
    if retry_failed:
        store.add_sweep_items(sweep_id, items)
        again = store.retry_failed_sweep_items(sweep_id, [it["item_id"] for it in items])
        echo(f"sweep {sweep_id}: {len(again)} failed item{'' if len(again) == 1 else 's'} put back to run")
    if items and items[0].get("backend") == "slurm":
        from trainperf.runner import slurm

        slurm.run_slurm(store, sweep_id, items, db, out, extra_sets, items[0]["slurm"], echo=echo, wait=wait)
        return status_counts(store, sweep_id, refresh=False)
    return _run_local(store, sweep_id, items, db, out, extra_sets, echo, take_over)


def run_local(store, sweep_id: str, items: list[dict], db: str, out: str, extra_sets: list[str],
              echo=print, wait: bool | None = None) -> dict:
    """For the sweep command: dispatches on the sweep file's backend like run_sweep."""
    return run_sweep(store, sweep_id, items, db, out, extra_sets, echo, wait)


def _run_local(store, sweep_id: str, items: list[dict], db: str, out: str, extra_sets: list[str],
               echo=print, take_over: bool = False) -> dict:
    """Run the file's unfinished items, one after another; returns counts by final status.

    Each item is claimed in the store before it runs, so two sweeps started on one file (or two files
    that share a name) never run an item twice; an item another live process holds is skipped."""
    store.add_sweep_items(sweep_id, items)
    problems = {item["item_id"]: layout_problem(item, extra_sets) for item in items}
    before = {r["item_id"]: r["status"] for r in store.sweep_items(sweep_id)}
    done = sum(before.get(it["item_id"]) == "success" for it in items)
    failed = sum(before.get(it["item_id"]) == "failed" for it in items)
    echo(f"sweep {sweep_id}: {len(items)} item{'' if len(items) == 1 else 's'} ({done} succeeded, {failed} failed "
         f"before); the others run one after another, each one's log in {sweep_folder(sweep_id, out)}")
    if failed:
        echo(f"  {failed} failed item{'' if failed == 1 else 's'} not run again: `trainperf sweep retry FILE` "
             "(or --retry-failed) runs them")
    order = sorted(items, key=lambda it: problems[it["item_id"]] is None)  # the refused ones first, at once
    for n, item in enumerate(order, 1):
        row = store.claim_sweep_item(sweep_id, item["item_id"], take_over=take_over)
        at = f"[{n}/{len(order)}]"
        if row is None:
            holder = store.sweep_item_holder(sweep_id, item["item_id"])
            if holder and holder.startswith("its previous run"):  # never two runs of one item at once
                echo(f"{at} skipped {item_label(item)}: {holder}; it runs when they have ended")
            elif holder:  # finished items are skipped silently: a sweep is idempotent
                echo(f"{at} skipped {item_label(item)}: running in {holder} (if that sweep is gone, --take-over runs it)")
            continue
        if problems[item["item_id"]]:
            store.set_sweep_item(sweep_id, row["item_id"], "failed", None, problems[item["item_id"]])
            echo(f"{at} failed  {item_label(row)}: {problems[item['item_id']]}")
            continue
        _run_item(store, sweep_id, row, db, out, extra_sets, echo, at)
    return status_counts(store, sweep_id)


def _run_item(store, sweep_id: str, row: dict, db: str, out: str, extra_sets: list[str], echo, at: str) -> None:
    """Run one claimed item through `trainperf run`, its stderr and summary kept in its log; record its end."""
    args = ["run", row["workload"], "--nproc-per-node", str(row["nproc"]), "--json", "--db", db, "--out", out,
            *_set_args(row["overrides"]), *[a for s in extra_sets for a in ("--set", s)]]
    cmd = [sys.executable, "-m", "trainperf", *args, "--sweep-item",
           json.dumps({"sweep_id": sweep_id, "item_id": row["item_id"], "owner_pid": os.getpid()})]
    log = item_log(sweep_id, row["item_id"], out)
    log.parent.mkdir(parents=True, exist_ok=True)
    echo(f"{at} start   {item_label(row)} (log: {log})")
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as stdout, open(log, "a+") as stderr:
        stderr.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} trainperf {shlex.join(args)}\n")
        stderr.flush()
        start = stderr.tell()
        try:
            returncode = run_passing_signals(cmd, stdout=stdout, stderr=stderr, on_start=lambda pgid: (
                store.set_sweep_item_run_group(sweep_id, row["item_id"], pgid)), pass_sigint=True)
        except Interrupted as exc:  # the run has recorded its own end; this item runs again on resume
            store.set_sweep_item(sweep_id, row["item_id"], "pending", _run_id(stdout),
                                 f"the sweep was stopped ({exc}); it runs again when the sweep is resumed")
            raise
        stderr.seek(start)
        err = stderr.read()
        summary = _read_json(stdout)
        stderr.write(_read(stdout).rstrip("\n") + f"\n=== exit {returncode} after {time.monotonic() - t0:.0f} s\n")
    status = "success" if returncode == 0 else "failed"
    reason = summary.get("status_reason") or summary.get("error") or (
        printable(err.strip().splitlines()[-1], 500) if returncode and err.strip() else None)
    store.set_sweep_item(sweep_id, row["item_id"], status, summary.get("run_id"), reason)
    took = f"{time.monotonic() - t0:.0f} s"
    echo(f"{at} {status:7s} {item_label(row)} {summary.get('run_id') or ''} ({took}){': ' + reason if reason else ''}"
         + (f" (log: {log})" if status != "success" else ""))


def _read(fh) -> str:
    fh.seek(0)
    return fh.read()


def _read_json(fh) -> dict:
    try:
        return json.loads(_read(fh))
    except json.JSONDecodeError:
        return {}


def _run_id(stdout) -> str | None:
    """The run id an interrupted `trainperf run --json` printed, if it got so far."""
    return _read_json(stdout).get("run_id")


def status_counts(store, sweep_id: str | None = None, refresh: bool = True) -> dict:
    """{sweep: {pending, running, success, failed}}; first asks Slurm about items whose job is in
    flight (if Slurm is installed here), so finished jobs are counted as finished."""
    if refresh and store.writable:  # a read-only store is shown as it is
        from trainperf.runner import slurm

        slurm.refresh(store, sweep_id)
    counts: dict = {}
    for row in store.sweep_items(sweep_id):
        per = counts.setdefault(row["sweep_id"], {"pending": 0, "running": 0, "success": 0, "failed": 0})
        per[row["status"]] += 1
    return counts
