"""The Slurm backend of `trainperf sweep`: one batch job per sweep item, resumable through the store.

A sweep file selects it with ``backend: slurm`` and describes the jobs in a ``slurm:`` mapping::

    name: scaling
    backend: slurm
    slurm:
      partition: gpu
      nodes: 4                     # > 1: torchrun on every node, c10d rendezvous on the first
      gpus_per_node: 8             # 0 on CPU nodes; also the default nproc_per_node of the runs
      time: "02:00:00"             # --time (or minutes as a number)
      account: myproject
      cpus_per_task: 96
      exclusive: true
      extra_sbatch: ["--qos=high", "--mem=0"]   # more #SBATCH lines
      setup: ["module load cuda"]               # shell lines run before srun
      extra_srun: ["--mpi=none"]                # more srun flags
      container_image: nvcr.io#nvidia/pytorch:25.01-py3    # enroot/pyxis: srun --container-image=...
      container_mounts: ["/lustre:/lustre"]                #              srun --container-mounts=...
      python: python               # interpreter on the nodes (default: this one, or `python` in a container)
      rdzv_port: 29500
      launcher: auto               # torchrun: the multi-node form (srun per node + c10d rendezvous) even on 1 node
      wait: false                  # like --wait: block until the jobs finish
      poll_seconds: 30
      script_dir: null             # default: <--out>/sweep-<name>
    runs:
      - workload: llama31_8b
        set: {...}

For each unfinished item `trainperf sweep FILE` writes ``<script_dir>/<item_id>.sbatch`` (kept, for
the operator to read or resubmit by hand) and submits it with ``sbatch --parsable``; the job's
stdout/stderr go to ``<item_id>-<jobid>.out/.err`` and its exit code to ``<item_id>-<jobid>.rc``
beside it. One job per item rather than a job array: every item keeps its own job id, state and
log, a failed or cancelled item is resubmitted alone, and items may differ in size.

The job id is recorded on the item in the store (``sweep_items.reason`` reads
``slurm job <id> <STATE>[: detail]; <script>``) and the item is ``running`` while the job is in
Slurm's queue. Every later `trainperf sweep FILE` / `sweep status` first asks Slurm about the
in-flight items (``scontrol show job``, then ``sacct`` for jobs the controller has forgotten, then
the ``.rc`` file): a job still pending or running is left alone, a finished one makes its item
``success`` (exit 0) or ``failed`` with the reason (the run's own ``status_reason`` from the store,
the error it printed, or Slurm's state: TIMEOUT, CANCELLED, OUT_OF_MEMORY, NODE_FAIL ...). Nothing
finished or in flight is submitted again; a failed job never stops the sweep.

The runs write their rows to the same SQLite store (``--db``, passed as an absolute path): it must
be on a filesystem the nodes and the login node share, and only rank 0 of a job writes. SQLite's WAL
journal is made for processes of one host (https://sqlite.org/wal.html) and file locks are unreliable
on NFS and SMB: a store on one of those is warned about when the sweep submits (``network_store_note``);
README.md, "Slurm and the results store", says what to do instead.
"""

from __future__ import annotations

import fcntl
import getpass
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

from trainperf.core.errors import SpecError
from trainperf.runner.sweep import item_label, slug, sweep_folder

IN_FLIGHT = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
             "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
REASON_RE = re.compile(r"^slurm job (\d+)\b(?:.*; (/[^;]*\.sbatch)$)?", re.S)


@dataclass
class SlurmConfig:
    partition: str | None = None
    nodes: int = 1
    gpus_per_node: int = 0
    time: str | None = None
    account: str | None = None
    cpus_per_task: int | None = None
    exclusive: bool = False
    extra_sbatch: list[str] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)
    extra_srun: list[str] = field(default_factory=list)
    container_image: str | None = None
    container_mounts: list[str] = field(default_factory=list)
    container_workdir: str | None = None
    python: str | None = None
    rdzv_port: int = 29500
    launcher: str = "auto"
    wait: bool = False
    poll_seconds: float = 30.0
    script_dir: str | None = None

    def interpreter(self) -> str:
        return self.python or ("python" if self.container_image else sys.executable)


