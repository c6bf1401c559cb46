"""``RunRow``: the one owner of a run's row in the results store, from its creation to its end.

The launcher that starts a run makes its row (``create``) and ends it when the run could not
(``mark_failed``, ``record_abnormal_end``); the trainer's rank 0 is lent the same row (the same
object, or in a torchrun worker one attached to the row its launcher made) through
``RunContext.row`` and records the run's start (``started``) and its typed ``RunSummary``
(``finished``) or failure (``failed``) on it. Nothing else of a run opens the store: one connection
per process, opened when first used (ranks other than 0 never open one).
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

from trainperf.core.layout import layout_string
from trainperf.core.results import RunSummary
from trainperf.core.spec import RunSpec
from trainperf.store.db import Store, StoreError, disk_full_reason


class RunRow:
    def __init__(self, db_path: str | os.PathLike, run_id: str, owner_pid: int | None = None):
        """``owner_pid``: the process that created the row (a torchrun worker's launcher); None: this one."""
        self.db_path, self.run_id, self.owner_pid = str(db_path), run_id, owner_pid
        self._store: Store | None = None

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store(self.db_path)
        return self._store

    @property
    def folder(self) -> Path:
        """The store's folder (where a full disk is looked for)."""
        return Path(self.db_path).parent

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    # -- the launcher's side ------------------------------------------------------------------------

    def create(self, spec: RunSpec, world_size: int, out_dir: Path, git_sha: str | None = None,
               purpose: str = "run", sweep_item: dict | None = None, reap: bool = False) -> None:
        """The row, 'running', owned by this process (``Store.create_run``); ``reap``: first mark this
        host's dead runs failed (a launcher does; an external rank leaves it to them)."""
        if reap:
            self.store.reap_dead_runs()
        self.store.create_run(self.run_id, spec.workload, spec.to_dict(), layout_string(spec.parallel), world_size,
                              spec.mlperf.division, spec.mlperf.comparable, spec.eval.target, str(out_dir),
                              git_sha=git_sha, purpose=purpose, sweep_item=sweep_item)

    def set_process_group(self, pgid: int) -> None:
        self.store.update_run_info(self.run_id, pgid=pgid)

    def mark_failed(self, reason: str) -> str | None:
        """Mark the run failed if it is still running; what could not be recorded (the store on a full
        disk, say) is returned, to be told with the run's summary instead."""
        try:
            self.store.mark_failed_if_running(self.run_id, reason)
            return None
        except (sqlite3.Error, StoreError) as exc:
            return f"{reason} (not recorded in the store: {disk_full_reason(exc, self.folder) or exc})"

    def prefix_failed_reason(self, cause: str) -> bool:
        """Put ``cause`` (a lost node, a cancelled job) before the reason of a row already failed."""
        return self.store.prefix_failed_reason(self.run_id, cause)

    def read(self) -> dict:
        """The row as stored ({} when it is not there); StoreError or sqlite3.Error when unreadable."""
        return self.store.get_run(self.run_id) or {}

    # -- the trainer's side (rank 0) ----------------------------------------------------------------

    def started(self, hardware: dict, software: dict, predicted: dict) -> None:
        """The machine it runs on, its software, and what the planner predicted for it."""
        self.store.update_run_info(self.run_id, hardware_json=json.dumps(hardware), software_json=json.dumps(software),
                                   predicted_step_time_s=predicted.get("step_time_s"),
                                   predicted_peak_gib=predicted.get("peak_mem_gib"))

    def finished(self, summary: RunSummary, evals: list[dict], steps: list[dict], summary_path: Path) -> bool:
        """The run's typed summary, its evals and sampled steps, in one transaction; False when the row
        was already ended (its launcher gone): the store keeps the first end of a run."""
        return self.store.finish_run(self.run_id, eval_rows=evals, step_rows=steps,
                                     owner_pid=self.owner_pid or os.getpid(), **summary.result_columns(),
                                     summary_path=str(summary_path))

    def failed(self, status: str, reason: str, evals: list[dict], steps: list[dict]) -> bool:
        return self.store.finish_run(self.run_id, eval_rows=evals, step_rows=steps,
                                     owner_pid=self.owner_pid or os.getpid(), status=status, status_reason=reason)
