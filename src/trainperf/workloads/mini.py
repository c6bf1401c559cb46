"""Synthetic workloads with a known optimum: ``mini-pretrain`` and ``mini-lora``.

Text comes from a fixed random first-order Markov chain over a 64-token vocabulary (each token has 3
possible successors). The best possible eval loss is the chain's own loss on the eval rows, computed
exactly; the target is that optimum plus a stated margin.

* mini-pretrain: a randomly initialised decoder learns source A.
* mini-lora: the base checkpoint is that decoder pretrained on source A (produced once, untimed,
  cached); fine-tuning data come from source B = A with 8 of the 64 tokens' successor distributions
  redrawn, laid out as 32 prompt tokens + 32 answer tokens with the loss on the answer only. The
  base model misses the target on B by a wide margin; LoRA adapters on q/k/v/o reach it.

Everything generated is cached under $TRAINPERF_CACHE (default ~/.cache/trainperf), keyed by the
generator's parameters, written atomically under a file lock, so concurrent runs share one copy.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from trainperf.core.errors import SpecError
from trainperf.core.files import atomic_write_dir
from trainperf.core.spec import RunSpec
from trainperf.data.markov import MarkovSource, prompt_answer_mask
from trainperf.data.tokens import TokenSplit, load_split, save_split
from trainperf.model.checkpoint import (
    inspect_checkpoint,
    load_checkpoint_into,
    save_hf_checkpoint,
)
from trainperf.model.llama import LlamaForCausalLM, init_full_tensor
from trainperf.model.loss import eval_loss_from_parts, per_sequence_loss, train_loss_sum
from trainperf.workloads.mini_specs import (  # noqa: F401  (defaults and shapes, re-exported for callers)
    SEQ,
    VOCAB,
    llama2_7b_model,
    mini_gpt_model,
    mini_gpt_pretrain_defaults,
    mini_lora_defaults,
    mini_model,
    mini_pretrain_defaults,
    synthetic_lora_defaults,
)

BRANCHING, SOURCE_SEED = 3, 1
PRETRAIN_MARGIN = 0.10  # nats above the known optimum
LORA_MARGIN = 0.10
LORA_REDRAWN_ROWS = list(range(0, VOCAB, 8))  # 8 tokens whose successors change in source B
CACHE_VERSION = 1


def cache_root() -> Path:
    return Path(os.environ.get("TRAINPERF_CACHE", Path.home() / ".cache" / "trainperf"))


@contextmanager
def _locked(name: str):
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield root
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _key(**params) -> str:
    params = {"v": CACHE_VERSION, "vocab": VOCAB, "branching": BRANCHING, "source_seed": SOURCE_SEED, **params}
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]


def source_a() -> MarkovSource:
    return MarkovSource(VOCAB, BRANCHING, seed=SOURCE_SEED)


def source_b() -> MarkovSource:
    return source_a().with_rows_redrawn(LORA_REDRAWN_ROWS, seed=5, branching=BRANCHING)


def _write_dataset(dest: Path, train: TokenSplit, val: TokenSplit, info: dict) -> None:
    def write_into(tmp: Path) -> None:
        save_split(train, tmp / "train.safetensors")
        save_split(val, tmp / "validation.safetensors")
        (tmp / "source.json").write_text(json.dumps(info, indent=2))

    atomic_write_dir(dest, write_into)


def pretrain_dataset(train_rows: int, eval_rows: int) -> tuple[Path, dict]:
    key = _key(kind="pretrain", train=train_rows, eval=eval_rows, seq=SEQ)
    with _locked("data") as root:
        dest = root / f"mini-pretrain-data-{key}"
        if not (dest / "source.json").is_file():
            src = source_a()
            train = TokenSplit(src.sample(train_rows, SEQ, seed=2), torch.ones(train_rows, SEQ, dtype=torch.bool))
            val = TokenSplit(src.sample(eval_rows, SEQ, seed=3), torch.ones(eval_rows, SEQ, dtype=torch.bool))
            _write_dataset(dest, train, val, {"source": "markov A", "vocab": VOCAB, "branching": BRANCHING,
                                              "entropy_rate": src.entropy_rate(),
                                              "optimal_eval_loss": src.optimal_loss(val)})
        return dest, json.loads((dest / "source.json").read_text())


def lora_dataset(train_rows: int, eval_rows: int) -> tuple[Path, dict]:
    key = _key(kind="lora", train=train_rows, eval=eval_rows, seq=SEQ, rows=LORA_REDRAWN_ROWS)
    base_dir, _ = base_checkpoint()  # before taking the data lock: building the base takes it too
    with _locked("data") as root:
        dest = root / f"mini-lora-data-{key}"
        if not (dest / "source.json").is_file():
            src = source_b()
            half = SEQ // 2
            train = TokenSplit(src.sample(train_rows, SEQ, seed=7), prompt_answer_mask(train_rows, SEQ, half))
            val = TokenSplit(src.sample(eval_rows, SEQ, seed=8), prompt_answer_mask(eval_rows, SEQ, half))
            _write_dataset(dest, train, val, {"source": "markov B (A with rows redrawn)", "vocab": VOCAB,
                                              "redrawn_rows": LORA_REDRAWN_ROWS, "entropy_rate": src.entropy_rate(),
                                              "optimal_eval_loss": src.optimal_loss(val),
                                              "base_model": str(base_dir),
                                              "base_eval_loss": _eval_loss_of_checkpoint(base_dir, val)})
        return dest, json.loads((dest / "source.json").read_text())


BASE_STEPS, BASE_BATCH, BASE_LR = 400, 16, 3e-3


def _eval_loss_of_checkpoint(path: Path, val: TokenSplit) -> float:
    """Eval loss (the training definition) of a checkpoint on a split: shows the base misses the target."""

    model = LlamaForCausalLM(mini_model())
    load_checkpoint_into(model, inspect_checkpoint(str(path)))
    with torch.no_grad():
        per_seq, has = per_sequence_loss(model(val.input_ids), val.input_ids, val.loss_mask)
    return eval_loss_from_parts(per_seq, has)


def base_checkpoint() -> tuple[Path, dict]:
    """The mini-lora base: the mini decoder pretrained on source A. Produced once, cached."""

    cfg = mini_model()
    key = _key(kind="base", steps=BASE_STEPS, batch=BASE_BATCH, lr=BASE_LR, cfg=cfg.__dict__)
    data_dir, _ = pretrain_dataset(4096, 64)
    with _locked("base") as root:
        dest = root / f"mini-lora-base-{key}"
        if not (dest / "config.json").is_file():
            t0 = time.perf_counter()
            torch.manual_seed(0)
            train = load_split(str(data_dir), "train")
            model = LlamaForCausalLM(cfg)
            with torch.no_grad():
                for name, p in model.named_parameters():
                    p.copy_(init_full_tensor(name, p.shape, cfg, 0, "cpu"))
            opt = torch.optim.AdamW(model.parameters(), lr=BASE_LR, weight_decay=0.0)
            g = torch.Generator().manual_seed(0)
            for _ in range(BASE_STEPS):
                idx = torch.randint(0, len(train), (BASE_BATCH,), generator=g)
                ids, mask = train.input_ids[idx], train.loss_mask[idx]
                loss = train_loss_sum(model(ids), ids, mask) / mask[:, 1:].sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
            save_hf_checkpoint({k: v.detach() for k, v in model.state_dict().items()}, cfg, str(dest))
            (dest / "trainperf_base.json").write_text(json.dumps(
                {"source": "markov A", "steps": BASE_STEPS, "final_train_loss": loss.item(),
                 "seconds": time.perf_counter() - t0}, indent=2))
        return dest, json.loads((dest / "trainperf_base.json").read_text())


def _need_generated_rows(spec: RunSpec) -> None:
    d = spec.data
    if d.train_samples < 1 or d.eval_samples < 1:
        raise SpecError(f"data.train_samples={d.train_samples}, data.eval_samples={d.eval_samples}: {spec.workload} "
                        "generates its dataset and needs at least 1 row of each (or give data.path)")


def prepare_mini_pretrain(spec: RunSpec) -> dict:
    info: dict = {}
    if spec.data.path is None:
        _need_generated_rows(spec)
        path, info = pretrain_dataset(spec.data.train_samples, spec.data.eval_samples)
        spec.data.path = str(path)
        if spec.eval.target < 0:
            spec.eval.target = round(info["optimal_eval_loss"] + PRETRAIN_MARGIN, 4)
    return info


def prepare_mini_lora(spec: RunSpec) -> dict:
    info: dict = {}
    if spec.data.path is None:
        _need_generated_rows(spec)  # before the base checkpoint is built
    if spec.model.path is None:
        path, base_info = base_checkpoint()
        spec.model.path = str(path)
        info["base"] = base_info
    if spec.data.path is None:
        path, data_info = lora_dataset(spec.data.train_samples, spec.data.eval_samples)
        spec.data.path = str(path)
        info.update(data_info)
        if spec.eval.target < 0:
            spec.eval.target = round(data_info["optimal_eval_loss"] + LORA_MARGIN, 4)
    return info


# ---------------------------------------------------------------------------------------------
# Throughput probes: any model shape, random weights, random tokens, no reachable target.


def random_token_dataset(rows: int, eval_rows: int, seq: int, vocab: int) -> Path:
    key = _key(kind="random", rows=rows, eval=eval_rows, seq=seq, tokens=vocab)
    with _locked("data") as root:
        dest = root / f"random-tokens-{key}"
        if not (dest / "source.json").is_file():
            g = torch.Generator().manual_seed(0)
            make = lambda n: TokenSplit(torch.randint(0, vocab, (n, seq), generator=g),  # noqa: E731
                                        torch.ones(n, seq, dtype=torch.bool))
            _write_dataset(dest, make(rows), make(eval_rows), {"source": "uniform random tokens",
                                                               "optimal_eval_loss": float(torch.log(torch.tensor(vocab)))})
        return dest


def prepare_synthetic(spec: RunSpec) -> dict:
    if spec.data.path is None:
        spec.data.path = str(random_token_dataset(spec.data.train_samples, spec.data.eval_samples, spec.data.seq_len, spec.model.vocab_size))
    return {"note": "throughput probe: random weights and tokens, no reachable target; the run ends as failed"}


def prepare_mlperf_lora(spec: RunSpec) -> dict:
    """llama2_70b_lora: the data comes from the user. Without a checkpoint (open division only, see
    check_closed_rules) the weights are random; without data, fabricated random-token rows of the
    configured length: a throughput run that cannot reach the target."""
    info: dict = {}
    if spec.model.path is None:
        info["note"] = "random weights (no model.path): a throughput run, open division, not comparable"
    if spec.data.path is None and spec.mlperf.division == "open":
        rows, eval_rows = spec.data.train_samples or 64, spec.data.eval_samples or 173
        spec.data.path = str(random_token_dataset(rows, eval_rows, spec.data.seq_len, spec.model.vocab_size))
        spec.data.eval_samples = 0
        info["data"] = f"fabricated: {rows} train / {eval_rows} validation rows of random tokens"
    return info


def prepare_mlperf_pretrain(spec: RunSpec) -> dict:
    if spec.data.path is None and spec.mlperf.division == "open":
        rows = spec.data.train_samples or 64
        spec.data.path = str(random_token_dataset(rows, spec.data.eval_samples or 8, spec.data.seq_len,
                                                  spec.model.vocab_size))
        return {"data": f"fabricated: {rows} rows of random tokens (throughput only)"}
    return {}