def parse_config(data, where: str) -> SlurmConfig:
    """The ``slurm:`` mapping of a sweep file; SpecError naming the key on anything malformed."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(f"{where}: 'slurm' must be a mapping (partition, nodes, gpus_per_node, time, ...)")
    known = {f.name for f in fields(SlurmConfig)}
    bad = set(data) - known
    if bad:
        raise SpecError(f"{where}: slurm has unknown keys {sorted(bad)}; valid: {', '.join(sorted(known))}")
    cfg = SlurmConfig()
    for k, v in data.items():
        if v is None:
            continue
        if k in ("nodes", "gpus_per_node", "cpus_per_task", "rdzv_port"):
            if isinstance(v, bool) or not isinstance(v, int):
                raise SpecError(f"{where}: slurm.{k}={v!r} must be an integer")
        elif k in ("exclusive", "wait"):
            if not isinstance(v, bool):
                raise SpecError(f"{where}: slurm.{k}={v!r} must be true or false")
        elif k == "poll_seconds":
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                raise SpecError(f"{where}: slurm.poll_seconds={v!r} must be a positive number")
        elif k in ("extra_sbatch", "setup", "extra_srun", "container_mounts"):
            if isinstance(v, str):
                v = [m for m in v.split(",") if m] if k == "container_mounts" else [v]
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise SpecError(f"{where}: slurm.{k} must be a list of strings")
        elif k == "time":
            if isinstance(v, bool) or not isinstance(v, (str, int)):
                raise SpecError(f"{where}: slurm.time={v!r} must be D-HH:MM:SS / HH:MM:SS or minutes")
            v = str(v)
        elif not isinstance(v, str):
            raise SpecError(f"{where}: slurm.{k}={v!r} must be a string")
        setattr(cfg, k, v)
    _check_slurm_syntax(cfg, where)
    if cfg.launcher not in ("auto", "torchrun"):
        raise SpecError(f"{where}: slurm.launcher={cfg.launcher!r} must be auto (one node: trainperf starts torchrun; "
                        "several: srun starts torchrun on each) or torchrun (the several-node form always)")
    if cfg.nodes < 1 or cfg.gpus_per_node < 0 or (cfg.cpus_per_task is not None and cfg.cpus_per_task < 1):
        raise SpecError(f"{where}: slurm.nodes must be >= 1, gpus_per_node >= 0 and cpus_per_task >= 1")
    return cfg


# what Slurm itself accepts (sbatch(1): --partition takes a comma-separated list of names, --time one of
# its six forms or UNLIMITED); a value outside it would be refused by sbatch or, with a newline, become a
# line of the batch script's shell
SLURM_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
SLURM_PARTITIONS_RE = re.compile(r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*")
SLURM_TIME_RE = re.compile(r"\d+|\d+:\d+|\d+:\d+:\d+|\d+-\d+|\d+-\d+:\d+|\d+-\d+:\d+:\d+|UNLIMITED|INFINITE")
SBATCH_OPTION_RE = re.compile(r"(#SBATCH[ \t]+)?--?[A-Za-z][A-Za-z0-9-]*(=[^\x00-\x1f\x7f]*|[ \t]+[^\x00-\x1f\x7f]*)?")
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def _check_slurm_syntax(cfg: SlurmConfig, where: str) -> None:
    """Every value that goes onto an #SBATCH line as it is: in Slurm's own syntax, one line."""
    for key, value, pattern, shape in (
            ("partition", cfg.partition, SLURM_PARTITIONS_RE, "partition names (letters, digits, _ . -), comma-separated"),
            ("account", cfg.account, SLURM_NAME_RE, "an account name (letters, digits, _ . -)"),
            ("time", cfg.time, SLURM_TIME_RE, "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED")):
        if value is not None and not pattern.fullmatch(value):
            raise SpecError(f"{where}: slurm.{key}={value!r} is not {shape}")
    for extra in cfg.extra_sbatch:
        if not SBATCH_OPTION_RE.fullmatch(extra.strip(" \t")):
            raise SpecError(f"{where}: slurm.extra_sbatch entry {extra!r} must be one sbatch option on one line "
                            "(e.g. --qos=high or #SBATCH --mem=0)")
    for key in ("container_image", "container_workdir", "python", "script_dir"):
        value = getattr(cfg, key)
        if value is not None and CONTROL_RE.search(value):
            raise SpecError(f"{where}: slurm.{key}={value!r} contains a line break or control character")
    for key in ("container_mounts", "extra_srun", "setup"):
        if any(CONTROL_RE.search(v.replace("\t", " ")) for v in getattr(cfg, key)):
            raise SpecError(f"{where}: slurm.{key} has an entry with a line break or control character "
                            "(give one line per entry)")


