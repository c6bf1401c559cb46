"""A GPT checkpoint saved by ``torch.distributed.checkpoint`` (DCP: Megatron Core's ``torch_dist`` format,
or any DCP folder of Megatron-named tensors) into the safetensors layout trainperf loads
(model/checkpoint.py: Megatron names + a config.json of Megatron's arguments). No pickle runs code:

* the folder's ``.metadata`` is a pickle (DCP has no other metadata format), read here, capped in
  size, with an unpickler that admits only DCP's own metadata classes, torch dtypes/sizes/layouts,
  paths and plain containers -- anything else is refused (``read_dcp_metadata``);
* every model tensor's entry is then checked (``check_dcp_metadata``): a float dtype, a shape and
  chunks that tile it, each chunk's bytes a slice inside a regular file of the folder (no absolute
  name, no ``..``, no link out) large enough for it, stored as uncompressed torch.save records;
* only then are the tensors allocated and read by DCP itself (``torch.distributed.checkpoint.load``,
  single process), which reads tensor payloads with ``torch.load(weights_only=True)``.

Accepted names: model/gpt.py's per-layer names, optionally under a ``model.`` prefix; layers stacked
on a leading dimension (``decoder.layers.mlp.linear_fc1.weight`` [L, ffn, hidden], Megatron Core's
``torch_dist`` form); and Transformer Engine's fused LayerNorm names (``linear_qkv.layer_norm_weight``
is the input LayerNorm, ``linear_fc1.layer_norm_weight`` the pre-MLP one). Optimizer states, RNG
states and ``_extra_state`` entries are not model tensors and are skipped.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import pickletools
import re
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trainperf.core.errors import SpecError
from trainperf.core.files import new_output_dir
from trainperf.core.spec import ModelSpec
from trainperf.core.untrusted import member_file, printable, read_untrusted_bytes

MAX_METADATA_BYTES = 1 << 30  # a 175B GPT's DCP metadata is tens of MB
MAX_CHUNKS = 4096  # saved blocks of one tensor (TP x PP x DP shards of a large run stay far below)
MAX_NDIM = 8
MAX_DIM = 1 << 40
DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what a safetensors GPT checkpoint holds

# module -> the names the metadata pickle may refer to (DCP's metadata dataclasses and what they hold)
_ALLOWED = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                                              "ChunkStorageMetadata", "TensorProperties", "MetadataIndex",
                                              "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path"},
    "collections": {"OrderedDict"},
    "builtins": {"set", "frozenset", "slice", "tuple", "list", "dict"},
}
MODEL_PREFIXES = ("embedding.", "decoder.", "output_layer.")
TE_NORM_NAMES = {"self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
                 "self_attention.linear_qkv.layer_norm_bias": "input_layernorm.bias",
                 "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
                 "mlp.linear_fc1.layer_norm_bias": "pre_mlp_layernorm.bias"}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if name in _ALLOWED.get(module, ()) or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it refers to {module}.{name}, which a DCP metadata file does not hold")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("it holds a persistent reference, which a DCP metadata file does not hold")


def read_dcp_metadata(path: Path):
    """The folder's DCP metadata, through the allow-listing unpickler; SpecError when absent or foreign.

    DCP has no other metadata format than this pickle (FileSystemReader.read_metadata calls
    ``pickle.load``), so it is read here instead: a regular file inside the folder, at most
    :data:`MAX_METADATA_BYTES`, unpickled with only DCP's metadata classes, torch dtypes/sizes/layouts,
    paths and plain containers admitted."""
    from torch.distributed.checkpoint.metadata import Metadata  # the type a DCP .metadata must hold

    path = Path(path)
    f = path / ".metadata"
    if not os.path.lexists(f):
        raise SpecError(f"{printable(path)!r} is not a torch.distributed.checkpoint folder (no .metadata file)")
    raw = read_untrusted_bytes(f, max_bytes=MAX_METADATA_BYTES, root=path, what="DCP metadata")
    try:
        _check_opcodes(raw)
        md = _MetadataUnpickler(io.BytesIO(raw)).load()
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is a bad input file
        raise SpecError(f"{printable(f)!r} is not a readable DCP metadata file "
                        f"({printable(_first_line(exc), 160)})") from None
    if not isinstance(md, Metadata):
        raise SpecError(f"{printable(f)!r} holds a {type(md).__name__}, not DCP Metadata")
    return md


def _check_opcodes(raw: bytes) -> None:
    """Walk the pickle's opcodes without running any (pickletools): every length it announces must lie
    inside the file, and no out-of-band buffer or bytearray opcode appears (DCP metadata holds none).
    The C unpickler allocates an announced length before reading it, and a bytearray8 of an absurd
    length makes CPython print a stray SystemError; this walk refuses both first."""
    for op, _, _ in pickletools.genops(raw):  # raises ValueError on a length past the end
        if op.name in ("BYTEARRAY8", "NEXT_BUFFER", "READONLY_BUFFER"):
            raise pickle.UnpicklingError(f"it holds a {op.name} opcode, which a DCP metadata file does not hold")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _dims(value, what: str, where: str) -> tuple[int, ...]:
    """A shape or offset of the metadata as non-negative ints, each at most MAX_DIM."""
    if not isinstance(value, (tuple, list)) or len(value) > MAX_NDIM or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_DIM for v in value):
        raise SpecError(f"{where}: {what} is {printable(repr(value), 80)}; expected at most {MAX_NDIM} "
                        f"integers in [0, {MAX_DIM}]")
    return tuple(value)


class _Window(io.RawIOBase):
    """Bytes [offset, offset+length) of an open file, as a seekable file of its own (for zipfile)."""

    def __init__(self, fh, offset: int, length: int):
        super().__init__()
        self.fh, self.offset, self.length, self.pos = fh, offset, length, 0

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.length}[whence]
        self.pos = min(max(base + pos, 0), self.length)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, b) -> int:
        n = min(len(b), self.length - self.pos)
        if n <= 0:
            return 0
        self.fh.seek(self.offset + self.pos)
        data = self.fh.read(n)  # a copy, not a view of ``b``: no buffer export outlives the call
        b[:len(data)] = data
        self.pos += len(data)
        return len(data)


def _check_payload(fh, offset: int, length: int, where: str) -> None:
    """A tensor payload DCP will hand to ``torch.load(weights_only=True)``: a zip whose records are all
    stored uncompressed inside the slice, so no record can unpack to more than the slice's bytes."""
    try:
        with zipfile.ZipFile(_Window(fh, offset, length)) as z:
            infos = z.infolist()
    except Exception as exc:  # noqa: BLE001 - zipfile raises many kinds (BadZipFile, NotImplementedError, ...)
        raise SpecError(f"{where}: the stored tensor is not a torch.save archive ({printable(_first_line(exc), 120)})") from None
    total = 0
    for info in infos:
        total += info.file_size
        if info.compress_type != zipfile.ZIP_STORED or info.header_offset + info.file_size > length or total > length:
            raise SpecError(f"{where}: the stored tensor's record {printable(info.filename, 60)} is compressed or "
                            f"larger than its {length:,} bytes; DCP writes them uncompressed")


