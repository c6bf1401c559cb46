"""Pre-tokenized pretraining data on disk: format ``trainperf-pretok-v1``, a reader and a converter.

Format ``trainperf-pretok-v1``
==============================

A dataset is a directory ``DIR`` holding five files::

    DIR/meta.json
    DIR/train_tokens.npy        DIR/train_docs.npy
    DIR/validation_tokens.npy   DIR/validation_docs.npy

``meta.json``::

    {"format": "trainperf-pretok-v1",
     "vocab_size": 128256,              # the tokenizer's vocabulary; must equal the model's vocab_size
     "dtype": "uint32",                 # "uint16" when vocab_size <= 65536, else "uint32"
     "eod_id": 128001,                  # end-of-document token appended to every document, or null
     "splits": {"train":      {"tokens": N, "documents": D},
                "validation": {"tokens": N, "documents": D}},
     "source": "free text: where the tokens came from"}

``{split}_tokens.npy``
    A 1-D array (``dtype`` above, little-endian, C order) of N token ids: the split's documents
    concatenated in order, each followed by ``eod_id`` when ``eod_id`` is not null. It is read
    with ``np.load(f, mmap_mode="r", allow_pickle=False)``; only the rows a step needs are paged in.

``{split}_docs.npy``
    A 1-D int64 array of D+1 start offsets into the token stream: document j is
    ``tokens[docs[j]:docs[j+1]]`` (its trailing ``eod_id`` included), ``docs[0] == 0``,
    ``docs[D] == N`` and the offsets never decrease. Training does not read it; it makes the
    documents recoverable (see :func:`read_document`) and is checked by :func:`inspect_pretok`.

Samples. With sequence length ``seq_len``, row i of a split is the contiguous window
``tokens[i*seq_len : (i+1)*seq_len]``: rows do not overlap and the tail of fewer than ``seq_len``
tokens is dropped, so a split has ``N // seq_len`` rows. Every position of a row is a prediction
target except position 0 (the trainer's convention: ``loss_mask[i, t]`` True means token t is
predicted from tokens < t, and t = 0 is never predicted, so the mask returned here is all True).
Document boundaries inside a row are not masked: attention is plain causal across the packed row,
as in MLPerf's NeMo recipe for Llama 3.1 8B. Evaluation uses the first rows of the validation
split (``PackedTokenSplit.limit(1024)`` for MLPerf's "first 1,024 sequences").

Converter. :func:`convert` (CLI ``trainperf data convert``) builds such a directory from plain
token files -- ``.txt`` (one document per line, whitespace-separated integer ids), ``.jsonl`` (one
JSON object per line with key ``input_ids``, ``tokens`` or ``ids``) and ``.npy`` (1-D: one
document; 2-D: each row a document) -- streaming (memory bounded by :data:`CHUNK_TOKENS`), into a
temporary directory next to the output that is renamed into place only when everything is written.
Empty documents (blank lines, empty lists) are skipped.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trainperf.core.errors import SpecError
from trainperf.core.files import check_output_dir, new_output_dir
from trainperf.core.untrusted import load_untrusted_json, printable
from trainperf.data.text import json_lines, load_tokenizer, text_lines, tokenized_pieces, tokenizer_file

FORMAT = "trainperf-pretok-v1"
SPLITS = ("train", "validation")
META = "meta.json"
JSONL_KEYS = ("input_ids", "tokens", "ids")
# Tokens held in memory at a time by the converter (per split buffer) and by verify_pretok_tokens.
# Tests monkeypatch it to force many chunks.
CHUNK_TOKENS = 64 * 2**20
MAX_META_BYTES = 1 << 20  # meta.json: a few hundred bytes


def token_dtype(vocab_size: int) -> np.dtype:
    """The stream dtype the format prescribes for a vocabulary."""
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.uint32)


def tokens_file(path: str | Path, split: str) -> Path:
    return Path(path) / f"{split}_tokens.npy"


def docs_file(path: str | Path, split: str) -> Path:
    return Path(path) / f"{split}_docs.npy"


def detect(path: str | Path) -> bool:
    """Whether ``path`` is a directory whose meta.json names this format (no other checks)."""
    try:
        meta = load_untrusted_json(Path(path) / META, max_bytes=MAX_META_BYTES, what=META)
    except SpecError:
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT


# ---------------------------------------------------------------------------------------------
# reading


def _load_npy(f: Path) -> np.ndarray:
    return np.load(f, mmap_mode="r", allow_pickle=False)


class PackedTokenSplit:
    """Rows of one split: row i = tokens[i*seq_len:(i+1)*seq_len], read from the memmap on demand."""

    def __init__(self, path: str | Path, split: str, seq_len: int, rows: int | None = None):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        self.path, self.split, self.seq_len = Path(path), split, seq_len
        self.tokens = _load_npy(tokens_file(path, split))
        full = len(self.tokens) // seq_len
        self._rows = full if rows is None else rows
        # a [full, seq_len] view of the memmap: indexing it reads only the requested rows
        self._view = self.tokens[: full * seq_len].reshape(full, seq_len)

    def __len__(self) -> int:
        return self._rows

    def take(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids int64 [n, seq_len], loss_mask bool [n, seq_len]) of rows ``idx``."""
        idx = torch.as_tensor(idx, dtype=torch.long).reshape(-1)
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self._rows):
            raise IndexError(f"{self.split} rows {idx.tolist()[:8]}... outside [0, {self._rows})")
        ids = np.asarray(self._view[idx.numpy()], dtype=np.int64)
        return torch.from_numpy(ids), torch.ones(ids.shape, dtype=torch.bool)

    def limit(self, n: int) -> "PackedTokenSplit":
        """A view of the first n rows (e.g. MLPerf's eval on the first 1,024 validation sequences)."""
        if not 0 <= n <= self._rows:
            raise SpecError(f"data.path {str(self.path)!r}: {self.split} split has {self._rows} rows of "
                            f"{self.seq_len} tokens, cannot take the first {n} (need 0 <= n <= {self._rows})")
        view = object.__new__(PackedTokenSplit)
        view.__dict__.update(self.__dict__)
        view._rows = n
        return view


