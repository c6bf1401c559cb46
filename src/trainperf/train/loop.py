"""The training loop of one rank: build, (untimed) load, train to the quality target on the MLPerf
clock, evaluate, stop collectively, log, store.

Timeline (MLPerf): cache_clear, init_start, hyperparameters, [model build + checkpoint load],
init_stop, run_start -- the clock starts here, before any data is read -- then blocks of training
separated by evals; run_stop at the first eval whose all-reduced loss meets the target (success), or
when train.max_steps is reached first (aborted: a failed run, never a time).
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import resource
import signal
import sqlite3
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from trainperf import __version__
from trainperf.core import flops as metrics
from trainperf.core.hardware import peak_flops_for
from trainperf.core.files import atomic_write_text
from trainperf.core.layout import (
    Layout,
    data_parallel_size,
    grad_accum_steps,
    layout_string,
)
from trainperf.core.results import RunRecord, RunSummary, per_gpu, steady_throughput
from trainperf.core.spec import (
    RunSpec,
    TrainSpec,
    eval_interval_samples,
    eval_skip_count,
)
from trainperf.data.sampler import GlobalBatchSampler, eval_shards, split_local
from trainperf.data.tokens import load_any
from trainperf.mlperf.log import KEYS, RunLog
from trainperf.mlperf.recipes import eval_samples_logged, hyperparameter_events, progress_count
from trainperf.mlperf.score import rcp_reference_samples
from trainperf.model import checkpoint as ckpt
from trainperf.parallel.distributed import init_distributed, is_collective_timeout
from trainperf.parallel.parallelize import build_mesh, data_parallel_rank
from trainperf.store.db import StoreError, disk_full_reason
from trainperf.train.clock import LaggedLog, StepClock
from trainperf.train.engine import Engine
from trainperf.train.live_metrics import MetricsServer
from trainperf.train.progress import RunProgress, expected_samples, progress_mode

ProfilerFactory = Callable[[RunSpec, Path, int, str, object], object]
MetricsServerFactory = Callable[[int, str, str, str], MetricsServer]


class _NoProfiler:
    """The step loop's profiler when the caller gives none."""

    def step(self) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class RunHooks:
    """What the trainer gets from its caller, who may use the layers above it (the planner, the
    tracer): ``predict(spec, hardware)`` -> the planner's prediction kept with the run;
    ``profiler_factory(spec, out_dir, rank, device_type, mesh)`` -> an object with ``step()`` and
    ``close()``; ``metrics_server_factory(port, host, run_id, workload)`` -> the live-metrics server.
    Left out: no prediction, no profiler, no live metrics."""

    predict: Callable[[RunSpec, dict], dict] | None = None
    profiler_factory: ProfilerFactory | None = None
    metrics_server_factory: MetricsServerFactory | None = None


@dataclass
class RunContext:
    run_id: str
    out_dir: Path
    row: RunRecord | None = None  # where rank 0 records the run (the runner's RunRow); None: nowhere
    progress: bool | str = False  # 'bar' (a terminal), 'lines' (a log file or pipe) or 'off'; True is 'bar'
    last_step: int = 0  # the last optimizer step every rank completed (for a hung run's record)
    hooks: RunHooks = field(default_factory=RunHooks)  # what the caller lends: prediction, profiler, live metrics
    metrics: MetricsServer | None = None  # the live-metrics server while the run trains
    evals: list[dict] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)


THROUGHPUT_PROBE = "throughput probe"  # how a run without an eval says what it was (the CLI prints it as such)


class RunInterrupted(RuntimeError):
    pass


