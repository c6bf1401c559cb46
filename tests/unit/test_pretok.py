"""The trainperf-pretok-v1 format: converter, reader, pre-launch checks (CPU, small files)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from trainperf.data import pretok
from trainperf.data.pretok import (PackedTokenSplit, convert, detect, inspect_pretok, read_document,
                                   verify_pretok_tokens)
from trainperf.core.errors import SpecError

from tests.fixtures.pretok import VOCAB, _docs, _write_txt

EOD = 999


def _write_jsonl(f: Path, docs, key="input_ids") -> Path:
    f.write_text("".join(json.dumps({key: d, "text": "x"}) + "\n" for d in docs))
    return f


def _stream(docs, eod):
    """Reference token stream and offsets, built by hand."""
    toks, offs = [], [0]
    for d in docs:
        toks += d + ([eod] if eod is not None else [])
        offs.append(len(toks))
    return toks, offs


def _load(out, split):
    t = np.load(out / f"{split}_tokens.npy", mmap_mode="r", allow_pickle=False)
    d = np.load(out / f"{split}_docs.npy", mmap_mode="r", allow_pickle=False)
    return t, d


def _check_split(out, split, docs, eod, dtype=np.uint16):
    toks, offs = _stream(docs, eod)
    t, d = _load(out, split)
    assert t.dtype == dtype and t.ndim == 1
    assert t.tolist() == toks
    assert d.dtype == np.int64 and d.tolist() == offs
    meta = json.loads((out / "meta.json").read_text())
    assert meta["splits"][split] == {"tokens": len(toks), "documents": len(docs)}
    for i, doc in enumerate(docs):
        assert read_document(out, split, i).tolist() == doc + ([eod] if eod is not None else [])


# ----------------------------------------------------------------------------------- converting


def test_convert_txt_with_validation_documents(tmp_path):
    docs = _docs(0, 12)
    f = _write_txt(tmp_path / "a.txt", docs[:7])
    # a blank line is no document
    with open(f, "a") as fh:
        fh.write("\n   \n")
    g = _write_txt(tmp_path / "b.txt", docs[7:])
    out = tmp_path / "out"
    summary = convert([str(f), str(g)], str(out), VOCAB, EOD, validation_documents=3, source="unit test")
    _check_split(out, "validation", docs[:3], EOD)
    _check_split(out, "train", docs[3:], EOD)
    meta = json.loads((out / "meta.json").read_text())
    assert meta == {"format": "trainperf-pretok-v1", "vocab_size": VOCAB, "dtype": "uint16", "eod_id": EOD,
                    "splits": meta["splits"], "source": "unit test"}
    assert summary["splits"] == meta["splits"]
    assert detect(out) and not detect(tmp_path)


@pytest.mark.parametrize("key", ["input_ids", "tokens", "ids"])
def test_convert_jsonl_keys_and_separate_validation(tmp_path, key):
    train, val = _docs(1, 9), _docs(2, 4)
    out = tmp_path / "out"
    convert([str(_write_jsonl(tmp_path / "t.jsonl", train, key))], str(out), VOCAB, EOD,
            validation_inputs=[str(_write_jsonl(tmp_path / "v.jsonl", val, key))])
    _check_split(out, "train", train, EOD)
    _check_split(out, "validation", val, EOD)


def test_convert_npy_1d_and_2d_without_eod(tmp_path):
    one = np.arange(5, 45, dtype=np.int32)            # a single document
    rows = np.arange(60, dtype=np.int64).reshape(4, 15) % VOCAB  # four documents
    np.save(tmp_path / "one.npy", one)
    np.save(tmp_path / "rows.npy", rows)
    out = tmp_path / "out"
    convert([str(tmp_path / "rows.npy"), str(tmp_path / "one.npy")], str(out), VOCAB, None, validation_documents=1)
    _check_split(out, "validation", [rows[0].tolist()], None)
    _check_split(out, "train", [r.tolist() for r in rows[1:]] + [one.tolist()], None)
    assert json.loads((out / "meta.json").read_text())["eod_id"] is None


def test_dtype_follows_vocab(tmp_path):
    docs = [[0, 65535, 3], [7, 8]]
    f = _write_txt(tmp_path / "a.txt", docs)
    convert([str(f)], str(tmp_path / "small"), 65536, None, validation_documents=1)
    convert([str(f)], str(tmp_path / "big"), 128256, 128001, validation_documents=1)
    assert _load(tmp_path / "small", "validation")[0].dtype == np.uint16
    big = _load(tmp_path / "big", "validation")[0]
    assert big.dtype == np.uint32 and big.tolist() == [0, 65535, 3, 128001]
    assert json.loads((tmp_path / "big" / "meta.json").read_text())["dtype"] == "uint32"
    assert json.loads((tmp_path / "small" / "meta.json").read_text())["dtype"] == "uint16"


def test_small_chunks_give_identical_files(tmp_path, monkeypatch):
    docs = _docs(3, 40, hi=80)
    txt = _write_txt(tmp_path / "a.txt", docs[:20])
    big = np.asarray(sum(docs[20:], []), dtype=np.int64)  # a long 1-D document, cut into many pieces
    np.save(tmp_path / "b.npy", big)
    np.save(tmp_path / "c.npy", np.asarray([d[:5] for d in docs[:10] if len(d) >= 5]))
    args = ([str(txt), str(tmp_path / "b.npy"), str(tmp_path / "c.npy")], VOCAB, EOD)
    convert(args[0], str(tmp_path / "one"), *args[1:], validation_documents=4)
    monkeypatch.setattr(pretok, "CHUNK_TOKENS", 7)
    convert(args[0], str(tmp_path / "many"), *args[1:], validation_documents=4)
    assert len(big) > 10 * 7  # the corpus is many chunks long
    for name in ["meta.json"] + [f"{s}_{k}.npy" for s in ("train", "validation") for k in ("tokens", "docs")]:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "many" / name).read_bytes(), name
    # and the content is the hand-built stream (the 1-D .npy is one document)
    c_rows = [d[:5] for d in docs[:10] if len(d) >= 5]
    _check_split(tmp_path / "many", "train", docs[4:20] + [big.tolist()] + c_rows, EOD)


def test_refuses_to_overwrite(tmp_path):
    f = _write_txt(tmp_path / "a.txt", _docs(4, 5))
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("x")
    with pytest.raises(SpecError, match="already exists"):
        convert([str(f)], str(out), VOCAB, EOD, validation_documents=1)
    assert sorted(p.name for p in out.iterdir()) == ["keep"]
    # an empty dir is fine: it is replaced
    empty = tmp_path / "empty"
    empty.mkdir()
    convert([str(f)], str(empty), VOCAB, EOD, validation_documents=1)
    assert detect(empty)


def test_failure_mid_conversion_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(pretok, "CHUNK_TOKENS", 5)  # some chunks are on disk when the failure comes
    written = []
    flush = pretok._NpyStream.flush

    def spy(self):
        flush(self)
        written.append((self.f, self.f.stat().st_size))
    monkeypatch.setattr(pretok._NpyStream, "flush", spy)
    good = _write_txt(tmp_path / "good.txt", _docs(5, 20))
    bad_docs = _docs(6, 3, lo=3)
    bad_docs[2][1] = VOCAB  # out of range, on line 3 of the last file
    bad = _write_txt(tmp_path / "last.txt", bad_docs)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(SpecError, match=r"last\.txt:3: token id 1000 \(token 1 of the document\)"):
        convert([str(good), str(bad)], str(tmp_path / "out"), VOCAB, EOD, validation_documents=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no out dir, no temp dir
    # the failure came mid-stream: token data had been written inside a temp dir next to out
    assert any(size > 128 and f.parent.name.startswith(".out.tmp-") for f, size in written)


@pytest.mark.parametrize("content, match", [
    ("1 2 x\n", r"bad\.txt:1: 'x' is not an integer"),
    ("1 2\n3 -1\n", r"bad\.txt:2: token id -1"),
    ("5 99999999999999999999999\n", r"bad\.txt:1: token id 99999999999999999999999"),
])
def test_convert_rejects_bad_txt(tmp_path, content, match):
    (tmp_path / "bad.txt").write_text(content)
    with pytest.raises(SpecError, match=match):
        convert([str(tmp_path / "bad.txt")], str(tmp_path / "out"), VOCAB, None, validation_documents=1)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("line, match", [
    ('{"text": "no ids"}', "one of the keys"),
    ('{"input_ids": [1, 2.5]}', "list of integer token ids"),
    ('{"input_ids": [1, true]}', "list of integer token ids"),
    ("[1, 2]", "one of the keys"),
    ("{not json", "not valid JSON"),
])
def test_convert_rejects_bad_jsonl(tmp_path, line, match):
    (tmp_path / "bad.jsonl").write_text('{"input_ids": [1, 2]}\n' + line + "\n")
    with pytest.raises(SpecError, match=r"bad\.jsonl:2: .*" + match):
        convert([str(tmp_path / "bad.jsonl")], str(tmp_path / "out"), VOCAB, None, validation_documents=1)


def test_convert_rejects_bad_npy_and_arguments(tmp_path):
    np.save(tmp_path / "f.npy", np.ones(4, dtype=np.float32))
    np.save(tmp_path / "big.npy", np.array([[1, 2], [3, VOCAB + 5]], dtype=np.int64))
    np.save(tmp_path / "ok.npy", np.arange(10))
    out = str(tmp_path / "out")
    with pytest.raises(SpecError, match=r"f\.npy: holds a 1-D float32"):
        convert([str(tmp_path / "f.npy")], out, VOCAB, None, validation_documents=1)
    with pytest.raises(SpecError, match=r"big\.npy row 1: token id 1005 \(token 1 of the document\)"):
        convert([str(tmp_path / "big.npy")], out, VOCAB, None, validation_documents=1)
    with pytest.raises(SpecError, match="no validation split"):
        convert([str(tmp_path / "ok.npy")], out, VOCAB, None)
    with pytest.raises(SpecError, match="not both"):
        convert([str(tmp_path / "ok.npy")], out, VOCAB, None, validation_documents=1,
                validation_inputs=[str(tmp_path / "ok.npy")])
    with pytest.raises(SpecError, match="hold only 1 non-empty documents"):
        convert([str(tmp_path / "ok.npy")], out, VOCAB, None, validation_documents=2)
    with pytest.raises(SpecError, match="train split would be empty"):
        convert([str(tmp_path / "ok.npy")], out, VOCAB, None, validation_documents=1)
    with pytest.raises(SpecError, match="--eod-id"):
        convert([str(tmp_path / "ok.npy")], out, VOCAB, VOCAB, validation_documents=1)
    with pytest.raises(SpecError, match="unknown input kind"):
        convert([str(tmp_path / "x.csv")], out, VOCAB, None, validation_documents=1)
    with pytest.raises(SpecError, match="no such input file"):
        convert([str(tmp_path / "missing.txt")], out, VOCAB, None, validation_documents=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.npy", "f.npy", "ok.npy"]


# -------------------------------------------------------------------------------------- reading


@pytest.fixture
def dataset(tmp_path):
    """A converted dir and its hand-built reference streams (seq_len 16, vocab 1000)."""
    train, val = _docs(7, 30), _docs(8, 10)
    out = tmp_path / "ds"
    convert([str(_write_txt(tmp_path / "t.txt", train))], str(out), VOCAB, EOD,
            validation_inputs=[str(_write_txt(tmp_path / "v.txt", val))])
    return out, {"train": _stream(train, EOD)[0], "validation": _stream(val, EOD)[0]}


def test_take_returns_exact_windows(dataset):
    out, ref = dataset
    seq = 16
    for split in ("train", "validation"):
        s = PackedTokenSplit(out, split, seq)
        toks = ref[split]
        assert len(s) == len(toks) // seq and len(toks) % seq  # a dropped tail exists
        idx = torch.tensor([len(s) - 1, 0, 2, 2])
        ids, mask = s.take(idx)
        expect = torch.tensor([toks[i * seq:(i + 1) * seq] for i in idx.tolist()], dtype=torch.int64)
        assert ids.dtype == torch.int64 and mask.dtype == torch.bool
        assert ids.shape == mask.shape == (4, seq)
        assert torch.equal(ids, expect)
        assert bool(mask.all())
    with pytest.raises(IndexError):
        s.take(torch.tensor([len(s)]))


def test_limit_views_first_rows(dataset):
    out, ref = dataset
    s = PackedTokenSplit(out, "validation", 8)
    assert len(s) > 3
    head = s.limit(3)
    assert len(head) == 3 and len(s) > 3  # the original is unchanged
    assert torch.equal(head.take(torch.arange(3))[0], s.take(torch.arange(3))[0])
    assert head.take(torch.tensor([2]))[0].tolist() == [ref["validation"][16:24]]
    with pytest.raises(IndexError):
        head.take(torch.tensor([3]))
    with pytest.raises(SpecError, match="cannot take the first"):
        s.limit(len(s) + 1)


def test_inspect_ok_and_verify_ok(dataset):
    out, ref = dataset
    rows = inspect_pretok(str(out), 16, VOCAB)
    assert rows == {"train": len(ref["train"]) // 16, "validation": len(ref["validation"]) // 16}
    for split in ("train", "validation"):
        verify_pretok_tokens(str(out), split, VOCAB)  # raises on failure
    with pytest.raises(SpecError):
        verify_pretok_tokens(str(out), "train", EOD)  # EOD itself is out of a 999-token vocabulary


def _meta(out):
    return json.loads((out / "meta.json").read_text())


def _set_meta(out, **kw):
    m = _meta(out)
    m.update(kw)
    (out / "meta.json").write_text(json.dumps(m))


def _save_over(f, arr):
    with open(f, "wb") as fh:
        np.save(fh, arr)


def _break_missing_dir(out):
    return str(out) + "-nope", "is not a directory"


def _break_missing_meta(out):
    (out / "meta.json").unlink()
    return str(out), "has no meta.json"


def _break_bad_json(out):
    (out / "meta.json").write_text("{")
    return str(out), "not valid JSON"


def _break_format(out):
    _set_meta(out, format="trainperf-pretok-v0")
    return str(out), "format is 'trainperf-pretok-v0', expected 'trainperf-pretok-v1'"


def _break_vocab(out):
    _set_meta(out, vocab_size=VOCAB + 1)
    return str(out), "vocab_size is 1001 but the model's vocab_size is 1000"


def _break_dtype_meta(out):
    _set_meta(out, dtype="uint32")
    return str(out), "dtype is 'uint32', but a vocabulary of 1000 is stored as 'uint16'"


def _break_dtype_file(out):
    t = np.load(out / "train_tokens.npy")
    _save_over(out / "train_tokens.npy", t.astype(np.int32))
    return str(out), r"train_tokens\.npy: holds a 1-D int32 array, expected 1-D uint16"


def _break_missing_tokens(out):
    (out / "validation_tokens.npy").unlink()
    return str(out), r"validation_tokens\.npy: missing"


def _break_missing_docs(out):
    (out / "train_docs.npy").unlink()
    return str(out), r"train_docs\.npy: missing"


def _break_truncated(out):
    f = out / "train_tokens.npy"
    f.write_bytes(f.read_bytes()[:-10])
    return str(out), r"train_tokens\.npy: not a readable \.npy file"


def _break_count(out):
    m = _meta(out)
    m["splits"]["train"]["tokens"] += 1
    (out / "meta.json").write_text(json.dumps(m))
    return str(out), r"train_tokens\.npy: holds \d+ tokens but meta\.json says splits\.train\.tokens="


def _break_splits(out):
    m = _meta(out)
    del m["splits"]["validation"]
    (out / "meta.json").write_text(json.dumps(m))
    return str(out), "splits.validation is None"


def _break_docs_order(out):
    d = np.load(out / "train_docs.npy")
    d[2], d[3] = d[3], d[2]
    _save_over(out / "train_docs.npy", d)
    return str(out), r"train_docs\.npy: offsets decrease at document 2"


def _break_docs_last(out):
    d = np.load(out / "validation_docs.npy")
    d[-1] -= 1
    _save_over(out / "validation_docs.npy", d)
    return str(out), r"validation_docs\.npy: last offset is \d+, expected the token count"


def _break_docs_length(out):
    d = np.load(out / "train_docs.npy")
    _save_over(out / "train_docs.npy", d[1:])
    return str(out), r"train_docs\.npy: .* expected 1-D int64 of documents\+1"


def _break_short_split(out):
    _save_over(out / "validation_tokens.npy", np.arange(10, dtype=np.uint16))
    _save_over(out / "validation_docs.npy", np.array([0, 10], dtype=np.int64))
    m = _meta(out)
    m["splits"]["validation"] = {"tokens": 10, "documents": 1}
    (out / "meta.json").write_text(json.dumps(m))
    return str(out), "validation split has 10 tokens, fewer than one row of data.seq_len=16"


def _break_pickled(out):
    _save_over(out / "train_tokens.npy", np.array([{"a": 1}], dtype=object))
    return str(out), r"train_tokens\.npy: not a readable \.npy file"


@pytest.mark.parametrize("breaker", [
    _break_missing_dir, _break_missing_meta, _break_bad_json, _break_format, _break_vocab, _break_dtype_meta,
    _break_dtype_file, _break_missing_tokens, _break_missing_docs, _break_truncated, _break_count, _break_splits,
    _break_docs_order, _break_docs_last, _break_docs_length, _break_short_split, _break_pickled,
], ids=lambda f: f.__name__[len("_break_"):])
def test_inspect_errors(dataset, breaker):
    out, _ = dataset
    inspect_pretok(str(out), 16, VOCAB)  # fine before
    path, match = breaker(out)
    with pytest.raises(SpecError, match=match) as exc:
        inspect_pretok(path, 16, VOCAB)
    assert "\n" not in str(exc.value)


def test_inspect_rejects_uint16_for_a_large_vocab(tmp_path):
    f = _write_txt(tmp_path / "a.txt", _docs(9, 20))
    out = tmp_path / "out"
    convert([str(f)], str(out), 65536, None, validation_documents=5)
    inspect_pretok(str(out), 4, 65536)
    _set_meta(out, vocab_size=128256)  # pretend the vocabulary is large: uint16 cannot hold it
    with pytest.raises(SpecError, match="stored as 'uint32'"):
        inspect_pretok(str(out), 4, 128256)


def test_verify_catches_planted_id(dataset, monkeypatch):
    out, ref = dataset
    monkeypatch.setattr(pretok, "CHUNK_TOKENS", 10)  # the bad id sits in a later chunk
    pos = len(ref["train"]) - 3
    t = np.load(out / "train_tokens.npy", mmap_mode="r+")
    t[pos] = VOCAB  # in-range for uint16, out of range for the model
    t.flush()
    del t
    inspect_pretok(str(out), 16, VOCAB)  # header-level checks cannot see it
    verify_pretok_tokens(str(out), "validation", VOCAB)
    with pytest.raises(SpecError, match=rf"train_tokens\.npy: token id 1000 at position {pos} is outside"):
        verify_pretok_tokens(str(out), "train", VOCAB)


# ------------------------------------------------------------------------------------------ CLI


def test_main_prints_summary_and_exits_2_on_bad_input(tmp_path, capsys):
    docs = _docs(10, 6)
    f = _write_txt(tmp_path / "a.txt", docs)
    out = tmp_path / "out"
    argv = [str(f), "--out", str(out), "--vocab-size", str(VOCAB), "--eod-id", str(EOD), "--validation-documents", "2",
            "--json"]
    assert pretok.main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["splits"]["validation"] == {"tokens": sum(len(d) + 1 for d in docs[:2]), "documents": 2}
    assert summary["splits"]["train"]["documents"] == 4
    assert pretok.main(argv) == 2  # out exists now
    err = capsys.readouterr().err
    assert err.startswith("trainperf: error: ") and "already exists" in err and err.count("\n") == 1
