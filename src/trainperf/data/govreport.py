"""Readers and writers for the two real MLPerf llama2_70b_lora GovReport dataset formats.

A directory given as ``data.path`` holds one of:

``govreport-parquet`` (the MLPerf reference format, read with ``load_dataset("parquet")``)
    ``train*.parquet`` and ``validation*.parquet`` (normally ``train-00000-of-00001.parquet`` and
    ``validation-00000-of-00001.parquet``; several shards are concatenated in sorted name order),
    either in the directory itself or in its ``data/`` subdirectory (the Hugging Face repo layout).
    Columns ``input_ids`` (list<int>) and ``labels`` (list<int>, -100 = no loss), optionally
    ``attention_mask`` (must be all ones: rows are packed, there is no padding).

``govreport-npy`` (NVIDIA's converted variant)
    ``train.npy`` and ``validation.npy`` written by ``np.save`` of a list of dicts
    ``{"input_ids": ..., "loss_mask": [0/1 ...], "seq_start_id": [0]}`` (an object array, i.e. a
    pickle inside the .npy). We never call ``np.load(allow_pickle=True)``: the header is parsed with
    ``numpy.lib.format`` and the payload is unpickled by a restricted unpickler whose ``find_class``
    allows only numpy's array/dtype/scalar reconstruction callables; any other global (``os.system``,
    ``builtins.eval`` ...) is refused with a SpecError before it is resolved.

If a directory holds both, the parquet files win (NVIDIA's converter deletes them, so both present
means the parquet files are the originals).

loss_mask convention (what ``TokenSplit.loss_mask`` means; see ``trainperf.data.tokens``):
``loss_mask[i, t]`` = token t of row i is a prediction target, predicted from tokens < t
(``trainperf.model.loss.shift_targets`` shifts it; ``loss_mask[:, 0]`` is never used).

* Parquet: Hugging Face causal-LM ``labels`` are aligned with ``input_ids`` and shifted inside the
  model (``logits[:, :-1]`` vs ``labels[:, 1:]``), so ``labels[t] != -100`` means token t is a
  target: ``loss_mask = labels != -100``. trainperf trains on ``input_ids`` as targets, so every
  label that is not -100 must equal the input id at the same position; anything else is a format
  error (reported, never silently "fixed").
* npy: NVIDIA builds its npy from the same parquet files with
  ``"loss_mask": [int(x != -100) for x in row["labels"]]`` — an unshifted, input-aligned copy of the
  labels mask (mlcommons/training_results_v4.0
  ``NVIDIA/benchmarks/llama2_70b_lora/implementations/nemo/scripts/convert_dataset.py``; identical
  in training_results_v4.1 ``NVIDIA/benchmarks/llama2_70b_lora/implementations/eos_ngc24.09_nemo/
  scripts/convert_dataset.py``, expected directory hash 02e1f87d26ece4943a47bedcad0da5d4). The
  consumer is NeMo's ``GPTSFTPackedDataset`` (config ``packed_sequence: True``; Dockerfile pins NeMo
  ``v2.0.0.rc0.beta`` for v4.0, ``24.09-alpha.rc0`` for v4.1), whose ``collate_fn`` takes
  ``tokens = input_ids[b:e-1]``, ``labels = input_ids[b+1:e]`` and, with ``answer_only_loss``,
  ``loss_mask = loss_mask[b+1:e]`` (NeMo v2.0.0rc0
  ``nemo/collections/nlp/data/language_modeling/megatron/gpt_sft_dataset.py``,
  ``GPTSFTPackedDataset._build_loss_mask``). So npy ``loss_mask[t]`` weights the prediction of
  ``input_ids[t]``: exactly our convention and exactly ``labels != -100``. No conversion is needed;
  both formats give identical TokenSplits for identical underlying data (tested).
  Caveat: the later NeMo 2 ``nemo/collections/llm/gpt/data/core.py`` (and Megatron-Bridge) slice
  ``loss_mask[b:e-1]``, i.e. they expect masks that NeMo's own newer packing tool stores already
  shifted onto the labels. The MLPerf npy files are not produced by that tool but by
  ``convert_dataset.py`` above, so they are input-aligned regardless of which NeMo reads them.

Real data: 8192 tokens per row, 3901 train rows, 173 validation rows; train labels cover every
token, validation labels mask the prompt and the final EOS (some validation rows may have no target
at all; MLPerf skips them in the eval mean, so they are counted, not rejected).
"""

