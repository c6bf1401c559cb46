"""Hugging Face safetensors checkpoints in, PEFT adapters out. No pickle anywhere.

A checkpoint directory holds ``config.json`` and one or more ``*.safetensors`` shards (with
``model.safetensors.index.json`` when sharded). A Llama checkpoint is Hugging Face's layout; a GPT
checkpoint is the same directory layout with Megatron Core's tensor names (model/gpt.py lists them;
the tied output layer is stored once, as ``embedding.word_embeddings.weight``, with any number of
padded rows >= vocab_size) and a config.json of Megatron's argument names. Each family's adapter --
its config.json keys, tensor names and expected shapes -- is its ModelFamily's (core/families); this
module reads and writes the files. ``inspect_checkpoint`` reads only the headers, so a missing,
corrupt or mismatched checkpoint is reported before any process is launched.
Loading goes tensor by tensor into whatever placement each parameter has (plain or DTensor):
no rank ever holds more than one full tensor at a time.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from trainperf.core.errors import SpecError
from trainperf.core.families import family
from trainperf.core.families.gpt import GPT_FAMILY, VOCAB_ROWS  # noqa: F401  VOCAB_ROWS: model/dcp_convert.py's
from trainperf.core.families.llama import LLAMA
from trainperf.core.files import atomic_write_dir
from trainperf.core.spec import LoRASpec, ModelSpec
from trainperf.core.untrusted import load_untrusted_json, member_file, printable
from trainperf.model.families import tied_source

MAX_JSON_BYTES = 64 * 1024 * 1024  # config.json and the shard index: a 405B model's index is a few MB

def config_keys(family_name: str) -> dict[str, str]:
    """ModelSpec field -> config.json key, for the model family's checkpoint layout."""
    return dict(family(family_name).config_keys)


@dataclass
class CheckpointIndex:
    path: Path
    config: dict
    tensors: dict[str, tuple[Path, list[int], str]]  # name -> (file, shape, dtype)

    @property
    def fused_qkv(self) -> bool:
        return any(n.endswith("self_attn.qkv_proj.weight") for n in self.tensors)


def hf_config_to_model_fields(config: dict, where: str) -> dict:
    return LLAMA.config_to_model_fields(config, where)


def megatron_config_to_model_fields(config: dict, where: str) -> dict:
    return GPT_FAMILY.config_to_model_fields(config, where)


def config_to_model_fields(config: dict, family_name: str, where: str) -> dict:
    """ModelSpec fields from a checkpoint's config.json, as the family's layout names them."""
    return family(family_name).config_to_model_fields(config, where)


def model_fields_to_megatron_config(m: ModelSpec, dtype: str = "float32") -> dict:
    return GPT_FAMILY.model_fields_to_config(m, dtype)


def model_fields_to_hf_config(m: ModelSpec, dtype: str = "float32") -> dict:
    return LLAMA.model_fields_to_config(m, dtype)


def inspect_checkpoint(path: str) -> CheckpointIndex:
    """Read config.json and every shard's header; SpecError if anything is missing or corrupt.

    The folder may come from anywhere: config.json and the index are read capped and depth-bounded
    (core/untrusted.py); a shard the index names must be a plain name inside the folder (never an
    absolute path or a ``..`` part) and a regular file, checked before it is opened (links are followed:
    a Hugging Face cache snapshot links its files into the cache); a shard's header is parsed by the
    safetensors library, which refuses offsets outside the file."""
    p = Path(path)
    shown = printable(path)
    if not p.is_dir():
        raise SpecError(f"model.path {shown!r} is not a directory (expected a Hugging Face checkpoint dir)")
    cfg_file = p / "config.json"
    if not os.path.lexists(cfg_file):
        raise SpecError(f"model.path {shown!r} has no config.json")
    config = load_untrusted_json(cfg_file, max_bytes=MAX_JSON_BYTES, what="config.json of model.path")
    if not isinstance(config, dict):
        raise SpecError(f"model.path {shown!r}: config.json must hold a JSON object, found {type(config).__name__}")
    index_file = p / "model.safetensors.index.json"
    weight_map: dict = {}
    if os.path.lexists(index_file):
        index = load_untrusted_json(index_file, max_bytes=MAX_JSON_BYTES, what="model.safetensors.index.json of model.path")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise SpecError(f"model.path {shown!r}: model.safetensors.index.json is corrupt "
                            "(expected a weight_map of tensor name -> shard file)")
        names = sorted(set(weight_map.values()))
    else:
        names = [f.name for f in sorted(p.glob("*.safetensors"))]
    try:
        files = sorted({member_file(p, f, what="shard", links_out=True) for f in names})
    except SpecError as exc:
        raise SpecError(f"model.path {shown!r}: {exc}") from None
    if not files:
        raise SpecError(f"model.path {shown!r} holds no *.safetensors files (pickled .bin checkpoints are not loaded)")
    tensors: dict[str, tuple[Path, list[int], str]] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as sf:
                names = list(sf.keys())
                shapes = {name: (list(sf.get_slice(name).get_shape()), sf.get_slice(name).get_dtype()) for name in names}
        except Exception as exc:  # noqa: BLE001 - the library's own error for a truncated or garbled header
            raise SpecError(f"model.path {shown!r}: {printable(f.name)} is not a readable safetensors file "
                            f"({printable(_first_line(exc), 160)})") from None
        for name in names:
            if name in tensors:  # which copy would load is an accident of file order: refuse, whatever the index says
                named = f" (the index names {printable(weight_map[name])})" if name in weight_map else ""
                raise SpecError(f"model.path {shown!r}: tensor {printable(name)!r} is stored twice, in "
                                f"{printable(tensors[name][0].name)} and {printable(f.name)}{named}; keep one copy")
            tensors[name] = (f, *shapes[name])
    return CheckpointIndex(p, config, tensors)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def expected_gpt_shapes(m: ModelSpec) -> dict[str, list[int]]:
    """Megatron names -> shapes (the GPT family's expected_shapes)."""
    return GPT_FAMILY.expected_shapes(m, False)


