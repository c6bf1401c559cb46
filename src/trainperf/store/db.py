"""The results store: one SQLite file, versioned schema, one transaction per write.

WAL journaling and a busy timeout make concurrent writers (several runs, a sweep, a report) safe;
every write is a single ``BEGIN IMMEDIATE`` transaction, so a reader never sees half a run.
A run row is created as ``running`` and finished in one update; a row left ``running`` by a process
that no longer exists is marked ``failed`` the next time the store is opened on that host.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from trainperf.core.processes import pid_namespace, process_alive, process_group_alive, process_start_time
from trainperf.core.results import RESULT_COLUMNS

SCHEMA_VERSION = 8
BUSY_TIMEOUT_S = 30.0  # how long a write waits for another process's transaction
MIN_FREE_BYTES_NEW_STORE = 16 * 2**20  # a new store's schema, WAL and first rows

MIGRATIONS = {
    1: """
    CREATE TABLE runs (
        run_id TEXT PRIMARY KEY,
        created_at REAL NOT NULL,
        finished_at REAL,
        workload TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('running', 'success', 'failed', 'hung')),
        status_reason TEXT,
        division TEXT,
        comparable INTEGER NOT NULL DEFAULT 0,
        spec_json TEXT NOT NULL,
        layout TEXT NOT NULL,
        world_size INTEGER NOT NULL,
        hardware_json TEXT,
        software_json TEXT,
        git_sha TEXT,
        host TEXT,
        pid INTEGER,
        target REAL,
        time_to_train_s REAL,
        samples_to_target INTEGER,
        final_eval_loss REAL,
        steps INTEGER,
        step_time_s REAL,
        tokens_per_s REAL,
        tokens_per_s_per_gpu REAL,
        model_tflops_per_gpu REAL,
        mfu REAL,
        peak_mem_gib REAL,
        out_dir TEXT,
        mllog_path TEXT,
        summary_path TEXT
    );
    CREATE INDEX runs_by_workload ON runs (workload, created_at);
    CREATE TABLE evals (
        run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
        samples_count INTEGER NOT NULL,
        step INTEGER NOT NULL,
        eval_loss REAL NOT NULL,
        elapsed_s REAL NOT NULL,
        PRIMARY KEY (run_id, samples_count)
    );
    CREATE TABLE steps (
        run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
        step INTEGER NOT NULL,
        samples INTEGER NOT NULL,
        loss REAL,
        lr REAL,
        grad_norm REAL,
        step_time_s REAL,
        tokens_per_s REAL,
        PRIMARY KEY (run_id, step)
    );
    """,
    # v2: the planner. Ranked layouts are kept so `run --layout-from-plan ID` can use one, and every
    # run keeps what the planner predicted for it, so `report` shows predicted vs measured.
    2: """
    CREATE TABLE plans (
        plan_id TEXT PRIMARY KEY,
        created_at REAL NOT NULL,
        workload TEXT NOT NULL,
        gpus INTEGER NOT NULL,
        gpus_per_node INTEGER NOT NULL,
        gpu TEXT NOT NULL,
        overrides_json TEXT NOT NULL,
        predicted_json TEXT NOT NULL
    );
    ALTER TABLE runs ADD COLUMN predicted_step_time_s REAL;
    ALTER TABLE runs ADD COLUMN predicted_peak_gib REAL;
    """,
    # v3: sweeps. One row per expanded item; an item with a finished run is never run again.
    3: """
    CREATE TABLE sweep_items (
        sweep_id TEXT NOT NULL,
        item_id TEXT NOT NULL,
        workload TEXT NOT NULL,
        nproc INTEGER NOT NULL,
        overrides_json TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('pending', 'running', 'success', 'failed')),
        run_id TEXT,
        reason TEXT,
        started_at REAL,
        finished_at REAL,
        PRIMARY KEY (sweep_id, item_id)
    );
    """,
    # v4: preflight results; the latest one of a GPU model feeds `plan` (measured beats datasheet)
    4: """
    CREATE TABLE preflights (
        preflight_id TEXT PRIMARY KEY, created_at REAL NOT NULL, host TEXT, hosts_json TEXT NOT NULL,
        world_size INTEGER NOT NULL, device TEXT NOT NULL, gpu TEXT, quick INTEGER NOT NULL,
        exit_code INTEGER NOT NULL, n_pass INTEGER NOT NULL, n_warn INTEGER NOT NULL, n_fail INTEGER NOT NULL,
        overrides_json TEXT NOT NULL, result_path TEXT
    );
    CREATE INDEX preflights_by_gpu ON preflights (gpu, created_at);
    CREATE TABLE preflight_checks (
        preflight_id TEXT NOT NULL REFERENCES preflights (preflight_id) ON DELETE CASCADE,
        idx INTEGER NOT NULL, check_name TEXT NOT NULL, subject TEXT NOT NULL, size TEXT, value REAL, unit TEXT,
        datasheet REAL, pct REAL, verdict TEXT NOT NULL, note TEXT,
        PRIMARY KEY (preflight_id, idx)
    );
    """,
    # v5: which process namespace a run's pid and a sweep item's claim belong to (a pid means nothing
    # across PID namespaces: containers on one host share its hostname)
    5: """
    ALTER TABLE runs ADD COLUMN pid_ns TEXT;
    ALTER TABLE sweep_items ADD COLUMN owner_host TEXT;
    ALTER TABLE sweep_items ADD COLUMN owner_pid_ns TEXT;
    ALTER TABLE sweep_items ADD COLUMN owner_pid INTEGER;
    """,
    # v6: what tells a live run from a dead one when a pid is reused or ranks outlive their launcher:
    # the start time of the recorded process and the process group of the run's tree (a run row and the
    # run a sweep item started). Columns are only added: no row is rewritten.
    6: """
    ALTER TABLE runs ADD COLUMN pid_started REAL;
    ALTER TABLE runs ADD COLUMN pgid INTEGER;
    ALTER TABLE sweep_items ADD COLUMN owner_started REAL;
    ALTER TABLE sweep_items ADD COLUMN run_pgid INTEGER;
    """,
    # v7: a run is a run or a tune trial (kept out of reports and scores unless asked for); the trials
    # stored before v7 are recognised by the eval interval `trainperf tune` gives them (no eval at all)
    7: """
    ALTER TABLE runs ADD COLUMN purpose TEXT NOT NULL DEFAULT 'run' CHECK (purpose IN ('run', 'trial'));
    UPDATE runs SET purpose = 'trial' WHERE spec_json LIKE '%"every_samples": 1000000000%';
    """,
    # v8: runs of another engine read from its MLPerf submission folders (`trainperf import`); NULL is
    # this engine's own run
    8: """
    ALTER TABLE runs ADD COLUMN engine TEXT;
    """,
}
PURPOSES = ("run", "trial")

# the runs columns an imported run may fill (import_runs)
IMPORTED_RUN_FIELDS = ("run_id", "created_at", "finished_at", "workload", "status", "status_reason", "division",
                       "comparable", "spec_json", "layout", "world_size", "hardware_json", "software_json", "target",
                       "time_to_train_s", "samples_to_target", "steps", "step_time_s", "tokens_per_s",
                       "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "out_dir", "mllog_path", "engine")

# what finish_run may write: a RunSummary's result columns, and the store's own record of the end
RUN_RESULT_FIELDS = (*RESULT_COLUMNS, "finished_at", "summary_path")


class StoreError(RuntimeError):
    pass


def _is_ours_and_dead(host: str | None, pid_ns: str | None, pid: int | None, started: float | None = None) -> bool:
    """A process recorded as (host, PID namespace, pid, start time) that is known gone. Another host's,
    or another namespace's, cannot be asked: it is not known gone. Rows from before v5 have no
    namespace, from before v6 no start time (a pid reused since then then looks alive)."""
    if host != socket.gethostname() or pid is None:
        return False
    if pid_ns is not None and pid_ns != pid_namespace():
        return False
    return not process_alive(pid, started)


def run_may_be_alive(row: dict) -> bool:
    """Whether any process of a run may still be running: its recorded process (pid and start time),
    or a living member of its process group. Another host's or namespace's run may always be."""
    if row.get("host") != socket.gethostname() or row.get("pid") is None:
        return True
    if row.get("pid_ns") is not None and row["pid_ns"] != pid_namespace():
        return True
    if process_alive(row["pid"], row.get("pid_started")):
        return True
    return row.get("pgid") is not None and process_group_alive(row["pgid"])


def require_existing_store(path: str | os.PathLike, used_by: str) -> None:
    """StoreError unless a store exists at ``path``: a reader given a misspelt --db would otherwise
    create a new, empty one and show nothing. ``used_by``: what wrote it ("your runs")."""
    if not Path(path).exists():
        raise StoreError(f"no results store at {str(path)!r} (nothing recorded there); give the --db {used_by} used")


DISK_NEARLY_FULL_BYTES = 1 << 20  # below this, a failed write is put down to the full disk


def disk_full_reason(exc: BaseException, where: str | os.PathLike) -> str | None:
    """'the disk is full (...)' when ``exc`` is a write that failed for want of space -- ENOSPC, SQLite's
    "database or disk is full", or an I/O error on a file system with (almost) no space left -- else None."""
    import errno

    try:
        free = shutil.disk_usage(where).free
    except OSError:
        free = None
    said = isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
    said = said or getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "disk is full" in str(exc)
    io_error = isinstance(exc, sqlite3.Error) and "disk I/O error" in str(exc)
    if not (said or (io_error and free is not None and free < DISK_NEARLY_FULL_BYTES)):
        return None
    left = "" if free is None else f"{free:,} bytes free on the file system of {str(where)!r}"
    return f"the disk is full ({left or 'No space left on device'})"


def _remove_journals_made(journals: list[Path]) -> None:
    """Remove the -wal/-shm files a refused open made. A -wal holding anything is kept: it would be
    another process's uncommitted pages, never ours (this open wrote nothing)."""
    for journal in journals:
        try:
            if journal.name.endswith("-wal") and journal.stat().st_size > 0:
                continue
            journal.unlink()
        except OSError:  # not made after all, or not ours to remove
            pass