def read_document(path: str | Path, split: str, i: int) -> np.ndarray:
    """Document i of a split as stored (its trailing eod_id, if any, included)."""
    docs = _load_npy(docs_file(path, split))
    return np.asarray(_load_npy(tokens_file(path, split))[int(docs[i]):int(docs[i + 1])])


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def inspect_pretok(path: str, seq_len: int, vocab_size: int) -> dict[str, int]:
    """Pre-launch check of a pretok dir (meta, headers, counts, docs index). Rows per split."""
    p = Path(path)
    where = f"data.path {path!r}"
    if not p.is_dir():
        raise SpecError(f"{where} is not a directory (expected a {FORMAT} dir: {META}, "
                        f"{{train,validation}}_{{tokens,docs}}.npy; build one with `trainperf data convert`)")
    if seq_len < 1:
        raise SpecError(f"data.seq_len={seq_len}: must be >= 1")
    mf = p / META
    if not os.path.lexists(mf):
        raise SpecError(f"{where} has no {META} (expected a {FORMAT} dir; build one with `trainperf data convert`)")
    meta = load_untrusted_json(mf, max_bytes=MAX_META_BYTES, what=f"{META} of data.path")
    if not isinstance(meta, dict):
        raise SpecError(f"{mf}: holds a {type(meta).__name__}, expected a JSON object with format={FORMAT!r}")
    if meta.get("format") != FORMAT:
        raise SpecError(f"{mf}: format is {meta.get('format')!r}, expected {FORMAT!r}")
    mv = meta.get("vocab_size")
    if not _is_int(mv) or mv != vocab_size:
        raise SpecError(f"{mf}: vocab_size is {mv!r} but the model's vocab_size is {vocab_size} "
                        f"(the data must be tokenized for the model's vocabulary)")
    want = token_dtype(vocab_size)
    if meta.get("dtype") != want.name:
        raise SpecError(f"{mf}: dtype is {meta.get('dtype')!r}, but a vocabulary of {vocab_size} is stored as "
                        f"{want.name!r} (uint16 when vocab_size <= 65536, else uint32)")
    eod = meta.get("eod_id")
    if eod is not None and (not _is_int(eod) or not 0 <= eod < vocab_size):
        raise SpecError(f"{mf}: eod_id is {eod!r}, expected null or an integer in [0, {vocab_size})")
    splits = meta.get("splits")
    if not isinstance(splits, dict):
        raise SpecError(f"{mf}: 'splits' is {splits!r}, expected {{\"train\": {{\"tokens\": N, \"documents\": D}}, "
                        f"\"validation\": {{...}}}}")
    rows = {}
    for split in SPLITS:
        s = splits.get(split)
        if not (isinstance(s, dict) and _is_int(s.get("tokens")) and _is_int(s.get("documents"))
                and s["tokens"] >= 0 and s["documents"] >= 0):
            raise SpecError(f"{mf}: splits.{split} is {s!r}, expected {{\"tokens\": N, \"documents\": D}} "
                            f"with non-negative integers")
        n, d = s["tokens"], s["documents"]
        tf, df = tokens_file(p, split), docs_file(p, split)
        tokens = _open_checked(tf, f"a 1-D {want.name} array of {n} tokens")
        if tokens.ndim != 1 or tokens.dtype != want:
            raise SpecError(f"{tf}: holds a {tokens.ndim}-D {tokens.dtype} array, expected 1-D {want.name} "
                            f"(meta.json dtype)")
        if len(tokens) != n:
            raise SpecError(f"{tf}: holds {len(tokens)} tokens but {META} says splits.{split}.tokens={n} "
                            f"(they must match; re-run `trainperf data convert`)")
        docs = _open_checked(df, f"a 1-D int64 array of {d + 1} document offsets")
        if docs.ndim != 1 or docs.dtype != np.dtype(np.int64) or len(docs) != d + 1:
            raise SpecError(f"{df}: holds a {docs.ndim}-D {docs.dtype} array of {docs.size} values, expected 1-D "
                            f"int64 of documents+1 = {d + 1} offsets")
        _check_offsets(docs, n, df)
        if n < seq_len:
            raise SpecError(f"{tf}: {split} split has {n} tokens, fewer than one row of data.seq_len={seq_len} "
                            f"(a split needs at least seq_len tokens)")
        rows[split] = n // seq_len
    return rows


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _open_checked(f: Path, expected: str) -> np.ndarray:
    if not f.is_file():
        raise SpecError(f"{f}: missing (a {FORMAT} dir holds {expected} there)")
    try:
        return _load_npy(f)
    except Exception as exc:  # truncated file, bad header, object dtype (allow_pickle=False) ...
        raise SpecError(f"{f}: not a readable .npy file ({_first_line(exc)}); "
                        f"expected {expected}") from None