# -- the batch script ------------------------------------------------------------------------------


def job_name(sweep_id: str, item_id: str) -> str:
    return f"tp-{slug(sweep_id)[:40]}-{item_id}"


def script_dir(cfg: SlurmConfig, sweep_id: str, out: str) -> Path:
    return Path(cfg.script_dir).resolve() if cfg.script_dir else sweep_folder(sweep_id, out)


def _set_args(overrides: dict, extra_sets: list[str]) -> list[str]:
    out = []
    for k, v in overrides.items():
        out += ["--set", f"{k}={str(v).lower() if isinstance(v, bool) else v}"]
    for s in extra_sets:
        out += ["--set", s]
    return out


# the run's stderr (its progress lines with --json, and its errors) joins its stdout in the job's .out, so
# the one file `tail -f` follows tells the run as it goes; .err keeps what the script's own lines say
MERGED = " 2>&1"


def render_script(item: dict, cfg: SlurmConfig, *, sweep_id: str, db: str, out: str, extra_sets: list[str],
                  directory: Path, workdir: str) -> str:
    """The sbatch script of one sweep item (``item``: item_id, workload, nproc, overrides)."""
    q = shlex.quote
    d = Path(directory)
    stem = item["item_id"]
    for name, path in (("the script folder", str(d)), ("the working folder", workdir)):
        # sbatch reads an #SBATCH value in double quotes, without escapes: a quote or line break cannot be said
        if CONTROL_RE.search(path) or '"' in path or "\\" in path:
            raise SpecError(f"{name} {path!r} contains a line break, a control character, a double quote or a "
                            "backslash, which an #SBATCH line cannot carry; give --out a plainer path")
    lines = ["#!/bin/bash",
             f"# trainperf sweep {sweep_id!r}, item {stem}: {item['workload']!r} on {cfg.nodes} node(s) "
             f"x {item['nproc']} process(es)",
             "# written by `trainperf sweep`; the sweep resubmits it only while the item is still pending",
             f"#SBATCH --job-name={job_name(sweep_id, stem)}",
             f"#SBATCH --nodes={cfg.nodes}",
             "#SBATCH --ntasks-per-node=1",
             f'#SBATCH --output="{d / f"{stem}-%j.out"}"',
             f'#SBATCH --error="{d / f"{stem}-%j.err"}"',
             f'#SBATCH --chdir="{workdir}"']
    for flag, value in (("partition", cfg.partition), ("account", cfg.account), ("time", cfg.time),
                        ("gpus-per-node", cfg.gpus_per_node), ("cpus-per-task", cfg.cpus_per_task)):
        if value:
            lines.append(f"#SBATCH --{flag}={value}")
    if cfg.exclusive:
        lines.append("#SBATCH --exclusive")
    for extra in cfg.extra_sbatch:
        extra = extra.strip()
        lines.append(extra if extra.startswith("#SBATCH") else f"#SBATCH {extra}")
    lines += ["", "set -o pipefail"]
    if os.environ.get("TRAINPERF_CACHE"):
        lines.append(f"export TRAINPERF_CACHE={q(os.environ['TRAINPERF_CACHE'])}")
    lines += cfg.setup
    srun = ["srun"]
    container = []
    if cfg.container_image:
        container.append(f"--container-image={cfg.container_image}")
        if cfg.container_mounts:
            container.append(f"--container-mounts={','.join(cfg.container_mounts)}")
        if cfg.container_workdir:
            container.append(f"--container-workdir={cfg.container_workdir}")
    run_args = ["run", item["workload"], "--json", "--db", str(Path(db).resolve()), "--out", str(Path(out).resolve()),
                *_set_args(item["overrides"], extra_sets)]
    if cfg.nodes == 1 and cfg.launcher == "auto":
        cmd = [*srun, "--ntasks=1", *cfg.extra_srun, *container, cfg.interpreter(), "-m", "trainperf",
               run_args[0], run_args[1], "--nproc-per-node", str(item["nproc"]), *run_args[2:]]
        lines.append(" ".join(q(c) for c in cmd) + MERGED)
    else:
        lines.append('head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)')
        cmd = [*srun, "--ntasks-per-node=1", "--kill-on-bad-exit=1", *cfg.extra_srun, *container]
        torchrun = [cfg.interpreter(), "-m", "torch.distributed.run"]
        lines.append(" ".join(q(c) for c in cmd + torchrun)
                     + ' --nnodes "$SLURM_NNODES" --nproc-per-node ' + str(item["nproc"])
                     + f' --rdzv-backend c10d --rdzv-endpoint "$head:{cfg.rdzv_port}" --rdzv-id "$SLURM_JOB_ID"'
                     + " -m trainperf " + " ".join(q(c) for c in run_args) + MERGED)
    lines += ["rc=$?", f'echo "$rc" > {q(str(d / stem))}-"$SLURM_JOB_ID".rc', 'exit "$rc"', ""]
    return "\n".join(lines)


