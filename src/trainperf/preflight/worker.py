"""One rank of a launched preflight: ``python -m torch.distributed.run --standalone --nproc-per-node N
-m trainperf.preflight.worker OUTDIR``. Reads OUTDIR/request.json; rank 0 writes OUTDIR/raw.json."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from trainperf.preflight.measure import measure_all


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    req = json.loads((out / "request.json").read_text())
    raw = measure_all(req)
    if int(os.environ.get("RANK", "0")) == 0:
        tmp = out / "raw.json.tmp"
        tmp.write_text(json.dumps(raw))
        tmp.replace(out / "raw.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
