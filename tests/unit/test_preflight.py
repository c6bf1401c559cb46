"""`trainperf preflight` on CPU (gloo): the arithmetic, the verdicts, and real multi-process runs.

* busbw factors and message bytes per collective against hand values (nccl-tests conventions);
* groups (intra-node, rails) and every-pair rounds;
* verdicts on synthetic numbers: datasheet thresholds, the slow GPU and the slow pair named, exit code;
* ``measured_overrides`` gives fields the planner's GPU preset takes;
* a real 2-process quick run through the command path, and a 2 "nodes" x 2 run started by external
  torchrun agents (the in-process rank path), with every collective, size and pair present;
* bad input: exit 2, one line, nothing launched.
"""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from trainperf.preflight import checks
from trainperf.preflight.checks import (
    COLLECTIVES,
    NA_CPU,
    busbw_factor,
    collective_elems,
    datasheet_verdict,
    evaluate,
    layout_groups,
    measured_overrides,
    node_names,
    pair_rounds,
    parse_size,
    sweep_sizes,
)
from trainperf.core.errors import SpecError


# -- arithmetic -------------------------------------------------------------------------------------

@pytest.mark.parametrize("n, ar, other", [(2, 1.0, 0.5), (4, 1.5, 0.75), (8, 1.75, 0.875)])
def test_busbw_factors_match_nccl_tests(n, ar, other):
    assert busbw_factor("all_reduce", n) == pytest.approx(ar)
    for coll in ("all_gather", "reduce_scatter", "all_to_all"):
        assert busbw_factor(coll, n) == pytest.approx(other)
    assert busbw_factor("sendrecv", n) == 1.0
    with pytest.raises(ValueError):
        busbw_factor("broadcast", n)


