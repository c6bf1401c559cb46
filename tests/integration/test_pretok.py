"""The trainperf-pretok-v1 format: converter, reader, pre-launch checks (CPU, small files)."""

import json
import subprocess
import sys


from trainperf.data.pretok import inspect_pretok

from tests.fixtures.pretok import VOCAB, _docs, _write_txt


def test_module_runs_as_a_script(tmp_path):
    f = _write_txt(tmp_path / "a.txt", _docs(11, 4))
    v = _write_txt(tmp_path / "v.txt", _docs(12, 2))
    r = subprocess.run([sys.executable, "-m", "trainperf.data.pretok", str(f), "--out", str(tmp_path / "o"),
                        "--vocab-size", str(VOCAB), "--validation-inputs", str(v), "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["splits"]["validation"]["documents"] == 2
    assert inspect_pretok(str(tmp_path / "o"), 4, VOCAB)["train"] >= 1