def _check_storage(path: Path, files: dict[str, tuple[Path, int]], info, where: str, need: int) -> None:
    """The bytes a chunk is read from: a file of the folder, a slice inside it of at least ``need``
    bytes, with no stream transforms (a decompressor could unpack any amount)."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo  # the storage entry DCP writes

    if not isinstance(info, _StorageInfo):
        raise SpecError(f"{where}: its storage entry is a {type(info).__name__}, not DCP's storage info")
    name = getattr(info, "relative_path", None)
    if not isinstance(name, str) or name not in files:
        f = member_file(path, name, what="DCP data file", index="the DCP metadata")
        files[name] = (f, os.stat(f).st_size)
    size = files[name][1]
    offset, length = getattr(info, "offset", None), getattr(info, "length", None)
    if not (isinstance(offset, int) and isinstance(length, int) and not isinstance(offset, bool)
            and not isinstance(length, bool) and offset >= 0 and length >= 0 and offset + length <= size):
        raise SpecError(f"{where}: stored at offset {printable(repr(offset), 30)}, length {printable(repr(length), 30)} "
                        f"of {printable(name)}, which holds {size:,} bytes; offsets and lengths must lie inside it")
    if length < need:
        raise SpecError(f"{where}: {length:,} stored bytes cannot hold its {need:,} bytes of tensor data")
    if getattr(info, "transform_descriptors", None):
        raise SpecError(f"{where}: stored through the transforms {printable(repr(info.transform_descriptors), 60)}; "
                        "only untransformed DCP data is read")


def _check_chunks(chunks, size: tuple[int, ...], where: str) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The chunks of a tensor: inside it, disjoint, and covering it exactly (so no element is left
    unread: the tensors are allocated uninitialised)."""
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata  # a saved block of the tensor

    if not isinstance(chunks, list) or not 1 <= len(chunks) <= MAX_CHUNKS:
        raise SpecError(f"{where}: {len(chunks) if isinstance(chunks, list) else printable(repr(chunks), 40)} "
                        f"chunks; a tensor is saved as 1 to {MAX_CHUNKS} chunks")
    out = []
    for c in chunks:
        if not isinstance(c, ChunkStorageMetadata):
            raise SpecError(f"{where}: a chunk is a {type(c).__name__}, not DCP's chunk metadata")
        off = _dims(getattr(c, "offsets", None), "a chunk's offsets", where)
        sz = _dims(getattr(c, "sizes", None), "a chunk's sizes", where)
        if len(off) != len(size) or len(sz) != len(size) or any(o + n > d for o, n, d in zip(off, sz, size)):
            raise SpecError(f"{where}: chunk at {list(off)} of shape {list(sz)} does not lie inside the tensor's "
                            f"shape {list(size)}")
        out.append((off, sz))
    lo = np.array([o for o, _ in out], dtype=np.int64).reshape(len(out), len(size))
    hi = lo + np.array([s for _, s in out], dtype=np.int64).reshape(len(out), len(size))
    volume = int(sum(math.prod(s) for _, s in out))
    overlap = np.all((lo[:, None, :] < hi[None, :, :]) & (lo[None, :, :] < hi[:, None, :]), axis=-1)
    np.fill_diagonal(overlap, False)
    if volume != math.prod(size) or overlap.any():
        raise SpecError(f"{where}: its chunks overlap or leave parts of the shape {list(size)} unsaved; DCP's chunks "
                        "tile a tensor exactly")
    return out


