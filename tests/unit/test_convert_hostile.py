"""Hostile inputs to `checkpoint convert`, `data convert` and the checkpoint / pretokenized readers:
each is refused in one line (exit 2 at the CLI) before any work, and nothing that existed is changed
or deleted; no partial output is left behind. Ends with seeded, bounded fuzz tests of each reader."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import random
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from trainperf.cli.main import main
from trainperf.core.errors import SpecError
from trainperf.core.files import atomic_write_dir, check_output_dir
from trainperf.core.spec import ModelSpec
from trainperf.data import megatron, pretok
from trainperf.model import checkpoint as ckpt
from trainperf.model.dcp_convert import convert_dcp_to_safetensors, read_dcp_metadata, read_dcp_model_tensors

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TINY = ModelSpec(name="tiny", family="gpt", vocab_size=16, hidden_size=8, intermediate_size=16, num_layers=1,
                 num_heads=2, num_kv_heads=2, rms_norm_eps=1e-5, max_position_embeddings=8,
                 make_vocab_size_divisible_by=16)


def _tree(root: Path) -> dict[str, str]:
    """Every path under root (links and folders included) -> a digest of what it is."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_dir():
                out[rel] = "dir"
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[rel] = "special"
    return out


def _one_line_refusal(capsys, rc: int, *needles: str) -> str:
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("trainperf: error: ") and err.count("\n") == 1, err
    for n in needles:
        assert n in err, err
    return err


def _save_dcp(state: dict, dest: Path) -> Path:
    import torch.distributed.checkpoint as dcp

    dcp.save(state, checkpoint_id=str(dest), no_dist=True)
    return dest


def _tiny_state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(*s, generator=g) for k, s in ckpt.expected_gpt_shapes(TINY).items()}


@pytest.fixture
def dcp_dir(tmp_path) -> Path:
    return _save_dcp(_tiny_state(), tmp_path / "dcp")


def _convert_argv(src, out) -> list[str]:
    return ["checkpoint", "convert", str(src), "--out", str(out), "--num-attention-heads", "2"]


def _tokens_txt(tmp_path) -> Path:
    f = tmp_path / "docs.txt"
    f.write_text("1 2 3\n4 5 6 7\n8 9\n")
    return f


def _data_argv(inputs, out) -> list[str]:
    return ["data", "convert", *map(str, inputs), "--out", str(out), "--vocab-size", "16",
            "--validation-documents", "1"]


# ------------------------------------------------------------------------------------ --out


def _out_cases(tmp_path: Path, src: Path) -> list[tuple[str, Path]]:
    """(case, --out) for every output that would lose data or cannot be written."""
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("precious")
    a_file = tmp_path / "a_file"
    a_file.write_text("precious")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "empty_target")
    (tmp_path / "empty_target").mkdir()
    inside = src / "sub"  # for a file input: under the file
    return [("existing non-empty folder", full), ("equal to the input", src), ("inside the input", inside),
            ("above the input", tmp_path), ("a file", a_file), ("under a file", a_file / "x" / "y"),
            ("a link", link), ("/proc", Path("/proc/trainperf-out")), ("/proc/self/cwd", Path("/proc/self/cwd/o")),
            ("/sys", Path("/sys/trainperf-out"))]


@pytest.mark.parametrize("command", ["checkpoint", "data"])
def test_an_out_that_would_lose_data_is_refused_in_one_line_and_nothing_changes(tmp_path, capsys, monkeypatch,
                                                                                 command):
    src = _save_dcp(_tiny_state(), tmp_path / "dcp") if command == "checkpoint" else _tokens_txt(tmp_path)
    cases = _out_cases(tmp_path, src)
    monkeypatch.chdir(tmp_path)
    cases.append(("--out .", Path(".")))
    before = _tree(tmp_path)
    for case, out in cases:
        argv = _convert_argv(src, out) if command == "checkpoint" else _data_argv([src], out)
        err = _one_line_refusal(capsys, main(argv), "--out")
        assert _tree(tmp_path) == before, case
        assert "Traceback" not in err, case
    # the control: a new folder, or an empty one, is written
    for out in (tmp_path / "new" / "deeper", tmp_path / "empty_target"):
        argv = _convert_argv(src, out) if command == "checkpoint" else _data_argv([src], out)
        assert main(argv) == 0
        assert (out / ("config.json" if command == "checkpoint" else "meta.json")).is_file()
    assert (tmp_path / "full" / "keep.txt").read_text() == "precious"


def test_out_messages_say_what_is_wrong(tmp_path, dcp_dir):
    cases = dict(_out_cases(tmp_path, dcp_dir))
    expect = {"existing non-empty folder": "already exists and is not empty", "equal to the input": "is the input",
              "inside the input": "lies inside the input", "above the input": "holds the input",
              "a file": "is an existing file", "under a file": "which is a file", "a link": "is a link",
              "/proc": "kernel filesystem", "/proc/self/cwd": "kernel filesystem", "/sys": "kernel filesystem"}
    for case, needle in expect.items():
        with pytest.raises(SpecError, match=needle):
            check_output_dir(cases[case], [dcp_dir])


