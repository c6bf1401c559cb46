"""Sweep files as untrusted input: hostile YAML (alias bombs, recursive anchors, deep nesting, huge
grids) is refused before anything is expanded, and a fuzz of mutated real sweep files ends every
case in success or one line of SpecError, never another exception."""

from __future__ import annotations

import os
import random
import subprocess
import time
from pathlib import Path

import pytest

from tests.fixtures.cli import trainperf_cmd
from trainperf.core.errors import SpecError
from trainperf.runner.sweep import MAX_SWEEP_ITEMS, load_sweep

SWEEPS = Path(__file__).resolve().parents[1] / "fixtures" / "sweeps"
FUZZ_CASES = 1000
FUZZ_SEED = 37


def _laughs(levels: int = 9) -> str:
    """The billion laughs: each level an anchor of ten aliases of the one before (10**levels leaves)."""
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + f"\nname: bomb\nruns:\n  - workload: mini-pretrain\n    seeds: *l{levels - 1}\n"


HOSTILE = {
    "billion-laughs": (_laughs(), r"aliases expand to [\d,]{13,} values, more than the 100,000 allowed"),
    "recursive-anchor": ("name: &n [*n]\nruns: [{workload: mini-pretrain}]\n", "recursive anchor"),
    "recursive-mapping": ("name: x\nruns:\n  - &b {workload: mini-pretrain, set: *b}\n", "recursive anchor"),
    "deep-nesting": ("name: x\nruns: " + "[" * 5_000 + "]" * 5_000 + "\n", "nested more than 64 deep"),
    "huge-grid": ("name: x\nruns:\n  - workload: mini-pretrain\n    seeds: [" + ", ".join(map(str, range(1000)))
                  + "]\n    set:\n      train.lr: [" + ", ".join(f"0.{i + 1}" for i in range(100)) + "]\n",
                  r"runs span 100,000 items, more than the 10,000 one sweep may hold"),
    "mixed-key-types": ("name: x\nruns:\n  - {workload: mini-pretrain, 3: a, b: c}\n", "unknown keys"),
    "list-value-in-grid": ("name: x\nruns:\n  - workload: mini-pretrain\n    set: {train.lr: [[1, 2]]}\n",
                           "must be a value"),
    "name-with-escape": ('name: "a\\e]0;owned\\a"\nruns: [{workload: mini-pretrain}]\n', "printable text"),
    "unhashable-key": ("name: x\n? [a]\n: 1\nruns: []\n", "unhashable key"),
    "not-utf8": (b"name: \xff\xfe\nruns: []\n", "not UTF-8"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_sweep_files_are_one_line_errors(tmp_path, case):
    text, words = HOSTILE[case]
    path = tmp_path / "s.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    t0 = time.perf_counter()
    with pytest.raises(SpecError, match=words) as err:
        load_sweep(str(path))
    assert "\n" not in str(err.value) and time.perf_counter() - t0 < 30  # refused, not expanded (1e9 values would take minutes)


def test_the_item_cap_is_checked_before_items_are_built():
    data = {"name": "x", "runs": [{"workload": "mini-pretrain", "seeds": list(range(MAX_SWEEP_ITEMS + 1))}]}
    from trainperf.runner.sweep import expand

    with pytest.raises(SpecError, match="10,001 items"):
        expand(data, "f")


def test_a_sweep_file_that_is_not_a_regular_file_or_too_large_is_refused(tmp_path):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(SpecError, match="not a regular file"):
        load_sweep(str(fifo))  # never blocks on the FIFO
    big = tmp_path / "big.yaml"
    big.write_text("name: x\n" + "# padding\n" * 120_000)
    with pytest.raises(SpecError, match="more than the 1,048,576 allowed"):
        load_sweep(str(big))


# -- fuzz ------------------------------------------------------------------------------------------

SPECIAL = ["&a ", "*a", "[", "]", "{", "}", ": ", ", ", "- ", "!!python/object:os.system ", "!!binary ", "<<: ",
           "? ", "|", ">", "'", '"', "\n", "\t", "  ", "#", "%YAML 1.1\n", "---\n", "...", "~", "null", ".nan",
           ".inf", "-1", "0", "1e400", "99999999999999999999", "true", "\x1b[2J", "\x00", "\ufeff", "é"]


def _mutate(text: str, rng: random.Random) -> str:
    """One to four edits of a real sweep file: spans deleted, duplicated or swapped, YAML syntax and
    odd values inserted, lines re-indented, an anchor/alias pair planted, the text cut short."""
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(8)
        i = rng.randrange(len(text) + 1)
        j = min(len(text), i + rng.randint(1, 40))
        lines = text.split("\n")
        if op == 0:
            text = text[:i] + text[j:]
        elif op == 1:
            text = text[:i] + rng.choice(SPECIAL) + text[i:]
        elif op == 2:
            text = text[:i] + text[i:j] * rng.randint(2, 5) + text[i:]
        elif op == 3 and len(lines) > 1:
            a, b = rng.randrange(len(lines)), rng.randrange(len(lines))
            lines[a], lines[b] = lines[b], lines[a]
            text = "\n".join(lines)
        elif op == 4:
            k = rng.randrange(len(lines))
            lines[k] = " " * rng.randint(0, 8) + lines[k].lstrip()
            text = "\n".join(lines)
        elif op == 5:  # an anchor on one value, its alias on another
            a, b = sorted(rng.sample(range(len(lines)), 2)) if len(lines) > 1 else (0, 0)
            lines[a] = lines[a].replace(": ", ": &z ", 1)
            lines[b] = lines[b].split(": ")[0] + ": *z" if ": " in lines[b] else lines[b] + " *z"
            text = "\n".join(lines)
        elif op == 6:
            text = text[:i]
        else:  # a value swapped for another kind of value
            text = text[:i] + rng.choice(["[1, 2]", "{a: b}", "[]", "{}", "''", "x" * 300, "-5", "3.5"]) + text[j:]
    return text


def _check_one(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    try:
        load_sweep(str(path))
    except SpecError as exc:
        message = str(exc)
        assert message and "\n" not in message and len(message) < 2000, repr(message)
        assert "\x1b" not in message, repr(message)  # names from the file are escaped
        return "refused"
    return "accepted"


def test_fuzz_mutated_sweep_files_end_in_success_or_one_line(tmp_path):
    rng = random.Random(FUZZ_SEED)
    sources = sorted(p for p in SWEEPS.iterdir() if p.suffix in (".yaml", ".toml"))
    outcomes = {"accepted": 0, "refused": 0}
    t0 = time.perf_counter()
    for n in range(FUZZ_CASES):
        source = sources[n % len(sources)]
        text = _mutate(source.read_text(), rng)
        try:
            outcomes[_check_one(tmp_path / f"case{source.suffix}", text)] += 1
        except Exception as exc:  # noqa: BLE001  the case and the exception, not a bare traceback
            raise AssertionError(f"case {n} ({source.name}): {type(exc).__name__}: {exc}\n{text!r}") from exc
    elapsed = time.perf_counter() - t0
    print(f"sweep fuzz: {FUZZ_CASES} cases, {outcomes}, {elapsed:.1f} s")
    assert outcomes["refused"] > FUZZ_CASES // 4 and outcomes["accepted"] > 0  # the mutations reach both ends


@pytest.mark.parametrize("case", ["billion-laughs", "recursive-anchor", "huge-grid"])
def test_the_cli_refuses_hostile_sweep_files_in_one_line_and_creates_nothing(tmp_path, case):
    (tmp_path / "s.yaml").write_text(HOSTILE[case][0])
    db, out = tmp_path / "t.db", tmp_path / "runs"
    proc = subprocess.run(trainperf_cmd("sweep", "s.yaml", "--db", str(db), "--out", str(out)), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not db.exists() and not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]


@pytest.mark.parametrize("value", ["partition=[a", "nodes={", "partition=&a [*a]"])
def test_a_slurm_value_that_is_not_yaml_is_one_line(value):
    import argparse

    from trainperf.cli.sweep import _single_run

    args = argparse.Namespace(slurm_options=[value], nproc_per_node=None, name=None, workload="mini-pretrain")
    with pytest.raises(SpecError, match=r"--slurm '.*'(:| could not be parsed)") as err:
        _single_run(args)
    assert "\n" not in str(err.value)