def lr_at(step: int, t: TrainSpec) -> float:
    """Learning rate for optimizer update number ``step`` (0-based): linear warmup to t.lr, then a
    cosine from t.lr down to t.lr * min_lr_ratio over decay_steps (default: the rest of max_steps)."""
    if t.warmup_steps and step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    decay = t.decay_steps or max(t.max_steps - t.warmup_steps, 1)
    progress = min((step - t.warmup_steps) / decay, 1.0)
    floor = t.lr * t.min_lr_ratio
    return floor + (t.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


class _UncacheableGraphFilter(logging.Filter):
    """Drops Inductor's "Failed to pickle cache key" warning when the cause is pickle's "fast mode:
    can't pickle cyclic objects": torchao's 8-bit optimizer state cannot key Inductor's FX graph
    cache, so its step compiles afresh in every run (docs/PERFORMANCE.md prices that); the warning
    and its traceback said so twice per compiled 8B run. Any other cache-key failure still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (record.getMessage().startswith("Failed to pickle cache key")
                    and isinstance(exc, ValueError) and "cyclic" in str(exc))


def quiet_uncacheable_graph_warning() -> None:
    """Install _UncacheableGraphFilter on Inductor's cache logger (once per process)."""
    logger = logging.getLogger("torch._inductor.codecache")
    if not any(isinstance(f, _UncacheableGraphFilter) for f in logger.filters):
        logger.addFilter(_UncacheableGraphFilter())


def build_optimizer(params: list[torch.nn.Parameter], t: TrainSpec) -> torch.optim.Optimizer:
    """train.optimizer: PyTorch's fused AdamW with fp32 states, or torchao's AdamW8bit (both moments in
    8 bits, blocks of 256 with an fp32 scale; tensors under 4096 elements keep fp32 moments). The 8-bit
    step compiles one kernel per parameter shape on its first call; it works on FSDP2's DTensor shards."""
    kwargs = dict(lr=lr_at(0, t), betas=(t.beta1, t.beta2), eps=t.eps, weight_decay=t.weight_decay)
    if t.optimizer == "adamw8bit":
        from torchao.optim import AdamW8bit

        quiet_uncacheable_graph_warning()
        return AdamW8bit(params, **kwargs)
    return torch.optim.AdamW(params, fused=True, **kwargs)


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a tensor holds on this rank: a DTensor's local shard; a wrapper subclass (torchao's 8-bit
    optimizer state: uint8 codes + fp32 scales) the sum of its inner tensors."""
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if isinstance(t, DTensor):
        t = t.to_local()
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()


def optimizer_state_bytes(opt: torch.optim.Optimizer) -> int:
    """What the optimizer's state occupies on this rank (moments, step counters)."""
    return sum(tensor_bytes(v) for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor))


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    """torchao's optimizers keep the rate as a tensor (a float would recompile their step) and refuse a
    float in its place: fill it."""
    for group in opt.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


def clip_gradients(params: list[torch.nn.Parameter], max_norm: float, pp_group=None,
                   counted_elsewhere: list[torch.nn.Parameter] = ()) -> torch.Tensor:
    """Clip the global gradient norm to max_norm; returns the norm before clipping. Sharded (DTensor)
    gradients reduce their norm over their own mesh dims; pipeline stages add theirs over pp_group.
    ``counted_elsewhere``: copies whose gradient another stage's norm already holds (a GPT's tied
    output layer on the last stage), clipped but not counted twice."""
    from torch.distributed.tensor import DTensor

    # grads live on different meshes (FSDP-only vs FSDP x TP): one norm per mesh, then combined
    by_mesh: dict = {}
    for q in params:
        if q.grad is not None:
            by_mesh.setdefault(q.grad.device_mesh if isinstance(q.grad, DTensor) else None, []).append(q)
    squared = torch.zeros((), device=params[0].device if params else "cpu")
    skip = {id(q) for q in counted_elsewhere}
    for group in by_mesh.values():
        counted = [q.grad for q in group if id(q) not in skip]
        if not counted:
            continue
        n = torch.nn.utils.get_total_norm(counted, norm_type=2.0, foreach=True)
        squared = squared + (n.full_tensor() if isinstance(n, DTensor) else n) ** 2
    if pp_group is not None:
        dist.all_reduce(squared, group=pp_group)
    norm = squared.sqrt()
    if max_norm > 0:
        for group in by_mesh.values():
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, norm, foreach=True)
    return norm


def pick_device(spec: RunSpec) -> str:
    if spec.hardware.device == "cpu":
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def software_versions() -> dict:
    import mlperf_logging

    return {"python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "mlperf_logging": getattr(mlperf_logging, "__version__", "unknown"),
            "trainperf": __version__}


