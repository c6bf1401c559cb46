"""From a command line to running ranks: resolve and validate the spec (before anything is launched),
prepare the workload's inputs (untimed), create the store row, then start the ranks -- with torchrun
on this machine, or in-process when an external torchrun/srun already started us as one rank."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import secrets
import socket
import sqlite3
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from trainperf.core.errors import SpecError
from trainperf.core.flops import lora_params, total_params
from trainperf.core.layout import layout_string
from trainperf.core.processes import process_start_time
from trainperf.core.resolve import resolve_spec
from trainperf.core.results import RunSummary
from trainperf.core.spec import RunSpec, set_value
from trainperf.data.tokens import inspect_any, verify_any
from trainperf.mlperf.recipes import apply_gbs_schedule, check_closed_rules, check_start_checkpoint, mark_open_if_shrunk
from trainperf.model import checkpoint as ckpt
from trainperf.parallel.distributed import init_distributed, is_collective_timeout, record_collectives
from trainperf.parallel.launcher import RANKS_END_ENV, Interrupted, killed_ranks, run_torchrun, torchrun_command
from trainperf.plan.costs import check_memory, estimate
from trainperf.plan.hardware import preset_for_device
from trainperf.runner import lost_node
from trainperf.runner.checks import cuda_available, validate_run
from trainperf.runner.row import RunRow
from trainperf.store.db import StoreError, disk_full_reason
from trainperf.trace.capture import profiler_for
from trainperf.train.live_metrics import MetricsServer
from trainperf.train.loop import (RunContext, RunHooks, RunInterrupted, apply_cuda_alloc_conf, dump_flight_recorder,
                                  pick_device, train)
from trainperf.workloads import get_workload


def external_launcher() -> str | None:
    """'torchrun' or 'srun' when this process is one rank of a job someone else launched."""
    if "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ):
        return "torchrun"
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "SLURM_PROCID" in os.environ:
        return "srun"
    return None


def external_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_NTASKS") or 1)


def _apply_checkpoint_config(spec: RunSpec, world_size: int, asked: dict | None = None) -> None:
    """A checkpoint's config.json defines the architecture; its tensors must match it. ``asked``: the
    model fields the user set (--set, --config) away from the workload's defaults -- one that
    config.json contradicts would be silently replaced, so it is an error."""
    where = f"model.path {spec.model.path!r}: config.json"
    index = ckpt.inspect_checkpoint(spec.model.path)
    keys = ckpt.config_keys(spec.model.family)
    fields = ckpt.config_to_model_fields(index.config, spec.model.family, f"model.path {spec.model.path!r}")
    for k, v in fields.items():
        if k in (asked or {}) and asked[k] != v:
            raise SpecError(f"model.{k}={asked[k]} contradicts {where} ({keys.get(k, k)}={v}): the "
                            f"checkpoint defines the architecture; drop the model.{k} override")
        try:
            set_value(spec, f"model.{k}", v)
        except SpecError as exc:
            raise SpecError(f"{where}: {exc}") from None
    try:
        validate_run(spec, world_size)
    except SpecError as exc:
        msg = str(exc)
        for ours, theirs in keys.items():  # name the key as config.json spells it
            msg = msg.replace(f"model.{ours}=", f"{theirs}=")
        raise SpecError(f"{where} describes an invalid model: {msg}") from None
    ckpt.check_checkpoint(index, spec.model)
    check_start_checkpoint(spec, index.config)


def prepare(workload: str, config: str | None, overrides: list[str], world_size: int) -> tuple[RunSpec, dict]:
    """Everything that can fail on bad input, in order, before any process starts. Raises SpecError."""
    wl = get_workload(workload)
    defaults = wl.defaults()
    spec = resolve_spec(defaults, config, overrides)
    apply_gbs_schedule(spec, defaults)  # gpt3 / llama31_405b: the rate and schedule follow the GBS
    asked = {k: getattr(spec.model, k) for k in ckpt.config_keys(spec.model.family)
             if getattr(spec.model, k) != getattr(defaults.model, k)}
    if spec.hardware.device == "cuda":
        if not torch.cuda.is_available():
            raise SpecError("hardware.device=cuda but no CUDA device is visible; use hardware.device=cpu or auto")
        if world_size > torch.cuda.device_count() and external_launcher() is None:
            raise SpecError(f"--nproc-per-node {world_size} exceeds the {torch.cuda.device_count()} visible GPUs")
    check_closed_rules(spec, architecture=False)  # a fixed hyperparameter changed in closed: say so first
    validate_run(spec, world_size, before_checkpoint=True)
    if spec.model.path:  # user-given checkpoint: check it before the workload builds anything
        _apply_checkpoint_config(spec, world_size, asked)
    info = wl.prepare(spec)
    if spec.model.path:
        _apply_checkpoint_config(spec, world_size, asked)
    if not spec.data.path:
        raise SpecError(f"workload {workload!r} needs data.path (a dataset directory)")
    rows = inspect_any(spec.data.path, spec.data.seq_len, spec.model.vocab_size)
    check_closed_rules(spec, rows)
    mark_open_if_shrunk(spec)
    # A verification pass over the token ids, before init (like a dataset checksum check): a bad
    # dataset must stop the run before anything is launched or stored, not inside the timed region.
    for split in ("train", "validation"):
        verify_any(spec.data.path, split, spec.model.vocab_size)
    if rows["train"] < spec.train.global_batch_size:
        raise SpecError(f"data.path {spec.data.path!r} has {rows['train']} training rows, fewer than one global batch "
                        f"({spec.train.global_batch_size})")
    if spec.eval.target < 0:
        raise SpecError("eval.target is not set: give eval.target=VALUE (the eval loss that ends the run)")
    if spec.hardware.memory_check:
        check_device_memory(spec, world_size)
    if spec.train.metrics_port and external_launcher() is None:  # rank 0 serves it on this machine
        check_metrics_endpoint(spec.train.metrics_host, spec.train.metrics_port)
    if spec.train.seed < 0:
        spec.train.seed = secrets.randbelow(2**31 - 1)  # MLPerf: every run logs its own seed
    return spec, info


def check_metrics_endpoint(host: str, port: int) -> None:
    """The address rank 0 will serve live metrics on: resolvable here and free now (the server binds
    it after the model is built; a bad one would end the run there)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise SpecError(f"train.metrics_host={host!r} does not resolve ({exc.strerror}); give an address of this "
                        "machine, e.g. 127.0.0.1 or 0.0.0.0") from None
    if not ipaddress.ip_address(address[0].split("%")[0]).is_loopback:  # allowed, but said once, by the launcher
        print(f"trainperf: warning: train.metrics_host={host!r} ({address[0]}) serves the live metrics beyond this "
              "machine (no authentication); give 127.0.0.1 to keep them on this host", file=sys.stderr)
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the HTTP server binds
        try:
            probe.bind(address)
        except OSError as exc:
            raise SpecError(f"train.metrics_port={port} on {host}: cannot listen there ({exc.strerror}); "
                            "choose a free port, or another train.metrics_host") from None


