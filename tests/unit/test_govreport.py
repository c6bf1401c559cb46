"""MLPerf GovReport readers: parquet (reference) and NVIDIA npy formats, restricted unpickling, bad inputs."""

from __future__ import annotations

import os
import pickle
import pickletools
from pathlib import Path

import numpy as np
import pytest
import torch

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from trainperf.data import govreport as g  # noqa: E402
from trainperf.data.tokens import TokenSplit  # noqa: E402
from trainperf.core.errors import SpecError

SEQ = 32
VOCAB = 500


def _data(rows: int, seed: int, validation: bool) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (rows, SEQ), generator=gen)
    if not validation:
        return ids, torch.ones(rows, SEQ, dtype=torch.bool)
    # validation-like: prompt masked, summary targets, final token (EOS) masked; one row without any target
    mask = torch.zeros(rows, SEQ, dtype=torch.bool)
    for r in range(rows - 1):
        start = 5 + 3 * r
        mask[r, start:SEQ - 1] = True
    mask[0, 0] = True  # position 0 carries no context; must still round-trip exactly
    return ids, mask


def _write(d: Path, fmt: str, splits=("train", "validation")) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    data = {"train": _data(6, 1, False), "validation": _data(4, 2, True)}
    writer = g.write_govreport_parquet if fmt == "parquet" else g.write_govreport_npy
    for s in splits:
        writer(d, s, *data[s])
    return data


def _msg(exc_info, *needles: str) -> str:
    msg = str(exc_info.value)
    assert "\n" not in msg, msg
    for n in needles:
        assert n in msg, (n, msg)
    return msg


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("fmt", ["parquet", "npy"])
def test_round_trip(tmp_path, fmt):
    data = _write(tmp_path, fmt)
    assert g.detect(str(tmp_path)) == f"govreport-{fmt}"
    assert g.inspect_govreport(str(tmp_path), SEQ, VOCAB) == {"train": 6, "validation": 4}
    for split, (ids, mask) in data.items():
        g.verify_govreport_tokens(str(tmp_path), split, VOCAB)
        ts = g.load_govreport(str(tmp_path), split)
        assert isinstance(ts, TokenSplit)
        assert ts.input_ids.dtype == torch.int64 and ts.loss_mask.dtype == torch.bool
        assert torch.equal(ts.input_ids, ids) and torch.equal(ts.loss_mask, mask)
    stats = g.scan_govreport(str(tmp_path), "validation", VOCAB)
    vmask = data["validation"][1]
    assert stats == {"rows": 4, "seq_len": SEQ, "target_tokens": int(vmask[:, 1:].sum()), "rows_without_target": 1}
    assert g.scan_govreport(str(tmp_path), "train", VOCAB)["target_tokens"] == 6 * (SEQ - 1)


def test_parquet_and_npy_give_identical_splits(tmp_path):
    _write(tmp_path / "p", "parquet")
    _write(tmp_path / "n", "npy")
    for split in g.SPLITS:
        a = g.load_govreport(str(tmp_path / "p"), split)
        b = g.load_govreport(str(tmp_path / "n"), split)
        assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask)


def test_npy_from_nvidia_conversion_matches_parquet(tmp_path):
    """Convert a parquet file exactly like NVIDIA's convert_dataset.py; masks must stay input-aligned."""
    _write(tmp_path, "parquet")
    out = tmp_path / "nv"
    out.mkdir()
    for split in g.SPLITS:
        table = pq.read_table(tmp_path / f"{split}-00000-of-00001.parquet")
        rows = []
        for ids, labels in zip(table.column("input_ids").to_pylist(), table.column("labels").to_pylist()):
            rows.append({"input_ids": np.asarray(ids), "loss_mask": [int(x != -100) for x in labels],
                         "seq_start_id": [0]})
        np.save(out / split, rows, allow_pickle=True)  # np.save of a Python list of dicts, as NVIDIA does
        ref_labels = np.asarray(table.column("labels").to_pylist())
        ts = g.load_govreport(str(out), split)
        assert torch.equal(ts.loss_mask, torch.from_numpy(ref_labels != -100))  # not shifted by one
        p = g.load_govreport(str(tmp_path), split)
        assert torch.equal(ts.input_ids, p.input_ids) and torch.equal(ts.loss_mask, p.loss_mask)


