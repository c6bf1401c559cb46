"""Preflight arithmetic and judgement, without torch: message sizes, nccl-tests bandwidth
conventions, node/group/pair layout, aggregation of per-rank timings, verdicts, planner overrides.

Bandwidth conventions follow nccl-tests (doc/PERFORMANCE.md): ``algbw = S / t`` with S as below,
``busbw = algbw * factor(n)`` (the factors: ``core.collectives``), decimal GB/s (1e9 B/s); ``t`` is the
mean time per operation over the timed iterations after warm-up, averaged over the ranks of the group
(nccl-tests' default ``-a``).

================  ================================================  =============
collective        S (bytes)                                         busbw factor
================  ================================================  =============
all_reduce        the buffer                                        2(n-1)/n
all_gather        the total output (n x each rank's input)           (n-1)/n
reduce_scatter    the total input (n x each rank's output)           (n-1)/n
all_to_all        what each rank sends in total                      (n-1)/n
sendrecv          what each rank sends (both directions at once)     1
================  ================================================  =============

Verdicts (documented thresholds, ``THRESHOLDS``):

* against the datasheet of the detected GPU (a ``trainperf.plan.hardware`` preset, or ``--gpu``):
  bf16 GEMM >= 70% of the dense peak passes, >= 55% warns, else fails (healthy H200: 73-80%);
  fp8 GEMM >= 60% / >= 45% of the fp8 peak (8192^3 with unit tensorwise scales reaches 67-74% on a
  healthy H200); HBM copy >= 80% / >= 65% of the preset's copy bandwidth; pinned host <-> device copies
  >= 80% / >= 65% of the preset's ``pcie_gbps`` for a GPU alone and of its share of the switch uplink
  (``pcie_gbps / host_link_gpus``) with every GPU of the node at once; collective and pair
  busbw at the largest size >= 80% / >= 60% of the preset busbw (intra-node busbw for a group inside one
  node, inter-node busbw for a group that crosses nodes). Sizes below 256 MiB are latency-bound and are
  never compared with the datasheet.
* against the best in the same run: a GPU (GEMM, HBM) or a pair (send/recv, compared only with pairs of
  the same kind, intra- or inter-node) or a per-node group that is >= 10% slower than the best is named
  slow and fails; >= 5% slower warns.
* on CPU every verdict is ``n/a (CPU: figures not meaningful)``: the same code runs, but nothing is
  compared.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field, fields
from typing import Any, Iterable

from trainperf.core import collectives as nccl_tests
from trainperf.core.errors import SpecError

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
TORCH_CALL = {"all_reduce": "all_reduce", "all_gather": "all_gather_into_tensor",
              "reduce_scatter": "reduce_scatter_tensor", "all_to_all": "all_to_all_single",
              "sendrecv": "batch_isend_irecv"}

PASS, WARN, FAIL = "pass", "warn", "fail"
NA_CPU = "n/a (CPU: figures not meaningful)"
CPU_NOTE = ("CPU run (gloo): the same code path with small sizes and fp32; figures not meaningful (they say "
            "nothing about any GPU or link) and every verdict is n/a")

# (pass if >=, warn if >=) as fractions of the datasheet figure; below the second: fail
THRESHOLDS: dict[str, Any] = {
    "gemm_bf16": (0.70, 0.55),
    "gemm_fp8": (0.60, 0.45),
    "hbm": (0.80, 0.65),
    "host_link": (0.80, 0.65),
    "busbw": (0.80, 0.60),
    # slower than the best of the same run by at least this fraction: warn, fail (and named slow)
    "slower_than_best": (0.05, 0.10),
    # collectives/pairs are compared with the datasheet only at sizes of at least this many bytes
    "min_datasheet_bytes": 256 * 2**20,
    # harness/plain throughput at least this: the harness adds no overhead of its own
    "baseline_ratio": 0.97,
}

_ORDER = {PASS: 0, WARN: 1, FAIL: 2}


# -- sizes --------------------------------------------------------------------------------------

_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20,
          "g": 2**30, "gb": 2**30, "gib": 2**30}


def parse_size(text: str) -> int:
    """'8', '64K', '1M', '4G', '512MiB' -> bytes (binary units). Raises SpecError."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise SpecError(f"size {text!r}: expected a byte count such as 8, 64K, 1M or 4G")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def fmt_bytes(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def sweep_sizes(quick: bool, device: str, max_bytes: int | None = None) -> list[int]:
    """Nominal message sizes. GPU full: 8 B .. 4 GiB doubling; GPU quick: 1 KiB .. 1 GiB x16.
    CPU full: 8 B .. 1 MiB x4; CPU quick: 8 B .. 8 KiB x32. The top is always included."""
    if device == "cuda":
        start, step, top = (2**10, 16, 2**30) if quick else (8, 2, 4 * 2**30)
    else:
        start, step, top = (8, 32, 8 * 2**10) if quick else (8, 4, 2**20)
    top = max_bytes or top
    sizes, s = [], min(start, top)
    while s < top:
        sizes.append(s)
        s *= step
    sizes.append(top)
    return sizes