# -- asking Slurm ----------------------------------------------------------------------------------


def _cmd(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None


def available() -> bool:
    return all(shutil.which(c) for c in ("sbatch", "scontrol"))


def submit(script: Path) -> str:
    """sbatch --parsable; the job id, or RuntimeError with sbatch's message."""
    out = _cmd(["sbatch", "--parsable", str(script)], timeout=120)
    if out is None:
        raise RuntimeError("sbatch could not be run (not installed, or it hung for 2 minutes)")
    if out.returncode != 0:
        msg = (out.stderr.strip() or out.stdout.strip() or f"exit {out.returncode}").splitlines()[-1]
        raise RuntimeError(f"sbatch failed: {msg}")
    return out.stdout.strip().split(";")[0]  # "<id>[;cluster]"


def queued_job_ids_by_name() -> dict[str, str]:
    """{job name: job id} of this user's jobs still in the queue (to adopt a job submitted by an
    invocation that died before recording its id)."""
    out = _cmd(["squeue", "-h", "-u", getpass.getuser(), "-o", "%i|%j"], timeout=60)
    if out is None or out.returncode != 0:
        return {}
    found = {}
    for line in out.stdout.splitlines():
        if "|" in line:
            jid, name = line.split("|", 1)
            found[name.strip()] = jid.strip()
    return found


@dataclass
class JobInfo:
    job_id: str
    state: str  # Slurm's JobState (PENDING, RUNNING, COMPLETED, FAILED, TIMEOUT, ...) or GONE
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None  # Slurm's Reason (why pending, or NonZeroExitCode, TimeLimit ...)
    nodes: str | None = None
    source: str = "scontrol"

    @property
    def in_flight(self) -> bool:  # UNREACHABLE: the controller did not answer; ask again later
        return self.state in IN_FLIGHT or self.state == "UNREACHABLE"


def _exit_pair(text: str | None) -> tuple[int | None, int | None]:
    m = re.match(r"(\d+):(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def _scontrol(job_id: str) -> JobInfo | None:
    """None if the controller does not know the job (any more); UNREACHABLE if it did not answer."""
    out = _cmd(["scontrol", "show", "job", "-o", job_id], timeout=30)
    if out is not None and out.returncode != 0 and "Invalid job id" in out.stderr + out.stdout:
        return None
    if out is None or out.returncode != 0 or "JobState=" not in out.stdout:
        why = "scontrol timed out" if out is None else (out.stderr.strip() or out.stdout.strip() or "no answer")
        return JobInfo(job_id, "UNREACHABLE", reason=why.splitlines()[-1][:200])
    kv = dict(re.findall(r"(\w+(?:/\w+)?)=(\S*)", out.stdout))
    code, sig = _exit_pair(kv.get("ExitCode"))
    nodes = kv.get("NodeList")
    return JobInfo(job_id, kv.get("JobState", "UNKNOWN"), code, sig, kv.get("Reason"),
                   nodes if nodes and nodes != "(null)" else None)


def _sacct(job_id: str) -> JobInfo | None:
    if not shutil.which("sacct"):
        return None
    out = _cmd(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobIDRaw,State,ExitCode,Reason,NodeList"], timeout=60)
    if out is None or out.returncode != 0:
        return None
    for line in out.stdout.splitlines():
        parts = line.split("|")
        if len(parts) >= 5 and parts[0] == job_id:
            code, sig = _exit_pair(parts[2])
            return JobInfo(job_id, parts[1].split()[0] if parts[1] else "UNKNOWN", code, sig, parts[3] or None,
                           parts[4] or None, source="sacct")
    return None


def job_info(job_id: str, rc_file: Path | None = None) -> JobInfo:
    """What Slurm knows about a job: the controller first, then accounting, then the job's own .rc file."""
    info = _scontrol(job_id) or _sacct(job_id)
    if info:
        return info
    if rc_file is not None and rc_file.is_file():
        try:
            code = int(rc_file.read_text().strip())
        except ValueError:
            code = None
        return JobInfo(job_id, "COMPLETED" if code == 0 else "FAILED", code, 0, None, source="rc file")
    return JobInfo(job_id, "GONE", source="none")


# -- results ---------------------------------------------------------------------------------------


def last_json(text: str) -> dict | None:
    """The last JSON object printed at the start of a line (the `trainperf run --json` summary)."""
    decoder = json.JSONDecoder()
    starts = [m.start() for m in re.finditer(r"(?m)^\{", text)]
    for pos in reversed(starts):
        try:
            obj, _ = decoder.raw_decode(text[pos:])
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return obj
    return None


def _last_error_line(text: str) -> str | None:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line and not line.startswith("srun: ") and "Warning" not in line and not line.startswith("warnings.warn"):
            return line[-500:]
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def outcome(info: JobInfo, directory: Path, item_id: str, store=None) -> tuple[str, str | None, str]:
    """(status, run_id, detail) of a finished job, from its stdout summary, the store and Slurm."""
    base = directory / f"{item_id}-{info.job_id}"
    summary = last_json(_read(base.with_suffix(".out"))) or {}
    run_id = summary.get("run_id")
    row = store.get_run(run_id) if (store is not None and run_id) else None
    exit_code = info.exit_code
    ok = info.state == "COMPLETED" and (exit_code in (0, None))
    detail = (row or {}).get("status_reason") or summary.get("status_reason") or summary.get("error")
    if row and row.get("status") in ("success", "failed"):
        ok = ok and row["status"] == "success"
    if not ok and not detail:  # the run's own messages are in .out (MERGED), before its JSON summary
        out_text = _read(base.with_suffix(".out"))
        starts = [m.start() for m in re.finditer(r"(?m)^\{", out_text)]
        detail = _last_error_line(_read(base.with_suffix(".err"))) or _last_error_line(
            out_text[:starts[-1]] if summary and starts else out_text)
    state = info.state
    if state == "GONE":
        detail = detail or ("Slurm no longer knows the job and it left no exit code (cancelled before it "
                            "started, or its node failed?)")
    head = state
    if state == "FAILED" and exit_code:
        head = f"FAILED exit {exit_code}"
    elif state not in ("COMPLETED", "FAILED", "GONE") and info.reason and info.reason != "None":
        head = f"{state} ({info.reason})"  # TIMEOUT, CANCELLED, OUT_OF_MEMORY, NODE_FAIL, ...
    return ("success" if ok else "failed"), run_id, head + (f": {detail}" if detail and not ok else "")


def reason_text(job_id: str, state: str, script: Path) -> str:
    return f"slurm job {job_id} {state}; {script}"


def parse_reason(reason: str | None) -> tuple[str | None, Path | None]:
    """(job id, script path) recorded on a sweep item by this backend, or (None, None)."""
    m = REASON_RE.match(reason or "")
    if not m:
        return None, None
    return m.group(1), (Path(m.group(2)) if m.group(2) else None)


# -- the sweep -------------------------------------------------------------------------------------


def refresh(store, sweep_id: str | None = None, echo=None) -> list[dict]:
    """Ask Slurm about every in-flight item (status running with a recorded job id); finish the ones
    whose job ended. Returns the items still in flight (with their JobInfo under 'slurm')."""
    in_flight = []
    rows = [r for r in store.sweep_items(sweep_id) if r["status"] == "running" and parse_reason(r["reason"])[0]]
    if not rows or not shutil.which("scontrol"):
        return [dict(r, slurm=None) for r in rows]
    for row in rows:
        job_id, script = parse_reason(row["reason"])
        directory = script.parent if script else None
        info = job_info(job_id, directory / f"{row['item_id']}-{job_id}.rc" if directory else None)
        if info.in_flight:
            text = info.state
            if info.state in ("PENDING", "UNREACHABLE") and info.reason not in (None, "None"):
                text += f" ({info.reason})"  # why it waits: Priority, Resources, QOSMaxJobsPerUser ...
            elif info.state == "RUNNING" and info.nodes:
                text += f" on {info.nodes}"
            new = reason_text(job_id, text, script) if script else f"slurm job {job_id} {text}"
            if new != row["reason"]:
                store.set_sweep_item(row["sweep_id"], row["item_id"], "running", None, new)
            in_flight.append(dict(row, reason=new, slurm=info, slurm_state=text))
            continue
        status, run_id, detail = outcome(info, directory or Path("."), row["item_id"], store)
        store.set_sweep_item(row["sweep_id"], row["item_id"], status, run_id,
                             reason_text(job_id, detail, script) if script else f"slurm job {job_id} {detail}")
        if echo:
            echo(f"{status:7s} {item_label(row)} {run_id or ''} slurm job {job_id} {detail}".rstrip())
    return in_flight


NETWORK_FILE_SYSTEMS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse.sshfs", "9p")


def file_system_type(path: str | os.PathLike) -> str | None:
    """The type of the file system holding ``path`` (its nearest existing folder), from /proc/mounts."""
    where = Path(path).resolve()
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        mounts = [line.split()[1:3] for line in Path("/proc/mounts").read_text().splitlines() if len(line.split()) > 2]
    except OSError:
        return None
    best = None
    for mount, kind in mounts:
        mount = mount.replace("\\040", " ")
        if (where == Path(mount) or Path(mount) in where.parents) and (best is None or len(mount) >= len(best[0])):
            best = (mount, kind)
    return best[1] if best else None


def network_store_note(db: str) -> str | None:
    """A warning line when the results store is on NFS or SMB, where SQLite's locks are not to be trusted."""
    kind = file_system_type(db)
    if kind not in NETWORK_FILE_SYSTEMS:
        return None
    return (f"warning: the results store {str(Path(db).resolve())!r} is on {kind}: SQLite's locking and WAL are not "
            "reliable there when jobs on other nodes write it (rows may be lost, or the file damaged); put --db on "
            "a cluster file system with working locks (Lustre mounted with flock, GPFS, BeeGFS), see README.md "
            "'Slurm and the results store'")


def run_slurm(store, sweep_id: str, items: list[dict], db: str, out: str, extra_sets: list[str], cfg: SlurmConfig,
              echo=print, wait: bool | None = None) -> None:
    """Submit every item not yet finished nor in Slurm's queue; with wait, poll until all have ended."""
    if not available():
        raise SpecError("backend: slurm but sbatch/scontrol are not on PATH (run the sweep on a Slurm login node)")
    note = network_store_note(db)
    if note:
        echo(note)
    store.add_sweep_items(sweep_id, items)
    directory = script_dir(cfg, sweep_id, out)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".submit.lock", "w") as lock:  # two invocations at once: one submits, the other sees it
        fcntl.flock(lock, fcntl.LOCK_EX)
        _submit_unfinished(store, sweep_id, items, db, out, extra_sets, cfg, directory, echo)
    if wait if wait is not None else cfg.wait:
        wait_for(store, sweep_id, cfg.poll_seconds, echo)


def _submit_unfinished(store, sweep_id: str, items: list[dict], db: str, out: str, extra_sets: list[str],
                       cfg: SlurmConfig, directory: Path, echo) -> None:
    refresh(store, sweep_id, echo)
    queued = queued_job_ids_by_name()
    wanted = {it["item_id"] for it in items}
    for row in store.sweep_items(sweep_id):
        if row["item_id"] not in wanted or row["status"] in ("success", "failed"):
            continue
        job_id, _ = parse_reason(row["reason"])
        if row["status"] == "running" and job_id:
            echo(f"queued  {item_label(row)} {row['reason'].rsplit('; /', 1)[0]}")
            continue  # still in Slurm's queue (refresh finished the rest)
        script = directory / f"{row['item_id']}.sbatch"
        adopted = queued.get(job_name(sweep_id, row["item_id"]))
        if adopted:
            job_id = adopted
        else:
            script.write_text(render_script(row, cfg, sweep_id=sweep_id, db=db, out=out, extra_sets=extra_sets,
                                            directory=directory, workdir=os.getcwd()))
            try:
                job_id = submit(script)
            except RuntimeError as exc:  # not a job failure: leave it pending, the next invocation retries
                store.set_sweep_item(sweep_id, row["item_id"], "pending", None, f"{exc}; {script}")
                echo(f"pending {item_label(row)} {exc}")
                continue
        store.set_sweep_item(sweep_id, row["item_id"], "running", None, reason_text(job_id, "SUBMITTED", script))
        echo(f"{'adopted' if adopted else 'submitted'} slurm job {job_id}: {item_label(row)} ({script})")


def wait_for(store, sweep_id: str, poll_seconds: float, echo=print) -> None:
    """Poll Slurm until no item of the sweep is in flight, finishing items as their jobs end."""
    last = None
    try:
        while True:
            pending = refresh(store, sweep_id, echo)
            if not pending:
                return
            states = sorted({p.get("slurm_state") or "?" for p in pending})
            line = f"waiting for {len(pending)} slurm job(s): {', '.join(states)}"
            if line != last:
                echo(line)
                last = line
            time.sleep(poll_seconds)
    except KeyboardInterrupt:
        echo("stopped waiting; the jobs go on in Slurm: run the sweep again (or `sweep status`) to collect them")
        raise


def status_lines(store, sweep_id: str | None = None) -> list[str]:
    """One line per item with its Slurm job (for `sweep status`); local items show their status only."""
    lines = []
    for r in store.sweep_items(sweep_id):
        job_id, _ = parse_reason(r["reason"])
        what = item_label(r)
        tail = (r["reason"] or "").rsplit("; /", 1)[0] if job_id else (r["reason"] or "")
        lines.append(f"{r['sweep_id']} {r['item_id']} {r['status']:7s} {what}  {r['run_id'] or ''} {tail}".rstrip())
    return lines


def add_slurm_args(parser) -> None:
    """`trainperf sweep` flags of the Slurm backend (for the sweep command's parser)."""
    parser.add_argument("--wait", action="store_true", default=None,
                        help="slurm backend: after submitting, poll until every job of the sweep has finished "
                             "(same as slurm.wait: true in the sweep file)")
