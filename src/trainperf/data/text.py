"""Raw text into token ids through a tokenizer read from a local path, for `trainperf data convert
--tokenizer`: a Hugging Face ``tokenizers`` JSON (``tokenizer.json``) or a SentencePiece model
(``*.model``, with the optional ``sentencepiece`` package). Nothing is downloaded.

Inputs: ``.jsonl`` (one JSON object per line; its ``text`` field, or ``text_key``, is one document)
and ``.txt`` (the whole file one document, or one document per line with ``per_line``). Documents are
encoded in batches (the Rust tokenizer's ``encode_batch`` runs them on every core) without special
tokens: the converter appends the end-of-document id itself.

Inputs may come from anywhere: lines are read as bytes with a cap (:data:`MAX_LINE_BYTES`; a longer
line is refused before it is held, let alone tokenized), decoded as UTF-8 with the line named on a
failure, and parsed as depth-bounded JSON (core/untrusted.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainperf.core.errors import SpecError
from trainperf.core.untrusted import parse_untrusted_json, printable, read_untrusted_text

BATCH_DOCUMENTS = 512
# The longest line (and whole-file .txt document) read: the Rust tokenizer is slow and can panic on a
# single string of tens of MB, and a line is held whole in memory. Tests monkeypatch it.
MAX_LINE_BYTES = 16 * 2**20
TEXT_SUFFIXES = (".jsonl", ".txt")


@dataclass
class TextTokenizer:
    """A loaded tokenizer: its vocabulary size, a batch encoder and a token-to-id lookup."""

    path: str
    kind: str  # 'tokenizers' or 'sentencepiece'
    vocab_size: int
    encode_batch: Callable[[list[str]], list[list[int]]]
    token_to_id: Callable[[str], int | None]


def _hf_tokenizer(path: Path) -> TextTokenizer:
    try:  # the Rust tokenizer loads only for a text conversion
        from tokenizers import Tokenizer
    except ImportError:
        raise SpecError(f"--tokenizer {printable(path)!r} is a tokenizer.json, which needs the tokenizers package "
                        "(pip install tokenizers)") from None

    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # the library raises a bare Exception for a malformed file
        raise SpecError(f"--tokenizer {str(path)!r}: not a Hugging Face tokenizer.json ({str(exc).splitlines()[0]})") from None

    def encode(texts: list[str]) -> list[list[int]]:
        try:
            return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
        except BaseException as exc:  # a Rust panic arrives as pyo3's PanicException, a BaseException
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise SpecError(f"--tokenizer {printable(path)!r} failed on a batch of {len(texts)} documents "
                            f"({type(exc).__name__}: {printable(str(exc).splitlines()[0] if str(exc) else '', 120)})") from None

    return TextTokenizer(str(path), "tokenizers", tok.get_vocab_size(with_added_tokens=True), encode, tok.token_to_id)


def _sentencepiece(path: Path) -> TextTokenizer:
    try:
        import sentencepiece  # optional: only SentencePiece models need it
    except ImportError:
        raise SpecError(f"--tokenizer {str(path)!r} is a SentencePiece model, which needs the sentencepiece "
                        "package (pip install sentencepiece), or give a tokenizer.json") from None
    sp = sentencepiece.SentencePieceProcessor()
    try:
        sp.Load(str(path))
    except (OSError, RuntimeError) as exc:  # which of the two depends on the version
        raise SpecError(f"--tokenizer {str(path)!r}: not a SentencePiece model ({str(exc).splitlines()[0]})") from None

    def lookup(token: str) -> int | None:
        i = sp.PieceToId(token)
        return None if i == sp.unk_id() and token != sp.IdToPiece(i) else i

    return TextTokenizer(str(path), "sentencepiece", sp.GetPieceSize(), lambda texts: sp.Encode(texts), lookup)


def tokenizer_file(path: str) -> Path:
    """The file a --tokenizer path names: itself, or a folder's tokenizer.json (else tokenizer.model)."""
    p = Path(path)
    if p.is_dir():
        found = [p / n for n in ("tokenizer.json", "tokenizer.model") if (p / n).is_file()]
        if not found:
            raise SpecError(f"--tokenizer {printable(path)!r}: the folder holds neither tokenizer.json nor "
                            "tokenizer.model")
        p = found[0]
    if not p.is_file():
        raise SpecError(f"--tokenizer {printable(path)!r}: no such file (a tokenizer.json, a SentencePiece .model, "
                        "or a folder with one)")
    return p


