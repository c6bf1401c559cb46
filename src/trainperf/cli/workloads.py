"""``trainperf workloads``: list the workloads with one-line descriptions."""

from __future__ import annotations

import argparse
import json

from trainperf.cli.errors import EXIT_OK
from trainperf.cli.options import add_common

HELP = "list workloads"
DESCRIPTION = "List the workloads with one-line descriptions."


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common(p)


def run(args) -> int:
    # the workload registry imports torch and the model: only when they are listed, not for --help
    from trainperf.workloads import WORKLOADS

    if args.json:
        print(json.dumps([{"name": w.name, "description": w.description} for w in WORKLOADS.values()], indent=2))
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table

    table = Table(title="trainperf workloads")
    table.add_column("workload")
    table.add_column("description")
    for w in WORKLOADS.values():
        table.add_row(w.name, w.description)
    Console().print(table)
    return EXIT_OK