def expected_shapes(m: ModelSpec, fused_qkv: bool) -> dict[str, list[int]]:
    """Checkpoint tensor name -> shape, as the model's family names them."""
    return family(m.family).expected_shapes(m, fused_qkv)


def check_checkpoint(index: CheckpointIndex, m: ModelSpec) -> None:
    """Every tensor the model needs is present with the right shape (fusing/unfusing q,k,v allowed)."""
    want = expected_shapes(m, index.fused_qkv)
    padded_rows = family(m.family).padded_rows
    for name, shape in want.items():
        if name not in index.tensors:
            raise SpecError(f"checkpoint {str(index.path)!r} lacks tensor {name!r}")
        got = index.tensors[name][1]
        # Megatron pads the vocabulary to its TP's multiple: any padding loads (fit_vocab_rows re-pads)
        padded_vocab = name in padded_rows and len(got) == 2 and got[1] == shape[1] and got[0] >= m.vocab_size
        if got != shape and not padded_vocab:
            raise SpecError(f"checkpoint {str(index.path)!r}: tensor {name!r} has shape {got}, config.json implies {shape}"
                            + (f" (rows >= vocab_size {m.vocab_size})" if name in padded_rows else ""))
        dtype = index.tensors[name][2]
        if dtype not in ("F32", "F16", "BF16"):
            raise SpecError(f"checkpoint {str(index.path)!r}: tensor {name!r} has dtype {dtype}; expected F32, F16 or BF16")


