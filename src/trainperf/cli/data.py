"""``trainperf data convert ...``: dataset tools (plain token files into the packed pretraining format)."""

from __future__ import annotations

import argparse

HELP = "dataset tools: `data convert` token files or raw text -> the packed pretraining format"
DESCRIPTION = ("`trainperf data convert INPUTS... --out DIR (--vocab-size V | --tokenizer PATH) [--eod-id E] "
               "(--validation-documents N | --validation-inputs ...) [--json]`: plain token files "
               "(.txt, .jsonl, .npy), or raw text (.jsonl text fields, .txt) through a local tokenizer.json or "
               "SentencePiece model, into the packed format llama31_8b reads (see data/pretok.py).")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["convert"], help="what to do")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="the action's own arguments (see `data convert --help`)")


def run(args) -> int:
    # the converter imports torch: only when a conversion runs, not for --help
    from trainperf.data import pretok

    return pretok.main(args.rest)