def _check_offsets(docs: np.ndarray, n: int, df: Path) -> None:
    if int(docs[0]) != 0:
        raise SpecError(f"{df}: first offset is {int(docs[0])}, expected 0")
    if int(docs[-1]) != n:
        raise SpecError(f"{df}: last offset is {int(docs[-1])}, expected the token count {n}")
    step = max(1, CHUNK_TOKENS)
    for start in range(0, len(docs) - 1, step):
        chunk = np.asarray(docs[start:start + step + 1])
        bad = np.flatnonzero(np.diff(chunk) < 0)
        if bad.size:
            j = start + int(bad[0])
            raise SpecError(f"{df}: offsets decrease at document {j} ({int(docs[j])} -> {int(docs[j + 1])}); "
                            f"expected non-decreasing offsets from 0 to {n}")


def verify_pretok_tokens(path: str, split: str, vocab_size: int) -> None:
    """Every token id of a split lies in [0, vocab_size); reads CHUNK_TOKENS tokens at a time."""
    tf = tokens_file(path, split)
    tokens = _open_checked(tf, "a 1-D array of token ids")
    if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
        raise SpecError(f"{tf}: holds a {tokens.ndim}-D {tokens.dtype} array, expected 1-D token ids")
    step = max(1, CHUNK_TOKENS)
    for start in range(0, len(tokens), step):
        chunk = np.asarray(tokens[start:start + step])
        if chunk.size and (int(chunk.max()) >= vocab_size or int(chunk.min()) < 0):
            j = int(np.flatnonzero((chunk < 0) | (chunk >= vocab_size))[0])
            raise SpecError(f"{tf}: token id {int(chunk[j])} at position {start + j} is outside the model's "
                            f"vocabulary [0, {vocab_size})")


