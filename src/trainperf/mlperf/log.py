"""MLPerf logs: writing this engine's through the ``mlperf-logging`` package's ``mllog`` (rank 0 only,
one file per run), and reading anyone's (:func:`read_log`) with the same package's line parser behind
the checks a downloaded file needs.

Each run gets its own ``logging.Logger`` with a single file handler, so runs in one process (tests,
sweeps) never write into each other's files, and nothing goes to stdout.

A log read here is bounded before mlperf_logging sees it (size, line length, JSON nesting, the shape
of every ``:::MLLOG`` record), and the values mlperf_logging's compliance checker turns into the path
of a rule file it executes (``submission_division``, ``submission_benchmark``, the ruleset) are held
to allow-lists (:func:`check_log_names`) before any checker is built.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from mlperf_logging.mllog import constants as C
from mlperf_logging.mllog.mllog import MLLogger

from trainperf.core.errors import SpecError
from trainperf.core.untrusted import (check_inside, finite_number, json_depth_ok, printable, read_untrusted_bytes,
                                      split_lines)


class RunLog:
    """Thin wrapper: a no-op on ranks other than 0."""

    def __init__(self, path: Path | None, run_id: str):
        self.enabled = path is not None
        self._handler = None
        if not self.enabled:
            return
        logger = logging.getLogger(f"trainperf.mllog.{run_id}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        for h in list(logger.handlers):
            logger.removeHandler(h)
        self._handler = logging.FileHandler(str(path), mode="w")
        self._handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(self._handler)
        self._logger = logger
        root = str(Path(__file__).resolve().parents[2])
        # stack offset 2: record the trainer's call site, not this wrapper
        self._log = MLLogger(logger=logger, default_stack_offset=2, root_dir=root)

    def event(self, key: str, value=None, **metadata) -> None:
        if self.enabled:
            self._log.event(key=key, value=value, metadata=metadata or None)

    def start(self, key: str, value=None, **metadata) -> None:
        if self.enabled:
            self._log.start(key=key, value=value, metadata=metadata or None)

    def end(self, key: str, value=None, **metadata) -> None:
        if self.enabled:
            self._log.end(key=key, value=value, metadata=metadata or None)

    def close(self) -> None:
        if self._handler is not None:
            self._handler.flush()
            self._logger.removeHandler(self._handler)
            self._handler.close()
            self._handler = None


KEYS = C  # re-export the constants module for call sites: KEYS.RUN_START, ...


# ---------------------------------------------------------------------------------------------
# Reading a log someone else wrote

USAGE = "training"
TOKEN = ":::MLLOG "
DIVISIONS = ("closed", "open")
# the published logs' longest :::MLLOG line is 353 characters and their largest file 1.2 MB; the
# package's parser is quadratic in a line's length (a 200 KB line takes 42 s), so longer is refused
MAX_LOG_BYTES = 32 * 1024 * 1024
MAX_LINE_CHARS = 16 * 1024
MAX_RECORD_DEPTH = 16
# the log keys whose values the installed compliance checker's rule files format into the name of
# another rule file they load (common.yaml: submission_division; {closed,open}_common.yaml:
# submission_benchmark; older rulesets' closed_resnet.yaml formats opt_name, reached only for resnet,
# which is never allowed here); check_log_names holds each to an allow-list, and checker_rule_file
# refuses any rule file outside the package whatever the value
PATH_KEYS = ("submission_division", "submission_benchmark")


@dataclass
class ParsedLog:
    """One MLPerf log as mlperf_logging's parser gives it (``loglines``, ``errors``: the lines it could
    not parse), with the SHA-256 of its bytes and the file line of each log line."""

    path: str
    ruleset: str
    loglines: list
    errors: list = field(default_factory=list)
    sha256: str = ""
    file_lines: list[int] = field(default_factory=list)


@functools.lru_cache(maxsize=1)
def _checker_dir() -> str:
    from mlperf_logging.compliance_checker import mlp_compliance

    return os.path.dirname(os.path.abspath(mlp_compliance.__file__))


def training_rulesets() -> list[str]:
    """The training rulesets the installed mlperf_logging has rule files and a JSON line parser for."""
    from mlperf_logging.compliance_checker import mlp_parser

    found = []
    for name in os.listdir(_checker_dir()):
        m = re.fullmatch(rf"{USAGE}_(\d+\.\d+\.\d+)", name)
        parse = getattr(mlp_parser, f"parse_file_{m.group(1).replace('.', '')}", None) if m else None
        module = sys.modules.get(getattr(parse, "__module__", ""), None)
        if m and getattr(module, "TOKEN", None) == TOKEN and hasattr(module, "string_to_logline"):
            found.append(m.group(1))
    return sorted(found, key=lambda r: tuple(int(x) for x in r.split(".")))


def check_ruleset(ruleset: object, what: str = "--ruleset") -> str:
    """``ruleset`` when it is one of :func:`training_rulesets`, else a SpecError naming them."""
    known = training_rulesets()
    if not isinstance(ruleset, str) or ruleset not in known:
        raise SpecError(f"{what} {printable(repr(ruleset), 60)} is not a training ruleset of the installed "
                        f"mlperf_logging (valid: {', '.join(known)})")
    return ruleset


def ruleset_benchmarks(ruleset: str) -> list[str]:
    """The benchmarks the installed mlperf_logging allows in a training ruleset."""
    from mlperf_logging.benchmark_meta import get_allowed_benchmarks

    return sorted(set(get_allowed_benchmarks(USAGE, check_ruleset(ruleset, "ruleset"))))


def known_benchmarks() -> list[str]:
    """Every MLPerf training benchmark the installed mlperf_logging knows (any ruleset)."""
    from mlperf_logging.benchmark_meta import get_result_file_counts

    return sorted(get_result_file_counts(USAGE))


def _line_parser(ruleset: str):
    from mlperf_logging.compliance_checker import mlp_parser

    parse = getattr(mlp_parser, f"parse_file_{check_ruleset(ruleset, 'ruleset').replace('.', '')}")
    return sys.modules[parse.__module__].string_to_logline


def _record_problem(record: object) -> str | None:
    """What keeps a parsed :::MLLOG record from being a log line (None when it is one): the package's
    parser indexes these fields and would end in a traceback without them."""
    if not isinstance(record, dict):
        return f"a {type(record).__name__} where the record's {{...}} belongs"
    for name in ("key", "time_ms", "value", "metadata"):
        if name not in record:
            return f"no {name!r}"
    if not isinstance(record["key"], str):
        return f"'key' is a {type(record['key']).__name__}, not text"
    if not isinstance(record["metadata"], dict):
        return f"'metadata' is a {type(record['metadata']).__name__} where a {{...}} belongs"
    try:
        finite_number(record["time_ms"], "'time_ms'", lo=0)
    except SpecError as exc:
        return str(exc)
    return None


def read_log(path: str | os.PathLike, ruleset: str, *, root: str | os.PathLike | None = None,
             max_bytes: int = MAX_LOG_BYTES, max_line: int = MAX_LINE_CHARS) -> ParsedLog:
    """An MLPerf log parsed line by line with the ruleset's own mlperf_logging line parser, after the
    checks a downloaded file needs: a regular file inside ``root`` (when given) of at most ``max_bytes``,
    no :::MLLOG line over ``max_line`` characters, each record a JSON object nested at most
    MAX_RECORD_DEPTH deep with a text key, a finite time_ms and a metadata object. Lines that are not
    JSON are the parser's ``errors``, as in mlperf_logging. Anything else is a one-line SpecError."""
    string_to_logline = _line_parser(ruleset)
    shown = printable(path)
    data = read_untrusted_bytes(path, max_bytes=max_bytes, root=root, what="MLPerf log")
    # latin-1, as mlperf_logging opens a log: every byte is a character, nothing fails to decode
    lines = split_lines(data.decode("latin-1"), max_chars=max_line, where=f"MLPerf log {path}", containing=TOKEN)
    out = ParsedLog(path=str(path), ruleset=ruleset, loglines=[], sha256=hashlib.sha256(data).hexdigest())
    lineno = 0
    for number, raw in enumerate(lines, 1):
        if TOKEN not in raw:
            continue
        # what the package's re.sub(".*" + TOKEN, TOKEN, line) leaves (from the last token on), in linear time
        line = (TOKEN + raw.rsplit(TOKEN, 1)[1]).strip()
        body = line[len(TOKEN):]
        if not json_depth_ok(body, MAX_RECORD_DEPTH):
            raise SpecError(f"MLPerf log {shown} line {number}: a record nested more than {MAX_RECORD_DEPTH} deep")
        try:
            record = json.loads(body)
        except (ValueError, RecursionError):
            record = None
        else:
            problem = _record_problem(record)
            if problem:
                raise SpecError(f"MLPerf log {shown} line {number}: not an :::MLLOG record ({problem}); each "
                                "needs a key, a time_ms, a value and a metadata object")
        try:
            out.loglines.append(string_to_logline(lineno, line))
            out.file_lines.append(number)
        except ValueError as exc:  # what mlperf_logging's parser counts as a parsing error
            out.errors.append((line, str(exc)))
        lineno += 1
    return out