def test_numpy1_pickle_names_are_accepted(tmp_path):
    """Real NVIDIA files were written by numpy 1.x (protocol 3, numpy.core.multiarray globals)."""
    from numpy.lib import format as npf

    ids, mask = _data(3, 5, True)
    arr = np.empty(3, dtype=object)
    for i in range(3):
        arr[i] = {"input_ids": ids[i].numpy(), "loss_mask": mask[i].numpy().astype(int).tolist(), "seq_start_id": [0]}
    payload = pickle.dumps(arr, protocol=3).replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n")
    globals_used = {a for op, a, _ in pickletools.genops(payload) if op.name == "GLOBAL"}
    assert "numpy.core.multiarray _reconstruct" in globals_used
    for split in g.SPLITS:
        with open(tmp_path / f"{split}.npy", "wb") as fh:
            npf.write_array_header_1_0(fh, {"descr": "|O", "fortran_order": False, "shape": (3,)})
            fh.write(payload)
    assert g.inspect_govreport(str(tmp_path), SEQ, VOCAB) == {"train": 3, "validation": 3}
    ts = g.load_govreport(str(tmp_path), "validation")
    assert torch.equal(ts.input_ids, ids) and torch.equal(ts.loss_mask, mask)


def test_parquet_shards_concatenate_in_sorted_order_and_data_subdir(tmp_path):
    a_ids, a_mask = _data(2, 7, False)
    b_ids, b_mask = _data(3, 8, False)
    d = tmp_path / "data"
    d.mkdir()
    # write shard 1 first to prove order comes from names, not creation time
    g.write_govreport_parquet(tmp_path / "tmp1", "train", b_ids, b_mask)
    os.replace(tmp_path / "tmp1" / "train-00000-of-00001.parquet", d / "train-00001-of-00002.parquet")
    g.write_govreport_parquet(tmp_path / "tmp0", "train", a_ids, a_mask)
    os.replace(tmp_path / "tmp0" / "train-00000-of-00001.parquet", d / "train-00000-of-00002.parquet")
    g.write_govreport_parquet(d, "validation", a_ids, a_mask)
    assert g.detect(str(tmp_path)) == "govreport-parquet"
    assert g.inspect_govreport(str(tmp_path), SEQ, VOCAB) == {"train": 5, "validation": 2}
    ts = g.load_govreport(str(tmp_path), "train")
    assert torch.equal(ts.input_ids, torch.cat([a_ids, b_ids]))


def test_detect(tmp_path):
    assert g.detect(str(tmp_path / "nope")) is None
    assert g.detect(str(tmp_path)) is None
    (tmp_path / "train.npy").write_bytes(b"")
    assert g.detect(str(tmp_path)) == "govreport-npy"
    (tmp_path / "validation-00000-of-00001.parquet").write_bytes(b"")
    assert g.detect(str(tmp_path)) == "govreport-parquet"


# ----------------------------------------------------------------------------- restricted unpickler


MARKER_NAME = "pwned"


class _Evil:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _evil_npy(d: Path, row: int) -> Path:
    ids, mask = _data(3, 3, False)
    marker = d / MARKER_NAME
    arr = np.empty(3, dtype=object)
    for i in range(3):
        arr[i] = {"input_ids": ids[i].numpy(), "loss_mask": [1] * SEQ, "seq_start_id": [0]}
    arr[row]["loss_mask"] = _Evil(marker)
    for split in g.SPLITS:
        np.save(d / f"{split}.npy", arr, allow_pickle=True)
    # the payload really references os.system (posix.system on Linux)
    raw = (d / "train.npy").read_bytes()
    strings = {a for op, a, _ in pickletools.genops(raw[raw.index(b"\x80"):]) if isinstance(a, str)}
    assert "system" in strings and os.system.__module__ in strings
    return marker