# ---------------------------------------------------------------------------------------------
# converting

# The pieces a reader yields: (where: file and line/row for messages, offset of the piece in its
# document, token ids, whether the piece ends its document). A .npy document may come in several pieces.
_Piece = tuple[str, int, np.ndarray, bool]


def _ints(where: str, values: list) -> np.ndarray:
    """int64 ids of a list of Python ints; ids beyond int64 are out of any vocabulary's range."""
    try:
        return np.asarray(values, dtype=np.int64)
    except OverflowError:
        j = next(i for i, v in enumerate(values) if not -2**63 <= v < 2**63)
        raise SpecError(f"{where}: token id {values[j]} (token {j} of the document) is outside "
                        f"the vocabulary") from None


def _read_txt(f: Path) -> Iterator[_Piece]:
    for where, line in text_lines(f):
        values = []
        for w in line.split():
            try:
                values.append(int(w))
            except ValueError:
                raise SpecError(f"{where}: {printable(w[:40])!r} is not an integer token id (a .txt input holds one "
                                f"document per line, ids separated by whitespace)") from None
        if values:
            yield where, 0, _ints(where, values), True


def _read_jsonl(f: Path) -> Iterator[_Piece]:
    for where, obj in json_lines(f):
        key = next((k for k in JSONL_KEYS if isinstance(obj, dict) and k in obj), None)
        if key is None:
            raise SpecError(f"{where}: expected a JSON object with one of the keys {list(JSONL_KEYS)}")
        values = obj[key]
        if not isinstance(values, list) or not all(_is_int(v) for v in values):
            raise SpecError(f"{where}: {key!r} must be a list of integer token ids, got {str(values)[:60]}")
        if values:
            yield where, 0, _ints(where, values), True


def _read_npy(f: Path) -> Iterator[_Piece]:
    try:
        arr = _load_npy(f)
    except Exception as exc:
        raise SpecError(f"{f}: not a readable .npy file ({_first_line(exc)}); "
                        f"expected a 1-D or 2-D integer array") from None
    if arr.dtype.kind not in "iu" or arr.ndim not in (1, 2):
        raise SpecError(f"{f}: holds a {arr.ndim}-D {arr.dtype} array, expected a 1-D (one document) or "
                        f"2-D (one document per row) integer array")
    step = max(1, CHUNK_TOKENS)
    docs = [arr] if arr.ndim == 1 else (arr[r] for r in range(arr.shape[0]))
    for r, doc in enumerate(docs):
        where = f"{f} row {r}" if arr.ndim == 2 else str(f)
        for start in range(0, len(doc), step):
            yield where, start, np.asarray(doc[start:start + step]), start + step >= len(doc)


READERS = {".txt": _read_txt, ".jsonl": _read_jsonl, ".npy": _read_npy}


def _pieces(files: list[str]) -> Iterator[_Piece]:
    for name in files:
        f = Path(name)
        reader = READERS.get(f.suffix.lower())
        if reader is None:
            raise SpecError(f"{f}: unknown input kind {f.suffix!r}; expected one of {sorted(READERS)}")
        if not f.is_file():
            raise SpecError(f"{f}: no such input file")
        yield from reader(f)


