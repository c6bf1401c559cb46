"""torchrun as trainperf starts it: ``python -m trainperf.parallel.torchrun ARGS`` is ``python -m
torch.distributed.run ARGS``, except that its end is told in one line -- a signal that stopped it, or
its failed ranks -- instead of a Python traceback (the ranks record the run's end themselves)."""

from __future__ import annotations

import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main as torchrun_main


def main(argv: list[str] | None = None) -> int:
    try:
        torchrun_main(sys.argv[1:] if argv is None else argv)
    except SignalException as exc:  # torchrun has already stopped its ranks
        print(f"trainperf: torchrun stopped its ranks ({exc.sigval.name})", file=sys.stderr)
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:  # torchrun logged each failed rank's exit above
        ranks = ", ".join(f"rank {r} exit {f.exitcode}" for r, f in sorted(exc.failures.items()))
        print(f"trainperf: torchrun: ranks failed ({ranks})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
