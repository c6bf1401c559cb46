"""torchrun as trainperf starts it: ``python -m trainperf.parallel.torchrun ARGS`` is ``python -m
torch.distributed.run ARGS``, except that

- its end is told in one line -- a signal that stopped it, or its failed ranks -- instead of a Python
  traceback (the ranks record the run's end themselves);
- on a host without CUDA, a ``-m MODULE`` entry point is imported here once and each rank is forked
  from this interpreter (torchrun's own ``--run-path`` with ``--start-method fork``): a rank starts
  without importing torch again. With CUDA each rank is its own interpreter, as torchrun starts it,
  so no rank can inherit anything of a CUDA runtime.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

import torch
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main as torchrun_main


def forked_ranks_argv(argv: list[str]) -> list[str]:
    """``argv`` with ``-m MODULE`` replaced by the module's file under ``--run-path --start-method fork``,
    the module imported first (so every rank forks with it, and what it imports, loaded); ``argv`` as it
    is when there is no ``-m``, the module is a package or not a plain file, or it does not import."""
    if "-m" not in argv:
        return argv
    i = argv.index("-m")
    module = argv[i + 1]
    try:
        spec = importlib.util.find_spec(module)
        if spec is None or spec.submodule_search_locations is not None or not (spec.origin or "").endswith(".py"):
            return argv
        importlib.import_module(module)
    except Exception:  # noqa: BLE001  each rank then starts it itself and reports what fails, as torchrun's ranks do
        return argv
    return [*argv[:i], "--run-path", "--start-method", "fork", spec.origin, *argv[i + 2:]]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not torch.cuda.is_available():
        argv = forked_ranks_argv(argv)
    try:
        torchrun_main(argv)
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