def test_message_bytes_follow_nccl_tests_conventions():
    mib = 2**20
    # all_reduce: the buffer; all_gather: total output; reduce_scatter: total input; all_to_all: all sent
    assert collective_elems("all_reduce", mib, 4, 2) == (mib, mib // 2, mib // 2)
    assert collective_elems("all_gather", mib, 4, 4) == (mib, mib // 16, mib // 4)
    assert collective_elems("reduce_scatter", mib, 4, 4) == (mib, mib // 4, mib // 16)
    assert collective_elems("all_to_all", mib, 4, 4) == (mib, mib // 4, mib // 4)
    assert collective_elems("sendrecv", 8, 2, 4) == (8, 2, 2)
    # too small to split 8 ways in bf16: one element per rank (16 B), never zero
    assert collective_elems("all_gather", 8, 8, 2) == (16, 1, 8)
    # not a multiple of n elements: rounded down to whole elements per rank
    assert collective_elems("reduce_scatter", 1000, 3, 4)[0] == 996


def test_sizes_and_parsing():
    assert sweep_sizes(True, "cpu") == [8, 256, 8192]
    full = sweep_sizes(False, "cuda")
    assert full[0] == 8 and full[-1] == 4 * 2**30 and all(b == 2 * a for a, b in zip(full, full[1:]))
    assert sweep_sizes(True, "cuda") == [2**10, 2**14, 2**18, 2**22, 2**26, 2**30]
    assert sweep_sizes(True, "cuda", 3 * 2**20)[-1] == 3 * 2**20  # the top is always measured
    assert parse_size("64K") == 65536 and parse_size("4G") == 4 * 2**30 and parse_size("512MiB") == 2**29
    with pytest.raises(SpecError):
        parse_size("12Q")


@pytest.mark.parametrize("n", range(2, 10))
def test_pair_rounds_cover_every_pair_once_with_disjoint_rounds(n):
    rounds = pair_rounds(n)
    pairs = [p for r in rounds for p in r]
    assert sorted(pairs) == [(a, b) for a in range(n) for b in range(a + 1, n)]
    for r in rounds:
        ranks = [x for p in r for x in p]
        assert len(ranks) == len(set(ranks))
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)


def test_nodes_and_groups():
    hosts = ["a", "a", "b", "b"]
    parts = {p["partition"]: p["groups"] for p in layout_groups(node_names(hosts, 2))}
    assert parts["world"] == [{"label": "world", "kind": "inter", "ranks": [0, 1, 2, 3]}]
    assert [(g["kind"], g["ranks"]) for g in parts["intra"]] == [("intra", [0, 1]), ("intra", [2, 3])]
    assert [(g["kind"], g["ranks"]) for g in parts["rail"]] == [("inter", [0, 2]), ("inter", [1, 3])]
    # one hostname but LOCAL_WORLD_SIZE < world: blocks of LOCAL_WORLD_SIZE ranks are nodes
    assert node_names(["h"] * 4, 2) == ["h#0", "h#0", "h#1", "h#1"]
    assert node_names(["h"] * 4, 4) == ["h"] * 4
    one = layout_groups(["h"] * 8)
    assert [p["partition"] for p in one] == ["world"] and one[0]["groups"][0]["kind"] == "intra"


def test_aggregation_averages_ranks_and_applies_factor():
    groups = [{"label": "world", "kind": "intra", "ranks": [0, 1, 2, 3]}]
    recs = [{"rank": r, "group": "world", "collective": "all_reduce", "size": 10**9, "bytes": 10**9,
             "time_s": t} for r, t in enumerate([0.01, 0.02, 0.03, 0.02])]
    (row,) = checks.aggregate_collectives(recs, groups)
    assert row["time_s"] == pytest.approx(0.02) and row["time_max_s"] == pytest.approx(0.03)
    assert row["algbw_gbps"] == pytest.approx(50.0)
    assert row["busbw_gbps"] == pytest.approx(75.0)  # 2(n-1)/n = 1.5 at n = 4
    pairs = checks.aggregate_pairs([{"rank": 0, "peer": 2, "size": 100, "bytes": 100, "time_s": 1e-6},
                                    {"rank": 2, "peer": 0, "size": 100, "bytes": 100, "time_s": 3e-6}],
                                   ["a", "a", "b", "b"])
    assert pairs[0]["ranks"] == [0, 2] and pairs[0]["link"] == "inter"
    assert pairs[0]["busbw_gbps"] == pytest.approx(100 / 2e-6 / 1e9)


# -- verdicts on synthetic numbers ---------------------------------------------------------------

def test_datasheet_thresholds():
    g = checks.THRESHOLDS["gemm_bf16"]
    assert datasheet_verdict(700, 1000, g)[0] == "pass"
    assert datasheet_verdict(699, 1000, g)[0] == "warn"
    assert datasheet_verdict(550, 1000, g)[0] == "warn"
    assert datasheet_verdict(549, 1000, g)[0] == "fail"
    assert datasheet_verdict(549, None, g)[0].startswith("n/a")
    assert datasheet_verdict(300, 400, checks.THRESHOLDS["busbw"]) == ("warn", 75.0)
    assert datasheet_verdict(3.5, 4.27, checks.THRESHOLDS["hbm"])[0] == "pass"  # 82%
    assert datasheet_verdict(1000, 1979, checks.THRESHOLDS["gemm_fp8"])[0] == "warn"  # 51%


def synthetic_raw(gemm=(790, 780, 700, 760), hbm=(4.2, 4.25, 4.1, 4.2), busbw=None, pair_bw=None,
                  top=2**30, device="cuda") -> dict:
    n = len(gemm)
    ranks = [{"rank": r, "local_rank": r, "device_index": r, "node": "h", "host": "h", "device_name": "NVIDIA H200"}
             for r in range(n)]
    busbw = busbw or {c: 300.0 for c in COLLECTIVES}
    colls = []
    for c, bw in busbw.items():
        for size, scale in ((2**20, 0.3), (top, 1.0)):
            colls.append({"collective": c, "group": "world", "kind": "intra", "ranks": list(range(n)), "n": n,
                          "size": size, "bytes": size, "time_s": 1.0, "algbw_gbps": bw * scale,
                          "busbw_gbps": bw * scale})
    pair_bw = pair_bw or {p: 360.0 for rnd in pair_rounds(n) for p in rnd}
    pairs = [{"ranks": list(p), "link": "intra", "size": top, "bytes": top, "time_s": 1.0, "algbw_gbps": v,
              "busbw_gbps": v} for p, v in pair_bw.items()]
    return {"device": device, "world_size": n, "ranks": ranks, "nodes": ["h"], "hosts": ["h"],
            "gemm": [{"rank": r, "dtype": "bf16", "n": 8192, "time_s": 1.0, "tflops": v} for r, v in enumerate(gemm)]
            + [{"rank": r, "dtype": "fp8", "n": 8192, "skipped": "test"} for r in range(n)],
            "hbm": [{"rank": r, "bytes": 2**30, "time_s": 1.0, "tbps": v} for r, v in enumerate(hbm)],
            "collectives": colls, "pairs": pairs}


def _h200():
    from trainperf.plan.hardware import PRESETS

    return PRESETS["h200"]


def _row(result, check, subject_prefix):
    (row,) = [r for r in result["checks"] if r["check"] == check and r["subject"].startswith(subject_prefix)]
    return row


def test_verdicts_name_the_slow_gpu_and_fail():
    res = evaluate(synthetic_raw(), _h200(), "test")
    # 700 TFLOP/s is 71% of 989 (datasheet pass) but 11.4% below the best GPU (790): fail, named
    assert _row(res, "gemm bf16", "rank 2")["verdict"] == "fail"
    assert [g["rank"] for g in res["slow_gpus"]] == [2]
    assert res["slow_gpus"][0]["slower_pct"] == pytest.approx(100 * (1 - 700 / 790))
    # 760 is 3.8% below the best: pass; 790 is the best: pass
    assert _row(res, "gemm bf16", "rank 3")["verdict"] == "pass"
    assert _row(res, "gemm bf16", "rank 0")["verdict"] == "pass"
    assert _row(res, "gemm bf16", "rank 0")["pct"] == pytest.approx(100 * 790 / 989)
    assert _row(res, "gemm fp8", "rank 0")["verdict"].startswith("n/a")
    assert res["exit_code"] == 1 and res["summary"]["fail"] == 1


def test_verdicts_warn_between_5_and_10_percent_below_best():
    res = evaluate(synthetic_raw(gemm=(790, 740, 790, 790)), _h200())
    assert _row(res, "gemm bf16", "rank 1")["verdict"] == "warn"  # 6.3% below the best
    assert res["slow_gpus"] == [] and res["exit_code"] == 0


def test_busbw_thresholds_against_preset():
    # preset intra busbw 277: 230 = 83% pass, 180 = 65% warn, 150 = 54% fail, 400 = 144% pass
    res = evaluate(synthetic_raw(busbw={"all_reduce": 400.0, "all_gather": 230.0, "reduce_scatter": 180.0,
                                        "all_to_all": 150.0}, gemm=(790,) * 4), _h200())
    assert _row(res, "all_reduce busbw", "world")["verdict"] == "pass"
    assert _row(res, "all_gather busbw", "world")["verdict"] == "pass"
    assert _row(res, "reduce_scatter busbw", "world")["verdict"] == "warn"
    assert _row(res, "all_to_all busbw", "world")["verdict"] == "fail"
    assert _row(res, "all_to_all busbw", "world")["size"] == "1 GiB"  # judged at the largest size
    assert res["exit_code"] == 1


def test_small_largest_size_is_not_judged_against_the_datasheet():
    res = evaluate(synthetic_raw(busbw={c: 10.0 for c in COLLECTIVES}, top=2**24, gemm=(790,) * 4), _h200())
    for c in COLLECTIVES:
        assert _row(res, f"{c} busbw", "world")["verdict"].startswith("n/a")
    assert res["exit_code"] == 0


def test_slow_pair_is_named():
    bw = {p: 360.0 for rnd in pair_rounds(4) for p in rnd}
    bw[(1, 3)] = 300.0  # 16.7% below the best pair
    res = evaluate(synthetic_raw(pair_bw=bw, gemm=(790,) * 4), _h200())
    assert [p["pair"] for p in res["slow_pairs"]] == [[1, 3]]
    assert _row(res, "sendrecv busbw (intra)", "pair 1-3")["verdict"] == "fail"
    assert _row(res, "sendrecv busbw (intra)", "pair 0-1")["verdict"] == "pass"
    assert res["exit_code"] == 1


def test_cpu_results_are_never_judged():
    res = evaluate(synthetic_raw(gemm=(1, 100, 1, 1), device="cpu"), _h200())
    assert {r["verdict"] for r in res["checks"]} == {NA_CPU}
    assert res["slow_gpus"] == [] and res["exit_code"] == 0 and res["measured_overrides"] == {}


def test_measured_overrides_feed_the_planner_preset():
    raw = synthetic_raw(busbw={"all_reduce": 330.0, "all_gather": 280.0, "reduce_scatter": 270.0, "all_to_all": 300.0})
    ov = measured_overrides(evaluate(raw, _h200()))
    assert ov == {"gemm_eff": round(700 / 989, 4), "hbm_tbps": 4.1, "intra_busbw_gbps": 275.0}
    gpu = dataclasses.replace(_h200(), **ov)  # every key is a GPU field
    assert gpu.intra_busbw_gbps == 275.0 and gpu.gemm_eff == pytest.approx(0.7078, abs=1e-4)
    # below 256 MiB nothing is taken for busbw
    assert "intra_busbw_gbps" not in measured_overrides(evaluate(synthetic_raw(top=2**20), _h200()))


def _with_host_link(raw: dict, alone=(55.0, 55.0, 54.0, 55.0), together=(27.0, 27.5, 27.0, 27.5)) -> dict:
    raw["host_link"] = [{"rank": r, "direction": d, "mode": m, "bytes": 2**30, "time_s": 1.0, "gbps": v}
                        for d in ("d2h", "h2d") for m, vals in (("alone", alone), ("together", together))
                        for r, v in enumerate(vals)]
    return raw


def test_host_link_is_judged_alone_against_pcie_and_together_against_the_uplink_share():
    """Each GPU alone against the preset's pinned-copy rate (52 GB/s on the H200), every GPU of the node
    at once against its share of a PCIe switch uplink (two GPUs per switch: 26 GB/s)."""
    res = evaluate(_with_host_link(synthetic_raw(gemm=(790,) * 4), alone=(55.0, 55.0, 38.0, 55.0)), _h200())
    assert _row(res, "host link d2h (alone)", "rank 0")["verdict"] == "pass"
    assert _row(res, "host link d2h (alone)", "rank 0")["datasheet"] == 52.0
    assert _row(res, "host link d2h (alone)", "rank 2")["verdict"] == "fail"  # 31% below the best GPU
    together = _row(res, "host link h2d (together)", "rank 1")
    assert together["datasheet"] == 26.0 and together["verdict"] == "pass"
    ov = measured_overrides(res)
    assert ov["pcie_gbps"] == 38.0 and ov["host_link_gpus"] == 2.0  # the slowest alone; 55 / 27.25
    assert dataclasses.replace(_h200(), **ov).host_link_gpus == 2.0
    # GPUs with their own uplinks: together as fast as alone, one GPU per link
    own = measured_overrides(evaluate(_with_host_link(synthetic_raw(gemm=(790,) * 4), together=(54.0,) * 4), _h200()))
    assert own["host_link_gpus"] == 1.0


def test_more_processes_than_gpus_is_bad_input(monkeypatch):
    import torch

    from trainperf.cli.preflight import build_request

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for k in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "SLURM_NTASKS", "SLURM_PROCID"):
        monkeypatch.delenv(k, raising=False)
    args = argparse.Namespace(nproc_per_node=3, quick=True, gpu=None, device="auto", max_bytes=None, iters=None,
                              out="runs", json=False)
    with pytest.raises(SpecError, match="--nproc-per-node 3 exceeds the 2 visible GPUs"):
        build_request(args)
    args.nproc_per_node = None  # default: every visible GPU, GPU sizes
    req, nproc, external = build_request(args)
    assert (nproc, external, req["device"], req["sizes"][-1]) == (2, False, "cuda", 2**30)