def check_dcp_metadata(path: Path, md) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Every model tensor of the metadata (key -> (shape, dtype)), each checked before anything is
    allocated or read: a float dtype, a shape and chunks that tile it, and each chunk's bytes a slice of
    a regular file inside the folder that is large enough to hold it and stored as torch.save writes it.
    The tensors' total size is so bounded by the bytes on disk."""
    from torch.distributed.checkpoint.metadata import MetadataIndex, TensorProperties, TensorStorageMetadata

    sdm, storage = getattr(md, "state_dict_metadata", None), getattr(md, "storage_data", None)
    if not isinstance(sdm, dict) or not isinstance(storage, dict):
        raise SpecError(f"{printable(path)!r}: the DCP metadata lacks its tensor table or storage table")
    files: dict[str, tuple[Path, int]] = {}
    out = {}
    for key, meta in sdm.items():
        if not isinstance(key, str):
            raise SpecError(f"{printable(path)!r}: the DCP metadata names a tensor {printable(repr(key), 60)}, not a string")
        name = key[len("model."):] if key.startswith("model.") else key
        if not (isinstance(meta, TensorStorageMetadata) and name.startswith(MODEL_PREFIXES) and "_extra_state" not in name):
            continue
        where = f"DCP folder {printable(path)!r}: tensor {printable(key, 120)!r}"
        props = getattr(meta, "properties", None)
        dtype = getattr(props, "dtype", None)
        if not isinstance(props, TensorProperties) or dtype not in DTYPES:
            raise SpecError(f"{where} has dtype {printable(str(dtype).removeprefix('torch.'), 40)}; a GPT checkpoint's weights are "
                            f"{', '.join(str(d).removeprefix('torch.') for d in DTYPES)}")
        size = _dims(getattr(meta, "size", None), "its shape", where)
        if not size:
            raise SpecError(f"{where} is a scalar; a GPT weight has at least one dimension")
        elem = torch.empty((), dtype=dtype).element_size()
        for off, sz in _check_chunks(getattr(meta, "chunks", None), size, where):
            info = storage.get(MetadataIndex(fqn=key, offset=torch.Size(off)))
            if info is None:
                raise SpecError(f"{where}: no storage entry for its chunk at {list(off)}")
            _check_storage(path, files, info, where, math.prod(sz) * elem)
        out[key] = (size, dtype)
    _check_payloads(path, md, out, files)
    return out


