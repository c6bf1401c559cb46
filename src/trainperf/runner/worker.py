"""Entry point of each process torchrun starts for ``run``: ``python -m trainperf.runner.worker RUN_DIR``.
RUN_DIR/launch.json holds the spec, the run id, the store and the launcher's pid; the launcher made the
run's row. A rank ends when torchrun does (the parent-death signal: a rank torchrun started
as an interpreter of its own runs under setsid, out of reach of its group), and does
not start at all if the launcher is already gone."""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import torch.distributed as dist

from trainperf.core.processes import process_alive
from trainperf.core.spec import RunSpec
from trainperf.parallel.launcher import die_with_parent
from trainperf.runner.local import run_hooks
from trainperf.runner.row import RunRow
from trainperf.train.loop import RunContext, RunInterrupted, train


def main(argv: list[str] | None = None) -> int:
    die_with_parent()  # SIGTERM when torchrun ends: this rank records the end and stops
    argv = sys.argv[1:] if argv is None else argv
    run_dir = Path(argv[0])
    launch = json.loads((run_dir / "launch.json").read_text())
    launcher = launch.get("launcher_pid")
    if launcher is not None and not process_alive(launcher, launch.get("launcher_started")):
        print(f"trainperf: the launcher of run {launch['run_id']} (pid {launcher}) is gone; not starting",
              file=sys.stderr)
        return 1
    spec = RunSpec.from_dict(launch["spec"])
    # the row its launcher made; rank 0 alone opens the store, when it first records on it
    row = RunRow(launch["db_path"], launch["run_id"], owner_pid=launcher)
    ctx = RunContext(run_id=launch["run_id"], out_dir=run_dir, row=row, progress=launch.get("progress", False),
                     hooks=run_hooks())
    try:
        train(spec, ctx)
        dist.barrier()  # rank 0 has stored the run: tear the group down together, not while it writes
    except RunInterrupted as exc:  # rank 0 recorded the end; the launcher prints the run's summary
        print(f"trainperf: rank {os.environ.get('RANK', '?')}: run {ctx.run_id} stopped ({exc})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a SIGINT before the trainer's handler was in place
        print(f"trainperf: rank {os.environ.get('RANK', '?')}: run {ctx.run_id} stopped (received signal SIGINT)",
              file=sys.stderr)
        return 1
    except Exception as exc:  # recorded by rank 0; the traceback is kept with the run, not printed
        where = run_dir / f"rank_{os.environ.get('RANK', 'x')}_error.txt"
        try:
            where.write_text(traceback.format_exc())
            kept = f"traceback: {where}"
        except OSError as err:  # a full disk: the line below is all there is
            kept = f"traceback not kept: {err.strerror or err}"
        first = str(exc).splitlines()[0] if str(exc) else ""
        print(f"trainperf: rank {os.environ.get('RANK', '?')}: run {ctx.run_id} failed: {type(exc).__name__}: "
              f"{first[:200]} ({kept})", file=sys.stderr)
        return 1
    finally:
        row.close()
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
