"""MLPerf logging through the ``mlperf-logging`` package's ``mllog``: rank 0 only, one file per run.

Each run gets its own ``logging.Logger`` with a single file handler, so runs in one process (tests,
sweeps) never write into each other's files, and nothing goes to stdout.
"""

from __future__ import annotations

import logging
from pathlib import Path

from mlperf_logging.mllog import constants as C
from mlperf_logging.mllog.mllog import MLLogger


class RunLog:
    """Thin wrapper: a no-op on ranks other than 0."""

    def __init__(self, path: Path | None, run_id: str):
        self.enabled = path is not None
        self._handler = None
        if not self.enabled:
            return
        logger = logging.getLogger(f"trainperf.mllog.{run_id}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        for h in list(logger.handlers):
            logger.removeHandler(h)
        self._handler = logging.FileHandler(str(path), mode="w")
        self._handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(self._handler)
        self._logger = logger
        root = str(Path(__file__).resolve().parents[2])
        # stack offset 2: record the trainer's call site, not this wrapper
        self._log = MLLogger(logger=logger, default_stack_offset=2, root_dir=root)

    def event(self, key: str, value=None, **metadata) -> None:
        if self.enabled:
            self._log.event(key=key, value=value, metadata=metadata or None)

    def start(self, key: str, value=None, **metadata) -> None:
        if self.enabled:
            self._log.start(key=key, value=value, metadata=metadata or None)

    def end(self, key: str, value=None, **metadata) -> None:
        if self.enabled:
            self._log.end(key=key, value=value, metadata=metadata or None)

    def close(self) -> None:
        if self._handler is not None:
            self._handler.flush()
            self._logger.removeHandler(self._handler)
            self._handler.close()
            self._handler = None


KEYS = C  # re-export the constants module for call sites: KEYS.RUN_START, ...