def load_tokenizer(path: str) -> TextTokenizer:
    """The tokenizer at a local path: a tokenizer.json, a SentencePiece .model, or a folder with one."""
    p = tokenizer_file(path)
    return _sentencepiece(p) if p.suffix == ".model" else _hf_tokenizer(p)


def text_lines(f: Path) -> Iterator[tuple[str, str]]:
    """(FILE:LINE, text) of each line of a file, read as bytes: a line longer than MAX_LINE_BYTES or
    not UTF-8 is a SpecError naming it."""
    limit = MAX_LINE_BYTES
    with open(f, "rb") as fh:
        for lineno, raw in enumerate(iter(lambda: fh.readline(limit + 1), b""), 1):
            where = f"{printable(f)}:{lineno}"
            if len(raw) > limit:
                raise SpecError(f"{where}: a line longer than {limit:,} bytes; split it into documents of at most "
                                f"{limit // 2**20} MiB")
            try:
                yield where, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise SpecError(f"{where}: not UTF-8 text (byte {exc.start} of the line); give UTF-8 files") from None


def json_lines(f: Path) -> Iterator[tuple[str, object]]:
    """(FILE:LINE, parsed value) of each non-blank line of a .jsonl file; SpecError on one that is not
    JSON, nests too deep, or holds NaN."""
    for where, line in text_lines(f):
        if line.strip():
            yield where, parse_untrusted_json(line, where=where)


def _texts_jsonl(f: Path, text_key: str) -> Iterator[tuple[str, str]]:
    for where, obj in json_lines(f):
        if not isinstance(obj, dict) or not isinstance(obj.get(text_key), str):
            raise SpecError(f"{where}: expected a JSON object with a string {text_key!r} field "
                            "(--text-key names another)")
        yield where, obj[text_key]


def _texts_txt(f: Path, per_line: bool) -> Iterator[tuple[str, str]]:
    if not per_line:
        size = os.stat(f).st_size
        if size > MAX_LINE_BYTES:
            raise SpecError(f"{printable(f)}: {size:,} bytes as one document, more than the {MAX_LINE_BYTES:,} "
                            "read as one; give --per-line (a document per line) or split the file")
        text = read_untrusted_text(f, max_bytes=MAX_LINE_BYTES, what="input")
        yield str(f), text.replace("\r\n", "\n").replace("\r", "\n")  # as a text-mode read gives it
        return
    for where, line in text_lines(f):
        if line.strip():
            yield where, line.rstrip("\r\n")


def text_documents(files: list[str], text_key: str = "text", per_line: bool = False) -> Iterator[tuple[str, str]]:
    """(where, text) of every non-empty document of the inputs, in order."""
    for name in files:
        f = Path(name)
        if f.suffix.lower() not in TEXT_SUFFIXES:
            raise SpecError(f"{f}: with --tokenizer the inputs are raw text: .jsonl (a {text_key!r} field per line) "
                            "or .txt")
        if not f.is_file():
            raise SpecError(f"{f}: no such input file")
        docs = _texts_jsonl(f, text_key) if f.suffix.lower() == ".jsonl" else _texts_txt(f, per_line)
        yield from ((w, t) for w, t in docs if t.strip())


def tokenized_pieces(tok: TextTokenizer, files: list[str], text_key: str = "text", per_line: bool = False,
                     on_document: Callable[[str], None] | None = None) -> Iterator[tuple[str, int, np.ndarray, bool]]:
    """The converter's pieces (where, offset, ids, document ends) of raw-text inputs, encoded in batches."""
    batch: list[tuple[str, str]] = []

    def flush() -> Iterator[tuple[str, int, np.ndarray, bool]]:
        for (where, text), ids in zip(batch, tok.encode_batch([t for _, t in batch])):
            if on_document is not None:
                on_document(text)
            yield where, 0, np.asarray(ids, dtype=np.int64), True
        batch.clear()

    for doc in text_documents(files, text_key, per_line):
        batch.append(doc)
        if len(batch) >= BATCH_DOCUMENTS:
            yield from flush()
    yield from flush()
