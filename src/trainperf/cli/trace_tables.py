"""The rich tables of ``trainperf trace``: per rank, collectives, communication and skew, top kernels,
idle gaps and the profiler's overhead, from a trace summary (trainperf.trace.summary)."""

from __future__ import annotations

from trainperf.trace import SUMMARY_FILE
from trainperf.trace.overhead import OVERHEAD_GOAL_PCT


def _ms(x) -> str:
    return "-" if x is None else f"{1e3 * x:,.2f}"


def _us(x) -> str:
    return "-" if x is None else f"{1e6 * x:,.1f}"


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1f}%"


def _bytes(n) -> str:
    if n is None:
        return "-"
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= f:
            return f"{n / f:.2f} {unit}"
    return f"{n} B"


def _gbps(x) -> str:
    return "-" if x is None else (f"{x:,.1f}" if x >= 1 else f"{x:.3g}")


def print_summary(s: dict, top: int = 10) -> None:
    from rich.console import Console

    console = Console(width=None if Console().is_terminal else 160)
    _print_ranks(console, s)
    _print_collectives(console, s, top)
    _print_comm_and_skew(console, s)
    _print_top_kernels(console, s, top)
    _print_idle_gaps(console, s, top)
    _print_overhead(console, s)
    console.print(f"summary: {s.get('summary_file')}")


def _print_ranks(console, s: dict) -> None:
    """The heading, the profiled steps and the per-rank table."""
    from rich.table import Table

    run = s.get("run") or {}
    head = f"trainperf trace: {run.get('workload') or ''} {s.get('mode', '')} trace of {len(s['ranks'])} ranks"
    if run.get("layout"):
        head += f", {run['layout']}"
    console.print(f"[bold]{head}[/bold]  ({s['trace_dir']})")
    steps = sorted({k for ks in s["steps_per_rank"].values() for k in ks})
    console.print(f"profiled steps (ProfilerStep#k = loop step k+1): {steps}")

    t = Table(title="per rank, mean per step (ms)")
    for col in ("rank", "step", "compute", "comm", "overlap", "exposed comm", "mem", "exposed mem", "idle",
                "wait in coll."):
        t.add_column(col, justify="right")
    for r in s["per_rank"]:
        t.add_row(str(r["rank"]), _ms(r["step_s"]), _ms(r["compute_s"]), _ms(r["comm_s"]), _pct(r["overlap_pct"]),
                  _ms(r["exposed_comm_s"]), _ms(r["mem_s"]), _ms(r["exposed_mem_s"]), _ms(r["idle_s"]),
                  _ms(r["collective_wait_s"]))
    tot = s["totals"]
    t.add_row("mean", _ms(tot["step_s"]), _ms(tot["compute_s"]), _ms(tot["comm_s"]), _pct(tot["overlap_pct"]),
              _ms(tot["exposed_comm_s"]), _ms(tot["mem_s"]), _ms(tot["exposed_mem_s"]), _ms(tot["idle_s"]),
              _ms(tot["collective_wait_s"]),
              style="bold")
    console.print(t)


def _print_collectives(console, s: dict, top: int) -> None:
    """The collectives table, largest first."""
    from rich.table import Table

    if s["collectives"]:
        t = Table(title="collectives (time per rank over the profiled steps; bandwidth from the transfer time = "
                        "the fastest rank's duration; GB/s = 1e9 B/s)")
        for col in ("op", "group", "n", "dtype", "size S", "calls/rank", "total ms/rank", "mean us", "transfer us",
                    "algbw GB/s", "busbw GB/s"):
            t.add_column(col, justify="right" if col not in ("op", "group", "dtype") else "left")
        for c in s["collectives"][:top]:
            t.add_row(c["op"], str(c["group"]), str(c["group_size"] or "?"), str(c["dtype"] or "?"), _bytes(c["bytes"]),
                      f"{c['count_per_rank']:g}", _ms(c["total_s_per_rank"]), _us(c["mean_s"]), _us(c["transfer_s"]),
                      _gbps(c["algbw_gbps"]), _gbps(c["busbw_gbps"]))
        if len(s["collectives"]) > top:
            t.caption = f"{len(s['collectives']) - top} more in --json / {SUMMARY_FILE}"
        console.print(t)