def _check_payloads(path: Path, md, tensors: dict, files: dict[str, tuple[Path, int]]) -> None:
    """Each model chunk's bytes are a torch.save archive of uncompressed records (see _check_payload)."""
    from torch.distributed.checkpoint.metadata import MetadataIndex

    by_file: dict[str, list[tuple[str, int, int]]] = {}
    for key in tensors:
        for c in md.state_dict_metadata[key].chunks:
            info = md.storage_data[MetadataIndex(fqn=key, offset=torch.Size(c.offsets))]
            by_file.setdefault(info.relative_path, []).append((key, info.offset, info.length))
    for name, items in by_file.items():
        f = files[name][0]
        try:
            fh = open(f, "rb")
        except OSError as exc:
            raise SpecError(f"DCP data file {printable(f)}: cannot read it ({exc.strerror or exc})") from None
        with fh:
            for key, offset, length in items:
                _check_payload(fh, offset, length, f"DCP folder {printable(path)!r}: tensor {printable(key, 120)!r}")


def _safe_reader(path: Path):
    from torch.distributed.checkpoint import FileSystemReader  # DCP's own reader of the shard files

    class SafeFileSystemReader(FileSystemReader):
        """DCP's file reader, with the metadata read once, through the allow-listing unpickler: the
        load uses the very metadata that was checked."""

        _md = None

        def read_metadata(self, *args, **kwargs):
            if self._md is None:
                md = read_dcp_metadata(Path(self.path))
                from torch.distributed.checkpoint.metadata import StorageMeta  # as FileSystemReader fills it in

                if not isinstance(getattr(md, "storage_meta", None), StorageMeta):
                    md.storage_meta = StorageMeta()
                md.storage_meta.load_id = self.load_id
                self._md = md
            return self._md

    return SafeFileSystemReader(str(path))