@pytest.mark.parametrize("command", ["checkpoint", "data"])
def test_a_read_only_or_unwritable_parent_is_refused_before_any_work(tmp_path, capsys, monkeypatch, command):
    src = _save_dcp(_tiny_state(), tmp_path / "dcp") if command == "checkpoint" else _tokens_txt(tmp_path)
    ro = tmp_path / "ro"
    ro.mkdir()
    real_statvfs = os.statvfs

    class ReadOnly:
        def __init__(self, st):
            self.st = st

        def __getattr__(self, name):
            return getattr(self.st, name)

        f_flag = os.ST_RDONLY

    monkeypatch.setattr(os, "statvfs", lambda p: ReadOnly(real_statvfs(p)) if str(p).startswith(str(ro)) else
                        real_statvfs(p))
    read = []
    monkeypatch.setattr(pretok, "_pieces", lambda files: read.append(files) or iter(()))
    before = _tree(tmp_path)
    argv = _convert_argv(src, ro / "out") if command == "checkpoint" else _data_argv([src], ro / "a" / "out")
    _one_line_refusal(capsys, main(argv), "read-only filesystem")
    assert _tree(tmp_path) == before and not read
    monkeypatch.undo()
    # a filesystem that refuses the write itself (EROFS at mkdir: a mount the flags do not show)
    import tempfile

    def erofs(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkdtemp", erofs)
    argv = _convert_argv(src, ro / "n" / "out") if command == "checkpoint" else _data_argv([src], ro / "n" / "out")
    _one_line_refusal(capsys, main(argv), "read-only filesystem")
    assert _tree(tmp_path) == before  # the parent it made for the temporary folder is gone too


@pytest.mark.parametrize("command", ["checkpoint", "data"])
def test_a_disk_full_mid_write_leaves_nothing_behind(tmp_path, capsys, monkeypatch, command):
    src = _save_dcp(_tiny_state(), tmp_path / "dcp") if command == "checkpoint" else _tokens_txt(tmp_path)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    if command == "checkpoint":
        monkeypatch.setattr(ckpt, "save_file", full)
    else:
        monkeypatch.setattr(pretok._NpyStream, "close", full)
    before = _tree(tmp_path)
    out = tmp_path / "made" / "for" / "it"
    argv = _convert_argv(src, out) if command == "checkpoint" else _data_argv([src], out)
    _one_line_refusal(capsys, main(argv), "no space left")
    assert _tree(tmp_path) == before  # no temporary sibling, no parent folders


def test_atomic_write_dir_never_replaces_and_its_callers_still_write_new_folders(tmp_path):
    dest = tmp_path / "d"
    dest.mkdir()
    (dest / "old").write_text("kept")
    with pytest.raises(SpecError, match="not empty"):
        atomic_write_dir(dest, lambda tmp: (tmp / "new").write_text("x"))
    assert sorted(p.name for p in dest.iterdir()) == ["old"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    empty = tmp_path / "e"
    empty.mkdir()
    atomic_write_dir(empty, lambda tmp: (tmp / "new").write_text("x"))
    assert (empty / "new").read_text() == "x"
    with pytest.raises(RuntimeError):
        atomic_write_dir(tmp_path / "f", lambda tmp: (_ for _ in ()).throw(RuntimeError("boom")))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "e"]
    # callers: a checkpoint writer refuses an existing checkpoint instead of replacing it
    ckpt.save_megatron_checkpoint(_tiny_state(), TINY, tmp_path / "ck")
    first = _tree(tmp_path / "ck")
    with pytest.raises(SpecError, match="not empty"):
        ckpt.save_megatron_checkpoint(_tiny_state(1), TINY, tmp_path / "ck")
    assert _tree(tmp_path / "ck") == first


# ------------------------------------------------------------------------ checkpoint convert


def _rewrite_metadata(path: Path, edit) -> None:
    md = read_dcp_metadata(path)
    edit(md)
    (path / ".metadata").write_bytes(pickle.dumps(md))


def _first_tensor(md, name="embedding.word_embeddings.weight"):
    return md.state_dict_metadata[name]


def _storage(md, name="embedding.word_embeddings.weight"):
    return next(v for k, v in md.storage_data.items() if k.fqn == name)


def _shard(path: Path) -> Path:
    return next(path.glob("*.distcp"))


def _set_dtype(dtype):
    return lambda md: setattr(_first_tensor(md).properties, "dtype", dtype)


def _set_size(size):
    def edit(md):
        t = _first_tensor(md)
        t.size = tuple(size)  # a tuple: torch.Size holds no integer past int64
        t.chunks[0].sizes = tuple(size)
    return edit


def _set_storage(**fields):
    return lambda md: [setattr(_storage(md), k, v) for k, v in fields.items()]


def _overlapping_chunks(md):
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    t = _first_tensor(md)
    t.chunks.append(ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([1, 8])))


def _chunk_outside(md):
    _first_tensor(md).chunks[0].sizes = torch.Size([17, 8])


