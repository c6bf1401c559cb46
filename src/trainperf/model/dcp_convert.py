"""A GPT checkpoint saved by ``torch.distributed.checkpoint`` (DCP: Megatron Core's ``torch_dist`` format,
or any DCP folder of Megatron-named tensors) into the safetensors layout trainperf loads
(model/checkpoint.py: Megatron names + a config.json of Megatron's arguments). No pickle runs code:

* the folder's ``.metadata`` is a pickle, read here with an unpickler that admits only DCP's own
  metadata classes, torch dtypes/sizes and paths -- anything else is refused (``read_dcp_metadata``);
* the tensors are read by DCP itself (``torch.distributed.checkpoint.load``, single process), into
  tensors allocated from that metadata; DCP reads tensor payloads with ``torch.load(weights_only=True)``.

Accepted names: model/gpt.py's per-layer names, optionally under a ``model.`` prefix; layers stacked
on a leading dimension (``decoder.layers.mlp.linear_fc1.weight`` [L, ffn, hidden], Megatron Core's
``torch_dist`` form); and Transformer Engine's fused LayerNorm names (``linear_qkv.layer_norm_weight``
is the input LayerNorm, ``linear_fc1.layer_norm_weight`` the pre-MLP one). Optimizer states, RNG
states and ``_extra_state`` entries are not model tensors and are skipped.
"""

from __future__ import annotations

import pickle
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from trainperf.core.errors import SpecError
from trainperf.core.spec import ModelSpec

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


def read_dcp_metadata(path: Path):
    """The folder's DCP metadata, through the allow-listing unpickler; SpecError when absent or foreign."""
    from torch.distributed.checkpoint.metadata import Metadata  # the type a DCP .metadata must hold

    f = path / ".metadata"
    if not f.is_file():
        raise SpecError(f"{str(path)!r} is not a torch.distributed.checkpoint folder (no .metadata file)")
    try:
        with open(f, "rb") as fh:
            md = _MetadataUnpickler(fh).load()
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is a bad input file
        raise SpecError(f"{str(f)!r} is not a readable DCP metadata file ({str(exc).splitlines()[0]})") from None
    if not isinstance(md, Metadata):
        raise SpecError(f"{str(f)!r} holds a {type(md).__name__}, not DCP Metadata")
    return md


def _safe_reader(path: Path):
    from torch.distributed.checkpoint import FileSystemReader  # DCP's own reader of the shard files

    class SafeFileSystemReader(FileSystemReader):
        """DCP's file reader, with the metadata read through the allow-listing unpickler."""

        def read_metadata(self, *args, **kwargs):
            md = read_dcp_metadata(Path(self.path))
            from torch.distributed.checkpoint.metadata import StorageMeta  # as FileSystemReader fills it in

            if getattr(md, "storage_meta", None) is None:
                md.storage_meta = StorageMeta()
            md.storage_meta.load_id = self.load_id
            return md

    return SafeFileSystemReader(str(path))


def read_dcp_model_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Every model tensor of a DCP folder (Megatron names as stored), loaded in this process."""
    import torch.distributed.checkpoint as dcp  # only a conversion needs DCP
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata  # tensor entries, not bytes

    path = Path(path)
    if not path.is_dir():
        raise SpecError(f"{str(path)!r} is not a directory (expected a torch.distributed.checkpoint folder)")
    reader = _safe_reader(path)
    md = reader.read_metadata()
    state = {}
    for key, meta in md.state_dict_metadata.items():
        name = key[len("model."):] if key.startswith("model.") else key
        if isinstance(meta, TensorStorageMetadata) and name.startswith(MODEL_PREFIXES) and "_extra_state" not in name:
            state[key] = torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
    if not state:
        raise SpecError(f"{str(path)!r}: no model tensors (names under embedding., decoder., output_layer.) in the DCP metadata")
    dcp.load(state, storage_reader=reader, no_dist=True)
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
    layers = {int(m.group(1)) for n in tensors if (m := re.match(r"decoder\.layers\.(\d+)\.", n))}
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

    where = f"DCP folder {str(src)!r}"
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
    ckpt.save_megatron_checkpoint(tensors, m, dest, shards=shards, extra_config=extra_config)
    return m