def test_restricted_unpickler_refuses_os_system(tmp_path):
    marker = _evil_npy(tmp_path, row=0)
    for call in (lambda: g.inspect_govreport(str(tmp_path), SEQ, VOCAB),
                 lambda: g.verify_govreport_tokens(str(tmp_path), "train", VOCAB),
                 lambda: g.load_govreport(str(tmp_path), "train")):
        with pytest.raises(SpecError) as ei:
            call()
        _msg(ei, "train.npy", f"{os.system.__module__}.system", "refused")
    assert not marker.exists()


def test_restricted_unpickler_refuses_payload_beyond_first_row(tmp_path):
    marker = _evil_npy(tmp_path, row=2)
    # the cheap check reads only row 0, so it passes; the full read must refuse
    assert g.inspect_govreport(str(tmp_path), SEQ, VOCAB) == {"train": 3, "validation": 3}
    with pytest.raises(SpecError) as ei:
        g.load_govreport(str(tmp_path), "validation")
    _msg(ei, "validation.npy", "refused")
    assert not marker.exists()


def test_restricted_unpickler_refuses_builtins_eval(tmp_path):
    from numpy.lib import format as npf

    class Eval:
        def __reduce__(self):
            return (eval, ("1+1",))

    for split in g.SPLITS:
        with open(tmp_path / f"{split}.npy", "wb") as fh:
            npf.write_array_header_1_0(fh, {"descr": "|O", "fortran_order": False, "shape": (1,)})
            pickle.dump(Eval(), fh, protocol=4)
    with pytest.raises(SpecError) as ei:
        g.load_govreport(str(tmp_path), "train")
    _msg(ei, "builtins.eval", "refused")


# ----------------------------------------------------------------------------- bad inputs


def test_missing_directory_and_files(tmp_path):
    with pytest.raises(SpecError) as ei:
        g.inspect_govreport(str(tmp_path / "absent"), SEQ, VOCAB)
    _msg(ei, "absent", "not a directory")
    with pytest.raises(SpecError) as ei:
        g.inspect_govreport(str(tmp_path), SEQ, VOCAB)
    _msg(ei, "train.npy", "parquet")


@pytest.mark.parametrize("fmt,name", [("parquet", "validation*.parquet"), ("npy", "validation.npy")])
def test_missing_split_file(tmp_path, fmt, name):
    _write(tmp_path, fmt, splits=("train",))
    with pytest.raises(SpecError) as ei:
        g.inspect_govreport(str(tmp_path), SEQ, VOCAB)
    _msg(ei, name)


def test_parquet_wrong_columns(tmp_path):
    for split in g.SPLITS:
        pq.write_table(pa.table({"tokens": [[1] * SEQ], "labels": [[1] * SEQ]}), tmp_path / f"{split}-0.parquet")
    with pytest.raises(SpecError) as ei:
        g.inspect_govreport(str(tmp_path), SEQ, VOCAB)
    _msg(ei, "train-0.parquet", "input_ids")
    for split in g.SPLITS:
        pq.write_table(pa.table({"input_ids": [[1] * SEQ], "labels": [["a"] * SEQ]}), tmp_path / f"{split}-0.parquet")
    with pytest.raises(SpecError) as ei:
        g.load_govreport(str(tmp_path), "train")
    _msg(ei, "labels", "list of integers")


