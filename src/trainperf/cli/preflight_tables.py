"""The rich tables of ``trainperf preflight``: every check's verdict, the busbw sweep by message size,
slow GPUs and pairs, the harness baseline and the measured preset fields, from a preflight result."""

from __future__ import annotations

from trainperf.preflight import checks


def _num(v: float | None, unit: str = "") -> str:
    if v is None:
        return "-"
    if unit == "TB/s":
        return f"{v:.2f}"
    return f"{v:,.1f}" if v >= 10 else f"{v:.3g}"


VERDICT_CELLS = {"pass": "[green]pass[/green]", "warn": "[yellow]warn[/yellow]", "fail": "[bold red]FAIL[/bold red]"}


def print_result(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if Console().is_terminal else 200)
    gpu = (result.get("gpu_preset") or {}).get("name") or (result["ranks"][0].get("device_name") if result["ranks"] else "?")
    table = Table(title=f"trainperf preflight: {result['world_size']} x {gpu} on {len(result['nodes'])} node(s)"
                        + (" (quick)" if result.get("quick") else ""))
    for col, just in (("check", "left"), ("subject", "left"), ("size", "right"), ("value", "right"),
                      ("datasheet", "right"), ("%", "right"), ("verdict", "left"), ("note", "left")):
        table.add_column(col, justify=just)
    rows = result["checks"]
    pair_rows = [r for r in rows if r["check"].startswith("sendrecv")]
    collapse = len(pair_rows) > 28
    for r in rows:
        if collapse and r in pair_rows and r["verdict"] == "pass":
            continue
        table.add_row(r["check"], r["subject"], r["size"], f"{_num(r['value'], r['unit'])} {r['unit']}",
                      _num(r["datasheet"], r["unit"]), "-" if r["pct"] is None else f"{r['pct']:.0f}%",
                      VERDICT_CELLS.get(r["verdict"], r["verdict"]), r.get("note") or "")
    if collapse:
        vals = sorted(r["value"] for r in pair_rows)
        table.add_row("sendrecv busbw", f"{len(pair_rows)} pairs (passing ones not shown)", pair_rows[0]["size"],
                      f"min {vals[0]:,.1f} / median {vals[len(vals) // 2]:,.1f} / max {vals[-1]:,.1f} GB/s", "", "", "", "")
    console.print(table)

    sizes, grid = checks.iter_sizes_table(result.get("collectives", []), "world")
    if sizes:
        sweep = Table(title=f"busbw GB/s by message size (world, {result['world_size']} ranks; sendrecv: slowest pair)")
        sweep.add_column("size", justify="right")
        for c in (*checks.COLLECTIVES, "sendrecv"):
            sweep.add_column(c, justify="right")
        pairs_by_size: dict[int, list[float]] = {}
        for p in result.get("pairs", []):
            pairs_by_size.setdefault(p["size"], []).append(p["busbw_gbps"])
        for s in sizes:
            sweep.add_row(checks.fmt_bytes(s), *(_num(grid[s].get(c)) for c in checks.COLLECTIVES),
                          _num(min(pairs_by_size[s])) if s in pairs_by_size else "-")
        console.print(sweep)

    for g in result.get("slow_gpus", []):
        console.print(f"[red]slow GPU[/red]: {g['who']} {g['check']} {g['value']:.3g} is {g['slower_pct']:.0f}% below the best ({g['best']:.3g})")
    for p in result.get("slow_pairs", []):
        console.print(f"[red]slow pair[/red]: {p['who']} ({p['link']}) {p['value']:.1f} GB/s is {p['slower_pct']:.0f}% below "
                      f"the best pair ({p['best']:.1f})")
    base = result.get("baseline", [])
    if base:
        parts = ", ".join(f"{b['check']} {b['size']} {b['ratio']:.2f}" for b in base)
        ok = all(b["ok"] for b in base)
        lim = checks.THRESHOLDS["baseline_ratio"]
        if result["device"] != "cuda":
            verdict = "CPU: ratios not meaningful either"
        elif ok:
            verdict = f"all >= {lim}: the harness measures what a plain loop does"
        else:
            verdict = f"[yellow]some < {lim}: the harness reads lower than a plain loop[/yellow]"
        console.print(f"harness/plain throughput: {parts} -- {verdict}")
    kt = result.get("kernel_table")
    if kt:
        use = "plan uses it" if result["device"] == "cuda" else "CPU: exercises the path, plan ignores it"
        console.print(f"kernel table: {kt['gemm_shapes']} GEMM and {kt['attention_shapes']} attention shapes in "
                      f"{kt['seconds']} s -> {kt['path']} ({use})")
    for n in result.get("notes", []):
        console.print(f"note: {n}")
    if result.get("note"):
        console.print(f"[yellow]{result['note']}[/yellow]")
    if result.get("preset_source"):
        console.print(f"datasheet: {result['preset_source']}")
    s = result["summary"]
    ov = result.get("measured_overrides") or {}
    if ov:
        console.print("measured preset fields: " + ", ".join(f"{k}={v}" for k, v in ov.items()))
    console.print(f"{s['pass']} pass, {s['warn']} warn, {s['fail']} fail, {s['n/a']} n/a -- {result['result_path']}")