def read_dcp_model_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Every model tensor of a DCP folder (Megatron names as stored), loaded in this process after
    :func:`check_dcp_metadata` has checked every entry against the files."""
    import torch.distributed.checkpoint as dcp  # only a conversion needs DCP
    from torch.distributed.checkpoint.api import CheckpointException  # DCP's wrapper of a failed read

    path = Path(path)
    if not path.is_dir():
        raise SpecError(f"{printable(path)!r} is not a directory (expected a torch.distributed.checkpoint folder)")
    reader = _safe_reader(path)
    md = reader.read_metadata()
    shapes = check_dcp_metadata(path, md)
    if not shapes:
        raise SpecError(f"{printable(path)!r}: no model tensors (names under embedding., decoder., output_layer.) in "
                        "the DCP metadata")
    state = {key: torch.empty(size, dtype=dtype) for key, (size, dtype) in shapes.items()}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DCP's notes on a single-process load, not the user's concern
            dcp.load(state, storage_reader=reader, no_dist=True)
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - a damaged data file, whatever DCP raised
        cause = next(iter(exc.failures.values()))[0] if isinstance(exc, CheckpointException) and exc.failures else exc
        raise SpecError(f"DCP folder {printable(path)!r}: its tensor data does not read "
                        f"({type(cause).__name__}: {printable(_first_line(cause), 160)})") from None
    return {(k[len("model."):] if k.startswith("model.") else k): v for k, v in state.items()}


def per_layer_names(tensors: dict[str, torch.Tensor], where: str = "the DCP folder") -> dict[str, torch.Tensor]:
    """Stacked layers split into ``decoder.layers.{i}.``, TE's fused LayerNorm names renamed, the tied
    output layer dropped (stored once, as the embedding); an output layer that differs from the
    embedding is refused (the GPT family ties them)."""
    out_layer, emb = tensors.get("output_layer.weight"), tensors.get("embedding.word_embeddings.weight")
    if out_layer is not None and (emb is None or not torch.equal(out_layer, emb)):
        raise SpecError(f"{where}: output_layer.weight differs from embedding.word_embeddings.weight (an untied "
                        "output layer); the GPT family ties them, as GPT-3 does")
    out: dict[str, torch.Tensor] = {}
    stacked = re.compile(r"^decoder\.layers\.(?!\d+\.)(.+)$")
    for name, t in tensors.items():
        m = stacked.match(name)
        items = [(f"decoder.layers.{i}.{m.group(1)}", t[i]) for i in range(t.shape[0])] if m else [(name, t)]
        for full, value in items:
            for te, ours in TE_NORM_NAMES.items():
                if full.endswith("." + te):
                    full = full[: -len(te)] + ours
            if full != "output_layer.weight":
                out[full] = value.contiguous()
    return out


@dataclass
class GPTShapes:
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    embedding_rows: int
    max_position_embeddings: int


def infer_shapes(tensors: dict[str, torch.Tensor], where: str) -> GPTShapes:
    """What the tensors' shapes say of the architecture (the head count they cannot say)."""
    for need in ("embedding.word_embeddings.weight", "embedding.position_embeddings.weight",
                 "decoder.layers.0.mlp.linear_fc1.weight"):
        if need not in tensors:
            raise SpecError(f"{where}: no tensor {need!r} (expected Megatron GPT names; found e.g. "
                            f"{', '.join(sorted(tensors)[:3])})")
    for need in ("embedding.word_embeddings.weight", "embedding.position_embeddings.weight",
                 "decoder.layers.0.mlp.linear_fc1.weight"):
        if tensors[need].ndim != 2 or 0 in tensors[need].shape:
            raise SpecError(f"{where}: tensor {need!r} has shape {list(tensors[need].shape)}; a GPT weight matrix "
                            "has two non-zero dimensions")
    layers = {int(m.group(1)) for n in tensors if (m := re.match(r"decoder\.layers\.(\d+)\.", n))}
    if max(layers) >= 100_000:
        raise SpecError(f"{where}: a layer numbered {max(layers)}; a GPT has fewer than 100,000 layers")
    emb = tensors["embedding.word_embeddings.weight"]
    return GPTShapes(num_layers=max(layers) + 1, hidden_size=emb.shape[1],
                     ffn_hidden_size=tensors["decoder.layers.0.mlp.linear_fc1.weight"].shape[0],
                     embedding_rows=emb.shape[0],
                     max_position_embeddings=tensors["embedding.position_embeddings.weight"].shape[0])