from __future__ import annotations

import io
import logging
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainperf.core.errors import SpecError
from trainperf.core.files import atomic_write
from trainperf.data.tokens import TokenSplit

SPLITS = ("train", "validation")
PARQUET = "govreport-parquet"
NPY = "govreport-npy"
IGNORE_INDEX = -100

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- common helpers


def _line(exc: BaseException) -> str:
    """First line of an exception's text, for one-line SpecError messages."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _where(path: str, file: Path) -> str:
    return f"data.path {path!r}: {file.name}"


def _parquet_dir(p: Path) -> Path | None:
    for d in (p, p / "data"):
        if d.is_dir() and any(f.is_file() for s in SPLITS for f in d.glob(f"{s}*.parquet")):
            return d
    return None


def detect(path: str) -> str | None:
    """"govreport-parquet", "govreport-npy", or None when ``path`` holds neither format."""
    p = Path(path)
    if not p.is_dir():
        return None
    if _parquet_dir(p) is not None:
        return PARQUET
    if any((p / f"{s}.npy").is_file() for s in SPLITS):
        return NPY
    return None


def _format(path: str) -> str:
    p = Path(path)
    if not p.is_dir():
        raise SpecError(f"data.path {path!r} is not a directory (expected MLPerf GovReport train-*.parquet and "
                        f"validation-*.parquet, or NVIDIA's train.npy and validation.npy)")
    fmt = detect(path)
    if fmt is None:
        raise SpecError(f"data.path {path!r} holds no GovReport files (expected train-*.parquet and "
                        f"validation-*.parquet, or NVIDIA's train.npy and validation.npy)")
    return fmt


def _check_split_name(split: str) -> None:
    if split not in SPLITS:
        raise SpecError(f"unknown split {split!r}; valid splits are {', '.join(SPLITS)}")


def _vocab_check(what: str, ids: np.ndarray, vocab_size: int) -> None:
    if ids.size == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab_size:
        bad = np.argwhere((ids < 0) | (ids >= vocab_size))[0]
        raise SpecError(f"{what} token ids span [{lo}, {hi}] (row {int(bad[0])} position {int(bad[1])} holds "
                        f"{int(ids[tuple(bad)])}), outside the model's vocabulary [0, {vocab_size})")


def _target_counts(mask: np.ndarray) -> tuple[int, int]:
    """(target tokens, rows without any target) counting positions >= 1 only (position 0 has no context)."""
    per_row = mask[:, 1:].sum(axis=1) if mask.shape[1] > 1 else np.zeros(mask.shape[0], dtype=np.int64)
    return int(per_row.sum()), int((per_row == 0).sum())


def _to_numpy_2d(x: Any, name: str) -> np.ndarray:
    a = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    if a.ndim != 2:
        raise SpecError(f"{name} must be a 2-D [rows, seq] array, got shape {list(a.shape)}")
    return a


def _writer_inputs(input_ids: Any, loss_mask: Any) -> tuple[np.ndarray, np.ndarray]:
    ids = _to_numpy_2d(input_ids, "input_ids")
    mask = _to_numpy_2d(loss_mask, "loss_mask")
    if ids.shape != mask.shape:
        raise SpecError(f"input_ids {list(ids.shape)} and loss_mask {list(mask.shape)} must have equal shapes")
    if not np.issubdtype(ids.dtype, np.integer):
        raise SpecError(f"input_ids must be integers, got {ids.dtype}")
    if mask.dtype != np.bool_:
        if not np.isin(mask, (0, 1)).all():
            raise SpecError("loss_mask must hold only 0/1 (or bool)")
        mask = mask.astype(np.bool_)
    return ids.astype(np.int64), mask


def _id_dtype(ids: np.ndarray) -> type:
    return np.int32 if ids.size == 0 or (int(ids.min()) >= np.iinfo(np.int32).min
                                         and int(ids.max()) <= np.iinfo(np.int32).max) else np.int64


# ----------------------------------------------------------------------------- parquet


def _pa():
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SpecError(f"reading GovReport parquet files needs pyarrow ({_line(exc)}); "
                        f"install it with pip install pyarrow") from None
    return pa, pc, pq


def _parquet_files(path: str, split: str) -> list[Path]:
    d = _parquet_dir(Path(path))
    files = sorted(f for f in d.glob(f"{split}*.parquet") if f.is_file()) if d is not None else []
    if not files:
        where = d if d is not None else Path(path)
        raise SpecError(f"data.path {path!r} has no {split}*.parquet in {str(where)!r} (MLPerf GovReport parquet "
                        f"needs train-00000-of-00001.parquet and validation-00000-of-00001.parquet)")
    return files


def _int_list_type(t) -> bool:
    pa, _, _ = _pa()
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return pa.types.is_integer(t.value_type)
    return False


def _check_parquet_schema(path: str, f: Path, schema) -> bool:
    """Validate columns; return whether attention_mask is present."""
    names = schema.names
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # which of the two a reader takes is undefined
        raise SpecError(f"{_where(path, f)} has the column{'s' if len(twice) > 1 else ''} {', '.join(twice)} more "
                        "than once; write each column once")
    for col in ("input_ids", "labels"):
        if col not in names:
            raise SpecError(f"{_where(path, f)} has columns {names} but needs input_ids and labels "
                            f"(list<int>, labels -100 where there is no loss)")
        if not _int_list_type(schema.field(col).type):
            raise SpecError(f"{_where(path, f)} column {col} has type {schema.field(col).type}, "
                            f"expected a list of integers")
    has_attn = "attention_mask" in names
    if has_attn and not _int_list_type(schema.field("attention_mask").type):
        raise SpecError(f"{_where(path, f)} column attention_mask has type {schema.field('attention_mask').type}, "
                        f"expected a list of integers")
    return has_attn


def _inspect_parquet(path: str, split: str, seq_len: int, vocab_size: int) -> int:
    pa, _, pq = _pa()
    rows = 0
    for f in _parquet_files(path, split):
        try:
            pf = pq.ParquetFile(str(f))
            schema = pf.schema_arrow
            md = pf.metadata
        except Exception as exc:
            raise SpecError(f"{_where(path, f)} is not a readable parquet file ({_line(exc)})") from None
        _check_parquet_schema(path, f, schema)
        n = md.num_rows
        rows += n
        if n == 0:
            continue
        for col in ("input_ids", "labels"):
            t = schema.field(col).type
            if pa.types.is_fixed_size_list(t) and t.list_size != seq_len:
                raise SpecError(f"{_where(path, f)} column {col} is a fixed list of {t.list_size} tokens "
                                f"but data.seq_len={seq_len}")
        # Leaf value counts from the footer: rows * seq_len when every row has seq_len tokens.
        leaf = {md.schema.column(i).path.split(".")[0]: i for i in range(md.num_columns)}
        for col in ("input_ids", "labels"):
            total = sum(md.row_group(g).column(leaf[col]).num_values for g in range(md.num_row_groups))
            if total != n * seq_len:
                raise SpecError(f"{_where(path, f)} column {col} holds {total} tokens in {n} rows "
                                f"({total / n:.1f} per row), expected {seq_len} per row (data.seq_len={seq_len})")
        # Token id range from the footer statistics, when the writer stored them.
        i = leaf["input_ids"]
        for g in range(md.num_row_groups):
            st = md.row_group(g).column(i).statistics
            if st is not None and st.has_min_max and (int(st.min) < 0 or int(st.max) >= vocab_size):
                raise SpecError(f"{_where(path, f)} input_ids span [{int(st.min)}, {int(st.max)}] (row group {g}), "
                                f"outside the model's vocabulary [0, {vocab_size})")
        try:
            first = next(pf.iter_batches(batch_size=1, columns=["input_ids", "labels"]))
            lens = [len(first.column(c)[0]) if first.column(c)[0].is_valid else None for c in ("input_ids", "labels")]
        except Exception as exc:
            raise SpecError(f"{_where(path, f)} is not a readable parquet file ({_line(exc)})") from None
        if lens != [seq_len, seq_len]:
            raise SpecError(f"{_where(path, f)} row 0 has {lens[0]} input_ids and {lens[1]} labels, "
                            f"expected {seq_len} each (data.seq_len={seq_len})")
    if rows == 0:
        raise SpecError(f"data.path {path!r}: {split}*.parquet has no rows (the {split} split needs at least one row)")
    return rows


def _list_column_2d(pa, pc, col, name: str, what: str, row0: int) -> np.ndarray:
    """A (chunked) list<int> column whose rows all have one length -> int64 [rows, L]."""
    parts = []
    width = None
    for chunk in col.chunks if hasattr(col, "chunks") else [col]:
        if len(chunk) == 0:
            continue
        if chunk.null_count:
            bad = row0 + int(np.flatnonzero(~np.asarray(chunk.is_valid()))[0])
            raise SpecError(f"{what} column {name} is null in row {bad}")
        lens = np.asarray(pc.list_value_length(chunk))
        w = int(lens[0]) if width is None else width
        if (lens != w).any():
            bad = int(np.flatnonzero(lens != w)[0])
            raise SpecError(f"{what} column {name} row {row0 + bad} has {int(lens[bad])} tokens but other rows have "
                            f"{w}; every row must have data.seq_len tokens")
        width = w
        values = chunk.flatten()
        if values.null_count:
            raise SpecError(f"{what} column {name} holds null tokens")
        parts.append(values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False).reshape(len(chunk), w))
        row0 += len(chunk)
    if not parts:
        return np.zeros((0, 0), dtype=np.int64)
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


def _read_parquet(path: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    pa, pc, pq = _pa()
    all_ids, all_mask = [], []
    for f in _parquet_files(path, split):
        what = _where(path, f)
        try:
            pf = pq.ParquetFile(str(f))
            has_attn = _check_parquet_schema(path, f, pf.schema_arrow)
            cols = ["input_ids", "labels"] + (["attention_mask"] if has_attn else [])
            table = pf.read(columns=cols)
        except SpecError:
            raise
        except Exception as exc:
            raise SpecError(f"{what} is not a readable parquet file ({_line(exc)})") from None
        if table.num_rows == 0:
            continue
        ids = _list_column_2d(pa, pc, table.column("input_ids"), "input_ids", what, 0)
        labels = _list_column_2d(pa, pc, table.column("labels"), "labels", what, 0)
        if labels.shape != ids.shape:
            raise SpecError(f"{what} rows have {ids.shape[1]} input_ids but {labels.shape[1]} labels; they must match")
        bad = (labels != IGNORE_INDEX) & (labels != ids)
        if bad.any():
            r, t = (int(v) for v in np.argwhere(bad)[0])
            raise SpecError(f"{what} row {r} position {t}: labels={int(labels[r, t])} but input_ids={int(ids[r, t])} "
                            f"({int(bad.sum())} such tokens); labels must equal input_ids or be -100, since trainperf "
                            f"predicts input_ids")
        if has_attn:
            attn = _list_column_2d(pa, pc, table.column("attention_mask"), "attention_mask", what, 0)
            if attn.shape != ids.shape:
                raise SpecError(f"{what} rows have {ids.shape[1]} input_ids but {attn.shape[1]} attention_mask "
                                f"entries; they must match")
            if (attn != 1).any():
                r, t = (int(v) for v in np.argwhere(attn != 1)[0])
                raise SpecError(f"{what} attention_mask is {int(attn[r, t])} at row {r} position {t}; only all-ones "
                                f"masks (packed rows without padding) are supported")
        if all_ids and all_ids[0].shape[1] != ids.shape[1]:
            raise SpecError(f"{what} rows have {ids.shape[1]} tokens but earlier {split} shards have "
                            f"{all_ids[0].shape[1]}; every row must have data.seq_len tokens")
        all_ids.append(ids)
        all_mask.append(labels != IGNORE_INDEX)
    if not all_ids:
        raise SpecError(f"data.path {path!r}: {split}*.parquet has no rows (the {split} split needs at least one row)")
    return np.concatenate(all_ids), np.concatenate(all_mask)


def write_govreport_parquet(dir: str | os.PathLike, split_name: str, input_ids: Any, loss_mask: Any) -> Path:
    """Write ``DIR/{split}-00000-of-00001.parquet`` in the MLPerf format (input_ids, labels, attention_mask).

    labels = input_ids where loss_mask else -100 (list<int64>, like HF); input_ids list<int32> (int64 when the
    ids do not fit); attention_mask list<int8> of ones. Refuses to write next to other shards of the same split
    (they would be concatenated on read).
    """
    _check_split_name(split_name)
    pa, _, pq = _pa()
    ids, mask = _writer_inputs(input_ids, loss_mask)
    d = Path(dir)
    target = d / f"{split_name}-00000-of-00001.parquet"
    others = [f.name for f in d.glob(f"{split_name}*.parquet") if f.name != target.name] if d.is_dir() else []
    if others:
        raise SpecError(f"{str(d)!r} already holds other {split_name} shards {sorted(others)}; they would be "
                        f"concatenated with {target.name} on read")
    rows, seq = ids.shape
    labels = np.where(mask, ids, IGNORE_INDEX).astype(np.int64)

    def lists(values: np.ndarray, typ) -> Any:
        offsets = pa.array(np.arange(0, rows * seq + 1, seq, dtype=np.int32))
        return pa.ListArray.from_arrays(offsets, pa.array(values.reshape(-1), type=typ))

    table = pa.table({
        "input_ids": lists(ids.astype(_id_dtype(ids)), pa.from_numpy_dtype(_id_dtype(ids))),
        "labels": lists(labels, pa.int64()),
        "attention_mask": lists(np.ones_like(ids, dtype=np.int8), pa.int8()),
    })
    return atomic_write(target, lambda tmp: pq.write_table(table, tmp))


# ----------------------------------------------------------------------------- npy (restricted unpickling)


def _numpy_callables() -> dict[tuple[str, str], Any]:
    try:
        from numpy._core import multiarray as ma
        from numpy._core import numeric as nm
    except ImportError:  # numpy < 2
        from numpy.core import multiarray as ma  # type: ignore[no-redef]
        from numpy.core import numeric as nm  # type: ignore[no-redef]
    import _codecs

    allowed: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        # protocol-2 pickles encode array bytes as latin-1 text and rebuild them with _codecs.encode
        ("_codecs", "encode"): _codecs.encode,
    }
    # numpy 1.x writes numpy.core.*, numpy 2.x numpy._core.*; both resolve to the running numpy's objects
    # without importing the deprecated numpy.core shim.
    for mod in ("numpy.core", "numpy._core"):
        allowed[(f"{mod}.multiarray", "_reconstruct")] = ma._reconstruct
        allowed[(f"{mod}.multiarray", "scalar")] = ma.scalar
        if hasattr(nm, "_frombuffer"):
            allowed[(f"{mod}.numeric", "_frombuffer")] = nm._frombuffer
    return allowed


_ALLOWED = _numpy_callables()


class UnsafePickleError(pickle.UnpicklingError):
    """The payload references a global outside the allow-list; nothing was called."""

    def __init__(self, module: str, name: str):
        super().__init__(f"{module}.{name}")
        self.module, self.name = module, name


class _Restricted:
    def find_class(self, module: str, name: str) -> Any:  # noqa: D401 - pickle API
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise UnsafePickleError(module, name) from None

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not allowed")


class _RestrictedUnpickler(_Restricted, pickle.Unpickler):
    """C unpickler for full loads."""


class _FirstRow(Exception):
    def __init__(self, row: Any):
        self.row = row


class _FirstRowUnpickler(_Restricted, pickle._Unpickler):  # type: ignore[name-defined]
    """Pure-Python unpickler that stops when the second row dict begins; the first is then on top of the stack.

    np.save of a list of dicts pickles ``_reconstruct(...)`` then ``BUILD`` with state
    ``(1, shape, dtype('O'), False, [dict0, dict1, ...])``; the dicts hold only arrays/lists, so the second
    EMPTY_DICT opcode marks the end of row 0.
    """

    dispatch = dict(pickle._Unpickler.dispatch)  # type: ignore[attr-defined]
    _dicts = 0

    def _load_empty_dict(self) -> None:
        self._dicts += 1
        if self._dicts == 2:
            raise _FirstRow(self.stack[-1] if self.stack else None)
        pickle._Unpickler.load_empty_dictionary(self)  # type: ignore[attr-defined]

    dispatch[pickle.EMPTY_DICT[0]] = _load_empty_dict


def _npy_header(path: str, f: Path, fh) -> tuple[tuple[int, ...], np.dtype, int]:
    from numpy.lib import format as npf

    try:
        version = npf.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = npf.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, fortran, dtype = npf.read_array_header_2_0(fh)
        else:
            raise ValueError(f"unsupported .npy format version {version}")
    except Exception as exc:
        raise SpecError(f"{_where(path, f)} is not a readable .npy file ({_line(exc)})") from None
    return shape, dtype, fh.tell()


def _npy_file(path: str, split: str) -> Path:
    f = Path(path) / f"{split}.npy"
    if not f.is_file():
        raise SpecError(f"data.path {path!r} has no {split}.npy (NVIDIA's GovReport format needs train.npy and "
                        f"validation.npy)")
    return f


def _check_object_array(path: str, f: Path, shape: tuple[int, ...], dtype: np.dtype) -> None:
    if dtype != np.dtype(object) or len(shape) != 1:
        raise SpecError(f"{_where(path, f)} holds a {dtype} array of shape {list(shape)}; expected NVIDIA's 1-D "
                        f"object array of {{input_ids, loss_mask, seq_start_id}} dicts (np.save of a list of dicts)")


def _unsafe(path: str, f: Path, exc: UnsafePickleError) -> SpecError:
    return SpecError(f"{_where(path, f)} references {exc.module}.{exc.name} in its pickle payload; refused to "
                     f"unpickle it (only numpy array/dtype reconstruction is allowed)")


def _npy_row(what: str, i: int, row: Any) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(row, dict):
        raise SpecError(f"{what} row {i} is a {type(row).__name__}, expected a dict with input_ids, loss_mask "
                        f"and seq_start_id")
    missing = [k for k in ("input_ids", "loss_mask") if k not in row]
    if missing:
        raise SpecError(f"{what} row {i} has keys {sorted(map(str, row))}, missing {missing} (expected input_ids, "
                        f"loss_mask, seq_start_id)")
    ids = np.asarray(row["input_ids"])
    mask = np.asarray(row["loss_mask"])
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise SpecError(f"{what} row {i} input_ids is a {ids.dtype} array of shape {list(ids.shape)}, expected a "
                        f"1-D list of integers")
    if mask.ndim != 1 or mask.shape != ids.shape:
        raise SpecError(f"{what} row {i} has {ids.shape[0]} input_ids but loss_mask of shape {list(mask.shape)}; "
                        f"they must have equal lengths")
    if mask.dtype != np.bool_:
        if not (np.issubdtype(mask.dtype, np.number) and np.isin(mask, (0, 1)).all()):
            raise SpecError(f"{what} row {i} loss_mask holds values other than 0/1")
        mask = mask != 0
    starts = row.get("seq_start_id", [0])
    starts_list = np.asarray(starts).reshape(-1).tolist() if not isinstance(starts, list) else starts
    if starts_list != [0]:
        raise SpecError(f"{what} row {i} has seq_start_id {starts_list[:8]}; only [0] (one causal sequence per row, "
                        f"as in the MLPerf files) is supported")
    return ids.astype(np.int64, copy=False), mask


def _npy_first_row(path: str, f: Path, offset: int, size: int) -> Any:
    """Row 0 of an object-array npy, read from a bounded prefix with the restricted pure-Python unpickler."""
    with open(f, "rb") as fh:
        fh.seek(offset)
        limit = 1 << 20
        while True:
            chunk_len = min(limit, size - offset)
            fh.seek(offset)
            data = fh.read(chunk_len)
            up = _FirstRowUnpickler(io.BytesIO(data))
            try:
                arr = up.load()
            except _FirstRow as done:
                return done.row
            except UnsafePickleError as exc:
                raise _unsafe(path, f, exc) from None
            except Exception as exc:
                if chunk_len < size - offset and limit < (256 << 20):
                    limit *= 16
                    continue
                raise SpecError(f"{_where(path, f)} has a corrupt or truncated pickle payload ({_line(exc)})") from None
            if not isinstance(arr, np.ndarray) or arr.dtype != object or arr.ndim != 1:
                raise SpecError(f"{_where(path, f)} pickle payload is a {type(arr).__name__}, expected a 1-D object "
                                f"array of dicts")
            return arr[0] if len(arr) else None


def _inspect_npy(path: str, split: str, seq_len: int, vocab_size: int) -> int:
    f = _npy_file(path, split)
    size = f.stat().st_size
    with open(f, "rb") as fh:
        shape, dtype, offset = _npy_header(path, f, fh)
        _check_object_array(path, f, shape, dtype)
        fh.seek(size - 1)
        last = fh.read(1)
    rows = shape[0]
    if rows == 0:
        raise SpecError(f"{_where(path, f)} has no rows (the {split} split needs at least one row)")
    if size <= offset or last != pickle.STOP:
        raise SpecError(f"{_where(path, f)} is truncated: its pickle payload does not end with the STOP opcode")
    first = _npy_first_row(path, f, offset, size)
    what = _where(path, f)
    ids, mask = _npy_row(what, 0, first)
    if ids.shape[0] != seq_len:
        raise SpecError(f"{what} row 0 has {ids.shape[0]} tokens but data.seq_len={seq_len}")
    _vocab_check(f"{what} row 0", ids[None], vocab_size)
    return rows


def _read_npy(path: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    f = _npy_file(path, split)
    what = _where(path, f)
    with open(f, "rb") as fh:
        shape, dtype, _ = _npy_header(path, f, fh)
        _check_object_array(path, f, shape, dtype)
        if shape[0] == 0:
            raise SpecError(f"{what} has no rows (the {split} split needs at least one row)")
        try:
            arr = _RestrictedUnpickler(fh).load()
        except UnsafePickleError as exc:
            raise _unsafe(path, f, exc) from None
        except Exception as exc:
            raise SpecError(f"{what} has a corrupt or truncated pickle payload ({_line(exc)})") from None
    if not isinstance(arr, np.ndarray) or arr.dtype != object or arr.shape != tuple(shape):
        got = f"{arr.dtype} array of shape {list(arr.shape)}" if isinstance(arr, np.ndarray) else type(arr).__name__
        raise SpecError(f"{what} pickle payload is a {got}, but its header says an object array of shape {list(shape)}")
    ids_rows, mask_rows = [], []
    for i, row in enumerate(arr):
        ids, mask = _npy_row(what, i, row)
        if ids_rows and ids.shape[0] != ids_rows[0].shape[0]:
            raise SpecError(f"{what} row {i} has {ids.shape[0]} tokens but row 0 has {ids_rows[0].shape[0]}; every "
                            f"row must have data.seq_len tokens")
        ids_rows.append(ids)
        mask_rows.append(mask)
    return np.stack(ids_rows), np.stack(mask_rows)


def write_govreport_npy(dir: str | os.PathLike, split_name: str, input_ids: Any, loss_mask: Any) -> Path:
    """Write ``DIR/{split}.npy`` like NVIDIA's convert_dataset.py: np.save of a list of
    ``{"input_ids": int array, "loss_mask": [0/1 ints], "seq_start_id": [0]}`` dicts."""
    _check_split_name(split_name)
    ids, mask = _writer_inputs(input_ids, loss_mask)
    ids = ids.astype(_id_dtype(ids))
    arr = np.empty(ids.shape[0], dtype=object)
    for i in range(ids.shape[0]):
        arr[i] = {"input_ids": ids[i].copy(), "loss_mask": [int(x) for x in mask[i]], "seq_start_id": [0]}

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.save(fh, arr, allow_pickle=True)

    return atomic_write(Path(dir) / f"{split_name}.npy", write)


# ----------------------------------------------------------------------------- public API


def inspect_govreport(path: str, seq_len: int, vocab_size: int) -> dict[str, int]:
    """Cheap pre-launch check (parquet footers + first row; npy header + first row). Rows per split."""
    fmt = _format(path)
    inspect = _inspect_parquet if fmt == PARQUET else _inspect_npy
    return {split: inspect(path, split, seq_len, vocab_size) for split in SPLITS}


def _read_split(path: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    _check_split_name(split)
    fmt = _format(path)
    return _read_parquet(path, split) if fmt == PARQUET else _read_npy(path, split)


def scan_govreport(path: str, split: str, vocab_size: int) -> dict[str, int]:
    """Full pass over one split: formats, token range, labels/mask consistency. Returns counts:
    rows, seq_len, target_tokens and rows_without_target (targets at positions >= 1)."""
    ids, mask = _read_split(path, split)
    what = f"data.path {path!r}: {split} split"
    _vocab_check(what, ids, vocab_size)
    targets, empty = _target_counts(mask)
    if targets == 0:
        raise SpecError(f"{what} has no loss targets in any of its {ids.shape[0]} rows (labels all -100 / "
                        f"loss_mask all 0 after position 0)")
    return {"rows": int(ids.shape[0]), "seq_len": int(ids.shape[1]), "target_tokens": targets,
            "rows_without_target": empty}


def verify_govreport_tokens(path: str, split: str, vocab_size: int) -> None:
    """Full pass: every id in [0, vocab_size), labels consistent with input_ids, loss_mask 0/1, equal row lengths,
    at least one target in the split (rows without a target are allowed and only counted); SpecError otherwise."""
    stats = scan_govreport(path, split, vocab_size)
    log.info("govreport %s: %d rows x %d tokens, %d target tokens, %d rows without a target",
             split, stats["rows"], stats["seq_len"], stats["target_tokens"], stats["rows_without_target"])


def load_govreport(path: str, split: str) -> TokenSplit:
    """Read a split as a TokenSplit (input_ids int64 [rows, seq], loss_mask bool [rows, seq])."""
    ids, mask = _read_split(path, split)
    return TokenSplit(torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)),
                      torch.from_numpy(np.ascontiguousarray(mask, dtype=np.bool_)))