def busbw_factor(collective: str, n: int) -> float:
    """nccl-tests' factor (``core.collectives``) of a collective preflight measures; ValueError for any other."""
    if collective not in COLLECTIVES + ("sendrecv",):
        raise ValueError(f"unknown collective {collective!r}")
    return nccl_tests.busbw_factor(collective, n)


def collective_elems(collective: str, size: int, n: int, elem: int) -> tuple[int, int, int]:
    """(S bytes actually moved by nccl-tests' convention, input numel, output numel) per rank for a
    nominal size: rounded down to whole elements (whole elements per rank where the buffer is split
    n ways), at least one element (per rank)."""
    if collective in ("all_reduce", "sendrecv"):
        count = max(1, size // elem)
        return count * elem, count, count
    per = max(1, size // elem // n)
    if collective == "all_gather":
        return per * n * elem, per, per * n
    if collective == "reduce_scatter":
        return per * n * elem, per * n, per
    if collective == "all_to_all":
        return per * n * elem, per * n, per * n
    raise ValueError(f"unknown collective {collective!r}")


# -- layout: nodes, groups, pairs ------------------------------------------------------------------

def node_names(hostnames: list[str], local_world_size: int | None) -> list[str]:
    """Node of every rank: its hostname; if every rank reports the same hostname but the launcher's
    LOCAL_WORLD_SIZE is smaller than the world (containers sharing a name, a local multi-node test),
    consecutive blocks of LOCAL_WORLD_SIZE ranks."""
    world = len(hostnames)
    if len(set(hostnames)) == 1 and local_world_size and 0 < local_world_size < world:
        return [f"{hostnames[0]}#{r // local_world_size}" for r in range(world)]
    return list(hostnames)


def layout_groups(nodes: list[str]) -> list[dict]:
    """Partitions of the ranks to measure collectives on; each is a list of groups measured
    concurrently. One node: just the world. Several nodes: the world (crosses nodes), one group per
    node (intra-node, NVLink), and rails: the i-th rank of every node (inter-node, one GPU per node,
    as nccl-tests' NCCL_TESTS_SPLIT="MOD <gpus per node>")."""
    world = len(nodes)
    order = list(dict.fromkeys(nodes))
    kind = "intra" if len(order) == 1 else "inter"
    parts = [{"partition": "world", "groups": [{"label": "world", "kind": kind, "ranks": list(range(world))}]}]
    if len(order) > 1:
        per_node = {h: [r for r in range(world) if nodes[r] == h] for h in order}
        intra = [{"label": f"node {h}", "kind": "intra", "ranks": rs} for h, rs in per_node.items() if len(rs) > 1]
        if intra:
            parts.append({"partition": "intra", "groups": intra})
        width = max(len(rs) for rs in per_node.values())
        rails = []
        for i in range(width):
            rs = [per_node[h][i] for h in order if i < len(per_node[h])]
            if len(rs) > 1:
                rails.append({"label": f"rail {i}", "kind": "inter", "ranks": rs})
        if rails:
            parts.append({"partition": "rail", "groups": rails})
    return parts


def pair_rounds(n: int) -> list[list[tuple[int, int]]]:
    """Every unordered pair of n ranks exactly once, in n-1 (n even) or n (n odd) rounds of disjoint
    pairs (the circle method), so each round's pairs run at the same time."""
    if n < 2:
        return []
    players = list(range(n)) + ([None] if n % 2 else [])
    m = len(players)
    rounds = []
    for _ in range(m - 1):
        pairs = []
        for i in range(m // 2):
            a, b = players[i], players[m - 1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
        players = [players[0], players[-1]] + players[1:-1]
    return rounds


# -- aggregation of per-rank records (rank 0, after an all-gather) ----------------------------------

def aggregate_collectives(records: list[dict], groups: list[dict]) -> list[dict]:
    """Per-rank records (collective, group label, size, bytes, time_s[, plain_time_s]) -> one row per
    (group, collective, size): time averaged over the group's ranks, algbw, busbw."""
    by_group = {g["label"]: g for g in groups}
    buckets: dict[tuple, list[dict]] = {}
    for r in records:
        buckets.setdefault((r["group"], r["collective"], r["size"]), []).append(r)
    rows = []
    for (label, coll, size), rs in buckets.items():
        g = by_group[label]
        n = len(g["ranks"])
        t = statistics.fmean(r["time_s"] for r in rs)
        algbw = rs[0]["bytes"] / t / 1e9
        row = {"collective": coll, "group": label, "kind": g["kind"], "ranks": g["ranks"], "n": n, "size": size,
               "bytes": rs[0]["bytes"], "time_s": t, "time_max_s": max(r["time_s"] for r in rs),
               "algbw_gbps": algbw, "busbw_gbps": algbw * busbw_factor(coll, n), "factor": busbw_factor(coll, n),
               "torch_call": TORCH_CALL[coll]}
        if all("plain_time_s" in r for r in rs):
            row["plain_time_s"] = statistics.fmean(r["plain_time_s"] for r in rs)
        rows.append(row)
    rank_of = {g["label"]: i for i, g in enumerate(groups)}
    rows.sort(key=lambda r: (rank_of[r["group"]], COLLECTIVES.index(r["collective"]), r["size"]))
    return rows


def aggregate_pairs(records: list[dict], nodes: list[str]) -> list[dict]:
    """Per-rank pair records (rank, peer, size, bytes, time_s) -> one row per (pair, size)."""
    buckets: dict[tuple, list[dict]] = {}
    for r in records:
        a, b = sorted((r["rank"], r["peer"]))
        buckets.setdefault((a, b, r["size"]), []).append(r)
    rows = []
    for (a, b, size), rs in sorted(buckets.items()):
        t = statistics.fmean(r["time_s"] for r in rs)
        algbw = rs[0]["bytes"] / t / 1e9
        rows.append({"ranks": [a, b], "link": "intra" if nodes[a] == nodes[b] else "inter", "size": size,
                     "bytes": rs[0]["bytes"], "time_s": t, "time_max_s": max(r["time_s"] for r in rs),
                     "algbw_gbps": algbw, "busbw_gbps": algbw * busbw_factor("sendrecv", 2)})
    return rows


# -- verdicts ---------------------------------------------------------------------------------------

def worst(*verdicts: str) -> str:
    judged = [v for v in verdicts if v in _ORDER]
    return max(judged, key=_ORDER.__getitem__) if judged else next(iter(verdicts), "n/a")


def datasheet_verdict(value: float, reference: float | None, thresholds: tuple[float, float]) -> tuple[str, float | None]:
    """(verdict, percent of the reference); n/a when there is no reference."""
    if not reference:
        return "n/a (no datasheet figure)", None
    frac = value / reference
    good, ok = thresholds
    return (PASS if frac >= good else WARN if frac >= ok else FAIL), 100.0 * frac


def relative_verdicts(values: dict[Any, float], higher_is_better: bool = True) -> dict[Any, dict]:
    """Each key against the best of the same run: {key: {verdict, slower, best}}; slower is the
    fraction below the best (0 for the best itself)."""
    if not values:
        return {}
    best = max(values, key=values.get) if higher_is_better else min(values, key=values.get)
    warn_at, fail_at = THRESHOLDS["slower_than_best"]
    out = {}
    top = values[best]
    for k, v in values.items():
        if top <= 0 or v <= 0:
            slower = 0.0 if v == top else 1.0
        else:
            slower = max(0.0, (1.0 - v / top) if higher_is_better else (1.0 - top / v))
        verdict = FAIL if slower >= fail_at else WARN if slower >= warn_at else PASS
        out[k] = {"verdict": verdict, "slower": slower, "best": best}
    return out


def _preset_dict(preset) -> dict | None:
    if preset is None:
        return None
    return {k: getattr(preset, k) for k in ("name", "bf16_tflops", "fp8_tflops", "hbm_tbps", "intra_busbw_gbps",
                                            "inter_busbw_gbps", "gemm_eff", "pcie_gbps", "host_link_gpus")}


def _gpus_per_node(ranks: list[dict]) -> int:
    per: dict[str, int] = {}
    for info in ranks:
        per[info.get("node", info.get("host", ""))] = per.get(info.get("node", info.get("host", "")), 0) + 1
    return max(per.values()) if per else 1


def _who(ranks: list[dict], r: int) -> str:
    """'rank 3 (node-a gpu3)': the rank, its node and its local device (proc<i> on CPU)."""
    info = ranks[r] if r < len(ranks) else {}
    if info.get("node") is None:
        return f"rank {r}"
    dev = f"gpu{info['device_index']}" if info.get("device_index") is not None else f"proc{info.get('local_rank', r)}"
    return f"rank {r} ({info['node']} {dev})"


@dataclass
class CheckResult:
    """One verdict row of a preflight: a measurement against the datasheet and the best of the run."""
    check: str
    subject: str
    size: str
    value: float | None
    unit: str
    datasheet: float | None
    pct: float | None
    verdict: str
    note: str

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class PreflightResult:
    """A judged preflight: the raw measurements (their keys come first in the JSON) and the verdicts."""
    raw: dict
    note: str | None
    gpu_preset: dict | None
    preset_source: str | None
    thresholds: dict
    checks: list[CheckResult]
    slow_gpus: list[dict]
    slow_pairs: list[dict]
    baseline: list[dict]
    summary: dict[str, int]
    exit_code: int
    measured_overrides: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """preflight.json: the raw result's keys, then the judgement's."""
        out = dict(self.raw)
        out.update({"note": self.note, "gpu_preset": self.gpu_preset, "preset_source": self.preset_source,
                    "thresholds": self.thresholds, "checks": [c.to_dict() for c in self.checks],
                    "slow_gpus": self.slow_gpus, "slow_pairs": self.slow_pairs, "baseline": self.baseline,
                    "summary": self.summary, "exit_code": self.exit_code,
                    "measured_overrides": self.measured_overrides})
        return out


class _Verdicts:
    """The verdict rows of one preflight as they are judged, and the GPUs and pairs named slow."""

    def __init__(self, raw: dict, preset):
        self.cpu = raw["device"] != "cuda"
        self.ranks = raw.get("ranks", [])
        self.datasheet = _preset_dict(preset) or {}
        self.rows: list[CheckResult] = []
        self.slow_gpus: list[dict] = []
        self.slow_pairs: list[dict] = []

    def who(self, rank: int) -> str:
        return _who(self.ranks, rank)

    def is_slow(self, rel: dict | None) -> bool:
        """Slower than the best of the run by the failing margin (never on CPU)."""
        return not self.cpu and bool(rel) and rel["slower"] >= THRESHOLDS["slower_than_best"][1]

    def add(self, check: str, subject: str, size: str, value: float | None, unit: str, reference: float | None,
            thresholds: tuple | None, rel: dict | None = None, note: str = "",
            datasheet_ok: bool = True) -> CheckResult:
        """One row: the worse of the datasheet verdict and the verdict against the best of the run."""
        if self.cpu:
            verdict, pct = NA_CPU, None
        elif value is None:
            verdict, pct = "n/a (skipped)", None
        else:
            if datasheet_ok and thresholds is not None:
                v_ds, pct = datasheet_verdict(value, reference, thresholds)
            else:
                v_ds, pct = "n/a (size below the datasheet comparison)", (100.0 * value / reference if reference else None)
            verdict = worst(v_ds, rel["verdict"]) if rel else v_ds
            if rel and rel["slower"] >= THRESHOLDS["slower_than_best"][0]:
                note = (note + "; " if note else "") + f"{100 * rel['slower']:.0f}% below the best: {rel['best_name']}"
        row = CheckResult(check=check, subject=subject, size=size, value=value, unit=unit,
                          datasheet=reference if not self.cpu else None, pct=pct, verdict=verdict, note=note)
        self.rows.append(row)
        return row


def _judge_gemm(v: _Verdicts, raw: dict) -> None:
    """Per GPU: bf16 (fp32 on CPU) and fp8 GEMM against the datasheet peak and the fastest GPU."""
    for dtype, key, ref_key in (("bf16", "gemm_bf16", "bf16_tflops"), ("fp8", "gemm_fp8", "fp8_tflops")):
        entries = [g for g in raw.get("gemm", []) if g["dtype"] in ((dtype, "fp32") if dtype == "bf16" else (dtype,))]
        measured = {g["rank"]: g["tflops"] for g in entries if not g.get("skipped")}
        rel = relative_verdicts(measured)
        for g in entries:
            label = f"gemm {g['dtype']}"
            if g.get("skipped"):
                v.add(label, v.who(g["rank"]), "-", None, "TFLOP/s", None, None, note=f"skipped: {g['skipped']}")
                continue
            r = rel.get(g["rank"])
            if r:
                r["best_name"] = v.who(r["best"])
            row = v.add(label, v.who(g["rank"]), f"{g['n']}^3", g["tflops"], "TFLOP/s", v.datasheet.get(ref_key),
                        THRESHOLDS[key], r)
            if v.is_slow(r):
                v.slow_gpus.append({"check": label, "rank": g["rank"], "who": row.subject, "value": g["tflops"],
                                    "best": measured[r["best"]], "slower_pct": 100 * r["slower"]})


def _judge_hbm(v: _Verdicts, raw: dict) -> None:
    hbm = raw.get("hbm", [])
    rel = relative_verdicts({h["rank"]: h["tbps"] for h in hbm})
    for h in hbm:
        r = rel[h["rank"]]
        r["best_name"] = v.who(r["best"])
        row = v.add("hbm copy", v.who(h["rank"]), fmt_bytes(h["bytes"]), h["tbps"], "TB/s", v.datasheet.get("hbm_tbps"),
                    THRESHOLDS["hbm"], r)
        if v.is_slow(r):
            v.slow_gpus.append({"check": "hbm copy", "rank": h["rank"], "who": row.subject, "value": h["tbps"],
                                "best": max(x["tbps"] for x in hbm), "slower_pct": 100 * r["slower"]})


def _judge_host_link(v: _Verdicts, raw: dict) -> None:
    """Each GPU alone against the preset's rate, all at once against its share of the uplink."""
    host = raw.get("host_link", [])
    for direction in ("d2h", "h2d"):
        for mode in ("alone", "together"):
            rs = [h for h in host if h["direction"] == direction and h["mode"] == mode]
            rel = relative_verdicts({h["rank"]: h["gbps"] for h in rs})
            ref = v.datasheet.get("pcie_gbps")
            if ref and mode == "together":
                ref = ref / max(1.0, min(v.datasheet.get("host_link_gpus", 1.0), _gpus_per_node(v.ranks)))
            for h in rs:
                r = rel[h["rank"]]
                r["best_name"] = v.who(r["best"])
                v.add(f"host link {direction} ({mode})", v.who(h["rank"]), fmt_bytes(h["bytes"]), h["gbps"], "GB/s",
                      ref, THRESHOLDS["host_link"], r)


def _judge_collectives(v: _Verdicts, raw: dict) -> None:
    """Each group at its largest size; per-node groups (and rails) against each other: a slow node stands out."""
    colls = raw.get("collectives", [])
    for coll in COLLECTIVES:
        largest: dict[str, dict] = {}
        for c in (c for c in colls if c["collective"] == coll):
            if c["group"] not in largest or c["size"] > largest[c["group"]]["size"]:
                largest[c["group"]] = c
        peers: dict[str, dict] = {}
        for c in largest.values():
            if c["group"] != "world":
                peers.setdefault(c["kind"], {})[c["group"]] = c["busbw_gbps"]
        rels = {kind: relative_verdicts(bw) for kind, bw in peers.items() if len(bw) > 1}
        for label, c in largest.items():
            r = rels.get(c["kind"], {}).get(label)
            if r:
                r["best_name"] = r["best"]
            ref = v.datasheet.get("intra_busbw_gbps" if c["kind"] == "intra" else "inter_busbw_gbps")
            v.add(f"{coll} busbw", f"{label} ({c['n']} ranks)", fmt_bytes(c["size"]), c["busbw_gbps"], "GB/s", ref,
                  THRESHOLDS["busbw"], r, datasheet_ok=c["size"] >= THRESHOLDS["min_datasheet_bytes"])


def _judge_pairs(v: _Verdicts, raw: dict) -> None:
    """send/recv pairs at their largest size, compared with pairs of the same kind (intra, inter)."""
    pairs = raw.get("pairs", [])
    if not pairs:
        return
    top = max(p["size"] for p in pairs)
    at_top = [p for p in pairs if p["size"] == top]
    for link in ("intra", "inter"):
        ps = {tuple(p["ranks"]): p for p in at_top if p["link"] == link}
        rel = relative_verdicts({k: p["busbw_gbps"] for k, p in ps.items()})
        ref = v.datasheet.get("intra_busbw_gbps" if link == "intra" else "inter_busbw_gbps")
        for k, p in sorted(ps.items()):
            r = rel[k]
            r["best_name"] = f"pair {r['best'][0]}-{r['best'][1]}"
            row = v.add(f"sendrecv busbw ({link})", f"pair {k[0]}-{k[1]}", fmt_bytes(top), p["busbw_gbps"], "GB/s",
                        ref, THRESHOLDS["busbw"], r, datasheet_ok=top >= THRESHOLDS["min_datasheet_bytes"])
            if v.is_slow(r):
                v.slow_pairs.append({"pair": list(k), "who": row.subject, "link": link, "value": p["busbw_gbps"],
                                     "best": ps[r["best"]]["busbw_gbps"], "slower_pct": 100 * r["slower"]})


def judge(raw: dict, preset=None, preset_source: str | None = None) -> PreflightResult:
    """Turn the raw measurements into the result: verdict rows, slow GPUs/pairs, baseline ratios,
    summary, exit code, planner overrides. ``preset`` is a GPU datasheet (``trainperf.plan.hardware.GPU``)
    or None."""
    v = _Verdicts(raw, preset)
    for judge_part in (_judge_gemm, _judge_hbm, _judge_host_link, _judge_collectives, _judge_pairs):
        judge_part(v, raw)
    counts = {verdict: sum(1 for r in v.rows if r.verdict == verdict) for verdict in (PASS, WARN, FAIL)}
    counts["n/a"] = len(v.rows) - sum(counts.values())
    result = PreflightResult(
        raw=dict(raw), note=CPU_NOTE if v.cpu else None, gpu_preset=_preset_dict(preset), preset_source=preset_source,
        thresholds={k: list(t) if isinstance(t, tuple) else t for k, t in THRESHOLDS.items()},
        checks=v.rows, slow_gpus=v.slow_gpus, slow_pairs=v.slow_pairs, baseline=baseline_rows(raw),
        summary=counts, exit_code=1 if counts[FAIL] else 0)
    result.measured_overrides = measured_overrides(result.to_dict())
    return result


def evaluate(raw: dict, preset=None, preset_source: str | None = None) -> dict:
    """``judge`` JSON-ready: the content of preflight.json."""
    return judge(raw, preset, preset_source).to_dict()


def baseline_rows(raw: dict) -> list[dict]:
    """Harness against a plain loop (torch.cuda.synchronize + time.perf_counter around N calls) of the
    same call: ratio = harness throughput / plain throughput = plain time / harness time."""
    out = []
    for dtype in ("bf16", "fp32"):
        g = [x for x in raw.get("gemm", []) if x["dtype"] == dtype and "plain_time_s" in x]
        if g:
            ratios = [x["plain_time_s"] / x["time_s"] for x in g]
            out.append({"check": f"gemm {dtype}", "size": f"{g[0]['n']}^3", "harness_s": statistics.fmean(x["time_s"] for x in g),
                        "plain_s": statistics.fmean(x["plain_time_s"] for x in g), "ratio": min(ratios),
                        "per_rank": ratios})
    h = [x for x in raw.get("hbm", []) if "plain_time_s" in x]
    if h:
        ratios = [x["plain_time_s"] / x["time_s"] for x in h]
        out.append({"check": "hbm copy", "size": fmt_bytes(h[0]["bytes"]), "harness_s": statistics.fmean(x["time_s"] for x in h),
                    "plain_s": statistics.fmean(x["plain_time_s"] for x in h), "ratio": min(ratios), "per_rank": ratios})
    for c in raw.get("collectives", []):
        if "plain_time_s" in c:
            out.append({"check": f"{c['collective']} ({c['group']})", "size": fmt_bytes(c["size"]), "harness_s": c["time_s"],
                        "plain_s": c["plain_time_s"], "ratio": c["plain_time_s"] / c["time_s"]})
    for b in out:
        b["ok"] = b["ratio"] >= THRESHOLDS["baseline_ratio"]
    return out


def measured_overrides(result: dict) -> dict:
    """GPU-preset fields measured by a preflight, for ``dataclasses.replace(gpu, **overrides)``:

    * ``gemm_eff``: the slowest GPU's bf16 GEMM TFLOP/s over the preset's bf16 peak (needs a preset);
    * ``hbm_tbps``: the slowest GPU's copy bandwidth;
    * ``intra_busbw_gbps``: the mean of all-gather and reduce-scatter busbw at the largest size, of the
      slowest intra-node group (the preset's figure is the same two collectives at 1 GiB);
    * ``inter_busbw_gbps``: likewise over the rails (one GPU per node), multi-node runs only;
    * ``pcie_gbps``: the slowest GPU's pinned copy rate alone (the slower direction), and
      ``host_link_gpus``: how many GPUs' worth that rate is divided by when every GPU of the node copies
      at once (alone / together, rounded; at least 1).

    A synchronous job runs at the pace of its slowest member, hence the minima. Collective figures
    are only taken at >= 256 MiB; CPU results give nothing."""
    if result.get("device") != "cuda":
        return {}
    out: dict[str, float] = {}
    gemm = [g["tflops"] for g in result.get("gemm", []) if g["dtype"] == "bf16" and not g.get("skipped")]
    peak = (result.get("gpu_preset") or {}).get("bf16_tflops")
    if gemm and peak:
        out["gemm_eff"] = round(min(gemm) / peak, 4)
    hbm = [h["tbps"] for h in result.get("hbm", [])]
    if hbm:
        out["hbm_tbps"] = round(min(hbm), 3)
    host = result.get("host_link", [])
    alone = [h["gbps"] for h in host if h["mode"] == "alone"]
    together = [h["gbps"] for h in host if h["mode"] == "together"]
    if alone and together:
        out["pcie_gbps"] = round(min(alone), 1)
        out["host_link_gpus"] = float(max(1, round(statistics.median(alone) / statistics.median(together))))
    colls = result.get("collectives", [])
    for kind, key in (("intra", "intra_busbw_gbps"), ("inter", "inter_busbw_gbps")):
        cand = [c for c in colls if c["collective"] in ("all_gather", "reduce_scatter") and c["kind"] == kind
                and c["size"] >= THRESHOLDS["min_datasheet_bytes"]]
        if kind == "inter":
            cand = [c for c in cand if c["group"].startswith("rail")]
        per_group: dict[str, dict[str, dict]] = {}
        for c in cand:
            cur = per_group.setdefault(c["group"], {}).get(c["collective"])
            if cur is None or c["size"] > cur["size"]:
                per_group[c["group"]][c["collective"]] = c
        vals = [statistics.fmean(x["busbw_gbps"] for x in d.values()) for d in per_group.values() if len(d) == 2]
        if vals:
            out[key] = round(min(vals), 1)
    return out


def store_rows(result: dict, preflight_id: str) -> tuple[dict, list[dict]]:
    """The rows a schema-v4 store would keep for a result (see the package docstring)."""
    s = result["summary"]
    row = {"preflight_id": preflight_id, "created_at": result.get("created_at"), "hosts": result.get("hosts", []),
           "world_size": result["world_size"], "device": result["device"],
           "gpu": (result.get("gpu_preset") or {}).get("name") or (result.get("ranks") or [{}])[0].get("device_name"),
           "quick": bool(result.get("quick")), "exit_code": result["exit_code"], "n_pass": s[PASS], "n_warn": s[WARN],
           "n_fail": s[FAIL], "overrides": result.get("measured_overrides", {}), "result_path": result.get("result_path")}
    checks = [{"idx": i, **{k: c[k] for k in ("check", "subject", "size", "value", "unit", "datasheet", "pct", "verdict",
                                                "note")}} for i, c in enumerate(result["checks"])]
    return row, checks


def iter_sizes_table(collectives: Iterable[dict], group: str = "world") -> tuple[list[int], dict[int, dict[str, float]]]:
    """(sizes, {size: {collective: busbw}}) of one group, for the sweep table."""
    table: dict[int, dict[str, float]] = {}
    for c in collectives:
        if c["group"] == group:
            table.setdefault(c["size"], {})[c["collective"]] = c["busbw_gbps"]
    return sorted(table), table