class _NpyStream:
    """A 1-D .npy file written incrementally: a header reserved up front, rewritten with the final length.

    numpy pads a 1-D header so that any length up to 21 digits fits in the same number of bytes, which
    is what lets the header be rewritten in place."""

    def __init__(self, f: Path, dtype: np.dtype):
        self.f, self.dtype, self.count = f, np.dtype(dtype).newbyteorder("<"), 0
        self.fh = open(f, "wb")
        self.header_len = self.fh.write(self._header(0))
        self.buf: list[np.ndarray] = []
        self.buffered = 0

    def _header(self, n: int) -> bytes:
        b = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            b, {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": (n,)})
        return b.getvalue()

    def append(self, a: np.ndarray) -> None:
        self.buf.append(a)
        self.buffered += len(a)
        self.count += len(a)
        if self.buffered >= CHUNK_TOKENS:
            self.flush()

    def flush(self) -> None:
        if self.buf:
            np.concatenate(self.buf).astype(self.dtype, copy=False).tofile(self.fh)
        self.buf, self.buffered = [], 0

    def close(self) -> None:
        self.flush()
        header = self._header(self.count)
        if len(header) != self.header_len:  # only with a numpy that does not pad for growth
            raise RuntimeError(f"{self.f}: .npy header changed size ({self.header_len} -> {len(header)} bytes)")
        self.fh.seek(0)
        self.fh.write(header)
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()


class _SplitWriter:
    def __init__(self, out: Path, split: str, vocab_size: int, eod_id: int | None):
        self.vocab_size, self.eod = vocab_size, eod_id
        self.tokens = _NpyStream(tokens_file(out, split), token_dtype(vocab_size))
        self.docs = _NpyStream(docs_file(out, split), np.dtype(np.int64))
        self.docs.append(np.zeros(1, np.int64))
        self.documents = 0
        self.open_doc = False

    def add(self, where: str, offset: int, ids: np.ndarray, doc_end: bool) -> None:
        if ids.size:
            if int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
                bad = int(np.flatnonzero((ids < 0) | (ids >= self.vocab_size))[0])
                raise SpecError(f"{where}: token id {int(ids[bad])} (token {offset + bad} of the document) is "
                                f"outside [0, vocab_size={self.vocab_size})")
            self.tokens.append(ids)
            self.open_doc = True
        if doc_end and self.open_doc:
            if self.eod is not None:
                self.tokens.append(np.array([self.eod], np.int64))
            self.docs.append(np.array([self.tokens.count], np.int64))
            self.documents += 1
            self.open_doc = False

    def close(self) -> dict[str, int]:
        self.tokens.close()
        self.docs.close()
        return {"tokens": self.tokens.count, "documents": self.documents}

    def abort(self) -> None:
        for s in (self.tokens, self.docs):
            s.fh.close()


def convert(inputs: list[str], out_dir: str, vocab_size: int | None, eod_id: int | None,
            validation_documents: int = 0, validation_inputs: list[str] | None = None,
            source: str = "", text: TextOptions | None = None) -> dict:
    """Build a trainperf-pretok-v1 dir from plain token files (.txt, .jsonl, .npy); see the module doc.

    The validation split comes from ``validation_inputs`` or else from the first
    ``validation_documents`` documents of ``inputs`` (one of the two is required). Writes into a
    temporary dir next to ``out_dir`` and renames it into place at the end; an ``out_dir`` that exists
    and is not an empty folder, is or holds or lies in an input, or is not writable is refused before
    anything is read (core/files.py), and a failure leaves nothing behind. Returns {"out": ..., "format": ..., "vocab_size": ..., "dtype": ...,
    "eod_id": ..., "splits": {split: {"tokens": N, "documents": D}}}.

    With ``text`` the inputs are raw text (.jsonl ``text`` fields, .txt files) encoded by the local
    tokenizer it names (data/text.py); ``vocab_size`` defaults to the tokenizer's."""
    sources = [*inputs, *(validation_inputs or []), *([tokenizer_file(text.tokenizer)] if text else [])]
    out = check_output_dir(out_dir, sources, "--out")  # before any reading: nothing existing is touched
    tok = load_tokenizer(text.tokenizer) if text else None
    if tok is not None:
        vocab_size = vocab_size or tok.vocab_size
        if text.eod_token is not None:
            eod_id = _eod_from_token(tok, text.eod_token, eod_id)
    if not _is_int(vocab_size) or vocab_size < 1 or vocab_size > 2**32:
        raise SpecError(f"--vocab-size={vocab_size!r}: expected an integer in [1, 2**32]")
    if eod_id is not None and (not _is_int(eod_id) or not 0 <= eod_id < vocab_size):
        raise SpecError(f"--eod-id={eod_id!r}: expected an integer in [0, vocab_size={vocab_size}) or none")
    if not inputs:
        raise SpecError("no input files: give one or more .txt, .jsonl or .npy token files")
    if not _is_int(validation_documents) or validation_documents < 0:
        raise SpecError(f"--validation-documents={validation_documents!r}: expected an integer >= 0")
    if validation_inputs and validation_documents:
        raise SpecError("give either --validation-inputs or --validation-documents, not both")
    if not validation_inputs and not validation_documents:
        raise SpecError("no validation split: give --validation-inputs FILE... (a separate validation set, as MLPerf "
                        "uses) or --validation-documents N (the first N documents of the inputs)")
    for f in [*inputs, *(validation_inputs or [])]:
        if tok is None and Path(f).suffix.lower() not in READERS:
            raise SpecError(f"{printable(f)}: unknown input kind {printable(Path(f).suffix)!r}; expected one of "
                            f"{sorted(READERS)}")
        if not Path(f).is_file():
            raise SpecError(f"{printable(f)}: no such input file (or not a regular file)")
    with new_output_dir(out, sources, "--out") as tmp:
        writers: dict[str, _SplitWriter] = {}
        try:
            writers = {s: _SplitWriter(tmp, s, vocab_size, eod_id) for s in SPLITS}
            val, train = writers["validation"], writers["train"]
            pieces = _pieces if tok is None else (lambda files: tokenized_pieces(
                tok, files, text.text_key, text.per_line, text.on_document))
            if validation_inputs:
                for piece in pieces(validation_inputs):
                    val.add(*piece)
            for piece in pieces(inputs):
                (val if val.documents < validation_documents else train).add(*piece)
            if validation_documents and val.documents < validation_documents:
                raise SpecError(f"--validation-documents={validation_documents}: the inputs hold only "
                                f"{val.documents} non-empty documents")
            splits = {s: w.close() for s, w in writers.items()}
            for s, counts in splits.items():
                if counts["tokens"] == 0:
                    raise SpecError(f"the {s} split would be empty: give inputs with at least one non-empty document "
                                    f"for it")
            meta = {"format": FORMAT, "vocab_size": vocab_size, "dtype": token_dtype(vocab_size).name,
                    "eod_id": eod_id, "splits": splits, "source": source}
            with open(tmp / META, "w") as fh:
                json.dump(meta, fh, indent=1)
                fh.write("\n")
                fh.flush()
                os.fsync(fh.fileno())
        except BaseException:
            for w in writers.values():
                w.abort()
            raise
    return {"out": str(out), **meta}


@dataclass
class TextOptions:
    """How `data convert --tokenizer` reads raw text (data/text.py)."""

    tokenizer: str  # a local tokenizer.json, SentencePiece .model, or a folder with one
    text_key: str = "text"  # the .jsonl field holding a document's text
    per_line: bool = False  # .txt: one document per line (else the whole file is one document)
    eod_token: str | None = None  # the end-of-document token by name, e.g. <|end_of_text|>
    on_document: Callable[[str], None] | None = None  # called with each document's text (a progress bar)


def _eod_from_token(tok, token: str, eod_id: int | None) -> int:
    found = tok.token_to_id(token)
    if found is None:
        raise SpecError(f"--eod-token {token!r}: not a token of {tok.path!r}")
    if eod_id is not None and eod_id != found:
        raise SpecError(f"--eod-token {token!r} is id {found}, but --eod-id says {eod_id}; give one of them")
    return found


# ---------------------------------------------------------------------------------------------
# CLI: trainperf data convert


def build_parser(prog: str = "trainperf data convert") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description=f"Convert token files (.txt: one document per line; .jsonl: {'/'.join(JSONL_KEYS)} "
                               f"per line; .npy: 1-D document or 2-D rows), or raw text through a local tokenizer "
                               f"(--tokenizer; .jsonl: a text field per line; .txt: a document per file or per line), "
                               f"into a {FORMAT} pretraining data dir.")
    p.add_argument("inputs", nargs="+", help="training files (.txt, .jsonl, .npy; raw text with --tokenizer)")
    p.add_argument("--out", required=True, help="output dir: a new path or an empty folder, apart from the inputs "
                                                "(nothing existing is overwritten)")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="tokenizer vocabulary size (Llama 3.1: 128256); with --tokenizer, the tokenizer's by default")
    p.add_argument("--eod-id", type=int, default=None, help="end-of-document id appended to each document "
                                                             "(default: none)")
    p.add_argument("--validation-documents", type=int, default=0,
                   help="take the first N documents of the inputs as the validation split")
    p.add_argument("--validation-inputs", nargs="+", default=None,
                   help="separate validation files (instead of --validation-documents)")
    p.add_argument("--source", default="", help="free text recorded in meta.json")
    p.add_argument("--tokenizer", metavar="PATH",
                   help="the inputs are raw text: encode them with this local tokenizer.json, SentencePiece .model, "
                        "or a folder holding one")
    p.add_argument("--text-key", default="text", help="with --tokenizer: the .jsonl field holding the text (default text)")
    p.add_argument("--per-line", action="store_true",
                   help="with --tokenizer: a .txt file holds one document per line (default: the whole file is one)")
    p.add_argument("--eod-token", metavar="TOKEN", help="with --tokenizer: the end-of-document token by name "
                                                         "(e.g. '<|end_of_text|>') instead of --eod-id")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    return p


