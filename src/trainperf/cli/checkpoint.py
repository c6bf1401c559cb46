"""``trainperf checkpoint convert SRC --out DIR --num-attention-heads N``: a GPT checkpoint saved by
``torch.distributed.checkpoint`` into the safetensors layout ``model.path`` loads (Megatron names and
a config.json of Megatron's arguments; see model/dcp_convert.py). Nothing is unpickled beyond DCP's
own metadata classes; every entry of the metadata is checked against the folder's files before a byte
of tensor data is read; ``--out`` must be new (or an empty folder) and apart from SRC."""

from __future__ import annotations

import argparse
import json

from trainperf.cli.errors import EXIT_OK, SpecError, bad_input
from trainperf.core.untrusted import printable

HELP = "checkpoint tools: `checkpoint convert` a torch.distributed.checkpoint GPT folder -> safetensors"
DESCRIPTION = ("`trainperf checkpoint convert SRC --out DIR --num-attention-heads N [--vocab-size V] "
               "[--layernorm-epsilon E] [--make-vocab-size-divisible-by D] [--shards K] "
               "[--consumed-train-samples S]`: a DCP folder of Megatron-named GPT tensors into a safetensors "
               "checkpoint dir with config.json (the layout the GPT workloads' model.path takes).")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["convert"], help="what to do")
    p.add_argument("src", help="the torch.distributed.checkpoint folder (holds .metadata and *.distcp)")
    p.add_argument("--out", required=True, help="the safetensors checkpoint dir to write: a new path or an empty folder, outside SRC "
                        "(nothing existing is overwritten)")
    p.add_argument("--num-attention-heads", type=int, required=True,
                   help="attention heads (the one size the tensors' shapes cannot say)")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="the tokenizer's vocabulary (default: the embedding's row count; GPT-3: 50257)")
    p.add_argument("--layernorm-epsilon", type=float, default=1e-5)
    p.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    p.add_argument("--shards", type=int, default=1, help="safetensors files (an index is written when > 1)")
    p.add_argument("--consumed-train-samples", type=int, default=None,
                   help="samples the checkpoint has trained on, recorded in config.json (GPT-3's: 6,144,000)")
    p.add_argument("--json", action="store_true", help="print the written config as JSON")


def run(args) -> int:
    # torch and DCP load only when a conversion runs, not for --help
    from trainperf.model.dcp_convert import convert_dcp_to_safetensors

    if args.consumed_train_samples is not None and args.consumed_train_samples < 0:
        return bad_input(f"--consumed-train-samples {args.consumed_train_samples}: must be >= 0", args.json)
    extra = {} if args.consumed_train_samples is None else {"consumed_train_samples": args.consumed_train_samples}
    try:
        m = convert_dcp_to_safetensors(args.src, args.out, args.num_attention_heads, args.vocab_size,
                                       args.layernorm_epsilon, args.make_vocab_size_divisible_by, args.shards, extra)
    except SpecError as exc:
        return bad_input(str(exc), args.json)
    summary = {"out": printable(args.out), "num_layers": m.num_layers, "hidden_size": m.hidden_size,
               "num_attention_heads": m.num_heads, "vocab_size": m.vocab_size}
    print(json.dumps(summary) if args.json else
          f"wrote {printable(args.out)}: GPT, {m.num_layers} layers, hidden {m.hidden_size}, {m.num_heads} heads, vocab {m.vocab_size}")
    return EXIT_OK
