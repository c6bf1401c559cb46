"""core/untrusted: the readers every untrusted file goes through."""

import os

import pytest

from trainperf.core.errors import SpecError
from trainperf.core.untrusted import (finite_number, load_untrusted_json, parse_untrusted_json,
                                      printable, read_untrusted_bytes)


def test_printable_escapes_terminal_controls():
    assert printable("a\x1b]0;owned\x07b") == "a\\x1b]0;owned\\x07b"
    assert printable("x\ny\u202ez") == "x\\x0ay\\u202ez"
    assert printable("NVIDIA H200 ümlaut") == "NVIDIA H200 ümlaut"
    assert printable("a" * 500, limit=10) == "aaaaaaa..."


def test_fifo_device_and_link_out_of_tree_refused(tmp_path):
    fifo = tmp_path / "f.json"
    os.mkfifo(fifo)
    with pytest.raises(SpecError, match="not a regular file"):
        read_untrusted_bytes(fifo)
    link = tmp_path / "zero.json"
    link.symlink_to("/dev/zero")
    with pytest.raises(SpecError, match="outside"):
        read_untrusted_bytes(link, root=tmp_path)
    with pytest.raises(SpecError, match="not a regular file"):
        read_untrusted_bytes(link)


def test_size_cap_and_json_limits(tmp_path):
    big = tmp_path / "big.json"
    big.write_text("[" + "1," * 100 + "1]")
    with pytest.raises(SpecError, match="203 bytes, more than the 50 allowed"):
        read_untrusted_bytes(big, max_bytes=50)
    assert load_untrusted_json(big) == [1] * 101
    with pytest.raises(SpecError, match="nested more than 64"):
        parse_untrusted_json("[" * 100_000 + "]" * 100_000, where="x")
    assert parse_untrusted_json('{"a": "[[[[" }', where="x", max_depth=1) == {"a": "[[[["}
    with pytest.raises(SpecError, match="NaN"):
        parse_untrusted_json('{"a": NaN}', where="x")
    with pytest.raises(SpecError, match="not valid JSON"):
        parse_untrusted_json('{"a": ', where="x")


def test_finite_number():
    assert finite_number("3", "gbs", lo=1) == 3.0
    for bad in (float("nan"), float("inf"), "1e400", [1], True, None):
        with pytest.raises(SpecError):
            finite_number(bad, "gbs")
    with pytest.raises(SpecError, match="above 0"):
        finite_number(0, "throughput", lo=0, lo_open=True)


def test_a_config_file_alias_bomb_and_fifo_are_refused(tmp_path):
    from trainperf.core.resolve import load_config_file

    bomb = tmp_path / "c.yaml"
    bomb.write_text('a: &a ["x","x","x","x","x","x","x","x","x","x"]\n'
                    + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)))
    with pytest.raises(SpecError, match="more than the"):
        load_config_file(str(bomb))
    fifo = tmp_path / "f.yaml"
    os.mkfifo(fifo)
    with pytest.raises(SpecError, match="not a regular file"):
        load_config_file(str(fifo))
