"""What every side-by-side script here does the same way: refuse to run without a GPU, and append its
result as one JSON line (bench/data/*.json files are these lines)."""

from __future__ import annotations

import json
import sys


def has_cuda(script: str) -> bool:
    """True on a CUDA machine; else says so on stderr (the script then exits 2)."""
    import torch  # here: scripts that only launch `trainperf run` need no torch of their own

    if torch.cuda.is_available():
        return True
    print(f"bench/{script} needs a CUDA GPU", file=sys.stderr)
    return False


def append_json_line(path: str | None, record: dict) -> None:
    """Append ``record`` to ``path`` as one line of JSON (nothing without a path)."""
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps(record) + "\n")