def split_qkv(qkv: torch.Tensor, hf_config: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of a fused qkv_proj weight -> (q, k, v), by the head counts in config.json."""
    heads = hf_config["num_attention_heads"]
    kv_heads = hf_config.get("num_key_value_heads") or heads
    head_dim = hf_config["hidden_size"] // heads
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=0)
    return q, k, v


class _TensorReader:
    """Reads full tensors by name, keeping one open handle per shard file."""

    def __init__(self, index: CheckpointIndex, model: torch.nn.Module | None = None):
        self.index, self.model = index, model
        self._handles: dict[Path, object] = {}

    def _handle(self, name: str):
        f = self.index.tensors[name][0]
        if f not in self._handles:
            self._handles[f] = safe_open(str(f), framework="pt")
        return self._handles[f]

    def get(self, name: str) -> torch.Tensor:
        return self._handle(name).get_tensor(name)

    def get_slice(self, name: str):
        return self._handle(name).get_slice(name)

    def full_tensor_for(self, param_name: str) -> torch.Tensor:
        """The checkpoint's tensor for one of our parameter names, fusing or splitting q/k/v."""
        # a tied copy (a GPT's output layer) is stored as the weight it is tied to
        base = param_name if param_name in self.index.tensors or self.model is None else tied_source(self.model, param_name)
        if base in self.index.tensors:
            return self.get(base)
        if base.endswith("self_attn.qkv_proj.weight"):  # unfused checkpoint, fused model
            pre = base[: -len("qkv_proj.weight")]
            return torch.cat([self.get(pre + f"{x}_proj.weight") for x in "qkv"], dim=0)
        for i, x in enumerate("qkv"):  # fused checkpoint, unfused model
            if base.endswith(f"self_attn.{x}_proj.weight"):
                pre = base[: -len(f"{x}_proj.weight")]
                return split_qkv(self.get(pre + "qkv_proj.weight"), self.index.config)[i]
        raise KeyError(param_name)


def to_storage(model: torch.nn.Module, name: str, full: torch.Tensor) -> torch.Tensor:
    """A full tensor in checkpoint order -> the order the model stores it in. The identity, except
    where the model says otherwise (``LlamaForCausalLM.storage_transforms``: a TP-sharded fused qkv)."""
    fns = model.storage_transforms(name)
    return fns[0](full) if fns else full


def from_storage(model: torch.nn.Module, name: str, full: torch.Tensor) -> torch.Tensor:
    fns = model.storage_transforms(name)
    return fns[1](full) if fns else full


def _local_slice(reader: "_TensorReader", name: str, param) -> torch.Tensor | None:
    """This rank's block of a plainly sharded parameter, read straight from the file (a byte-range
    read: no rank reads the whole tensor). None when the block is not one rectangle of the stored
    tensor -- strided (FSDP x TP) sharding, a TP row order, or q/k/v fused or split on load."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if not isinstance(param, DTensor) or name not in reader.index.tensors:
        return None
    if reader.model.storage_transforms(name) is not None or list(param.shape) != reader.index.tensors[name][1]:
        return None
    if any(type(pl) not in (Shard, Replicate) for pl in param.placements):
        return None
    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return reader.get_slice(name)[tuple(slice(o, o + n) for o, n in zip(offset, shape))]


def fit_vocab_rows(embedding: torch.Tensor, rows: int) -> torch.Tensor:
    """A padded-vocabulary tensor at this model's padding: rows past the checkpoint's are zero (padding
    ids never occur in data); rows past ours are the checkpoint's padding, dropped."""
    if embedding.shape[0] >= rows:
        return embedding[:rows]
    return torch.cat([embedding, embedding.new_zeros(rows - embedding.shape[0], *embedding.shape[1:])])


def load_checkpoint_into(model: torch.nn.Module, index: CheckpointIndex, on_tensor=None) -> int:
    """Copy checkpoint tensors into the model's (possibly sharded) parameters; returns bytes read.

    Each rank reads only its own block where the sharding allows it, else one full tensor at a
    time (never the whole model). LoRA adapters are not in a base checkpoint: left as initialised.
    Weights stored in float8 (hardware.frozen_dtype=fp8): every rank reads each such tensor whole
    (its scale comes from the whole tensor, with no collective), so those weights cost world-size
    times the reads of a plain load."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    reader = _TensorReader(index, model)
    padded_rows = family(model.cfg.family).padded_rows
    nbytes = 0
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_A." in name or ".lora_B." in name:
                continue
            if on_tensor is not None:  # progress: one call per base tensor
                on_tensor(name)
            if param.dtype == torch.float8_e4m3fn:  # hardware.frozen_dtype=fp8: scaled from the whole tensor
                from trainperf.model.float8 import write_float8_weight

                full = to_storage(model, name, reader.full_tensor_for(name))
                nbytes += full.numel() * full.element_size()
                write_float8_weight(model, name, param, full)
                continue
            local = _local_slice(reader, name, param)
            if local is not None:
                nbytes += local.numel() * local.element_size()
                param.to_local().copy_(local)
                continue
            full = to_storage(model, name, reader.full_tensor_for(name))
            nbytes += full.numel() * full.element_size()
            if name in padded_rows:
                full = fit_vocab_rows(full, param.shape[0])
            if isinstance(param, DTensor):
                local = distribute_tensor(full.to(param.device), param.device_mesh, param.placements, src_data_rank=None)
                param.to_local().copy_(local.to_local())
            else:
                param.copy_(full)
    return nbytes


def save_hf_checkpoint(state: dict[str, torch.Tensor], m: ModelSpec, dest: str) -> None:
    """Save a full state dict (our names = HF names) as a Hugging Face checkpoint directory."""
    dtype = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[
        next(iter(state.values())).dtype]

    hf_config = model_fields_to_hf_config(m, dtype)
    tensors = {}
    for k, v in state.items():
        if k.endswith("self_attn.qkv_proj.weight"):  # transformers' Llama has separate q/k/v
            pre = k[: -len("qkv_proj.weight")]
            for x, part in zip("qkv", split_qkv(v, hf_config)):
                tensors[pre + f"{x}_proj.weight"] = part.contiguous()
        else:
            tensors[k] = v.contiguous()

    def write(tmp: Path) -> None:
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2))
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})

    atomic_write_dir(Path(dest), write)


def save_megatron_checkpoint(state: dict[str, torch.Tensor], m: ModelSpec, dest: str | Path, shards: int = 1,
                             extra_config: dict | None = None) -> None:
    """A GPT state dict (Megatron names) as a safetensors checkpoint directory: config.json of Megatron's
    arguments, ``shards`` files and, when sharded, model.safetensors.index.json. The tied output layer
    is stored once; the embedding at the padding of TP 1. ``dest`` must be new (or an empty folder)."""
    tensors, config = megatron_checkpoint_contents(state, m, extra_config)
    write_safetensors_dir(tensors, config, Path(dest), shards)


def megatron_checkpoint_contents(state: dict[str, torch.Tensor], m: ModelSpec,
                                 extra_config: dict | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, config.json) of a GPT checkpoint: the tied copy dropped, the embedding at TP 1's padding."""
    from trainperf.model.gpt import TIED_WEIGHTS  # names the tied copy that is not stored

    tensors = {k: v.contiguous() for k, v in state.items() if k not in TIED_WEIGHTS}
    emb = "embedding.word_embeddings.weight"
    tensors[emb] = fit_vocab_rows(tensors[emb], m.padded_vocab_size(1)).contiguous()
    dtype = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[tensors[emb].dtype]
    return tensors, {**model_fields_to_megatron_config(m, dtype), **(extra_config or {})}


def write_safetensors_dir(tensors: dict[str, torch.Tensor], config: dict, dest: Path, shards: int) -> None:
    """config.json + safetensors shards (+ the index when more than one), written atomically."""
    atomic_write_dir(dest, lambda tmp: write_safetensors_files(tensors, config, tmp, shards))


def write_safetensors_files(tensors: dict[str, torch.Tensor], config: dict, folder: Path, shards: int) -> None:
    """config.json + safetensors shards (+ the index when more than one) into an existing, new folder."""
    names = sorted(tensors)
    shards = max(1, min(shards, len(names)))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    if shards == 1:
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = names[s::shards]
        save_file({n: tensors[n] for n in part}, str(folder / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))


def save_peft_adapter(adapter_state: dict[str, torch.Tensor], spec: LoRASpec, dest: str,
                      base_model_path: str | None) -> None:
    """``adapter_config.json`` + ``adapter_model.safetensors`` as PEFT writes them."""
    from trainperf.model.lora import peft_adapter_config, peft_key

    def write(tmp: Path) -> None:
        (tmp / "adapter_config.json").write_text(json.dumps(peft_adapter_config(spec, base_model_path), indent=2))
        tensors = {peft_key(k): v.contiguous() for k, v in adapter_state.items()}
        save_file(tensors, str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})

    atomic_write_dir(Path(dest), write)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value, gathered one mesh dim at a time, outermost first (FSDP's shards, then
    TP's: the order they unshard in); a plain tensor as it is. DTensor.full_tensor() of a 2-D sharding
    tries to merge both gathers into one and warns where their order rules that out."""
    from torch.distributed.tensor import DTensor, Replicate

    if not isinstance(t, DTensor):
        return t
    placements = list(t.placements)
    for dim in range(len(placements)):
        if not placements[dim].is_replicate():
            placements[dim] = Replicate()
            t = t.redistribute(t.device_mesh, placements)
    return t.to_local()


def gather_full_state(model: torch.nn.Module, only_adapters: bool = False, base_only: bool = False) -> dict[str, torch.Tensor]:
    """Full CPU tensors of every parameter (or only the adapters, or only the base). Collective
    under FSDP/TP: call on every rank of the model's mesh, in the same order."""
    from torch.distributed.tensor import DTensor

    from trainperf.model.lora import is_adapter_param

    out = {}
    for name, param in model.named_parameters():
        if (only_adapters and not is_adapter_param(name)) or (base_only and is_adapter_param(name)):
            continue
        if param.dtype == torch.float8_e4m3fn:  # hardware.frozen_dtype=fp8: back in the base's dtype,
            # shard by shard before gathering (gloo's collectives take no float8)
            from trainperf.model.float8 import dequantize_float8_weight

            if isinstance(param, DTensor):
                local = dequantize_float8_weight(model, name, param.to_local())
                t = full_tensor(DTensor.from_local(local, param.device_mesh, param.placements, shape=param.shape,
                                                   stride=param.stride()))
            else:
                t = dequantize_float8_weight(model, name, param.detach())
        else:
            t = full_tensor(param.detach())
        out[name] = from_storage(model, name, t.detach()).to("cpu", copy=True)
    return out
