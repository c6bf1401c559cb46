"""Options and defaults several commands share."""

from __future__ import annotations

import argparse

DEFAULT_DB = "trainperf.db"
DEFAULT_OUT = "runs"

HEADROOM_HELP = ("fraction of GPU memory a layout must leave free to be ranked, in [0, 0.5) (default 0.08: the "
                 "memory prediction was measured up to 8.8%% low, 8B LoRA TP2+SP on H200; 0 ranks up to the "
                 "full capacity, as before)")


def add_common(p: argparse.ArgumentParser) -> None:
    """--json and --db, last on every command that reads or writes the results store."""
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.add_argument("--db", default=DEFAULT_DB, help=f"results store, an SQLite file (default ./{DEFAULT_DB})")


def add_out(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=DEFAULT_OUT, help=f"directory for run artefacts (default ./{DEFAULT_OUT})")


def memory_headroom(args) -> float:
    """--memory-headroom, validated before any work (SpecError naming the valid range)."""
    # the planner loads only when plan or tune runs, not for --help
    from trainperf.plan.search import DEFAULT_MEMORY_HEADROOM, check_headroom

    return check_headroom(DEFAULT_MEMORY_HEADROOM if args.memory_headroom is None else args.memory_headroom)