def visible_gpu() -> tuple[str, float] | None:
    """(name, memory GiB) of GPU 0 from nvidia-smi -- without creating a CUDA context in this
    launcher process (it would hold memory on GPU 0 for the whole run)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0 or not out.stdout.strip():
        return None
    name, mib = out.stdout.strip().splitlines()[0].rsplit(",", 1)
    return name.strip(), float(mib) / 1024


def check_device_memory(spec: RunSpec, world_size: int) -> None:
    """On a GPU machine the planner's memory estimate gates the launch (OOM predicted = bad input)."""
    # the planner's memory model: only when a run is launched on a GPU machine
    if spec.hardware.device == "cpu" or not cuda_available():
        check_host_memory(spec)
        return
    found = visible_gpu()
    if found is None or preset_for_device(found[0]) is None:
        return
    gpu = dataclasses.replace(preset_for_device(found[0]), hbm_gib=found[1])
    check_memory(spec, gpu, min(world_size, int(os.environ.get("LOCAL_WORLD_SIZE", world_size))))


def host_memory_floor_gib(spec: RunSpec) -> float:
    """What a CPU run holds at least, whatever its layout (all its processes share this machine): the
    weights, and the trainable ones' gradients and optimizer state. Activations come on top."""
    total = total_params(spec.model)
    trainable = lora_params(spec.model, spec.lora) if spec.lora.enabled else total
    weight_bytes = 2 if "bf16" in (spec.hardware.dtype, spec.hardware.frozen_dtype) else 4
    state_bytes = 4 + 4 + (2 if spec.train.optimizer == "adamw8bit" else 8)  # fp32 master, gradient, moments
    return ((total - trainable) * weight_bytes + trainable * state_bytes) / 2**30