def hardware_info(device_type: str, world: int) -> dict:
    nodes = max(1, world // int(os.environ.get("LOCAL_WORLD_SIZE") or world))  # torchrun and srun set it per node
    if device_type == "cuda":
        name = torch.cuda.get_device_name()
        return {"device": "cuda", "gpu": name, "gpus": world, "nodes": nodes,
                "memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)}
    return {"device": "cpu", "gpu": None, "processes": world, "nodes": nodes,
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()}


def resolve_param_dtype(spec: RunSpec, device_type: str):
    """Compute dtype of parameters (FSDP gathers them in it; masters and optimizer stay fp32):
    bf16 on GPU, fp32 on CPU, unless hardware.dtype says otherwise."""
    if spec.hardware.dtype == "bf16" or (spec.hardware.dtype == "auto" and device_type == "cuda"):
        return torch.bfloat16
    return None


def _pinned_host_gib() -> float | None:
    try:  # the pinned allocator's statistics (torch.cuda.host_memory_stats: recent torch only)
        stats = torch.cuda.host_memory_stats()
    except (AttributeError, RuntimeError):
        return None
    peak = stats.get("allocated_bytes.peak", stats.get("reserved_bytes.peak"))
    return None if peak is None else peak / 2**30


def _peak_mem_gib(device_type: str) -> float:
    if device_type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB; the process's peak RSS
    return kib / 2**20


def train(spec: RunSpec, ctx: RunContext) -> RunSummary:
    """Run one training job on this rank. Returns the run summary (identical on every rank)."""
    device_type = pick_device(spec)
    rank, world, local = init_distributed(device_type, spec.train.collective_timeout_s, ctx.out_dir / "flight_recorder")
    device = torch.device(device_type, local) if device_type == "cuda" else torch.device("cpu")
    is_main = rank == 0
    if device_type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    # dropout streams, one per tensor-parallel group (tp_group_seed); parameters are seeded by name
    torch.manual_seed(Layout.of(spec.parallel).tp_group_seed(spec.train.seed, rank))

    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    log = RunLog(ctx.out_dir / "mllog.txt" if is_main else None, ctx.run_id)
    row = ctx.row if is_main else None  # rank 0 alone writes the run's row
    hw = hardware_info(device_type, world)
    predicted = ctx.hooks.predict(spec, hw) if ctx.hooks.predict else {}
    if row:
        row.started(hw, software_versions(), predicted)

    def on_signal(signum, frame):
        raise RunInterrupted(f"received signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, on_signal)
    # a SIGINT (Ctrl-C, or passed on by a sweep or a launcher) is recorded as itself, not as a bare KeyboardInterrupt
    previous_sigint = signal.signal(signal.SIGINT, on_signal)

    mode = progress_mode(ctx.progress) if is_main else "off"  # rank 0 alone speaks
    progress = RunProgress(mode, spec, expected_samples(spec, rcp_reference_samples if mode != "off" else None))
    try:
        summary = _Run(spec, ctx, log, progress, device, device_type, rank, world, hw).execute()
        summary.predicted = predicted
    except BaseException as exc:
        _record_failure(row, spec, ctx, exc, rank)
        raise
    finally:
        signal.signal(signal.SIGINT, previous_sigint)
        progress.close()
        log.close()
        if ctx.metrics is not None:
            ctx.metrics.close()
    if row:  # the typed summary, written as the row's end
        _report_unrecorded(ctx, row.finished(summary, ctx.evals, ctx.steps, ctx.out_dir / "summary.json"))
    if is_main:
        (ctx.out_dir / "summary.json").write_text(json.dumps(summary.as_dict(), indent=2))
    return summary


def _record_failure(row: RunRecord | None, spec: RunSpec, ctx: RunContext, exc: BaseException, rank: int) -> None:
    """A run that raised: 'hung' when a collective timed out (with this rank's Flight Recorder dump),
    else 'failed', with the reason."""
    reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    full = disk_full_reason(exc, ctx.out_dir)
    if full:  # said as such: an OSError number is not what a reader of the run looks for
        reason = f"{full}" + (f" writing {exc.filename}" if getattr(exc, "filename", None) else "") + f": {reason}"
    status = "failed"
    if is_collective_timeout(exc):
        status = "hung"
        dump_flight_recorder(ctx.out_dir / "flight_recorder", rank)
        reason = (f"a collective timed out after {spec.train.collective_timeout_s:g} s; last completed step "
                  f"{ctx.last_step}; flight recorder: {ctx.out_dir / 'flight_recorder'} ({reason[:200]})")
    if row:
        try:
            _report_unrecorded(ctx, row.failed(status, reason, ctx.evals, ctx.steps))
        except (sqlite3.Error, StoreError) as err:  # the store's disk is full too: the run's own error is raised
            print(f"trainperf: run {ctx.run_id}: {reason}; not recorded in the store: "
                  f"{disk_full_reason(err, row.folder) or err}", file=sys.stderr)


def _report_unrecorded(ctx: RunContext, recorded: bool) -> None:
    """The store keeps the first end of a run: one already ended (its launcher died) is not rewritten."""
    if not recorded:
        print(f"trainperf: run {ctx.run_id} had already been ended in the store (its launcher is gone); this "
              "rank's result was not recorded there", file=sys.stderr)


def dump_flight_recorder(dump_dir: Path, rank: int) -> Path | None:
    """Write this rank's Flight Recorder buffer to ``dump_dir/rank_<rank>``, as the NCCL watchdog does
    on a timeout (gloo writes none), for ``python -m torch.distributed.flight_recorder.fr_trace``.
    The path written, or None (an NCCL dump is already there, or this torch cannot dump)."""
    path = dump_dir / f"rank_{rank}"
    if path.exists():
        return None
    try:  # torch has no public call for it; this is the one its own dumps are made of
        trace = torch._C._distributed_c10d._dump_fr_trace(True, True, False)
    except (AttributeError, RuntimeError):  # a build without it: the run's record matters more than the dump
        return None
    if not trace:
        return None
    dump_dir.mkdir(parents=True, exist_ok=True)
    path.write_bytes(trace)
    return path


@dataclass
class _Outcome:
    """How the step loop ended."""

    status: str = "failed"
    reason: str | None = None  # why a run that did not reach its target stopped
    samples_to_target: int | None = None
    final_eval: float | None = None
    stop_time: float | None = None
    evals_done: int = 0
    last_step: int = 0


class _Run:
    """One rank's run, step by step: build (with the untimed warm-up), start the clock and read the
    data, the step loop (train step, evaluation, stop decision), close the log, gather the memory
    peaks and exports, and the summary."""

    def __init__(self, spec: RunSpec, ctx: RunContext, log: RunLog, progress: RunProgress, device, device_type: str,
                 rank: int, world: int, hw: dict):
        self.spec, self.ctx, self.log, self.progress = spec, ctx, log, progress
        self.device, self.device_type, self.rank, self.world, self.hw = device, device_type, rank, world, hw
        d = spec.data
        self.tokens_per_step = spec.train.global_batch_size * d.seq_len
        self.flops_per_token = metrics.train_flops_per_token(spec.model, spec.lora, d.seq_len)
        gpu_name = hw.get("gpu") if spec.hardware.gpu == "auto" else spec.hardware.gpu
        self.peak = spec.hardware.peak_tflops * 1e12 if spec.hardware.peak_tflops else (
            peak_flops_for(gpu_name) if gpu_name else None)

    def execute(self) -> RunSummary:
        self.log_submission()
        self.build()
        self.start_clock()
        outcome = self.step_loop()
        self.close_log(outcome)
        return self.summarize(outcome)

    def log_submission(self) -> None:
        spec, log, t = self.spec, self.log, self.spec.train
        log.event(KEYS.CACHE_CLEAR, True)
        log.start(KEYS.INIT_START)
        log.event(KEYS.SUBMISSION_BENCHMARK, spec.mlperf.benchmark)
        log.event(KEYS.SUBMISSION_DIVISION, spec.mlperf.division)
        log.event(KEYS.SUBMISSION_ORG, spec.mlperf.org)
        log.event(KEYS.SUBMISSION_PLATFORM, spec.mlperf.platform or f"{self.world}x{self.hw.get('gpu') or 'cpu'}")
        log.event(KEYS.SUBMISSION_STATUS, "onprem")
        log.event(KEYS.SEED, t.seed)
        for key, value in hyperparameter_events(spec):
            log.event(key, value)

    def build(self) -> None:
        """The mesh, the model (and its checkpoint), the optimizer, the untimed warm-up; ends init."""
        spec, p, t = self.spec, self.spec.parallel, self.spec.train
        self.mesh = build_mesh(p, self.device_type)
        n_base_tensors = sum(1 for _ in ckpt.expected_shapes(spec.model, spec.model.fused_qkv)) if spec.model.path else 0
        self.engine = Engine(spec, self.mesh, self.device, resolve_param_dtype(spec, self.device_type),
                             on_load_tensor=self.progress.loader(n_base_tensors // max(p.pp, 1)))
        if spec.model.path and self.log.enabled:
            self.log.event("checkpoint_load_s", round(self.engine.load_s, 3), gib=round(self.engine.load_bytes / 2**30, 3))
        self.trainable = self.engine.trainable
        self.opt = build_optimizer(self.trainable, t)
        self.pp_group = self.mesh["pp"].get_group() if p.pp > 1 else None
        self.dp, self.dp_rank = data_parallel_size(p), data_parallel_rank(self.mesh, p)
        untimed_warmup(self.engine, spec, t.untimed_warmup_steps)
        if self.device_type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        self.log.end(KEYS.INIT_STOP)

    def start_clock(self) -> None:
        """run_start, then the data: the run reads no data before the clock starts (the ids were
        verified in a separate pass before launch, like a dataset checksum check)."""
        p, t, e, d = self.spec.parallel, self.spec.train, self.spec.eval, self.spec.data
        dist.barrier()
        self.log.start(KEYS.RUN_START)
        self.run_start = time.perf_counter()
        self.progress.start_clock()
        self.train_split = load_any(d.path, "train", d.seq_len)
        val_split = load_any(d.path, "validation", d.seq_len)
        if d.eval_samples and d.eval_samples < len(val_split):  # e.g. llama31_8b: the first 1024 sequences
            val_split = val_split.limit(d.eval_samples)
        self.val_split = val_split
        self.log.event(KEYS.TRAIN_SAMPLES, len(self.train_split))
        self.log.event(KEYS.EVAL_SAMPLES, eval_samples_logged(self.spec, len(val_split)))
        self.sampler = GlobalBatchSampler(len(self.train_split), t.global_batch_size, t.seed)
        # a pipeline evaluates in the same micro-batches it trains in
        eval_bs = t.global_batch_size // self.dp if p.pp > 1 else e.batch_size
        self.val_batches = eval_shards(len(val_split), self.dp_rank, self.dp, eval_bs)
        self.log.start(KEYS.BLOCK_START, samples_count=0, epoch_num=0.0)

    def step_loop(self) -> _Outcome:
        """Train step by step; evaluate at every eval boundary past the skipped ones; stop at the
        target, at a diverged eval, or at train.max_steps."""
        spec, ctx, t = self.spec, self.ctx, self.spec.train
        interval, skip_evals = eval_interval_samples(spec), eval_skip_count(spec)
        self.clock = StepClock(self.device_type == "cuda")  # no host sync per step: read at log points, see clock.py
        factory = ctx.hooks.metrics_server_factory
        ctx.metrics = factory(t.metrics_port if self.rank == 0 else 0, t.metrics_host, ctx.run_id,
                              spec.workload) if factory else None
        self.step_log = LaggedLog(self._emit)
        outcome = _Outcome()
        self.engine.train()
        make_profiler = ctx.hooks.profiler_factory
        # a no-op unless train.profile_steps > 0
        prof = make_profiler(spec, ctx.out_dir, self.rank, self.device_type, self.mesh) if make_profiler else _NoProfiler()
        # the untimed warm-up's forward passes offload too
        self.offloaded_before = self.engine.offloaded_bytes()
        self.kept_before = self.engine.offloaded_bytes(kept_subclasses=True)
        for step in range(1, t.max_steps + 1):
            outcome.last_step = step
            self.train_step(step)
            samples = step * t.global_batch_size
            at_eval = samples % interval == 0 and samples // interval > skip_evals
            if at_eval and self.evaluate_and_decide(step, samples, outcome):
                break
            prof.step()  # ProfilerStep#k = loop step k+1, everything of the iteration
        prof.close()
        self.step_log.flush()
        return outcome

    def train_step(self, step: int) -> None:
        """One optimizer step on the step's global batch; its log record (read one step late) and the
        live metrics of the step before."""
        t, ctx, engine = self.spec.train, self.ctx, self.engine
        _test_stall(self.rank, step)
        self.clock.start()
        rows = self.sampler.global_batch(step - 1)
        ids, mask = self.train_split.take(rows)  # the step's global batch, in sampler order
        global_tokens = float(mask[:, 1:].sum())
        micro = [(ids[pos], mask[pos])
                 for pos in split_local(torch.arange(len(rows)), self.dp_rank, self.dp, t.micro_batch_size)]
        loss_local = engine.train_step(micro, global_tokens)
        grad_norm = clip_gradients(self.trainable, t.grad_clip, self.pp_group, engine.tied_copies)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        set_lr(self.opt, lr_at(step, t))
        self.clock.stop()
        ctx.last_step = self.clock.completed()  # for a hung run's record: finished on the GPU, not just queued
        if step % t.log_every == 0 or step <= 3 or step == t.max_steps:
            dist.all_reduce(loss_local)  # queued on the GPU; read one step later
            self.step_log.add({"step": step, "samples": step * t.global_batch_size, "loss": loss_local,
                               "lr": lr_at(step - 1, t), "grad_norm": grad_norm})
        self.step_log.lag()  # the previous step's values: ready, or about to be, while this step runs
        if self.rank == 0:
            write_progress(ctx.out_dir, step)
            server = ctx.metrics
            if server is not None and server.enabled and step > 1:  # the previous step: its time is known without waiting
                last = self.clock.time_of(step - 1)
                tps_gpu = per_gpu(self.tokens_per_step / last, self.world)
                server.update(step - 1, last, tps_gpu, metrics.mfu(self.flops_per_token, tps_gpu, self.peak),
                              _peak_mem_gib(self.device_type), samples=(step - 1) * t.global_batch_size)

    def _emit(self, rec: dict) -> None:
        step_time = self.clock.time_of(rec["step"])
        loss_val = rec["loss"] / self.spec.parallel.tp  # shares add up over dp, cp and pp; tp ranks hold copies
        self.ctx.steps.append({"step": rec["step"], "samples": rec["samples"], "loss": loss_val, "lr": rec["lr"],
                               "grad_norm": rec["grad_norm"], "step_time_s": step_time,
                               "tokens_per_s": self.tokens_per_step / step_time})
        self.log.event("train_loss", loss_val, samples_count=rec["samples"], lr=rec["lr"])
        self.progress.step(rec["step"], rec["samples"], loss_val, self.tokens_per_step / step_time)

    def evaluate_and_decide(self, step: int, samples: int, outcome: _Outcome) -> bool:
        """An eval between two blocks, and the stop decision: True when the run stops here (the target
        is met, or the eval loss is not finite). Every rank holds the same all-reduced loss, so every
        rank decides the same."""
        log, e = self.log, self.spec.eval
        self.step_log.flush()
        epoch_num = progress_count(self.spec, samples, len(self.train_split))  # gpt3: tokens, as its RCPs
        log.end(KEYS.BLOCK_STOP, samples_count=samples, epoch_num=epoch_num)
        log.start(KEYS.EVAL_START, samples_count=samples, epoch_num=epoch_num)
        eval_loss = evaluate(self.engine, self.val_split, self.val_batches, self.device)
        outcome.evals_done += 1
        log.event(KEYS.EVAL_ACCURACY, eval_loss, samples_count=samples, epoch_num=epoch_num)
        log.end(KEYS.EVAL_STOP, samples_count=samples, epoch_num=epoch_num)
        if not math.isfinite(eval_loss):  # no later eval can come back from it (and JSON has no nan)
            outcome.reason = f"the eval loss is {eval_loss} after {samples} samples: training diverged"
            return True
        outcome.final_eval = eval_loss
        self.ctx.evals.append({"samples_count": samples, "step": step, "eval_loss": eval_loss,
                               "elapsed_s": time.perf_counter() - self.run_start})
        self.progress.eval(step, samples, eval_loss, e.target)
        if self.ctx.metrics is not None:
            self.ctx.metrics.update_eval(samples, eval_loss, e.target)
        if eval_loss <= e.target:
            outcome.status, outcome.samples_to_target = "success", samples
            outcome.stop_time = time.perf_counter()
            log.end(KEYS.RUN_STOP, eval_loss, samples_count=samples, status="success")
            return True
        log.start(KEYS.BLOCK_START, samples_count=samples, epoch_num=epoch_num)
        return False

    def close_log(self, outcome: _Outcome) -> None:
        """A run that did not reach its target stops the clock here, aborted, with the reason."""
        if outcome.status == "success":
            return
        t, e = self.spec.train, self.spec.eval
        outcome.stop_time = time.perf_counter()
        last = outcome.final_eval
        if not outcome.reason and outcome.evals_done == 0:  # a throughput probe: steps measured, no eval asked for
            outcome.reason = (f"{THROUGHPUT_PROBE}: {t.max_steps} steps measured, no eval within them, so no time "
                              "to train")
        outcome.reason = outcome.reason or (
            f"target {e.target:.4f} not reached within train.max_steps={t.max_steps} "
            f"({outcome.evals_done} evals, the last at {last:.4f})")
        samples = outcome.last_step * t.global_batch_size
        self.log.end(KEYS.BLOCK_STOP, samples_count=samples,
                     epoch_num=progress_count(self.spec, samples, len(self.train_split)))
        self.log.end(KEYS.RUN_STOP, last, samples_count=samples, status="aborted")

    def memory_peaks(self) -> tuple[float, float, torch.Tensor]:
        """(peak memory GiB, optimizer state GiB, [reserved GiB, allocator retries]): each the largest rank's."""
        device, device_type = self.device, self.device_type
        peak_mem = torch.tensor([_peak_mem_gib(device_type)], dtype=torch.float64, device=device)
        dist.all_reduce(peak_mem, op=dist.ReduceOp.MAX)
        opt_state = torch.tensor([optimizer_state_bytes(self.opt) / 2**30], dtype=torch.float64, device=device)
        dist.all_reduce(opt_state, op=dist.ReduceOp.MAX)
        # what the caching allocator reserved, and how often it had to free its cache and retry (each
        # retry synchronises the device: a run near its memory limit loses its host/GPU overlap there)
        allocator = torch.cuda.memory_stats() if device_type == "cuda" else {}
        reserved = torch.tensor([allocator.get("reserved_bytes.all.peak", 0) / 2**30,
                                 allocator.get("num_alloc_retries", 0)], dtype=torch.float64, device=device)
        dist.all_reduce(reserved, op=dist.ReduceOp.MAX)
        return float(peak_mem.item()), float(opt_state.item()), reserved

    def export(self) -> tuple[str | None, str | None]:
        """(adapter dir, model dir): the trained LoRA adapters and, with train.save_final_model, the
        (base) weights as a Hugging Face checkpoint; written by rank 0, gathered by every rank."""
        spec, out_dir = self.spec, self.ctx.out_dir
        adapter_dir = model_dir = None
        if spec.lora.enabled:
            adapters = self.engine.gather(only_adapters=True)
            if self.rank == 0:
                adapter_dir = str(out_dir / "adapter")
                ckpt.save_peft_adapter(adapters, spec.lora, adapter_dir, spec.model.path)
        if spec.train.save_final_model:
            state = self.engine.gather(base_only=True)
            if self.rank == 0:
                model_dir = str(out_dir / "model")
                ckpt.save_hf_checkpoint(state, spec.model, model_dir)
        return adapter_dir, model_dir

    def summarize(self, outcome: _Outcome) -> RunSummary:
        spec, ctx, p, t = self.spec, self.ctx, self.spec.parallel, self.spec.train
        peak_mem, opt_state, reserved = self.memory_peaks()
        adapter_dir, model_dir = self.export()
        step_time, tps, tps_gpu = steady_throughput(self.clock.times(), self.tokens_per_step, self.world)
        cuda = self.device_type == "cuda"
        steps = max(outcome.last_step, 1)
        success = outcome.status == "success"
        return RunSummary(
            run_id=ctx.run_id, workload=spec.workload, status=outcome.status,
            status_reason=outcome.reason,
            time_to_train_s=(outcome.stop_time - self.run_start) if success else None,
            samples_to_target=outcome.samples_to_target, final_eval_loss=outcome.final_eval, target=spec.eval.target,
            evals=ctx.evals, steps=outcome.last_step, step_time_s=step_time, tokens_per_s=tps,
            tokens_per_s_per_gpu=tps_gpu, model_flops_per_token=self.flops_per_token,
            model_tflops_per_gpu=self.flops_per_token * tps_gpu / 1e12,
            mfu=metrics.mfu(self.flops_per_token, tps_gpu, self.peak), peak_flops=self.peak, peak_mem_gib=peak_mem,
            peak_mem_kind="max GPU memory allocated" if cuda else "max process RSS (CPU)",
            peak_reserved_gib=float(reserved[0]) if cuda else None, optimizer=t.optimizer,
            optimizer_state_gib=opt_state, cuda_alloc_retries=int(reserved[1]) if cuda else None,
            cuda_alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF") if cuda else None,
            pinned_host_gib=_pinned_host_gib() if cuda else None,
            checkpoint_load_s=self.engine.load_s, checkpoint_load_gib=self.engine.load_bytes / 2**30,
            activation_offload_gib_per_step=(self.engine.offloaded_bytes() - self.offloaded_before) / steps / 2**30,
            activation_offload_kept_gib_per_step=(self.engine.offloaded_bytes(kept_subclasses=True)
                                                  - self.kept_before) / steps / 2**30,
            layout=layout_string(p), placement=Layout.of(p).placement(int(os.environ.get("LOCAL_WORLD_SIZE", self.world))),
            world_size=self.world, hardware=self.hw, division=spec.mlperf.division, comparable=spec.mlperf.comparable,
            mllog=str(ctx.out_dir / "mllog.txt"), adapter=adapter_dir, model_dir=model_dir, out_dir=str(ctx.out_dir),
            seed=t.seed,
        )


def _test_stall(rank: int, step: int) -> None:
    """Fault injection for the hang test only: TRAINPERF_TEST_STALL=RANK:STEP:SECONDS makes that rank
    sleep before that step, so its peers wait in a collective until the timeout."""
    spec = os.environ.get("TRAINPERF_TEST_STALL")
    if spec:
        r, s, secs = spec.split(":")
        if int(r) == rank and int(s) == step:
            time.sleep(float(secs))


def write_progress(out_dir: Path, step: int) -> None:
    """RUN_DIR/progress.json: the last completed step, for the launcher when every rank was killed."""
    atomic_write_text(out_dir / "progress.json", json.dumps({"step": step, "time": time.time()}))


def untimed_warmup(engine: Engine, spec: RunSpec, steps: int) -> None:
    """Before run_start: forward+backward of this rank's micro-batches and one eval batch, on random
    tokens (the dataset is not touched before the clock starts). No optimizer step; gradients are
    dropped and every RNG stream restored, so training afterwards is bit-identical to no warmup."""
    if steps <= 0:
        return
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    t, d = spec.train, spec.data
    g = torch.Generator().manual_seed(0)
    micro = [(torch.randint(0, spec.model.vocab_size, (t.micro_batch_size, d.seq_len), generator=g),
              torch.ones(t.micro_batch_size, d.seq_len, dtype=torch.bool)) for _ in range(grad_accum_steps(spec))]
    for _ in range(steps):
        engine.train_step(micro, float(len(micro) * t.micro_batch_size * (d.seq_len - 1)))
        for q in engine.trainable:
            q.grad = None
    engine.train(False)
    eval_rows = len(micro[0][0]) * (len(micro) if spec.parallel.pp > 1 else 1)
    engine.eval_batch(torch.cat([m[0] for m in micro])[:eval_rows], torch.cat([m[1] for m in micro])[:eval_rows])
    engine.train(True)
    torch.set_rng_state(cpu_rng)
    if cuda_rng is not None:
        torch.cuda.set_rng_state_all(cuda_rng)


@torch.no_grad()
def evaluate(engine, split, batches, device) -> float:
    """MLPerf eval loss: mean over all validation sequences of each sequence's mean target loss.
    Every rank adds (sum of its rows' means, its row count) into one all-reduce; ranks that hold
    copies (TP, the CP group after its own reduction) add identical copies to both terms, and
    pipeline ranks without the last stage add zeros, so the ratio is the mean over sequences."""
    engine.train(False)
    acc = torch.zeros(2, dtype=torch.float64, device=device)
    for idx, weight in batches:
        rows = engine.eval_batch(*split.take(idx))
        if rows is None:
            continue
        sums, counts = rows
        w = weight.to(device) * (counts > 0).to(torch.float64)
        acc[0] += ((sums.double() / counts.double().clamp(min=1)) * w).sum()
        acc[1] += w.sum()
    dist.all_reduce(acc)
    engine.train(True)
    return float(acc[0] / acc[1])


def cuda_alloc_conf(spec: RunSpec, current: str | None) -> str | None:
    """PYTORCH_CUDA_ALLOC_CONF for this run's workers: hardware.expandable_segments added to what the
    environment already sets, unless that names expandable_segments itself (the user's word wins)."""
    if not spec.hardware.expandable_segments or (current and "expandable_segments" in current):
        return current
    return f"{current},expandable_segments:True" if current else "expandable_segments:True"


def apply_cuda_alloc_conf(spec: RunSpec) -> None:
    """Set this process's (and its children's) PYTORCH_CUDA_ALLOC_CONF from the spec. The caching
    allocator reads it when CUDA starts; where CUDA has already started, the setting is applied to it
    directly (torch's allocator-settings hook), so the run summary's ``cuda_alloc_conf`` is what ran."""
    current = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    conf = cuda_alloc_conf(spec, current)
    if not conf or conf == current:
        return
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")
