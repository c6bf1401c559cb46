"""`trainperf tune`: short measured trials of the planner's best layouts, by successive halving.

Round 1 runs every candidate for a few steps; each later round keeps the faster half (by measured
median step time, the first step excluded) -- and of that half only the layouts within
``keep_within`` of the round's best, since one clearly ahead needs no longer trial to be believed --
and runs them for twice as many steps, until one is left or the time budget is spent. After every
finished trial the planner is recalibrated to this machine (the median measured/predicted step-time
ratio so far), and a candidate whose recalibrated prediction is more than ``abandon_factor`` times the
best measured step is not tried at all. Every trial is a real `trainperf run` in its own process
tree, stored like any run, so an OOM, a crash or a layout the machine cannot run is recorded with its
reason and the search goes on.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from trainperf.core.layout import degrees_name
from trainperf.parallel.launcher import Interrupted, end_process_group, start_owned, stop_owned
from trainperf.plan.search import Candidate

TRIAL_STOP_GRACE_S = 10.0  # a trial told to stop records its end in this time, or its group is killed


@dataclass
class Trial:
    candidate: Candidate
    steps: int
    step_time_s: float | None = None
    run_id: str | None = None
    error: str | None = None
    wall_s: float = 0.0  # the trial's whole process tree: start-up, warm-up and steps
    summary: dict = field(default_factory=dict)  # the run's --json summary (peak memory, prediction, ...)


@dataclass
class TuneResult:
    trials: list[Trial] = field(default_factory=list)
    budget_spent: bool = False  # the budget ended the search with layouts left to try

    @property
    def ran(self) -> list[Trial]:
        """The trials that were started (not those the recalibrated planner ruled out)."""
        return [t for t in self.trials if not (t.error or "").startswith("not tried")]
    winner: Candidate | None = None
    elapsed_s: float = 0.0


def trial_name(cand: Candidate) -> str:
    """A trial's name: its layout id and the layout it runs, e.g. 'P2 DP4·TP2·SP'."""
    spec = getattr(cand, "spec", None)
    if spec is None:  # a candidate known by its id alone
        return f"{cand.id:>12s}"
    extra = f" MBS{spec.train.micro_batch_size}" + (f" recompute={spec.train.recompute}"
                                                     if spec.train.recompute != "none" else "")
    return f"{cand.id:>12s} {degrees_name(dataclasses.asdict(spec.parallel)) + extra:<28s}"


def trial_command(workload: str, gpus: int, set_line: str, steps: int, db: str, out: str, extra: list[str]) -> list[str]:
    """A trial is a plain `trainperf run` of a few steps, no eval; the user's overrides come last."""
    return [sys.executable, "-m", "trainperf", "run", workload, "--nproc-per-node", str(gpus), "--json", "--trial",
            "--db", db, "--out", out, "--set", f"train.max_steps={steps}", "--set", "train.log_every=1",
            "--set", "eval.every_samples=1000000000", *set_line.split(), *[x for s in extra for x in ("--set", s)]]


def run_trial(workload: str, gpus: int, cand: Candidate, steps: int, db: str, out: str, extra: list[str],
              timeout_s: float) -> Trial:
    """One trial in a process group of its own that dies with tune. A trial past ``timeout_s`` has its
    whole group ended (its ranks too); a SIGTERM/SIGINT to tune ends it the same way, then is raised as
    Interrupted with what was ended."""
    cmd = trial_command(workload, gpus, cand.set_line, steps, db, out, extra)
    trial = Trial(cand, steps)
    t0, started = time.perf_counter(), time.time()
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        proc = start_owned(cmd, stdout=stdout, stderr=stderr)
        previous = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            returncode = proc.wait(timeout=max(timeout_s, 1))
        except subprocess.TimeoutExpired:
            stop_owned(proc, grace_s=TRIAL_STOP_GRACE_S)
            trial.error = (f"stopped: the tune budget ran out ({timeout_s:.0f} s were left for this trial); its "
                           f"processes (process group {proc.pid}) were ended")
            trial.wall_s = time.perf_counter() - t0
            trial.run_id = _record_timeout(db, proc.pid, started, timeout_s)
            return trial
        except Interrupted as exc:  # the trial (a run) records the signal tune received
            stop_owned(proc, grace_s=TRIAL_STOP_GRACE_S, sig=exc.signum)
            raise Interrupted(f"{exc}: trial {cand.id} stopped, its processes (process group {proc.pid}) ended") from None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        end_process_group(proc.pid, grace_s=1.0)  # anything the trial left behind
        trial.wall_s = time.perf_counter() - t0
        stdout.seek(0)
        stderr.seek(0)
        out_text, err_text = stdout.read(), stderr.read()
    try:
        summary = json.loads(out_text)
    except json.JSONDecodeError:
        summary = {}
    trial.summary = summary if isinstance(summary, dict) else {}
    trial.run_id = trial.summary.get("run_id")
    if trial.summary.get("step_time_s"):  # a throughput trial ends 'failed' (no target): its steps still count
        trial.step_time_s = trial.summary["step_time_s"]
    else:
        lines = err_text.strip().splitlines()
        trial.error = trial.summary.get("error") or (lines[-1] if lines else f"exit {returncode}")
    return trial