def check_log_names(log: ParsedLog, benchmarks: list[str] | tuple[str, ...]) -> None:
    """Every value of the log that mlperf_logging's checkers make a file name of held to its allow-list
    (division in DIVISIONS, benchmark in ``benchmarks``), or a one-line SpecError naming the line:
    called before any checker sees the log, so no rule file outside the package is ever loaded."""
    allowed = dict(zip(PATH_KEYS, (tuple(DIVISIONS), tuple(benchmarks))))
    shown = printable(log.path)
    for ll, number in zip(log.loglines, log.file_lines):
        if ll.key in allowed:
            value = ll.value.get("value") if isinstance(ll.value, dict) else None
            if not isinstance(value, str) or value not in allowed[ll.key]:
                raise SpecError(f"MLPerf log {shown} line {number}: {ll.key} {printable(repr(value), 80)} is not one "
                                f"of {', '.join(allowed[ll.key])}; refused before any checker reads it")
    # the RCP checker takes the benchmark from the first line holding the text "submission_benchmark"
    first = next(((ll, n) for ll, n in zip(log.loglines, log.file_lines) if "submission_benchmark" in ll.full_string),
                 None)
    if first is not None and first[0].key != "submission_benchmark":
        raise SpecError(f"MLPerf log {shown} line {first[1]}: names submission_benchmark in a "
                        f"{printable(first[0].key, 60)} "
                        "record before the submission_benchmark one; refused before any checker reads it")


def checker_rule_file(config: str) -> str:
    """The path of a rule file the compliance checker is asked to load, refused (SpecError) unless it
    is one of the installed package's own training rule files: the last guard between a value from a
    log and the checker's exec of that file's code."""
    base = _checker_dir()
    path = os.path.join(base, config)
    real = str(check_inside(path, base, "compliance rule file"))
    top = os.path.relpath(real, base).split(os.sep)[0]
    if not re.fullmatch(rf"{USAGE}_\d+\.\d+\.\d+", top) or not real.endswith(".yaml"):
        raise SpecError(f"compliance rule file {printable(config)} is not one of mlperf_logging's training rule "
                        "files; refused")
    return str(real)
