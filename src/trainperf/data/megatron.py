"""Megatron-LM's indexed datasets (``.bin`` + ``.idx``, ``MMapIndexedDataset``), read directly: the
format the MLPerf GPT-3 reference and NVIDIA's NeMo implementations train on.

A dataset directory holds, per split, one or more pairs ``{split}*.idx`` / ``{split}*.bin`` (split:
``train`` or ``validation``; several shards are read one after another in name order). The ``.bin``
is the documents' token ids back to back; the ``.idx`` (little-endian) is::

    b"MMIDIDX\\x00\\x00"  magic (9 bytes)
    <Q version (1)   <B dtype code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16)
    <Q sequence count S   <Q document-index count D
    int32[S] sequence lengths   int64[S] byte offsets into .bin   int64[D] document indices

Rows are read as from the packed format (data/pretok.py): row i of a split is the window
``stream[i*seq_len:(i+1)*seq_len]`` of the split's token stream, every position a target but the first.
Only the index is read before launch; the token pass that checks ids against the vocabulary is
``verify_megatron_tokens``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trainperf.core.errors import SpecError
from trainperf.core.untrusted import printable, read_untrusted_bytes

MAGIC = b"MMIDIDX\x00\x00"
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}
SPLITS = ("train", "validation")
MAX_INDEX_BYTES = 2 << 30  # 12 bytes a sequence: 170M sequences, far above any real shard's index


@dataclass(frozen=True)
class MegatronIndex:
    bin_path: Path
    dtype: np.dtype
    lengths: np.ndarray  # int32 [S]: tokens of each sequence
    pointers: np.ndarray  # int64 [S]: byte offset of each sequence in .bin

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())


def read_index(idx: Path) -> MegatronIndex:
    """The index of one shard, checked against its .bin; SpecError naming the file otherwise.

    The index may come from anywhere: it is read capped (a regular file, core/untrusted.py), and its
    lengths must be non-negative and its pointers contiguous from a non-negative start, as Megatron's
    builder writes them, so that the one flat memmap per shard is exactly the sequences."""
    shown = printable(str(idx))
    raw = read_untrusted_bytes(idx, max_bytes=MAX_INDEX_BYTES, what="Megatron index")
    if raw[:9] != MAGIC or len(raw) < 34:
        raise SpecError(f"{shown!r} is not a Megatron indexed-dataset index (magic MMIDIDX expected)")
    version, code = struct.unpack_from("<QB", raw, 9)
    n_seq, n_doc = struct.unpack_from("<QQ", raw, 18)
    if version != 1 or code not in DTYPES:
        raise SpecError(f"{shown!r}: index version {version}, dtype code {code}; version 1 with codes 1-8 is read")
    body = 34
    if len(raw) < body + n_seq * 12 + n_doc * 8:
        raise SpecError(f"{shown!r} is truncated: {n_seq} sequences and {n_doc} document indices announced")
    lengths = np.frombuffer(raw, np.int32, n_seq, body)
    pointers = np.frombuffer(raw, np.int64, n_seq, body + 4 * n_seq)
    dtype = np.dtype(DTYPES[code])
    if n_seq and (int(lengths.min()) < 0 or int(pointers[0]) < 0):
        raise SpecError(f"{shown!r}: a negative sequence length or offset; the index is damaged")
    ends = pointers.astype(np.int64) + lengths.astype(np.int64) * dtype.itemsize
    if n_seq > 1 and not np.array_equal(pointers[1:], ends[:-1]):
        j = int(np.flatnonzero(pointers[1:] != ends[:-1])[0]) + 1
        raise SpecError(f"{shown!r}: sequence {j} starts at byte {int(pointers[j])}, not where sequence {j - 1} "
                        f"ends ({int(ends[j - 1])}); Megatron writes sequences back to back")
    bin_path = idx.with_suffix(".bin")
    size = bin_path.stat().st_size if bin_path.is_file() else -1
    need = int(ends[-1]) if n_seq else 0
    if size < need:
        raise SpecError(f"{printable(str(bin_path))!r} holds {max(size, 0)} bytes; its index {printable(idx.name)} "
                        f"needs {need}")
    return MegatronIndex(bin_path, dtype, lengths.copy(), pointers.copy())


def shards(path: str | Path, split: str) -> list[Path]:
    return sorted(Path(path).glob(f"{split}*.idx"))


def detect(path: str | Path) -> bool:
    return all(shards(path, s) for s in SPLITS)


class MegatronTokenSplit:
    """Rows of one split, read from the shards' .bin memmaps on demand (row i = tokens [i*S, (i+1)*S))."""

    def __init__(self, path: str | Path, split: str, seq_len: int, rows: int | None = None):
        self.path, self.split, self.seq_len = Path(path), split, seq_len
        self.streams = []  # one flat memmap per shard: its sequences back to back from the first pointer
        for idx in shards(path, split):
            ix = read_index(idx)
            if ix.tokens:
                start = int(ix.pointers[0])
                self.streams.append(np.memmap(ix.bin_path, dtype=ix.dtype, mode="r", offset=start, shape=(ix.tokens,)))
        self.starts = np.cumsum([0] + [len(s) for s in self.streams])
        full = int(self.starts[-1]) // seq_len
        self._rows = full if rows is None else rows

    def __len__(self) -> int:
        return self._rows

    def _window(self, begin: int) -> np.ndarray:
        end, parts = begin + self.seq_len, []
        for s, (lo, hi) in enumerate(zip(self.starts[:-1], self.starts[1:])):
            if lo < end and begin < hi:  # a row may straddle two shards
                parts.append(self.streams[s][max(begin - lo, 0):min(end, hi) - lo])
        return np.concatenate(parts).astype(np.int64)

    def take(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids int64 [n, seq_len], loss_mask bool [n, seq_len]) of rows ``idx``."""
        rows = torch.as_tensor(idx, dtype=torch.long).reshape(-1).tolist()
        if rows and (min(rows) < 0 or max(rows) >= self._rows):
            raise IndexError(f"{self.split} rows {rows[:8]}... outside [0, {self._rows})")
        ids = np.stack([self._window(r * self.seq_len) for r in rows]) if rows else np.zeros((0, self.seq_len), np.int64)
        return torch.from_numpy(ids), torch.ones(ids.shape, dtype=torch.bool)

    def limit(self, n: int) -> "MegatronTokenSplit":
        if not 0 <= n <= self._rows:
            raise SpecError(f"data.path {str(self.path)!r}: {self.split} has {self._rows} rows of {self.seq_len} "
                            f"tokens, cannot take the first {n}")
        view = object.__new__(MegatronTokenSplit)
        view.__dict__.update(self.__dict__)
        view._rows = n
        return view


def inspect_megatron(path: str, seq_len: int, vocab_size: int) -> dict[str, int]:
    """Rows per split from the indexes alone; a token dtype that cannot hold the vocabulary's ids, or a
    float one, is refused here."""
    rows = {}
    for split in SPLITS:
        tokens = 0
        for idx in shards(path, split):
            ix = read_index(idx)
            if ix.dtype.kind == "f":
                raise SpecError(f"{str(idx)!r} stores {ix.dtype} values, not token ids")
            most = np.iinfo(ix.dtype).max + 1
            if most < vocab_size:  # Megatron stores uint16 below 65,500 ids: data for another tokenizer
                raise SpecError(f"{str(idx)!r} stores {ix.dtype.name} ids (at most {most:,} distinct), but the model's "
                                f"vocabulary has {vocab_size:,}: the data was tokenized for another tokenizer; "
                                "tokenize it for this model's")
            tokens += ix.tokens
        rows[split] = tokens // seq_len
        if rows[split] < 1:
            raise SpecError(f"data.path {path!r}: {split} holds {tokens} tokens, less than one sequence of {seq_len}")
    return rows


def verify_megatron_tokens(path: str, split: str, vocab_size: int) -> None:
    """Every token id of the split in [0, vocab_size): a full pass, before launch."""
    for idx in shards(path, split):
        ix = read_index(idx)
        if not ix.tokens:
            continue
        data = np.memmap(ix.bin_path, dtype=ix.dtype, mode="r", offset=int(ix.pointers[0]), shape=(ix.tokens,))
        lo, hi = int(data.min()), int(data.max())
        if lo < 0 or hi >= vocab_size:
            raise SpecError(f"data.path {path!r}: {ix.bin_path.name} holds token id {hi if hi >= vocab_size else lo}, "
                            f"outside the model's vocabulary [0, {vocab_size})")


def write_indexed(prefix: str | Path, documents: list[np.ndarray], dtype=np.uint16) -> None:
    """Write documents as a Megatron ``prefix.bin`` / ``prefix.idx`` pair (one sequence per document),
    as Megatron's ``IndexedDatasetBuilder`` does."""
    prefix, dtype = Path(prefix), np.dtype(dtype)
    code = next(c for c, t in DTYPES.items() if np.dtype(t) == dtype)
    lengths = np.array([len(d) for d in documents], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1].astype(np.int64) * dtype.itemsize)]).astype(np.int64)
    with open(prefix.with_suffix(".bin"), "wb") as fh:
        for d in documents:
            fh.write(np.asarray(d, dtype=dtype).tobytes())
    doc_idx = np.arange(len(documents) + 1, dtype=np.int64)
    with open(prefix.with_suffix(".idx"), "wb") as fh:
        fh.write(MAGIC + struct.pack("<QB", 1, code) + struct.pack("<QQ", len(documents), len(doc_idx)))
        fh.write(lengths.tobytes() + pointers.tobytes() + doc_idx.tobytes())
