"""``trainperf preflight``: is every GPU and link as fast as its datasheet?

Mounted in ``trainperf.cli`` with ``add_arguments(parser)`` and ``run(args) -> int``; also runnable
alone as ``python -m trainperf.cli.preflight ...``. Exit codes: 0 no check failed, 1 a check failed
(or the workers did), 2 bad input (one-line error).
"""

from __future__ import annotations

import argparse
import json
import sys

from trainperf.cli.errors import EXIT_FAILED, SpecError, bad_input
from trainperf.cli.preflight_tables import print_result
from trainperf.preflight import session
from trainperf.preflight.session import measure_kernel_table_into, wants_kernel_table  # noqa: F401 -- the command's steps, by their old names

HELP = "is every GPU and link as fast as its datasheet? (GEMM, HBM, collectives, every pair)"
DESCRIPTION = ("Measure bf16/fp8 GEMM and HBM copy on every GPU, sweep all_reduce / all_gather / reduce_scatter / "
               "all_to_all over message sizes (nccl-tests busbw), send/recv between every pair of ranks, and judge "
               "each against the GPU's datasheet and against the best GPU/pair of the same run. Exit 1 if any check "
               "fails.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc-per-node", type=int, default=None,
                   help="processes (GPUs) to test with torchrun (default: every visible GPU; 2 on CPU); "
                        "ignored when torchrun/srun already started this process as one rank")
    p.add_argument("--quick", action="store_true",
                   help="a few message sizes (1 KiB..1 GiB x16) and fewer iterations instead of 8 B..4 GiB doubling")
    p.add_argument("--gpu", default=None,
                   help="datasheet to judge against: h100 | h200 | a100 | b200 | a GPU YAML (default: detected)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                   help="cuda (NCCL) or cpu (gloo, figures not meaningful); default cuda when visible")
    p.add_argument("--max-bytes", default=None, metavar="SIZE",
                   help="largest message of the sweep, e.g. 1G or 64K (default 4G, quick 1G; CPU 1M, quick 8K)")
    p.add_argument("--iters", type=int, default=None,
                   help="timed iterations per measurement (default 20, quick 10; CPU 3)")
    p.add_argument("--kernels", choices=["auto", "yes", "no"], default="auto",
                   help="also measure the planner's kernel table (GEMM and attention rates by shape, ~10 s on a GPU; "
                        "plan then uses it): auto = on GPU unless --quick")
    p.add_argument("--db", default="trainperf.db",
                   help="results store: the result is kept there and `plan` uses its measured figures (default ./trainperf.db)")
    p.add_argument("--out", default="runs",
                   help="directory under which preflight-<timestamp>/preflight.json is written (default ./runs)")
    if "--json" not in p._option_string_actions:  # trainperf's common options may already define it
        p.add_argument("--json", action="store_true", help="one JSON object on stdout")


def build_request(args) -> tuple[dict, int, bool]:
    """(request, processes, external) from the options. Raises SpecError on bad input, before anything starts."""
    return session.build_request(args.device, args.nproc_per_node, args.quick, args.iters, args.max_bytes, args.out)


def _resolve_preset(args, raw: dict):
    """(preset or None, where it came from)."""
    # the GPU presets load only once something was measured, not for --help
    from trainperf.plan.hardware import load_gpu, preset_for_device

    if args.gpu:
        return load_gpu(args.gpu), f"--gpu {args.gpu}"
    if raw["device"] != "cuda":
        return None, None
    names = sorted({r.get("device_name") or "" for r in raw["ranks"]})
    preset = preset_for_device(names[0]) if names else None
    if preset is None:
        return None, f"no preset for {names[0]!r}: datasheet checks are n/a (give --gpu)"
    return preset, f"detected {names[0]}" + (f" (mixed GPUs: {', '.join(names)})" if len(names) > 1 else "")


def run(args) -> int:
    # the store (and sqlite3) loads only when a command runs, not for --help
    from trainperf.store.db import StoreError, check_store_path

    try:
        req, nproc, external = build_request(args)
        if args.gpu:
            # the GPU presets load only when --gpu is given
            from trainperf.plan.hardware import load_gpu

            load_gpu(args.gpu)  # a bad --gpu is bad input: say so before measuring
        if getattr(args, "db", None):  # so is a --db that cannot store the result
            check_store_path(args.db)
    except (SpecError, StoreError) as exc:
        return bad_input(str(exc), args.json)

    def announce(run_dir):  # on rank 0, before measuring
        if not args.json:
            print(f"preflight: {nproc} process(es) on {req['device']}"
                  + (f", log {run_dir / 'workers.log'}" if run_dir and nproc > 1 else ""), file=sys.stderr)
    try:
        result = session.run_preflight(req, nproc, external, args.out, getattr(args, "db", None),
                                       getattr(args, "kernels", "auto"), args.iters,
                                       lambda raw: _resolve_preset(args, raw), announce)
    except session.WorkersFailed as exc:
        if args.json:
            print(json.dumps({"error": str(exc), "exit_code": EXIT_FAILED}))
        print(f"trainperf: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if session.reporting_rank(external) != 0:
        return result["exit_code"]
    if args.json:
        print(json.dumps(result))
    else:
        print_result(result)
    return result["exit_code"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainperf preflight", description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