def _record_timeout(db: str, pid: int, started: float, timeout_s: float) -> str | None:
    """The stopped trial's row says it timed out, not only the signal that stopped it; its run id."""
    from pathlib import Path

    from trainperf.store.db import Store, StoreError  # only once a trial has timed out

    if not Path(db).is_file():  # the trial never made the store: nothing to correct, nothing to create
        return None
    try:
        store = Store(db)
    except StoreError:  # the trial never made the store: nothing to correct
        return None
    try:
        return store.end_stopped_run(pid, started, f"timed out after {timeout_s:.0f} s: the tune budget left this "
                                                   "trial no more, so tune stopped it (SIGTERM)")
    finally:
        store.close()


def _raise_interrupted(signum, frame):
    raise Interrupted(f"tune received {signal.Signals(signum).name}", signum)


def recalibrated(cand: Candidate, ratios: list[float]) -> float:
    """The planner's step time for a candidate, scaled by how the measured trials compared with it."""
    import statistics

    return cand.est.step_time_s * (statistics.median(ratios) if ratios else 1.0)


def successive_halving(workload: str, gpus: int, candidates: list[Candidate], db: str, out: str, extra: list[str],
                       budget_s: float, first_steps: int = 4, echo=print, abandon_factor: float = 1.25,
                       keep_within: float = 0.03, run=run_trial) -> TuneResult:
    result = TuneResult()
    t0 = time.perf_counter()
    alive, steps = list(candidates), first_steps
    ratios: list[float] = []  # measured / predicted step time of every finished trial
    best = float("inf")
    while alive:
        measured = []
        for cand in alive:
            left = budget_s - (time.perf_counter() - t0)
            if left <= 0:
                result.budget_spent = True
                break
            if abandon_factor and ratios and recalibrated(cand, ratios) > abandon_factor * best:
                trial = Trial(cand, steps, error=f"not tried: recalibrated prediction {recalibrated(cand, ratios):.4f} s/step "
                                                 f"> {abandon_factor:g} x best measured {best:.4f}")
                result.trials.append(trial)
                echo(f"{trial_name(cand)} {steps:3d} steps: {trial.error}")
                continue
            trial = run(workload, gpus, cand, steps, db, out, extra, left)
            result.trials.append(trial)
            echo(f"{trial_name(cand)} {steps:3d} steps: " + (f"{trial.step_time_s:.4f} s/step (planned "
                 f"{cand.est.step_time_s:.4f})" if trial.step_time_s else f"dropped: {trial.error}"))
            if trial.step_time_s:
                measured.append(trial)
                ratios.append(trial.step_time_s / cand.est.step_time_s)
                best = min(best, trial.step_time_s)
        if not measured:
            break
        measured.sort(key=lambda tr: tr.step_time_s)
        result.winner = measured[0].candidate
        round_best = measured[0].step_time_s
        close = [tr for tr in measured[: max(1, len(measured) // 2)]
                 if not keep_within or tr.step_time_s <= round_best * (1 + keep_within)]
        alive, steps = [tr.candidate for tr in close], steps * 2
        if len(alive) == 1 or time.perf_counter() - t0 >= budget_s:
            break  # one left (it is the winner) or no time for another round
    result.elapsed_s = time.perf_counter() - t0
    return result