def _available_host_gib() -> float | None:
    try:
        with open("/proc/meminfo") as fh:
            fields = dict(line.split(":", 1) for line in fh)
        return int(fields["MemAvailable"].split()[0]) / 2**20
    except (OSError, KeyError, ValueError):
        return None


def check_host_memory(spec: RunSpec) -> None:
    """On CPU: refuse, before anything is built, a run whose weights and optimizer state alone exceed the
    memory this machine has available (a 7B model on a laptop would swap or be killed mid-build)."""
    available = _available_host_gib()
    need = host_memory_floor_gib(spec)
    if available is not None and need > available:
        raise SpecError(f"out of memory predicted: on CPU this run holds at least {need:.1f} GiB (weights, gradients "
                        f"and optimizer state of a {spec.model.num_layers}-layer, {spec.model.hidden_size}-wide model) "
                        f"and {available:.1f} GiB is available; use a smaller model, a GPU, or "
                        "hardware.memory_check=false to try anyway")


def predict_run(spec: RunSpec, hw: dict) -> dict:
    """What the planner predicts for this run on this GPU (nothing on CPUs or unknown GPUs): kept
    with the run so `report` can show predicted against measured."""
    gpu = preset_for_device(hw.get("gpu") or "")
    if gpu is None:
        return {}
    est = estimate(spec, gpu, int(os.environ.get("LOCAL_WORLD_SIZE", hw.get("gpus", 1))))
    return {"gpu_preset": gpu.name, "step_time_s": est.step_time_s, "peak_mem_gib": est.allocated_gib,
            "tokens_per_s_per_gpu": est.tokens_per_s_per_gpu}


def run_hooks():
    """What the trainer gets from the layers above it: the planner's prediction, the step profiler
    (train.profile_steps), the live-metrics server (train.metrics_port)."""
    return RunHooks(predict=predict_run, profiler_factory=profiler_for, metrics_server_factory=MetricsServer)


def new_run_id(workload: str) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{workload}-{secrets.token_hex(3)}"


def git_sha() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def launch(spec: RunSpec, out_root: str, db_path: str, nproc_per_node: int, progress: bool | str,
           purpose: str = "run", sweep_item: dict | None = None) -> dict:
    """Run the job to completion and return its summary (status success or failed). ``sweep_item``: the
    sweep item the run is for, linked to the run's row as it is made (``Store.create_run``). The run's
    ``RunRow`` is this launcher's from the row's creation to its end; one rank trains in this process
    on the same row, several torchrun workers attach to it."""
    apply_cuda_alloc_conf(spec)  # in-process training and torchrun's workers (they inherit the environment)
    run_id = new_run_id(spec.workload)
    run_dir = Path(out_root) / run_id
    made = [d for d in (run_dir, *run_dir.parents) if not d.exists()]  # what a refused start removes again
    run_dir.mkdir(parents=True, exist_ok=True)
    row = RunRow(db_path, run_id)
    try:
        row.create(spec, nproc_per_node, run_dir, git_sha=git_sha(), purpose=purpose, sweep_item=sweep_item, reap=True)
    except BaseException:  # no row was made (a full disk, a store gone bad): no run folder either
        row.close()
        _remove_empty(made)
        raise
    try:
        summary, ended = _train_or_torchrun(spec, row, run_dir, db_path, nproc_per_node, progress)
        if summary is None:
            summary = abnormal_end_summary(spec, row, run_dir, ended)
    finally:
        row.close()
    return summary.as_dict()  # what the command prints