def _newer_schema(path: Path, version: int) -> StoreError:
    return StoreError(f"results store {str(path)!r} has schema v{version}, newer than this trainperf's "
                      f"(v{SCHEMA_VERSION}): upgrade trainperf, or give another --db")


def check_store_path(path: str | os.PathLike) -> None:
    """StoreError if a store at ``path`` could not be opened or created, without creating anything
    (bad input must leave no file behind): an existing one is opened and checked, a new one's nearest
    existing folder must be a writable folder."""
    path = Path(path)
    if path.exists():
        Store(path).close()
        return
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise StoreError(f"results store {str(path)!r}: cannot create its folder ({str(ancestor)!r} is a file); "
                         "give a --db path in a folder you can write")
    if not os.access(ancestor, os.W_OK):
        raise StoreError(f"results store {str(path)!r}: {str(ancestor)!r} is not writable; give a --db path in a "
                         "folder you can write")
    if shutil.disk_usage(ancestor).free < MIN_FREE_BYTES_NEW_STORE:
        raise StoreError(f"results store {str(path)!r}: less than {MIN_FREE_BYTES_NEW_STORE // 2**20} MiB free on "
                         f"the file system of {str(ancestor)!r}; free space or give another --db")


class Store:
    def __init__(self, path: str | os.PathLike, read_only_ok: bool = False):
        """``read_only_ok``: a reader (report, sweep status) may open a store it cannot write; it then
        reads it as it is (no WAL switch, no migration, no reaping)."""
        self.path = Path(path)
        self.writable = True
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"results store {str(self.path)!r}: cannot create its folder ({exc.strerror}); "
                             "give a --db path in a folder you can write") from None
        if self.path.is_dir():
            raise StoreError(f"results store {str(self.path)!r} is a folder; give --db a file in it, e.g. "
                             f"{str(self.path / 'trainperf.db')!r}")
        # SQLite opens a read-only file and fails only at the first write (a run's row, a report's reaping);
        # WAL also creates files beside it
        for where in (self.path, self.path.parent):
            if where.exists() and not os.access(where, os.W_OK):
                if not (read_only_ok and self.path.is_file()):
                    raise StoreError(f"results store {str(self.path)!r} is read-only here ({str(where)!r} is not "
                                     "writable); copy it to a folder you can write and give that as --db")
                self.writable = False
        existed = self.path.exists()
        # the journal files this open makes (WAL: -wal and -shm): a refused open removes those it made
        journals = [p for p in (Path(f"{self.path}-wal"), Path(f"{self.path}-shm")) if not p.exists()]
        try:
            self.conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None)
            self.conn.row_factory = sqlite3.Row
            self.conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            self.conn.execute("PRAGMA foreign_keys = ON")
            self._check_integrity()
            if self.writable:
                self._switch_to_wal()
                self._migrate()
            elif self.schema_version > SCHEMA_VERSION:
                raise _newer_schema(self.path, self.schema_version)
        except (sqlite3.DatabaseError, StoreError) as exc:
            if getattr(self, "conn", None) is not None:
                self.conn.close()
            if isinstance(exc, StoreError):  # refused as it is (a damaged file, a newer schema)
                raise
            if not existed:  # a store that could not be made (a full disk) leaves no file behind
                for leftover in (self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm")):
                    leftover.unlink(missing_ok=True)
            else:
                _remove_journals_made(journals)
            full = disk_full_reason(exc, self.path.parent)
            if full:  # a healthy file on a full disk: not damaged, nothing to restore
                raise StoreError(f"results store {str(self.path)!r}: {full}; nothing was written to it; free space "
                                 "there, or give a --db on another disk") from None
            if "readonly" in str(exc).replace("-", "").replace(" ", ""):
                raise StoreError(f"results store {str(self.path)!r} is read-only here ({exc}); copy it to a folder "
                                 "you can write and give that as --db") from None
            raise StoreError(f"results store {str(self.path)!r} is not a usable SQLite database ({exc}); nothing "
                             "was written to it; give another --db, or restore it from a copy") from None

    def _check_integrity(self) -> None:
        """SQLite's own consistency check of every page (``PRAGMA quick_check``: b-trees, records, no
        index comparison) before anything reads or writes: a damaged file is refused, never written."""
        if not self.path.is_file() or self.path.stat().st_size == 0:
            return  # a new store
        problems = [r[0] for r in self.conn.execute("PRAGMA quick_check(3)").fetchall()]
        if problems != ["ok"]:
            found = " ".join("; ".join(problems).split())  # SQLite's report spans lines: one line here
            raise StoreError(f"results store {str(self.path)!r} is damaged (database disk image is malformed; "
                             f"quick_check: {found[:160]}); nothing was written to it; restore it from a backup or "
                             "give another --db")

    def _switch_to_wal(self) -> None:
        """Put the file in WAL mode once; it stays so.

        Changing the journal mode needs the file to itself, and SQLite answers "database is locked" at
        once, without waiting on the busy timeout, while another process holds it (the ranks of one
        torchrun opening a new store together). So wait here, as the busy timeout would.
        """
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        if self.conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
            return
        while True:
            try:
                self.conn.execute("PRAGMA journal_mode = WAL")  # a file system without WAL keeps its mode
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def close(self) -> None:
        self.conn.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def _migrate(self) -> None:
        with self.transaction() as c:
            version = c.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise _newer_schema(self.path, version)
            for v in range(version + 1, SCHEMA_VERSION + 1):
                # statement by statement: executescript() would COMMIT mid-transaction
                for stmt in MIGRATIONS[v].split(";"):
                    if stmt.strip():
                        c.execute(stmt)
                c.execute(f"PRAGMA user_version = {v}")

    def check_cell_types(self, tables: tuple[str, ...] = ("runs", "evals", "steps")) -> None:
        """StoreError naming the first table and column holding a cell of another type than the column's
        (SQLite stores what it is given: a text in a REAL column, written by another tool, would break
        whatever formats it)."""
        allowed = {"REAL": ("real", "integer", "null"), "INTEGER": ("integer", "null"), "TEXT": ("text", "null")}
        for table in tables:
            columns = [(r["name"], r["type"].upper()) for r in self.conn.execute(f"PRAGMA table_info({table})")]
            checked = [(name, allowed[kind]) for name, kind in columns if kind in allowed]
            counts = self.conn.execute("SELECT " + ", ".join(
                f"SUM(typeof({name}) NOT IN ({', '.join(repr(t) for t in ok)}))" for name, ok in checked)
                + f" FROM {table}").fetchone()
            for (name, ok), bad in zip(checked, counts):
                if bad:
                    kind = dict(columns)[name]
                    raise StoreError(f"results store {str(self.path)!r}: {bad} cell(s) of {table}.{name} are not "
                                     f"{kind} values; the store was changed by something other than trainperf -- "
                                     "fix or remove those rows, or give another --db")

    @property
    def schema_version(self) -> int:
        return self.conn.execute("PRAGMA user_version").fetchone()[0]

    # -- runs ---------------------------------------------------------------------------------

    def create_run(self, run_id: str, workload: str, spec: dict, layout: str, world_size: int,
                   division: str, comparable: bool, target: float, out_dir: str,
                   hardware: dict | None = None, software: dict | None = None, git_sha: str | None = None,
                   pid: int | None = None, purpose: str = "run", sweep_item: dict | None = None) -> None:
        """The run's row, 'running', owned by process ``pid`` (this one by default) of this host, with
        that process's start time and process group: what tells later whether the run may be alive.
        ``sweep_item`` ({sweep_id, item_id, owner_pid}: the item a sweep started this run for): the item,
        while that sweep still holds it, gets this run's id in the same transaction, so no sweep killed
        afterwards can leave the item without it (and ``finish_run`` then ends the item with the run)."""
        pid = pid if pid is not None else os.getpid()
        try:
            pgid = os.getpgid(pid)
        except OSError:
            pgid = None
        with self.transaction() as c:
            c.execute(
                """INSERT INTO runs (run_id, created_at, workload, status, division, comparable, spec_json, layout,
                   world_size, hardware_json, software_json, git_sha, host, pid, pid_ns, pid_started, pgid, target,
                   out_dir, purpose) VALUES (?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                (run_id, time.time(), workload, division, int(comparable), json.dumps(spec, sort_keys=True), layout,
                 world_size, json.dumps(hardware or {}), json.dumps(software or {}), git_sha, socket.gethostname(),
                 pid, pid_namespace(), process_start_time(pid), pgid, target, out_dir, purpose),
            )
            if sweep_item:
                c.execute("UPDATE sweep_items SET run_id = ? WHERE sweep_id = ? AND item_id = ? AND status = 'running' "
                          "AND owner_pid = ?", (run_id, sweep_item["sweep_id"], sweep_item["item_id"],
                                                sweep_item["owner_pid"]))

    def import_runs(self, rows: list[dict]) -> list[str]:
        """Finished runs of another engine, all in one transaction (a run id already stored is left as
        it is); returns the ids newly written."""
        bad = sorted({k for row in rows for k in row} - set(IMPORTED_RUN_FIELDS))
        if bad or any(not row.get("engine") for row in rows):
            raise ValueError(f"imported runs need an engine and only these fields: {bad or 'engine missing'}")
        written = []
        with self.transaction() as c:
            for row in rows:
                if c.execute("SELECT 1 FROM runs WHERE run_id = ?", (row["run_id"],)).fetchone():
                    continue
                cols = list(row)
                c.execute(f"INSERT INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                          [row[k] for k in cols])
                written.append(row["run_id"])
        return written

    def update_run_info(self, run_id: str, **fields: Any) -> None:
        allowed = {"hardware_json", "software_json", "pid", "pgid", "predicted_step_time_s", "predicted_peak_gib"}
        bad = set(fields) - allowed
        if bad:
            raise StoreError(f"cannot update {sorted(bad)}")
        with self.transaction() as c:
            for k, v in fields.items():
                c.execute(f"UPDATE runs SET {k} = ? WHERE run_id = ?", (v, run_id))

    def finish_run(self, run_id: str, eval_rows: list[dict] | None = None, step_rows: list[dict] | None = None,
                   owner_pid: int | None = None, **result: Any) -> bool:
        """Write the run's outcome, its evals and sampled steps in one transaction -- only while the row is
        still 'running' and, given ``owner_pid``, owned by that process (the one that created the row). A
        row already ended (marked failed because its launcher died, say) is left as it is: False."""
        bad = set(result) - set(RUN_RESULT_FIELDS)
        if bad:
            raise StoreError(f"unknown run result fields {sorted(bad)}")
        result.setdefault("finished_at", time.time())
        cols = ", ".join(f"{k} = ?" for k in result)
        owned = "" if owner_pid is None else " AND pid = ?"
        with self.transaction() as c:
            if c.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is None:
                raise StoreError(f"run {run_id!r} is not in the store")
            cur = c.execute(f"UPDATE runs SET {cols} WHERE run_id = ? AND status = 'running'{owned}",
                            (*result.values(), run_id, *([] if owner_pid is None else [owner_pid])))
            if cur.rowcount != 1:
                return False
            if result.get("status") == "success" and self.schema_version >= 3:  # the sweep item this run was started for (if any) ends with it
                c.execute("UPDATE sweep_items SET status = 'success', reason = NULL, finished_at = ? WHERE run_id = ? "
                          "AND status IN ('pending', 'running')", (result["finished_at"], run_id))
            for e in eval_rows or []:
                c.execute("INSERT OR REPLACE INTO evals VALUES (?, ?, ?, ?, ?)",
                          (run_id, e["samples_count"], e["step"], e["eval_loss"], e["elapsed_s"]))
            for s in step_rows or []:
                c.execute("INSERT OR REPLACE INTO steps VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                          (run_id, s["step"], s["samples"], s.get("loss"), s.get("lr"), s.get("grad_norm"),
                           s.get("step_time_s"), s.get("tokens_per_s")))
        return True

    def mark_failed_if_running(self, run_id: str, reason: str) -> bool:
        with self.transaction() as c:
            cur = c.execute(
                "UPDATE runs SET status = 'failed', status_reason = ?, finished_at = ? WHERE run_id = ? AND status = 'running'",
                (reason, time.time(), run_id))
            return cur.rowcount == 1

    def prefix_failed_reason(self, run_id: str, cause: str) -> bool:
        """Put ``cause`` (found after the row was ended: a rank killed outright) before the reason a
        failed row holds (what its peers saw). False if the row is not failed."""
        with self.transaction() as c:
            cur = c.execute("UPDATE runs SET status_reason = ? || COALESCE('; then ' || status_reason, '') "
                            "WHERE run_id = ? AND status = 'failed'", (cause, run_id))
            return cur.rowcount == 1

    def end_stopped_run(self, pid: int, since: float, reason: str) -> str | None:
        """The run process ``pid`` of this host started at or after ``since``, which its caller stopped
        (a tune trial past its time): its row says ``reason`` first, then what the run recorded as it
        stopped (a row still running is failed). Its run id, or None when it made no row."""
        with self.transaction() as c:
            row = c.execute("SELECT run_id FROM runs WHERE host = ? AND pid = ? AND created_at >= ? AND status IN "
                            "('running', 'failed') ORDER BY created_at DESC LIMIT 1",
                            (socket.gethostname(), pid, since)).fetchone()
            if row is None:
                return None
            c.execute("UPDATE runs SET status_reason = ? || CASE WHEN status = 'running' OR status_reason IS NULL "
                      "THEN '' ELSE ' (as it stopped: ' || status_reason || ')' END, status = 'failed', "
                      "finished_at = COALESCE(finished_at, ?) WHERE run_id = ?", (reason, time.time(), row[0]))
            return row[0]

    def mark_hung_if_running(self, run_id: str, reason: str) -> bool:
        with self.transaction() as c:
            cur = c.execute(
                "UPDATE runs SET status = 'hung', status_reason = ?, finished_at = ? WHERE run_id = ? AND status = 'running'",
                (reason, time.time(), run_id))
            return cur.rowcount == 1

    def reap_dead_runs(self) -> list[str]:
        """Rows left 'running' by a process of this host (and PID namespace) that is gone, with no living
        process left in its group, become 'failed' (not in a store opened read-only: a reader shows them
        as they are)."""
        if not self.writable:
            return []
        rows = self.conn.execute("SELECT run_id, host, pid_ns, pid, pid_started, pgid FROM runs WHERE status = "
                                 "'running' AND host = ?", (socket.gethostname(),)).fetchall()
        dead = [r["run_id"] for r in rows if not run_may_be_alive(dict(r))]
        for run_id in dead:
            self.mark_failed_if_running(run_id, "the process running it died before it finished")
        return dead

    # -- plans --------------------------------------------------------------------------------

    def save_plan(self, rows: list[dict]) -> None:
        """rows: plan_id, workload, gpus, gpus_per_node, gpu, overrides (dict), predicted (dict)."""
        with self.transaction() as c:
            for r in rows:
                c.execute("INSERT INTO plans VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                          (r["plan_id"], time.time(), r["workload"], r["gpus"], r["gpus_per_node"], r["gpu"],
                           json.dumps(r["overrides"]), json.dumps(r["predicted"])))

    def get_plan(self, plan_id: str) -> dict | None:
        row = self.conn.execute("SELECT * FROM plans WHERE plan_id = ?", (plan_id,)).fetchone()
        if not row:
            return None
        out = dict(row)
        out["overrides"], out["predicted"] = json.loads(out["overrides_json"]), json.loads(out["predicted_json"])
        return out

    # -- sweeps -------------------------------------------------------------------------------

    def add_sweep_items(self, sweep_id: str, items: list[dict]) -> int:
        """Register items (item_id, workload, nproc, overrides); existing ones are left as they are."""
        with self.transaction() as c:
            before = c.total_changes
            for it in items:
                c.execute("INSERT OR IGNORE INTO sweep_items (sweep_id, item_id, workload, nproc, overrides_json, status) "
                          "VALUES (?, ?, ?, ?, ?, 'pending')",
                          (sweep_id, it["item_id"], it["workload"], it["nproc"], json.dumps(it["overrides"])))
            return c.total_changes - before

    def set_sweep_item(self, sweep_id: str, item_id: str, status: str, run_id: str | None = None,
                       reason: str | None = None) -> None:
        now = time.time()
        with self.transaction() as c:  # an item its run ended as a success is never put back to run again
            c.execute("UPDATE sweep_items SET status = ?, run_id = COALESCE(?, run_id), reason = ?, "
                      "started_at = CASE WHEN ? = 'running' THEN ? ELSE started_at END, "
                      "finished_at = CASE WHEN ? IN ('success', 'failed') THEN ? ELSE finished_at END "
                      "WHERE sweep_id = ? AND item_id = ? AND NOT (status = 'success' AND ? = 'pending')",
                      (status, run_id, reason, status, now, status, now, sweep_id, item_id, status))

    def retry_failed_sweep_items(self, sweep_id: str, item_ids: list[str]) -> list[str]:
        """Put the failed ones of ``item_ids`` back to pending, in one transaction, for `sweep retry`; an
        item whose recorded run succeeded after all becomes 'success' instead (never run twice). The ids
        put back."""
        wanted, again = set(item_ids), []
        with self.transaction() as c:
            for row in c.execute("SELECT item_id, run_id FROM sweep_items WHERE sweep_id = ? AND status = 'failed'",
                                 (sweep_id,)).fetchall():
                if row["item_id"] not in wanted:
                    continue
                if self._run_succeeded(c, row["run_id"]):
                    c.execute("UPDATE sweep_items SET status = 'success', reason = NULL WHERE sweep_id = ? AND "
                              "item_id = ?", (sweep_id, row["item_id"]))
                    continue
                c.execute("UPDATE sweep_items SET status = 'pending' WHERE sweep_id = ? AND item_id = ? AND "
                          "status = 'failed'", (sweep_id, row["item_id"]))
                again.append(row["item_id"])
        return again

    def claim_sweep_item(self, sweep_id: str, item_id: str, take_over: bool = False) -> dict | None:
        """Mark a local item 'running' for this process, atomically, if no one else runs it: it is pending,
        or 'running' for a process known gone (an interrupted sweep), or ``take_over`` (the user knows its
        holder is gone: another host's, or a pid reused since). Never while the item's previous run may
        still be alive (its process group, or its run row's process), take_over or not. The claimed row,
        or None when it is finished or held (``sweep_item_holder`` says by what)."""
        with self.transaction() as c:
            row = c.execute("SELECT * FROM sweep_items WHERE sweep_id = ? AND item_id = ?", (sweep_id, item_id)).fetchone()
            if row is None or row["status"] in ("success", "failed"):
                return None
            if self._run_succeeded(c, row["run_id"]):  # its run succeeded, whatever became of the sweep since
                c.execute("UPDATE sweep_items SET status = 'success', reason = NULL, finished_at = COALESCE("
                          "finished_at, ?) WHERE sweep_id = ? AND item_id = ?", (time.time(), sweep_id, item_id))
                return None
            if row["status"] == "running" and row["owner_pid"] is not None and not take_over and not _is_ours_and_dead(
                    row["owner_host"], row["owner_pid_ns"], row["owner_pid"], row["owner_started"]):
                return None
            if self._previous_run_alive(dict(row)):
                return None
            c.execute("UPDATE sweep_items SET status = 'running', reason = NULL, started_at = ?, owner_host = ?, "
                      "owner_pid_ns = ?, owner_pid = ?, owner_started = ?, run_pgid = NULL WHERE sweep_id = ? AND "
                      "item_id = ?", (time.time(), socket.gethostname(), pid_namespace(), os.getpid(),
                                      process_start_time(os.getpid()), sweep_id, item_id))
        out = dict(row) | {"status": "running"}
        out["overrides"] = json.loads(out.pop("overrides_json"))
        return out

    @staticmethod
    def _run_succeeded(c: sqlite3.Connection, run_id: str | None) -> bool:
        return run_id is not None and c.execute("SELECT 1 FROM runs WHERE run_id = ? AND status = 'success'",
                                                (run_id,)).fetchone() is not None

    def _previous_run_alive(self, item: dict) -> str | None:
        """What of an item's previous run may still be running on this host: its process group (started
        by a sweep that is gone), or its run row's process; None if nothing."""
        same_place = item.get("owner_host") == socket.gethostname() and item.get("owner_pid_ns") in (None, pid_namespace())
        if same_place and item.get("run_pgid") is not None and process_group_alive(item["run_pgid"]):
            return f"its previous run's processes (process group {item['run_pgid']}) are still running"
        if item.get("run_id"):
            run = self.conn.execute("SELECT * FROM runs WHERE run_id = ?", (item["run_id"],)).fetchone()
            if run is not None and run["status"] == "running" and run_may_be_alive(dict(run)):
                return (f"its previous run {item['run_id']} is still running (host {run['host']}, pid {run['pid']}, "
                        f"process group {run['pgid']})")
        return None

    def set_sweep_item_run_group(self, sweep_id: str, item_id: str, pgid: int) -> None:
        """The process group of the run a sweep started for an item: a resumed sweep waits for it."""
        with self.transaction() as c:
            c.execute("UPDATE sweep_items SET run_pgid = ? WHERE sweep_id = ? AND item_id = ?", (pgid, sweep_id, item_id))

    def sweep_item_holder(self, sweep_id: str, item_id: str) -> str | None:
        """What holds an unfinished item: 'host H, pid P' of the process it is claimed by (unless known
        gone), or its previous run still alive; None if nothing does."""
        row = self.conn.execute("SELECT * FROM sweep_items WHERE sweep_id = ? AND item_id = ?",
                                (sweep_id, item_id)).fetchone()
        if row is None or row["status"] in ("success", "failed"):
            return None
        alive = self._previous_run_alive(dict(row))
        if alive:
            return alive
        if row["status"] != "running" or row["owner_pid"] is None or _is_ours_and_dead(
                row["owner_host"], row["owner_pid_ns"], row["owner_pid"], row["owner_started"]):
            return None
        return f"host {row['owner_host']}, pid {row['owner_pid']}"

    def sweep_items(self, sweep_id: str | None = None) -> list[dict]:
        q, args = "SELECT * FROM sweep_items", []
        if sweep_id:
            q, args = q + " WHERE sweep_id = ?", [sweep_id]
        rows = [dict(r) for r in self.conn.execute(q + " ORDER BY sweep_id, item_id", args).fetchall()]
        for r in rows:
            r["overrides"] = json.loads(r.pop("overrides_json"))
        return rows

    def save_preflight(self, row: dict, checks: list[dict]) -> None:
        """A preflight result and its checks, in one transaction."""
        with self.transaction() as c:
            c.execute("INSERT INTO preflights VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                      (row["preflight_id"], row.get("created_at") or time.time(), socket.gethostname(),
                       json.dumps(row.get("hosts", [])), row["world_size"], row["device"], row.get("gpu"),
                       int(bool(row.get("quick"))), row["exit_code"], row["n_pass"], row["n_warn"], row["n_fail"],
                       json.dumps(row.get("overrides", {})), row.get("result_path")))
            for ch in checks:
                c.execute("INSERT INTO preflight_checks VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                          (row["preflight_id"], ch["idx"], ch["check"], ch["subject"],
                           None if ch.get("size") is None else str(ch["size"]), ch.get("value"), ch.get("unit"),
                           ch.get("datasheet"), ch.get("pct"), ch["verdict"], ch.get("note")))

    def latest_preflight(self, gpu: str | None = None) -> dict | None:
        """The newest GPU preflight (of this GPU model, if given) with its measured preset overrides."""
        q = "SELECT * FROM preflights WHERE device = 'cuda'" + (" AND gpu = ?" if gpu else "") + \
            " ORDER BY created_at DESC LIMIT 1"
        row = self.conn.execute(q, (gpu,) if gpu else ()).fetchone()
        if row is None:
            return None
        out = dict(row)
        out["overrides"] = json.loads(out.pop("overrides_json"))
        return out

    def get_run(self, run_id: str) -> dict | None:
        row = self.conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return dict(row) if row else None

    def list_runs(self, workload: str | None = None, limit: int = 50, trials: bool = True) -> list[dict]:
        """The newest runs, of one workload or all; ``trials=False`` leaves tune trials out."""
        q, where, args = "SELECT * FROM runs", [], []
        if workload:
            where.append("workload = ?")
            args.append(workload)
        if not trials:
            where.append("purpose = 'run'")
        if where:
            q += " WHERE " + " AND ".join(where)
        q += " ORDER BY created_at DESC LIMIT ?"
        args.append(limit)
        return [dict(r) for r in self.conn.execute(q, args).fetchall()]

    def evals(self, run_id: str) -> list[dict]:
        return [dict(r) for r in self.conn.execute(
            "SELECT * FROM evals WHERE run_id = ? ORDER BY samples_count", (run_id,)).fetchall()]

    def steps(self, run_id: str) -> list[dict]:
        return [dict(r) for r in self.conn.execute(
            "SELECT * FROM steps WHERE run_id = ? ORDER BY step", (run_id,)).fetchall()]
