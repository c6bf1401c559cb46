"""Per step and per rank, on interval unions (the definitions of Meta's Holistic Trace Analysis, HTA):

    compute   |U(COMP)|                 GPU: kernels that are not NCCL; CPU traces (gloo): the leaf
                                        CPU ops of the training threads (the CPU's "kernels")
    comm      |U(COMM)|                 GPU: NCCL kernels; CPU: the gloo:* work on gloo's threads
    overlap   |U(COMP) ∩ U(COMM)|       overlap % = overlap / comm
    exposed   |U(COMM) \\ U(COMP)|       = comm - overlap
    mem       |U(MEM)|                  GPU memcpy/memset (0 on CPU)
    exposed mem |U(MEM) \\ (U(COMP) ∪ U(COMM))|  copies nothing else runs beside (activation offload's
                                        cost when it is not hidden)
    idle      step - |U(COMP ∪ COMM ∪ MEM)|; GPU traces also list the gaps (``gaps.idle_gaps``)

Times are integer nanoseconds (``Breakdown``) until the summary turns them into seconds
(``StepBreakdown``, ``RankBreakdown``), so step = compute + comm - overlap + exposed mem + idle holds exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from trainperf.trace.intervals import Interval, clip, intersect, total, union

NS = 1e-9


@dataclass
class Breakdown:
    """One step of one rank, in ns."""
    step: int
    span: int
    compute: int
    comm: int
    overlap: int
    mem: int
    idle: int
    mem_exposed: int = 0

    @property
    def exposed(self) -> int:
        return self.comm - self.overlap


def breakdown(step: int, lo: int, hi: int, comp: list[Interval], comm: list[Interval],
              mem: list[Interval] = ()) -> Breakdown:
    """Compute / comm / overlap / mem / idle of the window [lo, hi) from merged interval lists."""
    c, m, x = clip(comp, lo, hi), clip(comm, lo, hi), clip(list(mem), lo, hi)
    kernels = union(c, m)
    busy = union(kernels, x)
    return Breakdown(step=step, span=hi - lo, compute=total(c), comm=total(m), overlap=total(intersect(c, m)),
                     mem=total(x), idle=(hi - lo) - total(busy), mem_exposed=total(busy) - total(kernels))


class _Row:
    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class StepBreakdown(_Row):
    """One profiled step of one rank, in seconds: a row of the summary's ``steps``."""
    rank: int
    step: int
    step_s: float
    compute_s: float
    comm_s: float
    overlap_s: float
    overlap_pct: float | None
    exposed_comm_s: float
    mem_s: float
    exposed_mem_s: float
    idle_s: float

    @classmethod
    def of(cls, rank: int, b: Breakdown) -> StepBreakdown:
        return cls(rank=rank, step=b.step, step_s=b.span * NS, compute_s=b.compute * NS, comm_s=b.comm * NS,
                   overlap_s=b.overlap * NS, overlap_pct=100.0 * b.overlap / b.comm if b.comm else None,
                   exposed_comm_s=b.exposed * NS, mem_s=b.mem * NS, exposed_mem_s=b.mem_exposed * NS,
                   idle_s=b.idle * NS)


@dataclass
class RankBreakdown(_Row):
    """One rank's mean per profiled step, in seconds: a row of the summary's ``per_rank``."""
    rank: int
    steps: int
    step_s: float
    compute_s: float
    comm_s: float
    overlap_pct: float | None
    exposed_comm_s: float
    mem_s: float
    exposed_mem_s: float
    idle_s: float
    collective_wait_s: float = 0.0  # filled in once collectives are matched across ranks

    @classmethod
    def of(cls, rank: int, bds: list[Breakdown]) -> RankBreakdown:
        n = max(len(bds), 1)
        comm = sum(b.comm for b in bds)
        return cls(rank=rank, steps=len(bds), step_s=sum(b.span for b in bds) / n * NS,
                   compute_s=sum(b.compute for b in bds) / n * NS, comm_s=comm / n * NS,
                   overlap_pct=100.0 * sum(b.overlap for b in bds) / comm if comm else None,
                   exposed_comm_s=sum(b.exposed for b in bds) / n * NS, mem_s=sum(b.mem for b in bds) / n * NS,
                   exposed_mem_s=sum(b.mem_exposed for b in bds) / n * NS, idle_s=sum(b.idle for b in bds) / n * NS)


def rank_breakdowns(trace) -> list[Breakdown]:
    """Every profiled step of one ``RankTrace``."""
    return [breakdown(k, s, e, trace.comp, trace.comm, trace.mem) for k, s, e in trace.steps]
