"""The profiler's own cost: the overhead of a traced run (profiled against unprofiled step wall
times, from the steps files ``capture`` writes), the breakdown of the unprofiled step estimated from
it, and a one-line hint when the overhead exceeds the goal."""

from __future__ import annotations

import statistics

OVERHEAD_GOAL_PCT = 3.0  # the goal: tracing may cost at most this much step time
HOST_PACED_SHARE = 0.05  # the unprofiled GPU waits on the host this share of the step or more


def unprofiled_estimate(per_rank: list[dict], over: dict) -> dict | None:
    """The breakdown of the *unprofiled* step, estimated. The profiler adds host time per op
    (docs/OBSERVABILITY.md has the figure): on a launch-bound step the GPU waits for it,
    so it shows up as idle time, or, on the other ranks of a collective, as time waiting inside the
    collective. Kernel durations themselves are GPU-side and unchanged. So the extra step time
    (profiled minus unprofiled wall time, per rank) is taken out of idle first, then out of the
    collective waits (and with them out of exposed communication). None without an overhead
    baseline."""
    ranks = (over or {}).get("per_rank") or {}
    rows = []
    for r in per_rank:
        o = ranks.get(str(r["rank"])) or {}
        base, prof = o.get("baseline_step_s"), o.get("profiled_step_s")
        if base is None or prof is None:
            continue
        extra = max(0.0, prof - base)
        idle = max(0.0, r["idle_s"] - extra)
        rest = extra - (r["idle_s"] - idle)
        wait = r.get("collective_wait_s") or 0.0
        wait_left = max(0.0, wait - rest)
        rows.append({"rank": r["rank"], "step_s": base, "profiler_extra_s": extra, "compute_s": r["compute_s"],
                     "exposed_comm_s": max(0.0, r["exposed_comm_s"] - (wait - wait_left)), "idle_s": idle,
                     "collective_wait_s": wait_left,
                     "unexplained_s": max(0.0, rest - wait)})  # extra time neither idle nor waits absorb
    if not rows:
        return None
    keys = ("step_s", "profiler_extra_s", "compute_s", "exposed_comm_s", "idle_s", "collective_wait_s", "unexplained_s")
    return {"totals": {k: statistics.mean(x[k] for x in rows) for k in keys}, "per_rank": rows,
            "method": "profiled breakdown minus the profiler's extra step time (profiled - unprofiled wall "
                      "time), taken from idle first, then from time waiting inside collectives"}


def overhead_hint(over: dict, estimate: dict | None) -> str | None:
    """One line for a trace whose profiler overhead exceeds the goal: whether the step is paced by
    the host (then the profiler's per-op host cost lands on the step in full, and the figure to read
    is the unprofiled estimate), and what makes such a step GPU-bound. None within the goal."""
    pct = (over or {}).get("overhead_pct")
    if pct is None or pct <= OVERHEAD_GOAL_PCT or not estimate:
        return None
    u = estimate["totals"]
    waiting = u["idle_s"] + u["collective_wait_s"]
    if u["step_s"] <= 0 or waiting / u["step_s"] < HOST_PACED_SHARE:
        return (f"profiler overhead {pct:+.1f}% on a step whose GPU is busy (estimated): "
                "the breakdown is distorted by it; compare with the unprofiled estimate")
    return (f"host-paced step: unprofiled, the GPU waits {1e3 * waiting:.0f} of {1e3 * u['step_s']:.0f} ms "
            "(idle, and inside collectives for a slower rank; estimated), and the profiler's per-op host "
            f"cost lengthens such a step ({pct:+.1f}%); read the unprofiled estimate. A GPU-bound "
            "configuration traces within 3% (train.compile=true, a larger train.micro_batch_size: "
            "7B TP2+SP went from +43% to +0.4%, docs/OBSERVABILITY.md)")


def overhead(steps_info: dict[int, dict]) -> dict:
    """Profiler overhead from the steps files: median wall time of the profiled (active) steps over
    that of the unprofiled ones (wait steps after the first, and the steps after the window)."""
    per_rank = {}
    for rank, info in sorted(steps_info.items()):
        steps = info.get("steps") or []
        base = [s["wall_s"] for s in steps if (s["phase"] == "wait" and s["index"] > 0) or s["phase"] == "after"]
        prof = [s["wall_s"] for s in steps if s["phase"] == "active"]
        entry = {"baseline_step_s": statistics.median(base) if base else None,
                 "profiled_step_s": statistics.median(prof) if prof else None,
                 "baseline_steps": len(base), "profiled_steps": len(prof), "export_s": info.get("export_s")}
        entry["overhead_pct"] = (100.0 * (entry["profiled_step_s"] / entry["baseline_step_s"] - 1)
                                 if base and prof and entry["baseline_step_s"] > 0 else None)
        per_rank[str(rank)] = entry
    vals = [e["overhead_pct"] for e in per_rank.values() if e["overhead_pct"] is not None]
    return {"overhead_pct": statistics.median(vals) if vals else None,
            "method": "median step wall time, profiled (active) steps vs unprofiled steps of the same run "
                      "(first step excluded); trace export time excluded and given separately",
            "per_rank": per_rank}
