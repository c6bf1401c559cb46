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


def run(args) -> int:
    import torch

    args.config, args.overrides, args.layout_from_plan = None, [], None
    if not torch.cuda.is_available() or torch.cuda.device_count() < args.nproc_per_node:
        args.overrides.append("hardware.device=cpu")
    rc = run_command.run(args, workload="mini-lora")
    if not args.json and rc != EXIT_BAD_INPUT:  # nothing ran: no table under the error
        report_args = argparse.Namespace(db=args.db, json=False, workload=None, limit=10, html=None)
        report_command.run(report_args)
    return rc