def _chunk_short(md):
    _first_tensor(md).chunks[0].sizes = torch.Size([8, 8])


DCP_CASES = {  # case -> (how the folder is damaged, what the one line says)
    "missing shard": (lambda p: _shard(p).unlink(), "DCP data file"),
    "truncated shard": (lambda p: _shard(p).write_bytes(_shard(p).read_bytes()[:1000]), "lie inside it"),
    "empty shard": (lambda p: _shard(p).write_bytes(b""), "lie inside it"),
    "garbage shard": (lambda p: _shard(p).write_bytes(random.Random(1).randbytes(_shard(p).stat().st_size)),
                      "not a torch.save archive"),
    "shard a FIFO": (lambda p: (_shard(p).unlink(), os.mkfifo(p / "__0_0.distcp")), "not a regular file"),
    "shard a link to /dev/zero": (lambda p: (_shard(p).unlink(), (p / "__0_0.distcp").symlink_to("/dev/zero")),
                                  "points outside"),
    "missing .metadata": (lambda p: (p / ".metadata").unlink(), "no .metadata"),
    "empty .metadata": (lambda p: (p / ".metadata").write_bytes(b""), "not a readable DCP metadata"),
    "garbage .metadata": (lambda p: (p / ".metadata").write_bytes(b"\x80\x05garbage" * 40), "not a readable DCP metadata"),
    "truncated .metadata": (lambda p: (p / ".metadata").write_bytes((p / ".metadata").read_bytes()[:300]),
                            "not a readable DCP metadata"),
    ".metadata a link to /dev/zero": (lambda p: ((p / ".metadata").unlink(), (p / ".metadata").symlink_to("/dev/zero")),
                                      "points outside"),
    ".metadata naming os.system": (lambda p: (p / ".metadata").write_bytes(
        b"cos\nsystem\n(S'touch pwned'\ntR."), "os.system"),
    "negative offset": (lambda p: _rewrite_metadata(p, _set_storage(offset=-5)), "must lie inside"),
    "huge offset": (lambda p: _rewrite_metadata(p, _set_storage(offset=2**62)), "must lie inside"),
    "negative length": (lambda p: _rewrite_metadata(p, _set_storage(length=-1)), "must lie inside"),
    "huge length": (lambda p: _rewrite_metadata(p, _set_storage(length=2**62)), "must lie inside"),
    "negative size": (lambda p: _rewrite_metadata(p, _set_size([-16, 8])), "expected at most"),
    "huge size": (lambda p: _rewrite_metadata(p, _set_size([2**40, 2**20])), "cannot hold"),
    "absurd size": (lambda p: _rewrite_metadata(p, _set_size([10**30, 8])), "expected at most"),
    "bool dtype": (lambda p: _rewrite_metadata(p, _set_dtype(torch.bool)), "dtype bool"),
    "complex dtype": (lambda p: _rewrite_metadata(p, _set_dtype(torch.complex64)), "dtype complex64"),
    "dtype a string": (lambda p: _rewrite_metadata(p, _set_dtype("float32")), "dtype float32"),
    "path ../../etc/passwd": (lambda p: _rewrite_metadata(p, _set_storage(relative_path="../../etc/passwd")),
                              "'..' part"),
    "absolute path": (lambda p: _rewrite_metadata(p, _set_storage(relative_path="/etc/passwd")), "absolute name"),
    "path not a string": (lambda p: _rewrite_metadata(p, _set_storage(relative_path=7)), "not a file name"),
    "a zstd transform": (lambda p: _rewrite_metadata(p, _set_storage(transform_descriptors=["stream.zstd/1"])),
                         "transforms"),
    "overlapping chunks": (lambda p: _rewrite_metadata(p, _overlapping_chunks), "overlap"),
    "a chunk outside the tensor": (lambda p: _rewrite_metadata(p, _chunk_outside), "does not lie inside"),
    "chunks leaving part unsaved": (lambda p: _rewrite_metadata(p, _chunk_short), "unsaved"),
    "no storage entry": (lambda p: _rewrite_metadata(p, lambda md: md.storage_data.pop(
        next(k for k in md.storage_data if k.fqn == "embedding.word_embeddings.weight"))), "no storage entry"),
    "a scalar weight": (lambda p: _rewrite_metadata(p, _set_size([])), "scalar"),
    "a list for the tensor table": (lambda p: _rewrite_metadata(p, lambda md: setattr(md, "state_dict_metadata", [])),
                                    "tensor table"),
}


@pytest.mark.parametrize("case", sorted(DCP_CASES))
def test_damaged_dcp_folders_are_refused_in_one_line(tmp_path, capsys, monkeypatch, case):
    src = _save_dcp(_tiny_state(), tmp_path / "dcp")
    damage, needle = DCP_CASES[case]
    damage(src)
    monkeypatch.chdir(tmp_path)
    before = _tree(tmp_path)
    _one_line_refusal(capsys, main(_convert_argv(src, tmp_path / "out")), needle)
    assert _tree(tmp_path) == before
    assert not (tmp_path / "pwned").exists()


