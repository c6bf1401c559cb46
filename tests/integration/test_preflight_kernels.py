"""preflight measures the planner's kernel table; on a GPU it becomes a measured figure plan uses."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.fixtures.preflight import _env, preflight_cmd
from trainperf.plan.kernels import load_table


def test_preflight_cli_on_cpu_measures_the_table_when_asked(tmp_path):
    cmd = preflight_cmd("--nproc-per-node", "1", "--device", "cpu", "--quick", "--kernels", "yes", "--json",
                        "--out", str(tmp_path / "runs"), "--db", str(tmp_path / "t.db"))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    kt = result["kernel_table"]
    assert Path(kt["path"]).is_file() and kt["gemm_shapes"] > 0
    assert "kernel_table" not in result["measured_overrides"]
    assert load_table(kt["path"]).device == "cpu"