def _train_or_torchrun(spec: RunSpec, row: RunRow, run_dir: Path, db_path: str, nproc_per_node: int,
                       progress: bool | str) -> tuple[RunSummary | None, str | None]:
    """(the run's summary, or None when it wrote none; why it failed, when the store could not be told)."""
    ended, summary = None, None
    try:
        (run_dir / "spec.json").write_text(json.dumps(spec.to_dict(), indent=2))
        if nproc_per_node == 1:  # one rank: no need for a torchrun process tree
            try:
                summary = train(spec, RunContext(run_id=row.run_id, out_dir=run_dir, row=row, progress=progress,
                                                 hooks=run_hooks()))
            finally:
                if dist.is_initialized():
                    dist.destroy_process_group()
        else:
            (run_dir / "launch.json").write_text(json.dumps(
                {"spec": spec.to_dict(), "run_id": row.run_id, "db_path": str(Path(db_path).resolve()),
                 "progress": progress, "launcher_pid": os.getpid(), "launcher_started": process_start_time(os.getpid())}))
            env = dict(os.environ)
            if spec.hardware.device == "cpu" or not cuda_available():
                env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc_per_node)))
            env[RANKS_END_ENV] = str(run_dir / "ranks_end.json")  # which rank ended how, if any fails
            cmd = torchrun_command(nproc_per_node, "trainperf.runner.worker", str(run_dir))
            returncode = run_torchrun(cmd, env, on_start=row.set_process_group,
                                      pass_sigint=True)  # the ranks record which signal stopped the run
            if returncode != 0:
                record_abnormal_end(row.store, row.run_id, run_dir, f"torchrun exited with code {returncode}")
    except (Interrupted, RunInterrupted) as exc:  # SIGTERM (a sweep, a scheduler): a failed run, reported as one
        ended = row.mark_failed(f"interrupted: {exc}")
    except KeyboardInterrupt:  # SIGINT to a one-process run
        ended = row.mark_failed("interrupted: received SIGINT")
    except Exception as exc:  # a failed run, reported as one; the traceback is kept with the run
        ended = row.mark_failed(failure_reason(exc, run_dir, keep=traceback.format_exc()))
    finally:
        unrecorded = row.mark_failed("the run ended without recording a result")
        ended = ended or unrecorded
    return summary or _summary_written(run_dir), ended