def test_a_dcp_path_leaving_the_folder_is_never_opened(tmp_path, monkeypatch):
    """The data file a hostile .metadata names outside the folder is a valid copy: had it been read, the
    conversion would have worked. It is refused by the metadata check, before DCP reads any data."""
    import torch.distributed.checkpoint as dcp

    src = _save_dcp(_tiny_state(), tmp_path / "dcp")
    (tmp_path / "outside.distcp").write_bytes(_shard(src).read_bytes())
    opened = []
    monkeypatch.setattr(dcp, "load", lambda *a, **k: opened.append(a))
    for name in ("../outside.distcp", str(tmp_path / "outside.distcp")):
        _rewrite_metadata(src, lambda md: [setattr(v, "relative_path", name) for v in md.storage_data.values()])
        with pytest.raises(SpecError, match="not inside"):
            read_dcp_model_tensors(src)
    (tmp_path / "dcp" / "in.distcp").symlink_to(tmp_path / "outside.distcp")
    _rewrite_metadata(src, lambda md: [setattr(v, "relative_path", "in.distcp") for v in md.storage_data.values()])
    with pytest.raises(SpecError, match="points outside"):
        read_dcp_model_tensors(src)
    assert opened == []


@pytest.mark.parametrize("flag, value, needle", [
    ("--make-vocab-size-divisible-by", "0", "--make-vocab-size-divisible-by 0: must be >= 1"),
    ("--make-vocab-size-divisible-by", "-128", "must be >= 1"),
    ("--num-attention-heads", "0", "--num-attention-heads 0: must be >= 1"),
    ("--shards", "0", "--shards 0"),
    ("--vocab-size", "-3", "--vocab-size -3"),
    ("--layernorm-epsilon", "nan", "--layernorm-epsilon nan"),
    ("--layernorm-epsilon", "inf", "--layernorm-epsilon inf"),
    ("--consumed-train-samples", "-1", "--consumed-train-samples -1"),
])
def test_bad_convert_arguments_are_refused_before_reading(tmp_path, capsys, monkeypatch, flag, value, needle):
    import trainperf.model.dcp_convert as dc

    read = []
    monkeypatch.setattr(dc, "read_dcp_model_tensors", lambda p: read.append(p))
    argv = _convert_argv(tmp_path / "dcp", tmp_path / "out")
    argv = argv[:-1] + [value] if flag == "--num-attention-heads" else argv + [flag, value]
    _one_line_refusal(capsys, main(argv), needle)
    assert not read and not (tmp_path / "out").exists()


# ------------------------------------------------------------------ safetensors checkpoints (model.path)


def _safetensors_ckpt(dest: Path, shards: int = 2) -> Path:
    ckpt.save_megatron_checkpoint(_tiny_state(), TINY, dest, shards=shards)
    return dest


def _set_header(f: Path, edit) -> None:
    raw = f.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    edit(header)
    new = json.dumps(header).encode()
    f.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n:])


def _first_entry(header: dict) -> dict:
    return header[next(k for k in header if k != "__metadata__")]


def _index_names(name):
    def edit(p: Path):
        idx = json.loads((p / "model.safetensors.index.json").read_text())
        first = next(iter(idx["weight_map"]))
        idx["weight_map"][first] = name
        (p / "model.safetensors.index.json").write_text(json.dumps(idx))
    return edit


def _shard1(p: Path) -> Path:
    return sorted(p.glob("*.safetensors"))[0]


SAFETENSORS_CASES = {
    "index names ../../etc/passwd": (_index_names("../../etc/passwd"), "'..' part"),
    "index names /etc/passwd": (_index_names("/etc/passwd"), "absolute name"),
    "index names a list": (_index_names(["x"]), "corrupt"),
    "index names a FIFO": (lambda p: (os.mkfifo(p / "fifo"), _index_names("fifo")(p)), "not a regular file"),
    "index names a folder": (lambda p: ((p / "sub").mkdir(), _index_names("sub")(p)), "not a regular file"),
    "index nested 100k deep": (lambda p: (p / "model.safetensors.index.json").write_text("[" * 100_000),
                               "nested more than"),
    "config.json a link to /dev/zero": (lambda p: ((p / "config.json").unlink(), (p / "config.json").symlink_to(
        "/dev/zero")), "not a regular file"),
    "config.json NaN": (lambda p: (p / "config.json").write_text('{"hidden_size": NaN}'), "NaN"),
    "truncated shard": (lambda p: _shard1(p).write_bytes(_shard1(p).read_bytes()[:-9]), "not a readable safetensors"),
    "empty shard": (lambda p: _shard1(p).write_bytes(b""), "not a readable safetensors"),
    "garbage shard": (lambda p: _shard1(p).write_bytes(random.Random(2).randbytes(300)), "not a readable safetensors"),
    "header size huge": (lambda p: _shard1(p).write_bytes(struct.pack("<Q", 2**63) + _shard1(p).read_bytes()[8:]),
                         "not a readable safetensors"),
    "negative offsets": (lambda p: _set_header(_shard1(p), lambda h: _first_entry(h).update(data_offsets=[-8, 0])),
                         "not a readable safetensors"),
    "offsets past the end": (lambda p: _set_header(_shard1(p), lambda h: _first_entry(h).update(
        data_offsets=[0, 2**40])), "not a readable safetensors"),
    "negative shape": (lambda p: _set_header(_shard1(p), lambda h: _first_entry(h).update(shape=[-1, 8])),
                       "not a readable safetensors"),
    "bool dtype": (lambda p: _rewrite_with(p, "decoder.final_layernorm.weight", torch.ones(8, dtype=torch.bool)),
                   "dtype BOOL"),
    "complex dtype": (lambda p: _rewrite_with(p, "decoder.final_layernorm.bias", torch.ones(8, dtype=torch.complex64)),
                      "dtype C64"),
}


