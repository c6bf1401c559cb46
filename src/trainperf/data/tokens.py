"""Token datasets on disk, and the one interface the trainer reads them through.

trainperf's own format is a directory with ``train.safetensors`` and ``validation.safetensors``, each
holding ``input_ids`` (int, [rows, seq]) and ``loss_mask`` (bool/int, [rows, seq]);
``loss_mask[i, t]`` says whether token t of row i is a prediction target (predicted from tokens < t),
the same meaning as MLPerf's ``loss_mask`` / ``labels != -100``.

Other formats are recognised by their files and read by their own modules: the MLPerf GovReport
parquet and NVIDIA npy files (``data.govreport``) and packed pre-tokenized pretraining streams
(``data.pretok``). Every reader gives a split with ``len()`` and ``take(rows) -> (ids, mask)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from trainperf.core.errors import SpecError
from trainperf.core.files import atomic_write

SPLITS = ("train", "validation")


@dataclass
class TokenSplit:
    input_ids: torch.Tensor  # int64 [rows, seq]
    loss_mask: torch.Tensor  # bool [rows, seq]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def take(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.input_ids[rows], self.loss_mask[rows]

    def limit(self, n: int) -> "TokenSplit":
        return TokenSplit(self.input_ids[:n], self.loss_mask[:n])


def save_split(split: TokenSplit, path: Path) -> None:
    atomic_write(path, lambda tmp: save_file({"input_ids": split.input_ids.to(torch.int32).contiguous(),
                                              "loss_mask": split.loss_mask.to(torch.uint8).contiguous()}, str(tmp)))


INTEGER_DTYPES = ("U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64")  # safetensors' names


def inspect_dataset(path: str, seq_len: int, vocab_size: int) -> dict[str, int]:
    """Header-only check of a dataset dir: files present, readable, shapes consistent. Rows per split."""
    p = Path(path)
    if not p.is_dir():
        raise SpecError(f"data.path {path!r} is not a directory (expected train.safetensors and validation.safetensors)")
    rows = {}
    for split in SPLITS:
        f = p / f"{split}.safetensors"
        if not f.is_file():
            raise SpecError(f"data.path {path!r} has no {split}.safetensors")
        try:
            with safe_open(str(f), framework="pt") as sf:
                names = set(sf.keys())
                if not {"input_ids", "loss_mask"} <= names:
                    raise SpecError(f"data.path {path!r}: {f.name} must hold input_ids and loss_mask, found {sorted(names)}")
                shape = list(sf.get_slice("input_ids").get_shape())
                mshape = list(sf.get_slice("loss_mask").get_shape())
                id_dtype = sf.get_slice("input_ids").get_dtype()
        except SpecError:
            raise
        except Exception as exc:
            raise SpecError(f"data.path {path!r}: {f.name} is not a readable safetensors file ({str(exc).splitlines()[0]})") from None
        if id_dtype not in INTEGER_DTYPES:
            raise SpecError(f"data.path {path!r}: {f.name} input_ids are {id_dtype}; token ids must be integers "
                            f"({', '.join(INTEGER_DTYPES)})")
        if len(shape) != 2 or shape != mshape:
            raise SpecError(f"data.path {path!r}: {f.name} input_ids {shape} and loss_mask {mshape} must be equal 2-D shapes")
        if shape[1] != seq_len:
            raise SpecError(f"data.path {path!r}: {f.name} rows have {shape[1]} tokens but data.seq_len={seq_len}")
        if shape[0] < 1:
            raise SpecError(f"data.path {path!r}: {f.name} has no rows")
        rows[split] = shape[0]
    return rows


def verify_token_range(path: str, split: str, vocab_size: int) -> None:
    """Every token id lies in [0, vocab_size); SpecError otherwise."""
    with safe_open(str(Path(path) / f"{split}.safetensors"), framework="pt") as sf:
        ids = sf.get_tensor("input_ids")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise SpecError(f"data.path {path!r}: {split} token ids span [{int(ids.min())}, {int(ids.max())}], "
                        f"outside the model's vocabulary [0, {vocab_size})")


def load_split(path: str, split: str) -> TokenSplit:
    """Read a split (its ids were verified before launch: see runner.local.prepare)."""
    with safe_open(str(Path(path) / f"{split}.safetensors"), framework="pt") as sf:
        ids = sf.get_tensor("input_ids").to(torch.int64)
        mask = sf.get_tensor("loss_mask").to(torch.bool)
    return TokenSplit(ids, mask)


# ---------------------------------------------------------------------------------------------
# Format dispatch: inspect (headers, before launch), verify (a full pass, before launch), load.

def dataset_format(path: str) -> str:
    """'safetensors', 'govreport-parquet', 'govreport-npy', 'pretok' or 'megatron' (indexed .bin/.idx);
    SpecError when none fits."""
    from trainperf.data import govreport, megatron, pretok

    p = Path(path)
    if not p.is_dir():
        raise SpecError(f"data.path {path!r} is not a directory")
    if pretok.detect(path):
        return "pretok"
    if megatron.detect(path):
        return "megatron"
    found = govreport.detect(path)
    if found:
        return found
    if any((p / f"{s}.safetensors").is_file() for s in SPLITS):
        return "safetensors"
    raise SpecError(f"data.path {path!r} holds no dataset trainperf reads: expected train/validation .safetensors, "
                    "GovReport train*/validation*.parquet or train.npy/validation.npy, a pretok dir (meta.json), "
                    "or Megatron indexed datasets train*.idx/.bin and validation*.idx/.bin")


def _reader(path: str):
    """(inspect, verify, load) of the format the dir holds; load takes (path, split, seq_len)."""
    fmt = dataset_format(path)
    if fmt == "pretok":
        from trainperf.data import pretok

        return pretok.inspect_pretok, pretok.verify_pretok_tokens, pretok.PackedTokenSplit
    if fmt == "megatron":
        from trainperf.data import megatron

        return megatron.inspect_megatron, megatron.verify_megatron_tokens, megatron.MegatronTokenSplit
    if fmt.startswith("govreport"):
        from trainperf.data import govreport

        return (govreport.inspect_govreport, govreport.verify_govreport_tokens,
                lambda p, split, seq_len: govreport.load_govreport(p, split))
    return inspect_dataset, verify_token_range, lambda p, split, seq_len: load_split(p, split)


def inspect_any(path: str, seq_len: int, vocab_size: int) -> dict[str, int]:
    return _reader(path)[0](path, seq_len, vocab_size)


def verify_any(path: str, split: str, vocab_size: int) -> None:
    _reader(path)[1](path, split, vocab_size)


def load_any(path: str, split: str, seq_len: int):
    """A split object with len() and take(rows) (and limit(n)) in whichever format the dir holds."""
    return _reader(path)[2](path, split, seq_len)