def _text_progress(args) -> tuple[TextOptions | None, object]:
    """The raw-text options and, on a terminal, a rich bar counting documents and megabytes."""
    if not args.tokenizer:
        if args.vocab_size is None:
            raise SpecError("--vocab-size is required for token files (or give --tokenizer for raw text)")
        return None, None
    bar = None
    on_document = None
    if sys.stderr.isatty():
        from rich.console import Console  # the bar loads only on a terminal
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                       console=Console(stderr=True), transient=True)
        task = bar.add_task("tokenizing")
        seen = {"docs": 0, "bytes": 0}

        def on_document(text: str) -> None:
            seen["docs"] += 1
            seen["bytes"] += len(text)
            if seen["docs"] % 256 == 0:
                bar.update(task, description=f"tokenizing: {seen['docs']:,} documents, {seen['bytes'] / 1e6:,.1f} MB")

        bar.start()
    return TextOptions(args.tokenizer, args.text_key, args.per_line, args.eod_token, on_document), bar


def _print_summary(summary: dict) -> None:
    splits = ", ".join(f"{s} {c['documents']:,} documents / {c['tokens']:,} tokens" for s, c in summary["splits"].items())
    print(f"wrote {summary['out']} ({summary['format']}, vocab {summary['vocab_size']}, {summary['dtype']}, "
          f"eod {summary['eod_id']}): {splits}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    bar = None
    try:
        text, bar = _text_progress(args)
        summary = convert(args.inputs, args.out, args.vocab_size, args.eod_id,
                          validation_documents=args.validation_documents,
                          validation_inputs=args.validation_inputs, source=args.source, text=text)
    except SpecError as exc:
        if args.json:
            print(json.dumps({"error": printable(str(exc), 4000), "exit_code": 2}))
        print(f"trainperf: error: {printable(str(exc), 4000)}", file=sys.stderr)
        return 2
    finally:
        if bar is not None:
            bar.stop()
    if args.json:
        print(json.dumps(summary))
    else:
        _print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