def _rewrite_with(p: Path, name: str, value: torch.Tensor) -> None:
    import shutil

    tensors, config = ckpt.megatron_checkpoint_contents(_tiny_state(), TINY)
    tensors[name] = value
    shutil.rmtree(p)
    ckpt.write_safetensors_dir(tensors, config, p, 2)


@pytest.mark.parametrize("case", sorted(SAFETENSORS_CASES))
def test_damaged_safetensors_checkpoints_are_refused_in_one_line(tmp_path, case):
    p = _safetensors_ckpt(tmp_path / "ck")
    damage, needle = SAFETENSORS_CASES[case]
    damage(p)
    with pytest.raises(SpecError, match=needle) as exc:
        index = ckpt.inspect_checkpoint(str(p))
        ckpt.check_checkpoint(index, TINY)
    assert "\n" not in str(exc.value)


def test_an_index_naming_a_file_outside_is_never_opened(tmp_path, monkeypatch):
    p = _safetensors_ckpt(tmp_path / "ck")
    (tmp_path / "outside.safetensors").write_bytes(_shard1(p).read_bytes())
    opened = []
    import trainperf.model.checkpoint as mod

    real = mod.safe_open
    monkeypatch.setattr(mod, "safe_open", lambda f, *a, **k: (opened.append(f), real(f, *a, **k))[1])
    for name in ("../outside.safetensors", str(tmp_path / "outside.safetensors"), "../../../../../../etc/passwd"):
        _index_names(name)(p)
        with pytest.raises(SpecError, match="not inside"):
            ckpt.inspect_checkpoint(str(p))
    assert opened == []


# ------------------------------------------------------------------------------- data convert


@pytest.fixture
def tokenizer_json(tmp_path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["the cat sat on the mat", "a dog ran"],
                            trainers.WordLevelTrainer(special_tokens=["<unk>", "<eod>"]))
    path = tmp_path / "tok" / "tokenizer.json"
    path.parent.mkdir()
    tok.save(str(path))
    return path


def _text_argv(inputs, out, tok, *extra) -> list[str]:
    return ["data", "convert", *map(str, inputs), "--out", str(out), "--tokenizer", str(tok),
            "--validation-documents", "1", *extra]


DATA_CASES = {  # case -> (file name, bytes, tokenizer?, extra flags, what the line says)
    "invalid UTF-8 in a token .txt": ("a.txt", b"1 2\n3 \xff\xfe 4\n", False, (), "a.txt:2: not UTF-8"),
    "invalid UTF-8 in a token .jsonl": ("a.jsonl", b'{"ids": [1]}\n{"ids": [2, "\xc3("]}\n', False, (),
                                        "a.jsonl:2: not UTF-8"),
    "invalid UTF-8 in raw text .jsonl": ("t.jsonl", b'{"text": "the cat"}\n{"text": "\xed\xa0\x80"}\n', True, (),
                                         "t.jsonl:2: not UTF-8"),
    "invalid UTF-8 in a raw .txt, per line": ("t.txt", b"the cat\nthe \xff mat\n", True, ("--per-line",),
                                              "t.txt:2: not UTF-8"),
    "invalid UTF-8 in a raw .txt, whole": ("t.txt", b"the cat\nthe \xff mat\n", True, (), "not UTF-8"),
    "JSON nested 100k deep": ("a.jsonl", b'{"ids": [1, 2]}\n' + b"[" * 100_000 + b"\n", False, (),
                              "a.jsonl:2: JSON nested more than"),
    "raw JSON nested 100k deep": ("t.jsonl", b'{"text": "a"}\n{"text": ' + b"[" * 100_000 + b"\n", True, (),
                                  "t.jsonl:2: JSON nested more than"),
    "NaN token id": ("a.jsonl", b'{"ids": [1, 2]}\n{"ids": [NaN]}\n', False, (), "NaN"),
    "a 60 MB line": ("t.jsonl", b'{"text": "the cat"}\n{"text": "' + b"the cat " * 7_500_000 + b'"}\n', True, (),
                     "t.jsonl:2: a line longer than"),
    "a 60 MB token line": ("a.txt", b"1 2\n" + b"3 " * 30_000_000 + b"\n", False, (), "a.txt:2: a line longer than"),
    "a 60 MB raw .txt as one document": ("t.txt", b"the cat " * 7_500_000, True, (), "--per-line"),
}


