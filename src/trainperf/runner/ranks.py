"""Where a run's ranks come from: started here (torchrun for several processes, or in-process), or this
process is one rank of a job torchrun / srun already started -- the one rule ``run`` and ``trace`` share."""

from __future__ import annotations

import os

from trainperf.core.spec import RunSpec
from trainperf.runner import local


def reporting_rank() -> int:
    """This process's rank in a job someone else launched (0 when this process started the run)."""
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) if local.external_launcher() else 0


def prepare_here(workload: str, config: str | None, overrides: list[str], nproc_per_node: int) -> RunSpec:
    """The resolved, validated spec for the world this run has: the external job's when torchrun / srun
    started this process, else ``nproc_per_node``. SpecError on bad input, before any work."""
    world = local.external_world_size() if local.external_launcher() else nproc_per_node
    spec, _ = local.prepare(workload, config, overrides, world)
    return spec


def run_here(spec: RunSpec, out: str, db: str, nproc_per_node: int, progress: bool | str,
             **launch) -> tuple[dict, bool]:
    """(the run's summary, whether this process reports it): one rank of an external job trains in-process
    and only rank 0 reports; otherwise the run is launched here (``launch``: runner.local.launch's keywords)."""
    if local.external_launcher():
        return local.run_as_external_rank(spec, out, db, progress), reporting_rank() == 0
    return local.launch(spec, out, db, nproc_per_node, progress, **launch), True
