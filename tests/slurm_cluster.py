"""A real one-node Slurm cluster for tests: install it if missing, start it, stop what we started.

Debian's ``slurm-wlm`` (22.05) with ``munge``, run as root on this machine: a munge key, a
``/etc/slurm/slurm.conf`` describing this host (its name, CPUs and memory as ``slurmd -C`` reports
them), then ``munged``, ``slurmctld`` and ``slurmd`` (each daemonises) and a wait until ``sinfo`` shows
the node usable. Finished jobs are kept in slurmctld's memory for an hour (``MinJobAge``) so
``scontrol show job`` still answers for them: there is no accounting database (no ``sacct``) here.

Idempotent: if the cluster already answers (an earlier session left it running, or a concurrent
one owns it), it is reused and not stopped at the end; otherwise only the daemons started here are
stopped, by process id. ``TRAINPERF_SLURM_KEEP=1`` leaves the daemons running for the next session.

    cluster = SlurmCluster()
    cluster.ensure_installed()    # raises SlurmUnavailable(reason) if it cannot be installed here
    cluster.start()
    ...
    cluster.stop()

Also usable by hand: ``python tests/slurm_cluster.py start|stop|status``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

PACKAGES = ["slurm-wlm", "munge"]
BINARIES = ["munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo"]
CONF = Path("/etc/slurm/slurm.conf")
MUNGE_KEY = Path("/etc/munge/munge.key")
STATE = Path("/var/lib/trainperf-slurm")  # spool, state, logs and pid files of the test cluster
PARTITION = "debug"
MARKER = "# written by trainperf tests/slurm_cluster.py"


class SlurmUnavailable(RuntimeError):
    """Slurm is not installed and cannot be installed here (not root, no apt-get, no package source)."""


def _run(cmd: list[str], timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return f"({path} not readable)"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (OSError, IndexError):
        return True


class SlurmCluster:
    def __init__(self, state: Path = STATE, partition: str = PARTITION):
        self.state = Path(state)
        self.partition = partition
        self.host = socket.gethostname().split(".")[0]
        self.started: dict[str, int] = {}  # daemon name -> pid, only those this object started
        self.reused = False
        self.install_s = 0.0
        self.start_s = 0.0

    # -- install ---------------------------------------------------------------------------------

    def missing(self) -> list[str]:
        return [b for b in BINARIES if not shutil.which(b)]

    def ensure_installed(self) -> float:
        """Install slurm-wlm + munge with apt-get if any binary is missing; seconds spent (0 if present)."""
        if not self.missing():
            return 0.0
        if os.geteuid() != 0:
            raise SlurmUnavailable(f"Slurm is not installed ({', '.join(self.missing())} missing) and installing it "
                                   "needs root, but the tests run as uid %d" % os.geteuid())
        if not shutil.which("apt-get"):
            raise SlurmUnavailable("Slurm is not installed and there is no apt-get to install it with")
        t0 = time.perf_counter()
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        try:
            upd = _run(["apt-get", "update"], timeout=300, env=env)
        except subprocess.TimeoutExpired:
            raise SlurmUnavailable("apt-get update took over 5 minutes: no reachable package source") from None
        if upd.returncode != 0:
            raise SlurmUnavailable(f"apt-get update failed (no package source?): {(upd.stderr or upd.stdout)[-800:]}")
        try:
            inst = _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES], timeout=900, env=env)
        except subprocess.TimeoutExpired:
            raise SlurmUnavailable("apt-get install slurm-wlm munge took over 15 minutes") from None
        if inst.returncode != 0:
            text = inst.stderr + inst.stdout
            if any(w in text for w in ("Unable to locate package", "Temporary failure resolving", "Could not resolve",
                                       "Failed to fetch", "has no installation candidate")):
                raise SlurmUnavailable(f"apt-get cannot get {' '.join(PACKAGES)} here: {text[-800:]}")
            raise RuntimeError(f"apt-get install {' '.join(PACKAGES)} failed: {text[-2000:]}")
        if self.missing():
            raise RuntimeError(f"installed {PACKAGES} but {self.missing()} still missing")
        self.install_s = time.perf_counter() - t0
        return self.install_s

    # -- state -----------------------------------------------------------------------------------

    def node_state(self) -> str | None:
        """The node's state as sinfo reports it (idle, mixed, allocated, down*, drained, ...) or None if
        the controller does not answer."""
        if not shutil.which("sinfo"):
            return None
        try:
            out = _run(["sinfo", "-h", "-N", "-n", self.host, "-o", "%T"], timeout=15)
        except subprocess.TimeoutExpired:
            return None
        if out.returncode != 0 or not out.stdout.strip():
            return None
        return out.stdout.split()[0].strip()

    def usable(self) -> bool:
        return (self.node_state() or "").rstrip("*~#!%$@^-") in ("idle", "mixed", "allocated", "completing")

    # -- configuration ---------------------------------------------------------------------------

    def _node_line(self) -> str:
        """``NodeName=host CPUs=.. Boards=.. ... RealMemory=..`` from ``slurmd -C``, memory a little
        under what is free (a node that reports less than its configured memory is drained)."""
        out = _run(["slurmd", "-C"], timeout=30)
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("NodeName=")), "")
        fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        if not fields:
            fields = {"NodeName": self.host, "CPUs": str(os.cpu_count() or 1)}
        fields["NodeName"] = self.host
        avail_mib = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20
        total = int(fields.get("RealMemory", avail_mib))
        fields["RealMemory"] = str(max(256, min(total, avail_mib) * 9 // 10))
        fields.pop("UpTime", None)
        keep = ("NodeName", "CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory")
        addr = "127.0.0.1" if self._resolves_to_loopback() else None
        return " ".join(f"{k}={fields[k]}" for k in keep if k in fields) + (f" NodeAddr={addr}" if addr else "") \
            + " State=UNKNOWN"

    def _resolves_to_loopback(self) -> bool:
        try:
            return socket.gethostbyname(self.host).startswith("127.")
        except OSError:
            return True

    def write_conf(self) -> None:
        s = self.state
        for d in (s / "ctld", s / "d", s / "log"):
            d.mkdir(parents=True, exist_ok=True)
        conf = f"""{MARKER}