@pytest.mark.parametrize("case", sorted(DATA_CASES))
def test_hostile_data_inputs_are_refused_in_one_line(tmp_path, capsys, tokenizer_json, case):
    name, content, raw, extra, needle = DATA_CASES[case]
    f = tmp_path / name
    f.write_bytes(content)
    before = _tree(tmp_path)
    t0 = time.perf_counter()
    argv = _text_argv([f], tmp_path / "out", tokenizer_json, *extra) if raw else _data_argv([f], tmp_path / "out")
    _one_line_refusal(capsys, main(argv), needle)
    assert time.perf_counter() - t0 < 10  # refused from the bytes, not after tokenizing them
    assert _tree(tmp_path) == before


def test_a_fifo_input_is_refused_without_waiting(tmp_path, capsys):
    os.mkfifo(tmp_path / "a.txt")
    _one_line_refusal(capsys, main(_data_argv([tmp_path / "a.txt"], tmp_path / "out")), "not a regular file")


def test_a_tokenizer_panic_is_one_line(tmp_path, capsys, tokenizer_json, monkeypatch):
    """Whatever the Rust tokenizer raises (pyo3's PanicException is a BaseException) is one line."""
    import types

    import tokenizers

    class PanicException(BaseException):
        pass

    class Panicking:
        """The real tokenizer, whose batch encoder panics as the Rust one does."""

        def __init__(self, path):
            self.tok = tokenizers.Tokenizer.from_file(path)

        @classmethod
        def from_file(cls, path):
            return cls(path)

        def __getattr__(self, name):
            return getattr(self.tok, name)

        def encode_batch(self, *a, **k):
            raise PanicException("called `Result::unwrap()` on an `Err` value\nstack backtrace:")

    monkeypatch.setitem(sys.modules, "tokenizers", types.SimpleNamespace(Tokenizer=Panicking))
    (tmp_path / "t.jsonl").write_text('{"text": "the cat"}\n{"text": "a dog"}\n')
    _one_line_refusal(capsys, main(_text_argv([tmp_path / "t.jsonl"], tmp_path / "out", tokenizer_json)),
                      "PanicException")
    assert not (tmp_path / "out").exists()


def test_raw_text_without_the_tokenizers_package_names_it(tmp_path, capsys, tokenizer_json, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # as if not installed: import raises ImportError
    (tmp_path / "t.jsonl").write_text('{"text": "the cat"}\n')
    _one_line_refusal(capsys, main(_text_argv([tmp_path / "t.jsonl"], tmp_path / "out", tokenizer_json)),
                      "needs the tokenizers package")


def test_tokenizers_is_a_declared_dependency():
    import tomllib

    deps = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.split(">")[0].split("=")[0].strip() == "tokenizers" for d in deps)