def convert_dcp_to_safetensors(src: str | Path, dest: str | Path, num_heads: int, vocab_size: int | None = None,
                               layernorm_epsilon: float = 1e-5, make_vocab_size_divisible_by: int = 128,
                               shards: int = 1, extra_config: dict | None = None) -> ModelSpec:
    """Convert, check every name and shape against the config it writes, then write atomically."""
    from trainperf.model import checkpoint as ckpt  # the target layout's writer and shape table

    check_convert_arguments(num_heads, vocab_size, layernorm_epsilon, make_vocab_size_divisible_by, shards)
    # the output is checked and its temporary sibling made before any reading: an output that would
    # lose data, or that cannot be written, is refused first; a failure leaves nothing behind
    with new_output_dir(dest, [src], "--out") as tmp:
        m = _converted(src, dest, num_heads, vocab_size, layernorm_epsilon, make_vocab_size_divisible_by)
        tensors, config = ckpt.megatron_checkpoint_contents(m.tensors, m.spec, extra_config)
        ckpt.write_safetensors_files(tensors, config, tmp, shards)
    return m.spec


@dataclass
class _Converted:
    spec: ModelSpec
    tensors: dict[str, torch.Tensor]


def _converted(src, dest, num_heads, vocab_size, layernorm_epsilon, make_vocab_size_divisible_by) -> _Converted:
    from trainperf.model import checkpoint as ckpt  # the target layout's shape table

    where = f"DCP folder {printable(src)!r}"
    tensors = per_layer_names(read_dcp_model_tensors(src), where)
    s = infer_shapes(tensors, where)
    vocab = vocab_size or s.embedding_rows
    if vocab > s.embedding_rows:
        raise SpecError(f"--vocab-size {vocab} exceeds the embedding's {s.embedding_rows} rows in {where}")
    if num_heads < 1 or s.hidden_size % num_heads:
        raise SpecError(f"--num-attention-heads {num_heads} does not divide the hidden size {s.hidden_size} of {where}")
    m = ModelSpec(name=Path(dest).name, family="gpt", vocab_size=vocab, hidden_size=s.hidden_size,
                  intermediate_size=s.ffn_hidden_size, num_layers=s.num_layers, num_heads=num_heads,
                  num_kv_heads=num_heads, rms_norm_eps=layernorm_epsilon,
                  max_position_embeddings=s.max_position_embeddings,
                  make_vocab_size_divisible_by=make_vocab_size_divisible_by)
    want = ckpt.expected_gpt_shapes(m)
    extra = sorted(set(tensors) - set(want))
    if extra:
        raise SpecError(f"{where}: tensor {extra[0]!r} is not a GPT parameter of {s.num_layers} layers")
    for name, shape in want.items():
        got = list(tensors[name].shape) if name in tensors else None
        if got is None:
            raise SpecError(f"{where}: lacks tensor {name!r}")
        if got != shape and not (name in ckpt.VOCAB_ROWS and got[1:] == shape[1:]):
            raise SpecError(f"{where}: tensor {name!r} has shape {got}; a GPT of these sizes needs {shape}")
    return _Converted(m, tensors)


def check_convert_arguments(num_heads: int, vocab_size: int | None, layernorm_epsilon: float,
                            make_vocab_size_divisible_by: int, shards: int) -> None:
    """The command line's sizes, before anything is read."""
    if num_heads < 1:
        raise SpecError(f"--num-attention-heads {num_heads}: must be >= 1")
    if vocab_size is not None and vocab_size < 1:
        raise SpecError(f"--vocab-size {vocab_size}: must be >= 1 (or left out: the embedding's row count)")
    if not (math.isfinite(layernorm_epsilon) and 0 < layernorm_epsilon < 1):
        raise SpecError(f"--layernorm-epsilon {layernorm_epsilon}: must be a finite number in (0, 1) (GPT-3: 1e-5)")
    if make_vocab_size_divisible_by < 1:
        raise SpecError(f"--make-vocab-size-divisible-by {make_vocab_size_divisible_by}: must be >= 1 (Megatron's "
                        "default: 128)")
    if shards < 1:
        raise SpecError(f"--shards {shards}: must be >= 1")