def _summary_written(run_dir: Path) -> RunSummary | None:
    """The summary the workers' rank 0 wrote (another process's), typed again; None when it wrote none
    or it was cut short (a full disk: the store's record is the summary then)."""
    summary_file = run_dir / "summary.json"
    if not summary_file.is_file():
        return None
    try:
        return RunSummary.from_dict(json.loads(summary_file.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def failure_reason(exc: BaseException, run_dir: Path, keep: str | None = None) -> str:
    """One line for a run that raised ``exc``: the disk being full said as such; ``keep``: the traceback,
    written beside the run (named in the line) when the disk takes it."""
    first = str(exc).splitlines()[0] if str(exc) else ""
    reason = f"{type(exc).__name__}: {first}"
    full = disk_full_reason(exc, run_dir if run_dir.exists() else run_dir.parent)
    if full:
        where = f" writing {exc.filename}" if isinstance(exc, OSError) and exc.filename else ""
        reason = f"{full}{where}: {reason}"
    if keep is not None:
        try:
            (run_dir / "launcher_error.txt").write_text(keep)
            reason += f" (traceback: {run_dir / 'launcher_error.txt'})"
        except OSError as err:
            (run_dir / "launcher_error.txt").unlink(missing_ok=True)  # not a cut-short file in its place
            reason += f" (traceback not kept: {err.strerror or err})"
    return reason


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders a refused run made (deepest first), each only while it is empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def abnormal_end_summary(spec: RunSpec, row: RunRow, run_dir: Path, ended: str | None = None) -> RunSummary:
    """The summary of a run that wrote none (killed, interrupted, a rank died, a full disk): what the
    store says of it. ``ended``: why it failed, when the store could not be told (or read)."""
    try:
        stored = row.read()
    except (StoreError, sqlite3.Error) as exc:
        stored = {"status": "failed", "status_reason": ended or f"the store could not be read ({exc})"}
    if ended and stored.get("status") in (None, "running"):
        stored = {**stored, "status": "failed", "status_reason": ended}
    return RunSummary.ended_early(
        row.run_id, spec.workload, stored.get("status", "failed"),
        stored.get("status_reason") or ended or "the run ended without recording a result", spec.eval.target,
        layout_string(spec.parallel), stored.get("world_size"), run_dir)


def record_abnormal_end(store, run_id: str, run_dir: Path, reason: str) -> None:
    """The ranks died without finishing the row. If any left a Flight Recorder dump, a collective
    timed out (the NCCL watchdog aborts the process): the run is 'hung'; otherwise 'failed'."""
    dumps = sorted((run_dir / "flight_recorder").glob("rank_*"))
    progress = run_dir / "progress.json"
    last = json.loads(progress.read_text())["step"] if progress.is_file() else 0
    killed = killed_ranks(run_dir / "ranks_end.json")
    if killed:  # the cause, before what its peers recorded when their connections to it broke
        cause = f"{', '.join(killed)} (kill -9, or the out-of-memory killer) after step {last}"
        if not store.mark_failed_if_running(run_id, cause):
            store.prefix_failed_reason(run_id, cause)
        return
    if dumps:
        store.mark_hung_if_running(run_id, f"a collective timed out after step {last}; {reason}; flight recorder "
                                           f"dumps: {', '.join(d.name for d in dumps)} in {dumps[0].parent}")
    else:
        store.mark_failed_if_running(run_id, f"{reason} (last completed step {last})")


def run_as_external_rank(spec: RunSpec, out_root: str, db_path: str, progress: bool | str) -> dict:
    """We are one rank of a job torchrun/srun started: agree on a run id, then train in-process. A
    failure ends with each rank's Flight Recorder dump and, on rank 0, the lost node named in the row."""
    apply_cuda_alloc_conf(spec)
    # what must be in place before the group exists, which train() finds already made: the timeout (a
    # group's cannot change later) and the Flight Recorder. The run folder, where a dump goes, is agreed
    # below and set by train() before any training collective: torch reads it at the first dump.
    record_collectives()
    init_distributed(pick_device(spec), spec.train.collective_timeout_s)
    # one exchange: rank 0's run id and seed, and every rank's node and address (to name a lost one)
    table: list = [None] * dist.get_world_size()
    dist.all_gather_object(table, [new_run_id(spec.workload), spec.train.seed, *lost_node.rank_host()])
    run_id, spec.train.seed = table[0][:2]
    hosts = [tuple(t[2:]) for t in table]
    run_dir = Path(out_root) / run_id
    if dist.get_rank() == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "spec.json").write_text(json.dumps(spec.to_dict(), indent=2))
    row = RunRow(db_path, run_id)  # opened by rank 0 alone, when first used
    ctx = RunContext(run_id=run_id, out_dir=run_dir, row=row, progress=progress, hooks=run_hooks())
    try:
        if dist.get_rank() == 0:  # no launcher process made the row: rank 0 does
            row.create(spec, dist.get_world_size(), run_dir)
        summary = train(spec, ctx)
        dist.barrier()  # rank 0 has stored the run: tear the group down together, not while it writes
        return summary.as_dict()  # what the command prints
    except BaseException as exc:
        _name_lost_node(exc, ctx, row, hosts)
        raise
    finally:
        row.close()
        dist.destroy_process_group()


def _name_lost_node(exc: BaseException, ctx: RunContext, row: RunRow, hosts: list) -> None:
    """After a failed multi-rank run: this rank's Flight Recorder dump (where it waited), and on rank 0
    the cause before the reason its row holds. Best effort: Slurm may SIGKILL us any moment now."""
    import signal

    # the run is ending: srun's SIGTERM to the step now would only cut this record short (SIGKILL still ends it)
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        rank = dist.get_rank()
        if len(hosts) > 1:
            dump_flight_recorder(ctx.out_dir / "flight_recorder", rank)
        if rank == 0:
            why = lost_node.cause(exc, hosts, rank, ctx.last_step, is_collective_timeout(exc))
            if why:
                row.prefix_failed_reason(why)
    except Exception as err:  # a store gone, Slurm not answering: the run's own error is the one raised
        print(f"trainperf: run {ctx.run_id}: the lost node could not be named ({type(err).__name__}: {err})",
              file=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, previous)