def test_the_cli_contract_end_to_end(tmp_path, dcp_dir):
    """A handful of cases through a fresh interpreter: one line on stderr, exit 2, nothing changed."""
    (tmp_path / "bad.txt").write_bytes(b"1 \xff\n")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep").write_text("x")
    cases = [_convert_argv(dcp_dir, tmp_path / "full"), _data_argv([tmp_path / "bad.txt"], tmp_path / "o2")]
    before = _tree(tmp_path)
    for argv in cases:
        r = subprocess.run([sys.executable, "-m", "trainperf", *argv], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("trainperf: error: "), r.stderr
    assert _tree(tmp_path) == before


# ------------------------------------------------------------------------------------ fuzz

FUZZ_SEED = 37


def _mutate(data: bytes, rng: random.Random) -> bytes:
    """One random damage of a byte string: flips, a cut, an insertion, a duplicated or zeroed run."""
    b = bytearray(data)
    kind = rng.randrange(6)
    if kind == 0 or not b:
        for _ in range(rng.randint(1, 8)):
            if b:
                b[rng.randrange(len(b))] = rng.randrange(256)
    elif kind == 1:
        b = b[:rng.randrange(len(b))]
    elif kind == 2:
        i = rng.randrange(len(b) + 1)
        b[i:i] = rng.randbytes(rng.randint(1, 16))
    elif kind == 3:
        i = rng.randrange(len(b))
        b[i:i] = b[i:i + rng.randint(1, 64)]
    elif kind == 4:
        i = rng.randrange(len(b))
        b[i:i + rng.randint(1, 32)] = bytes(min(32, len(b) - i))
    else:
        i, j = sorted(rng.randrange(len(b) + 1) for _ in range(2))
        del b[i:j]
    return bytes(b)


def _hostile_value(rng: random.Random):
    return rng.choice([-1, 0, 2**63, 2**64 + 5, -(2**62), 10**30, 1.5, float("nan"), "x", None, [], {}, (1, 2),
                       torch.Size([-1]), torch.Size([2**40, 2**40]), (10**30,), torch.bool, torch.complex128, "../x", "/etc/passwd"])


def _mutate_metadata(md, rng: random.Random) -> None:
    """Set one field somewhere in DCP's metadata to a hostile value."""
    name = rng.choice(sorted(md.state_dict_metadata))
    t = md.state_dict_metadata[name]
    info = next(v for k, v in md.storage_data.items() if k.fqn == name)
    target, field = rng.choice([(t, "size"), (t.properties, "dtype"), (t.chunks[0], "offsets"),
                                (t.chunks[0], "sizes"), (info, "offset"), (info, "length"), (info, "relative_path"),
                                (info, "transform_descriptors"), (t, "chunks"), (md, "storage_data")])
    value = _hostile_value(rng)
    if rng.random() < 0.2 and field in vars(target):  # a pickle may also leave a field out altogether
        delattr(target, field)
        try:
            pickle.dumps(target)
            return
        except AttributeError:  # a class whose own __getstate__ needs the field (TensorProperties)
            pass
    setattr(target, field, value)


def _outcome(fn) -> str:
    try:
        fn()
    except SpecError as exc:
        assert "\n" not in str(exc), str(exc)
        return "refused"
    return "ok"


def test_fuzz_dcp_metadata_and_shards(tmp_path, capsys):
    """.metadata bytes damaged, one of its fields set to a hostile value, or the shard's bytes damaged:
    the conversion refuses in one line or writes a checkpoint; never a traceback."""
    rng = random.Random(FUZZ_SEED)
    src = _save_dcp(_tiny_state(), tmp_path / "dcp")
    md_bytes, shard_bytes = (src / ".metadata").read_bytes(), _shard(src).read_bytes()
    counts = {"ok": 0, "refused": 0}
    t0 = time.perf_counter()
    cases = 400
    for i in range(cases):
        (src / ".metadata").write_bytes(md_bytes)
        _shard(src).write_bytes(shard_bytes)
        which = i % 3
        if which == 0:
            (src / ".metadata").write_bytes(_mutate(md_bytes, rng))
        elif which == 1:
            md = pickle.loads(md_bytes)
            _mutate_metadata(md, rng)
            (src / ".metadata").write_bytes(pickle.dumps(md))
        else:
            _shard(src).write_bytes(_mutate(shard_bytes, rng))
        out = tmp_path / f"out{i}"
        counts[_outcome(lambda: convert_dcp_to_safetensors(src, out, 2))] += 1
        assert not any(p.name.startswith(f".out{i}.") for p in tmp_path.iterdir())
    elapsed = time.perf_counter() - t0
    with capsys.disabled():
        print(f"\nDCP fuzz: {cases} cases, {counts}, {elapsed:.1f} s")
    assert counts["refused"] > cases // 2  # the mutations are mostly damage, and are caught as such
    # through the CLI: the same contract end to end, in process
    (src / ".metadata").write_bytes(_mutate(md_bytes, random.Random(FUZZ_SEED)))
    rc = main(_convert_argv(src, tmp_path / "cli"))
    err = capsys.readouterr().err
    assert rc in (0, 2) and (rc == 0 or err.count("\n") == 1)


def test_fuzz_safetensors_header(tmp_path):
    rng = random.Random(FUZZ_SEED)
    p = _safetensors_ckpt(tmp_path / "ck", shards=1)
    f = p / "model.safetensors"
    raw = f.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    counts = {"ok": 0, "refused": 0}
    t0 = time.perf_counter()
    cases = 400
    for i in range(cases):
        if i % 8 == 0:  # a benign change: free text in the header's __metadata__, which any reader accepts
            header = json.loads(raw[8:8 + n])
            header["__metadata__"] = {"format": "pt", "note": rng.choice(["", "x" * 500, "\u202e\x1b[2J", "{[("])}
            new = json.dumps(header).encode()
            f.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n:])
        elif i % 2:  # the header's bytes (its length field included)
            f.write_bytes(_mutate(raw[:8 + n], rng) + raw[8 + n:])
        else:  # the header's JSON, re-encoded: hostile offsets, shapes, dtypes that still parse
            header = json.loads(raw[8:8 + n])
            entry = header[rng.choice([k for k in header if k != "__metadata__"])]
            key = rng.choice(["data_offsets", "shape", "dtype"])
            entry[key] = rng.choice([[-1, 4], [0, 2**62], [2**63, 0], [5, 1], [-(2**40)], [2**33, 2**33], "BOOL",
                                     "C64", "F64", "I8", [], [0], None, 7])
            new = json.dumps(header).encode()
            f.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n:])

        def inspect_and_read():
            index = ckpt.inspect_checkpoint(str(p))
            ckpt.check_checkpoint(index, TINY)
            from safetensors import safe_open

            with safe_open(str(f), framework="pt") as sf:  # what loading reads, once the checks pass
                for name in sf.keys():
                    sf.get_tensor(name)
        counts[_outcome(inspect_and_read)] += 1
    elapsed = time.perf_counter() - t0
    print(f"safetensors header fuzz: {cases} cases, {counts}, {elapsed:.1f} s")
    assert counts["refused"] > cases // 2 and counts["ok"] >= cases // 8


