"""trainperf: one entry point, one sub-command per question.

Each command is a module of this package with ``HELP``, ``DESCRIPTION``, ``add_arguments(parser)``
and ``run(args) -> int``; this module assembles the parser and dispatches. Heavy imports (torch, the
model, the planner) happen inside the commands' ``run``, so ``trainperf --help`` starts fast.

Exit codes: 0 success, 1 the run failed (e.g. target not reached), 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from types import ModuleType

from trainperf import __version__
from trainperf.cli.errors import EXIT_BAD_INPUT, bad_input

_ARGV: list[str] = []


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own errors: one line, exit 2 (JSON too with --json)
        if "--json" in _ARGV:
            print(json.dumps({"error": message, "exit_code": EXIT_BAD_INPUT}))
        self.exit(EXIT_BAD_INPUT, f"trainperf: error: {message}\n")


def commands() -> dict[str, ModuleType]:
    """The command modules by name, in `trainperf --help` order."""
    # imported on first use, not with this package: `python -m trainperf.cli.preflight` runs that module
    # as __main__ and warns when the package has imported it already
    from trainperf.cli import (
        checkpoint,
        data,
        demo,
        import_,
        plan,
        preflight,
        report,
        run,
        score,
        sweep,
        trace,
        tune,
        workloads,
    )

    return {"run": run, "plan": plan, "tune": tune, "sweep": sweep, "workloads": workloads, "report": report,
            "preflight": preflight, "trace": trace, "data": data, "checkpoint": checkpoint, "score": score,
            "demo": demo, "import": import_}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trainperf", description="Prove, tune and explain how fast a GPU cluster trains LLMs.")
    parser.add_argument("--version", action="version", version=f"trainperf {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, command in commands().items():
        command.add_arguments(sub.add_parser(name, help=command.HELP, description=command.DESCRIPTION))
    return parser


def main(argv: list[str] | None = None) -> int:
    _ARGV[:] = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(_ARGV)
    import sqlite3  # only once the arguments parsed: `trainperf --help` starts without it

    # the store (and sqlite3) loads only when a command runs, not for --help
    from trainperf.store.db import StoreError

    try:
        return commands()[args.command].run(args)
    except ModuleNotFoundError as exc:  # e.g. torch on a machine that only plans: one line, not a traceback
        missing = (exc.name or "").split(".")[0]
        if not missing or missing == "trainperf":
            raise
        return bad_input(f"`trainperf {args.command}` needs the {missing!r} package, which this Python "
                         f"({sys.executable}) does not have: install it (torch: see the README)",
                         getattr(args, "json", False))
    except StoreError as exc:  # a store that went bad after it opened (e.g. read-only, full disk)
        return bad_input(str(exc), getattr(args, "json", False))
    except sqlite3.DatabaseError as exc:  # a damaged page found by a query, after the open's checks
        if isinstance(exc, (sqlite3.IntegrityError, sqlite3.InterfaceError, sqlite3.ProgrammingError)):
            raise  # a row this trainperf should not have written: a bug, not a damaged file
        db = getattr(args, "db", None)
        if "malformed" in str(exc) or "not a database" in str(exc):
            return bad_input(f"results store {db!r} is damaged ({exc}); restore it from a backup or give another "
                             "--db", getattr(args, "json", False))
        return bad_input(f"results store {db!r}: {exc}", getattr(args, "json", False))  # e.g. disk full, I/O error