ClusterName=trainperf
SlurmctldHost={self.host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
SwitchType=switch/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
StateSaveLocation={s / 'ctld'}
SlurmdSpoolDir={s / 'd'}
SlurmctldPidFile={s / 'slurmctld.pid'}
SlurmdPidFile={s / 'slurmd.pid'}
SlurmctldLogFile={s / 'log' / 'slurmctld.log'}
SlurmdLogFile={s / 'log' / 'slurmd.log'}
SlurmctldPort=6817
SlurmdPort=6818
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=3600
InactiveLimit=0
KillWait=10
Waittime=0
SlurmctldTimeout=30
SlurmdTimeout=60
{self._node_line()}
PartitionName={self.partition} Nodes={self.host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""
        CONF.parent.mkdir(parents=True, exist_ok=True)
        if CONF.is_file() and MARKER not in CONF.read_text():
            CONF.rename(CONF.with_suffix(".conf.before-trainperf"))  # someone else's: keep it aside
        CONF.write_text(conf)

    # -- daemons ---------------------------------------------------------------------------------

    def _munge_ok(self) -> bool:
        try:
            enc = _run(["munge", "-n"], timeout=10)
            return enc.returncode == 0 and _run(["unmunge"], timeout=10, input=enc.stdout).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def _start_munge(self) -> None:
        if self._munge_ok():
            return
        MUNGE_KEY.parent.mkdir(parents=True, exist_ok=True)
        if not MUNGE_KEY.is_file() or MUNGE_KEY.stat().st_size < 32:
            MUNGE_KEY.write_bytes(os.urandom(1024))
        for d in (Path("/run/munge"), Path("/var/log/munge"), Path("/var/lib/munge"), MUNGE_KEY.parent):
            d.mkdir(parents=True, exist_ok=True)
            shutil.chown(d, "munge", "munge")
        shutil.chown(MUNGE_KEY, "munge", "munge")
        MUNGE_KEY.chmod(0o400)
        Path("/run/munge").chmod(0o755)
        pidfile = Path("/run/munge/munged.pid")
        out = _run(["runuser", "-u", "munge", "--", "munged", "--force"], timeout=30)
        if out.returncode != 0:
            raise RuntimeError(f"munged did not start: {out.stderr.strip()} {_tail(Path('/var/log/munge/munged.log'))}")
        for _ in range(50):
            if self._munge_ok():
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"munge does not answer after starting munged: {_tail(Path('/var/log/munge/munged.log'))}")
        if pidfile.is_file():
            self.started["munged"] = int(pidfile.read_text().split()[0])

    def _start_daemon(self, name: str) -> None:
        pidfile = self.state / f"{name}.pid"
        if pidfile.is_file():
            try:
                old = int(pidfile.read_text().split()[0])
            except (ValueError, IndexError):
                old = 0
            if old and _pid_alive(old):
                return  # running already (e.g. slurmd alive while the controller was down)
        out = _run([name], timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"{name} did not start ({out.returncode}): {out.stderr.strip()}\n"
                               f"{_tail(self.state / 'log' / f'{name}.log')}")
        for _ in range(100):
            if pidfile.is_file() and pidfile.read_text().strip():
                self.started[name] = int(pidfile.read_text().split()[0])
                return
            time.sleep(0.1)
        raise RuntimeError(f"{name} started but wrote no pid file {pidfile}: {_tail(self.state / 'log' / f'{name}.log')}")

    def start(self, timeout: float = 90) -> "SlurmCluster":
        """Start (or reuse) the cluster; returns when the node accepts jobs."""
        t0 = time.perf_counter()
        if self.usable():
            self.reused = True
            return self
        if self.missing():
            raise SlurmUnavailable(f"Slurm is not installed ({', '.join(self.missing())} missing): "
                                   "call ensure_installed() first")
        self._start_munge()
        if not CONF.is_file() or MARKER not in CONF.read_text() or self.node_state() is None:
            self.write_conf()
        self._start_daemon("slurmctld")
        self._start_daemon("slurmd")
        deadline = time.monotonic() + timeout
        resumed = False
        while time.monotonic() < deadline:
            state = self.node_state()
            if self.usable():
                self.start_s = time.perf_counter() - t0
                return self
            if state and any(w in state for w in ("down", "drain", "fail")) and not resumed:
                _run(["scontrol", "update", f"nodename={self.host}", "state=resume"], timeout=15)
                resumed = True
            time.sleep(0.5)
        raise RuntimeError(f"the Slurm node did not become idle within {timeout:.0f} s (state {self.node_state()!r})\n"
                           f"slurmctld log:\n{_tail(self.state / 'log' / 'slurmctld.log')}\n"
                           f"slurmd log:\n{_tail(self.state / 'log' / 'slurmd.log')}")

    def stop(self) -> None:
        """Stop the daemons this object started (by pid), slurmd first; leave everything else alone."""
        if os.environ.get("TRAINPERF_SLURM_KEEP") == "1":
            return
        for name in ("slurmd", "slurmctld", "munged"):
            pid = self.started.pop(name, None)
            if not pid or not _pid_alive(pid):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            for _ in range(100):
                if not _pid_alive(pid):
                    break
                time.sleep(0.1)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def stop_by_pidfiles(self) -> None:
        """By hand (``python tests/slurm_cluster.py stop``): stop the test cluster's daemons, whoever started them."""
        for name, pidfile in (("slurmd", self.state / "slurmd.pid"), ("slurmctld", self.state / "slurmctld.pid"),
                              ("munged", Path("/run/munge/munged.pid"))):
            try:
                self.started[name] = int(pidfile.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pass
        self.stop()


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "status"
    c = SlurmCluster()
    if what == "start":
        print(f"installed in {c.ensure_installed():.1f} s")
        c.start()
        print(f"{'reused' if c.reused else 'started'}: node {c.host} {c.node_state()} {c.started}")
    elif what == "stop":
        c.stop_by_pidfiles()
        print("stopped")
    else:
        print(f"node {c.host}: {c.node_state()}")