def test_npy_wrong_keys_and_packed_rows(tmp_path):
    ids = np.arange(SEQ)
    for split in g.SPLITS:
        np.save(tmp_path / f"{split}.npy", [{"input_ids": ids, "labels": ids.tolist()}], allow_pickle=True)
    with pytest.raises(SpecError) as ei:
        g.inspect_govreport(str(tmp_path), SEQ, VOCAB)
    _msg(ei, "train.npy", "loss_mask")
    for split in g.SPLITS:
        np.save(tmp_path / f"{split}.npy", [{"input_ids": ids, "loss_mask": [1] * SEQ, "seq_start_id": [0, 10]}],
                allow_pickle=True)
    with pytest.raises(SpecError) as ei:
        g.load_govreport(str(tmp_path), "validation")
    _msg(ei, "seq_start_id", "[0, 10]")
    for split in g.SPLITS:
        np.save(tmp_path / f"{split}.npy", [{"input_ids": ids, "loss_mask": [2] * SEQ, "seq_start_id": [0]}],
                allow_pickle=True)
    with pytest.raises(SpecError) as ei:
        g.verify_govreport_tokens(str(tmp_path), "train", VOCAB)
    _msg(ei, "loss_mask", "0/1")


def test_npy_numeric_array_rejected(tmp_path):
    for split in g.SPLITS:
        np.save(tmp_path / f"{split}.npy", np.zeros((2, SEQ), dtype=np.int64))
    with pytest.raises(SpecError) as ei:
        g.inspect_govreport(str(tmp_path), SEQ, VOCAB)
    _msg(ei, "train.npy", "int64", "object array")


@pytest.mark.parametrize("fmt", ["parquet", "npy"])
def test_wrong_row_length(tmp_path, fmt):
    _write(tmp_path, fmt)
    with pytest.raises(SpecError) as ei:
        g.inspect_govreport(str(tmp_path), 2 * SEQ, VOCAB)
    _msg(ei, "train", str(SEQ), f"data.seq_len={2 * SEQ}")


@pytest.mark.parametrize("fmt", ["parquet", "npy"])
def test_ragged_rows(tmp_path, fmt):
    ids = [list(range(SEQ)), list(range(SEQ - 1))]
    for split in g.SPLITS:
        if fmt == "parquet":
            pq.write_table(pa.table({"input_ids": ids, "labels": ids}), tmp_path / f"{split}-0.parquet")
        else:
            np.save(tmp_path / f"{split}.npy", [{"input_ids": np.asarray(r), "loss_mask": [1] * len(r),
                                                 "seq_start_id": [0]} for r in ids], allow_pickle=True)
    if fmt == "parquet":  # footer value counts expose it without reading rows
        with pytest.raises(SpecError) as ei:
            g.inspect_govreport(str(tmp_path), SEQ, VOCAB)
        _msg(ei, "input_ids", f"expected {SEQ} per row")
    with pytest.raises(SpecError) as ei:
        g.verify_govreport_tokens(str(tmp_path), "train", VOCAB)
    _msg(ei, "row 1", str(SEQ - 1))


@pytest.mark.parametrize("fmt", ["parquet", "npy"])
def test_token_id_out_of_vocab(tmp_path, fmt):
    ids, mask = _data(3, 4, False)
    ids[1, 7] = VOCAB
    writer = g.write_govreport_parquet if fmt == "parquet" else g.write_govreport_npy
    for split in g.SPLITS:
        writer(tmp_path, split, ids, mask)
    with pytest.raises(SpecError) as ei:
        g.verify_govreport_tokens(str(tmp_path), "train", VOCAB)
    _msg(ei, f"[0, {VOCAB})", "row 1 position 7")
    g.verify_govreport_tokens(str(tmp_path), "train", VOCAB + 1)  # a larger vocabulary accepts it
    if fmt == "parquet":  # footer statistics catch it before launch
        with pytest.raises(SpecError) as ei:
            g.inspect_govreport(str(tmp_path), SEQ, VOCAB)
        _msg(ei, "input_ids", str(VOCAB))


def test_labels_inconsistent_with_input_ids(tmp_path):
    ids = np.arange(SEQ).reshape(1, SEQ) + 10
    labels = ids.copy()
    labels[0, :4] = -100
    labels[0, 9] = 3  # neither -100 nor the input id
    for split in g.SPLITS:
        pq.write_table(pa.table({"input_ids": ids.tolist(), "labels": labels.tolist()}), tmp_path / f"{split}-0.parquet")
    assert g.inspect_govreport(str(tmp_path), SEQ, VOCAB) == {"train": 1, "validation": 1}
    for call in (lambda: g.verify_govreport_tokens(str(tmp_path), "train", VOCAB),
                 lambda: g.load_govreport(str(tmp_path), "validation")):
        with pytest.raises(SpecError) as ei:
            call()
        _msg(ei, "row 0 position 9", "labels=3", "input_ids=19")


