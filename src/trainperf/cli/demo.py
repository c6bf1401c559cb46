"""``trainperf demo``: the main job on embedded defaults: mini-lora on 2 processes, then the report."""

from __future__ import annotations

import argparse

from trainperf.cli import report as report_command
from trainperf.cli import run as run_command
from trainperf.cli.errors import EXIT_BAD_INPUT
from trainperf.cli.options import add_common, add_out

HELP = "the main job on embedded defaults: mini-lora on 2 processes, then the report"
DESCRIPTION = ("Run mini-lora to its target on 2 processes (GPUs if present, else CPU), store it, "
               "and print the report table.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc-per-node", type=int, default=2, help="processes (default 2)")
    add_out(p)
    add_common(p)


def _defaults_of(command, argv: list[str]) -> argparse.Namespace:
    """A command's arguments as its own parser fills them (every option it has gets its default)."""
    parser = argparse.ArgumentParser(prog=f"trainperf {command.__name__.rsplit('.', 1)[-1]}")
    command.add_arguments(parser)
    return parser.parse_args(argv)


def run(args) -> int:
    import torch

    run_args = _defaults_of(run_command, ["mini-lora", "--nproc-per-node", str(args.nproc_per_node),
                                          "--db", args.db, "--out", args.out, *(["--json"] if args.json else [])])
    if not torch.cuda.is_available() or torch.cuda.device_count() < args.nproc_per_node:
        run_args.overrides.append("hardware.device=cpu")
    rc = run_command.run(run_args)
    if not args.json and rc != EXIT_BAD_INPUT:  # nothing ran: no table under the error
        report_command.run(_defaults_of(report_command, ["--db", args.db, "--limit", "10"]))
    return rc
