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

import functools
import importlib
import importlib.util
import logging
import sys

import torch
import torch.multiprocessing as mp
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main as torchrun_main

from trainperf.parallel.launcher import RANKS_END_ENV, rank_end, signal_name

ELASTIC_PROCESS_LOGGER = "torch.distributed.elastic.multiprocessing.api"


class _NoTraceback(logging.Filter):
    """Drop torch-elastic's record of a failed forked rank: a traceback of its own monitor loop, not of
    the rank. The rank and how it ended are told in one line when torchrun returns (``main``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.exc_info is None


def _blame_the_killed_rank(join):
    """``ProcessContext.join`` of forked ranks reports the first failed rank it looks at: when a rank is
    killed (kill -9, the OOM killer), the peers that then fail on their broken connections are as likely
    to be named. A rank already ended by a signal before the join -- before torch's own clean-up signals
    the rest -- is the one reported."""
    @functools.wraps(join)
    def wrapped(self, *args, **kwargs):
        before = [p.exitcode for p in self.processes]  # polled, not joined
        try:
            return join(self, *args, **kwargs)
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
            killed = [i for i, code in enumerate(before) if code is not None and code < 0]
            if not killed or exc.error_index in killed:
                raise
            i, code = killed[0], before[killed[0]]
            name = signal_name(-code)
            raise mp.ProcessExitedException(f"process {i} terminated with signal {name}", error_index=i,
                                            error_pid=self.processes[i].pid, exit_code=code,
                                            signal_name=name) from None
    return wrapped


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


def _write_ranks_end(exitcodes: dict[int, int]) -> None:
    """{rank: exit code} of the failed ranks to the file ``TRAINPERF_RANKS_END`` names, if any."""
    import json
    import os

    path = os.environ.get(RANKS_END_ENV)
    if not path:
        return
    try:
        with open(path, "w") as fh:
            json.dump({"exitcodes": {str(r): code for r, code in exitcodes.items()},
                       "ends": [rank_end(r, code) for r, code in sorted(exitcodes.items())]}, fh)
    except OSError:  # a full disk: the line printed above is what is left of it
        pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not torch.cuda.is_available():
        argv = forked_ranks_argv(argv)
    logging.getLogger(ELASTIC_PROCESS_LOGGER).addFilter(_NoTraceback())
    mp.ProcessContext.join = _blame_the_killed_rank(mp.ProcessContext.join)
    try:
        torchrun_main(argv)
    except SignalException as exc:  # torchrun has already stopped its ranks
        print(f"trainperf: torchrun stopped its ranks ({exc.sigval.name})", file=sys.stderr)
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:  # torchrun logged each failed rank's exit above
        ranks = ", ".join(rank_end(r, f.exitcode) for r, f in sorted(exc.failures.items()))
        print(f"trainperf: torchrun: ranks failed ({ranks})", file=sys.stderr)
        _write_ranks_end({r: f.exitcode for r, f in exc.failures.items()})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
