"""`data convert --tokenizer`: raw text through a local tokenizer into the packed pretraining format."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trainperf.core.errors import SpecError
from trainperf.data import pretok
from trainperf.data.pretok import TextOptions, convert, read_document


@pytest.fixture
def tokenizer_json(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["the cat sat on the mat", "a dog ran"],
                            trainers.WordLevelTrainer(special_tokens=["<unk>", "<eod>"]))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path, tok


def test_jsonl_text_is_encoded_by_the_tokenizer_with_its_eod(tmp_path, tokenizer_json):
    _, tok = tokenizer_json
    texts = ["the cat sat", "a dog ran on the mat", "the mat", "cat"]
    (tmp_path / "c4.jsonl").write_text("".join(json.dumps({"text": t, "url": "x"}) + "\n" for t in texts))
    out = convert([str(tmp_path / "c4.jsonl")], str(tmp_path / "pretok"), None, None, validation_documents=1,
                  text=TextOptions(str(tmp_path), eod_token="<eod>"))
    eod = tok.token_to_id("<eod>")
    assert out["vocab_size"] == tok.get_vocab_size() and out["eod_id"] == eod
    assert out["splits"]["validation"]["documents"] == 1 and out["splits"]["train"]["documents"] == 3
    doc = read_document(tmp_path / "pretok", "train", 0)
    assert doc.tolist() == tok.encode("a dog ran on the mat", add_special_tokens=False).ids + [eod]


def test_txt_files_are_documents_and_bad_inputs_are_one_line_errors(tmp_path, tokenizer_json, capsys):
    path, tok = tokenizer_json
    for i, t in enumerate(["the cat sat on the mat", "a dog ran"]):
        (tmp_path / f"d{i}.txt").write_text(t + "\n")
    argv = [str(tmp_path / "d0.txt"), str(tmp_path / "d1.txt"), "--out", str(tmp_path / "o"), "--tokenizer", str(path),
            "--validation-documents", "1", "--json"]
    assert pretok.main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["splits"]["train"]["tokens"] == 3 and summary["eod_id"] is None
    assert np.array_equal(read_document(tmp_path / "o", "validation", 0), tok.encode("the cat sat on the mat").ids)
    with pytest.raises(SpecError, match="not a token of"):
        convert([str(tmp_path / "d0.txt")], str(tmp_path / "p"), None, None, validation_documents=1,
                text=TextOptions(str(path), eod_token="</s>"))
    with pytest.raises(SpecError, match="neither tokenizer.json nor tokenizer.model"):
        convert([str(tmp_path / "d0.txt")], str(tmp_path / "p"), None, None, validation_documents=1,
                text=TextOptions(str(tmp_path / "o")))
    (tmp_path / "bad.jsonl").write_text('{"body": "x"}\n')
    assert pretok.main([str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "q"), "--tokenizer", str(path),
                        "--validation-documents", "1"]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:1: expected a JSON object with a string 'text' field" in err and err.count("\n") == 1


def test_a_sentencepiece_model_encodes_like_sentencepiece_itself(tmp_path):
    spm = pytest.importorskip("sentencepiece")  # in the test extras; optional for users
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(["the cat sat on the mat", "a dog ran far", "the mat was red", "cats and dogs"] * 20))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "sp"), vocab_size=24,
                                   model_type="unigram", user_defined_symbols=["<eod>"], minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "sp.model"))
    texts = ["the cat ran", "a red mat", "dogs sat"]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = convert([str(tmp_path / "docs.jsonl")], str(tmp_path / "pretok"), None, None, validation_documents=1,
                  text=TextOptions(str(tmp_path / "sp.model"), eod_token="<eod>"))
    eod = sp.PieceToId("<eod>")
    assert out["vocab_size"] == sp.GetPieceSize() == 24 and out["eod_id"] == eod
    assert read_document(tmp_path / "pretok", "train", 0).tolist() == sp.Encode("a red mat") + [eod]
    with pytest.raises(SpecError, match="not a SentencePiece model"):
        (tmp_path / "bad.model").write_bytes(b"not a model")
        convert([str(tmp_path / "docs.jsonl")], str(tmp_path / "pretok2"), None, None, validation_documents=1,
                text=TextOptions(str(tmp_path / "bad.model")))