def test_attention_mask_with_padding_rejected(tmp_path):
    ids = [list(range(SEQ))]
    attn = [[1] * (SEQ - 2) + [0, 0]]
    for split in g.SPLITS:
        pq.write_table(pa.table({"input_ids": ids, "labels": ids, "attention_mask": attn}),
                       tmp_path / f"{split}-0.parquet")
    with pytest.raises(SpecError) as ei:
        g.verify_govreport_tokens(str(tmp_path), "train", VOCAB)
    _msg(ei, "attention_mask", f"position {SEQ - 2}")


@pytest.mark.parametrize("fmt", ["parquet", "npy"])
def test_empty_split(tmp_path, fmt):
    _write(tmp_path, fmt)
    empty = torch.zeros(0, SEQ, dtype=torch.int64)
    (g.write_govreport_parquet if fmt == "parquet" else g.write_govreport_npy)(
        tmp_path, "validation", empty, empty.bool())
    with pytest.raises(SpecError) as ei:
        g.inspect_govreport(str(tmp_path), SEQ, VOCAB)
    _msg(ei, "validation", "no rows")


def test_split_without_any_target_rejected_rows_without_target_allowed(tmp_path):
    ids, _ = _data(2, 9, False)
    g.write_govreport_npy(tmp_path, "train", ids, torch.ones_like(ids, dtype=torch.bool))
    g.write_govreport_npy(tmp_path, "validation", ids, torch.zeros_like(ids, dtype=torch.bool))
    g.verify_govreport_tokens(str(tmp_path), "train", VOCAB)
    with pytest.raises(SpecError) as ei:
        g.verify_govreport_tokens(str(tmp_path), "validation", VOCAB)
    _msg(ei, "validation", "no loss targets")


def test_truncated_parquet(tmp_path):
    _write(tmp_path, "parquet")
    f = tmp_path / "train-00000-of-00001.parquet"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(SpecError) as ei:
        g.inspect_govreport(str(tmp_path), SEQ, VOCAB)
    _msg(ei, "train-00000-of-00001.parquet", "not a readable parquet file")
    with pytest.raises(SpecError) as ei:
        g.load_govreport(str(tmp_path), "train")
    _msg(ei, "not a readable parquet file")


@pytest.mark.parametrize("keep", [0.9, 0.3, 60])
def test_truncated_npy(tmp_path, keep):
    _write(tmp_path, "npy")
    f = tmp_path / "validation.npy"
    raw = f.read_bytes()
    f.write_bytes(raw[: int(len(raw) * keep)] if keep < 1 else raw[:keep])  # 60 bytes: inside the header
    with pytest.raises(SpecError) as ei:
        g.inspect_govreport(str(tmp_path), SEQ, VOCAB)
    _msg(ei, "validation.npy")
    with pytest.raises(SpecError) as ei:
        g.load_govreport(str(tmp_path), "validation")
    _msg(ei, "validation.npy")


def test_writers_reject_bad_inputs(tmp_path):
    ids = torch.zeros(2, SEQ, dtype=torch.int64)
    with pytest.raises(SpecError):
        g.write_govreport_npy(tmp_path, "train", ids, torch.zeros(2, SEQ + 1, dtype=torch.bool))
    with pytest.raises(SpecError):
        g.write_govreport_parquet(tmp_path, "test", ids, ids.bool())
    g.write_govreport_parquet(tmp_path, "train", ids, ids.bool())
    (tmp_path / "train-00001-of-00002.parquet").write_bytes(b"")
    with pytest.raises(SpecError) as ei:
        g.write_govreport_parquet(tmp_path, "train", ids, ids.bool())
    _msg(ei, "train-00001-of-00002.parquet")