def _print_comm_and_skew(console, s: dict) -> None:
    """Communication per parallel dimension, rank skew and the straggler."""
    if s.get("comm_by_group"):
        console.print("communication per step by parallel dimension (per rank): " + "; ".join(
            f"{g}: {_ms(v['comm_s_per_step'])} ms in {v['calls_per_step']:.3g} calls, {_bytes(v['bytes_per_step'])}, "
            f"transfer {_ms(v['transfer_s_per_step'])} ms" for g, v in s["comm_by_group"].items()))
    sk = s.get("skew") or {}
    if sk and len(s["ranks"]) > 1:
        console.print("step time by rank: " + ", ".join(f"{k}: {_ms(v)} ms" for k, v in sk["step_s_by_rank"].items())
                      + f"; slowest rank {sk['slowest_rank']} (+{_ms(sk['slowest_minus_fastest_s'])} ms over the fastest, "
                        f"{_pct(sk['slowest_over_median_pct'])} over the median)")
        st = sk.get("straggler")
        if st:
            console.print(f"straggler: rank {st['rank']} -- the other ranks wait "
                          f"{_ms(st['others_wait_more_by_s_per_step'])} ms per step longer inside collectives for it; "
                          f"it started last in {st['arrived_last']} of {st['matched_collectives']} matched collectives")
    if s.get("note"):
        console.print(f"[yellow]{s['note']}[/yellow]")


def _print_top_kernels(console, s: dict, top: int) -> None:
    """The top kernels (GPU) or leaf ops (CPU)."""
    from rich.table import Table

    if s["top"]:
        t = Table(title="top kernels" if s.get("mode") == "gpu" else "top ops (leaf CPU ops; gloo work)")
        for col in ("name", "kind", "calls/rank", "total ms/rank", "mean us", "% of compute"):
            t.add_column(col, justify="left" if col in ("name", "kind") else "right")
        for k in s["top"][:top]:
            name = k["name"] if len(k["name"]) <= 90 else k["name"][:87] + "..."
            t.add_row(name, k["kind"], f"{k['count_per_rank']:g}", _ms(k["total_s_per_rank"]), _us(k["mean_s"]),
                      _pct(k["pct_of_compute"]))
        console.print(t)


def _print_idle_gaps(console, s: dict, top: int) -> None:
    """Where the GPU sat idle, by cause."""
    from rich.table import Table

    gaps = s.get("idle_gaps")
    if gaps and gaps["by_cause"]:
        t = Table(title=f"where the GPU sat idle: gaps of {_us(gaps['min_gap_s'])} us or more, "
                        f"{_ms(gaps['inside_s_per_step'])} ms per step inside the step and "
                        f"{_ms(gaps['edges_s_per_step'])} ms at its start and end (the trace waits for the GPU "
                        f"after every step; training does not) -- cause, and the host ops at the sync or launch")
        for col in ("cause", "where (host)", "gaps/step", "ms/step"):
            t.add_column(col, justify="left" if col in ("cause", "where (host)") else "right")
        for g in gaps["by_cause"][:top]:
            where = g["where"] if len(g["where"]) <= 90 else g["where"][:87] + "..."
            t.add_row(g["cause"], where, f"{g['count_per_step']:.3g}", _ms(g["total_s_per_step"]))
        if len(gaps["by_cause"]) > top:
            t.caption = f"{len(gaps['by_cause']) - top} more, and the largest gaps one by one, in --json / {SUMMARY_FILE}"
        console.print(t)


def _print_overhead(console, s: dict) -> None:
    """The profiler's own overhead and, when large, the unprofiled step estimate."""
    o = s.get("overhead") or {}
    if o.get("overhead_pct") is not None:
        r0 = next(iter(o["per_rank"].values()))
        console.print(f"profiler overhead: {o['overhead_pct']:+.1f}% step time (median over ranks; rank "
                      f"{next(iter(o['per_rank']))}: {_ms(r0['profiled_step_s'])} ms profiled vs "
                      f"{_ms(r0['baseline_step_s'])} ms unprofiled), trace export {r0['export_s']:.2f} s once")
    u = (s.get("unprofiled_estimate") or {}).get("totals")
    if u and o.get("overhead_pct") is not None and o["overhead_pct"] > OVERHEAD_GOAL_PCT:
        console.print(f"unprofiled step, estimated (the profiler's {_ms(u['profiler_extra_s'])} ms of host time "
                      f"taken out of idle, then collective waits): step {_ms(u['step_s'])} ms = compute "
                      f"{_ms(u['compute_s'])} + exposed comm {_ms(u['exposed_comm_s'])} + idle {_ms(u['idle_s'])} ms "
                      f"(+ mem copies, overlaps)")
    if s.get("overhead_hint"):
        console.print(f"[yellow]{s['overhead_hint']}[/yellow]")