def _pretok_dir(tmp_path: Path) -> Path:
    f = tmp_path / "docs.txt"
    g = np.random.default_rng(0)
    f.write_text("".join(" ".join(map(str, g.integers(0, 100, g.integers(3, 30)))) + "\n" for _ in range(40)))
    pretok.convert([str(f)], str(tmp_path / "pt"), 128, 127, validation_documents=5)
    return tmp_path / "pt"


def test_fuzz_pretokenized_index(tmp_path):
    """meta.json, {split}_docs.npy and {split}_tokens.npy damaged one at a time: inspect_pretok refuses
    in one line, or the rows and documents it admits read."""
    rng = random.Random(FUZZ_SEED)
    d = _pretok_dir(tmp_path)
    files = ["meta.json", "train_docs.npy", "train_tokens.npy", "validation_docs.npy"]
    original = {n: (d / n).read_bytes() for n in files}
    counts = {"ok": 0, "refused": 0}
    t0 = time.perf_counter()
    cases = 300
    for i in range(cases):
        for n in files:
            (d / n).write_bytes(original[n])
        name = files[i % len(files)]
        if name == "meta.json" and i % 8 == 0:  # structured: a hostile value where a count belongs
            meta = json.loads(original[name])
            split = rng.choice(["train", "validation"])
            meta["splits"][split][rng.choice(["tokens", "documents"])] = _json_hostile(rng)
            (d / name).write_text(json.dumps(meta))
        else:
            (d / name).write_bytes(_mutate(original[name], rng))

        def inspect_and_read():
            rows = pretok.inspect_pretok(str(d), 8, 128)
            for split in pretok.SPLITS:
                s = pretok.PackedTokenSplit(d, split, 8)
                s.take(torch.arange(min(rows[split], 4)))
                meta = json.loads((d / "meta.json").read_text())
                for j in range(min(meta["splits"][split]["documents"], 3)):
                    pretok.read_document(d, split, j)
        counts[_outcome(inspect_and_read)] += 1
    elapsed = time.perf_counter() - t0
    print(f"pretok index fuzz: {cases} cases, {counts}, {elapsed:.1f} s")
    assert counts["refused"] > cases // 4 and counts["ok"] > 0


def _json_hostile(rng: random.Random):
    return rng.choice([-1, 2**70, 1.5, "12", None, [], True, 1e308, 10**6])


def test_fuzz_megatron_index(tmp_path):
    """A Megatron .idx damaged: inspect_megatron refuses in one line, or every row it admits reads."""
    rng = random.Random(FUZZ_SEED)
    g = np.random.default_rng(1)
    for split in megatron.SPLITS:
        megatron.write_indexed(tmp_path / f"{split}_text_document",
                               [g.integers(0, 100, g.integers(3, 40)) for _ in range(20)])
    idx = tmp_path / "train_text_document.idx"
    original = idx.read_bytes()
    counts = {"ok": 0, "refused": 0}
    t0 = time.perf_counter()
    cases = 400
    for _ in range(cases):
        idx.write_bytes(_mutate(original, rng))

        def inspect_and_read():
            rows = megatron.inspect_megatron(str(tmp_path), 8, 128)
            s = megatron.MegatronTokenSplit(tmp_path, "train", 8)
            if rows["train"]:
                s.take(torch.arange(rows["train"]))
            megatron.verify_megatron_tokens(str(tmp_path), "train", 2**16)
        counts[_outcome(inspect_and_read)] += 1
    elapsed = time.perf_counter() - t0
    print(f"Megatron index fuzz: {cases} cases, {counts}, {elapsed:.1f} s")
    assert counts["refused"] > cases // 2


def test_fuzz_data_convert_inputs(tmp_path):
    """Token .jsonl / .txt inputs damaged byte by byte: the converter refuses in one line or writes a
    dataset inspect_pretok accepts."""
    rng = random.Random(FUZZ_SEED)
    jsonl = "".join(json.dumps({"input_ids": [rng.randrange(100) for _ in range(rng.randint(1, 12))]}) + "\n"
                    for _ in range(12)).encode()
    txt = "".join(" ".join(str(rng.randrange(100)) for _ in range(rng.randint(1, 12))) + "\n" for _ in range(12)).encode()
    counts = {"ok": 0, "refused": 0}
    t0 = time.perf_counter()
    cases = 200
    for i in range(cases):
        name, data = ("in.jsonl", jsonl) if i % 2 else ("in.txt", txt)
        f = tmp_path / name
        f.write_bytes(_mutate(data, rng))
        out = tmp_path / f"o{i}"

        def convert_and_check():
            pretok.convert([str(f)], str(out), 100, None, validation_documents=1)
            pretok.inspect_pretok(str(out), 1, 100)
        counts[_outcome(convert_and_check)] += 1
        assert not any(p.name.startswith(f".o{i}.") for p in tmp_path.iterdir())
    elapsed = time.perf_counter() - t0
    print(f"data convert input fuzz: {cases} cases, {counts}, {elapsed:.1f} s")
    assert counts["refused"] > 0 and counts["ok"] > 0
