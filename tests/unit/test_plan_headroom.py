"""`plan --memory-headroom` (and `tune`'s): a layout is ranked only if its predicted memory leaves the
given fraction of the GPU free; the default covers the largest memory under-prediction measured."""

from __future__ import annotations

import dataclasses
import json

import pytest
from trainperf.cli import main
from trainperf.plan.hardware import PRESETS
from trainperf.plan.search import DEFAULT_MEMORY_HEADROOM, fits_within, plan
from trainperf.core.errors import SpecError
from trainperf.core.resolve import resolve_spec
from trainperf.workloads.mini import synthetic_lora_defaults

H200 = PRESETS["h200"]


def _base(*overrides: str):
    spec = resolve_spec(synthetic_lora_defaults(), None, list(overrides))
    spec.hardware.device = "cuda"
    return spec


def _plain(cands) -> set[str]:
    """The enumerated layouts (not the partial-recompute variants plan derives from them)."""
    return {c.set_line for c in cands if "train.recompute_layers" not in c.overrides}


def test_a_layout_at_97_percent_ranks_without_headroom_and_not_with_5_percent():
    base = _base("train.global_batch_size=8")
    ranked, _ = plan(base, H200, 2, 2, objective="throughput")
    target = next(c for c in ranked if "train.recompute_layers" not in c.overrides)
    gpu = dataclasses.replace(H200, hbm_gib=target.est.reserved_gib / 0.97)  # the layout needs 97% of this GPU

    at0, over0 = plan(base, gpu, 2, 2, objective="throughput", headroom=0.0)
    assert target.set_line in {c.set_line for c in at0}
    assert not any(c.est.fits for c in over0)  # headroom 0: the old rule, est.fits alone

    at5, over5 = plan(base, gpu, 2, 2, objective="throughput", headroom=0.05)
    assert target.set_line not in {c.set_line for c in at5}
    excluded = next(c for c in over5 if c.set_line == target.set_line)
    assert excluded.est.fits  # fits the GPU, excluded only by the margin
    assert all(c.est.reserved_gib <= 0.95 * gpu.hbm_gib for c in at5)
    assert [c.id for c in at5] == [f"P{i}" for i in range(1, len(at5) + 1)]
    assert fits_within(target.est, gpu, 0.02) and not fits_within(target.est, gpu, 0.04)


def test_more_headroom_never_adds_layouts():
    """The 70B LoRA recipe on 2 H200s (the edge case: 138.2 of 139 GiB ranked first without a margin)."""
    from trainperf.workloads import get_workload

    base = resolve_spec(get_workload("llama2_70b_lora").defaults(), None, ["mlperf.division=open"])
    prev_plain, prev_k, counts = None, {}, []
    for h in (0.0, 0.02, DEFAULT_MEMORY_HEADROOM, 0.2):
        ranked, over = plan(base, H200, 2, 2, objective="throughput", headroom=h)
        assert all(c.est.reserved_gib <= (1 - h) * H200.hbm_gib for c in ranked)
        plain = _plain(ranked)
        counts.append(len(plain))
        if prev_plain is not None:
            assert plain <= prev_plain, (h, plain - prev_plain)
        # a partial-recompute variant never recomputes fewer layers with more headroom
        k = {(c.set_line.split(" --set train.recompute_layers=")[0]): c.overrides["train.recompute_layers"]
             for c in ranked if "train.recompute_layers" in c.overrides}
        for layout, layers in k.items():
            if layout in prev_k:
                assert layers >= prev_k[layout], (h, layout)
        prev_plain, prev_k = plain, k
    assert counts[0] > counts[-1]  # the headroom does exclude layouts here
    # the 0-margin pick sits at the very edge; the default's pick leaves its margin
    edge = plan(base, H200, 2, 2, objective="throughput")[0][0]
    safe = plan(base, H200, 2, 2, objective="throughput", headroom=DEFAULT_MEMORY_HEADROOM)[0][0]
    assert edge.est.reserved_gib > 0.97 * H200.hbm_gib
    assert safe.est.reserved_gib <= (1 - DEFAULT_MEMORY_HEADROOM) * H200.hbm_gib


@pytest.mark.parametrize("bad", ["0.5", "-0.01", "1", "nan"])
def test_invalid_headroom_is_rejected_before_any_work(bad, tmp_path, capsys):
    db = tmp_path / "t.db"
    # an unknown workload too: the headroom is checked first, and no store is created
    assert main(["plan", "no-such-workload", "--gpus", "2", "--memory-headroom", bad, "--db", str(db)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("trainperf: error: --memory-headroom") and "[0, 0.5)" in err
    assert not db.exists()
    assert main(["tune", "no-such-workload", "--gpus", "1", "--memory-headroom", bad, "--db", str(db),
                 "--out", str(tmp_path / "runs")]) == 2
    assert "[0, 0.5)" in capsys.readouterr().err
    with pytest.raises(SpecError, match=r"\[0, 0.5\)"):
        plan(_base(), H200, 2, 2, headroom=float(bad))


def _plan_json(tmp_path, capsys, *extra: str) -> dict:
    rc = main(["plan", "synthetic-lora", "--gpus", "2", "--top", "1000", "--json", "--db", str(tmp_path / "t.db"), *extra])
    data = json.loads(capsys.readouterr().out)
    assert rc == (0 if data["ranked"] else 1)
    return data


def test_json_carries_the_headroom(tmp_path, capsys):
    default = _plan_json(tmp_path, capsys)
    assert default["memory_headroom"] == DEFAULT_MEMORY_HEADROOM
    assert default["usable_gib"] == pytest.approx((1 - DEFAULT_MEMORY_HEADROOM) * H200.hbm_gib, abs=1e-3)
    assert all(r["memory_gib"] <= default["usable_gib"] for r in default["ranked"])

    # a GPU of 1.02 x the best layout's memory: headroom 0 ranks it, headroom 0.1 does not (over_headroom counts it)
    zero = _plan_json(tmp_path, capsys, "--memory-headroom", "0")
    top = max(r["memory_gib"] for r in zero["ranked"])
    gpu_yaml = tmp_path / "gpu.yaml"
    gpu_yaml.write_text(f"base: h200\nname: small H200\nhbm_gib: {top * 1.02}\n")
    loose = _plan_json(tmp_path, capsys, "--gpu", str(gpu_yaml), "--memory-headroom", "0", "--datasheet")
    tight = _plan_json(tmp_path, capsys, "--gpu", str(gpu_yaml), "--memory-headroom", "0.1", "--datasheet")
    assert loose["memory_headroom"] == 0 and loose["over_headroom"] == 0
    assert tight["memory_headroom"] == 0.1 and tight["over_headroom"] > 0
    plain = [{r["set"] for r in d["ranked"] if "recompute_layers" not in r["set"]} for d in (loose, tight)]
    assert plain[1] < plain[0]  # strictly fewer enumerated layouts ranked
    assert max(r["memory_gib"] for r in tight["ranked"]) <= tight["usable_gib"] < top


def test_table_header_names_the_headroom(tmp_path, capsys):
    assert main(["plan", "synthetic-lora", "--gpus", "2", "--top", "1", "--memory-headroom", "0.12",
                 "--db", str(tmp_path / "t.db")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "memory headroom 12% (122.3 of 139 GiB usable)" in out


def test_tune_ranks_with_the_same_headroom(tmp_path, capsys, monkeypatch):
    import trainperf.runner.tune as tune
    import trainperf.plan.search as search
    from trainperf.runner.tune import TuneResult

    seen = {}
    real_plan = search.plan

    def spy_plan(*args, **kw):
        seen["headroom"] = kw.get("headroom")
        return real_plan(*args, **kw)

    def no_trials(workload, gpus, cands, *args, **kw):
        seen["cands"] = cands
        return TuneResult()

    monkeypatch.setattr(search, "plan", spy_plan)
    monkeypatch.setattr(tune, "successive_halving", no_trials)
    argv = ["tune", "synthetic-lora", "--gpus", "2", "--json", "--db", str(tmp_path / "t.db"), "--out", str(tmp_path / "r"),
            "--set", "hardware.memory_check=false"]  # no GPU here: a 7B trial would not fit the CPU (none runs: a spy)
    assert main(argv) == 1  # no trial ran: nothing to recommend
    assert seen["headroom"] == DEFAULT_MEMORY_HEADROOM
    assert json.loads(capsys.readouterr().out)["memory_headroom"] == DEFAULT_MEMORY_HEADROOM
    assert main(argv + ["--memory-headroom", "0.3"]) == 1
    assert seen["headroom"] == 0.3
    assert all(c.est.reserved_gib <= 0.7 * H200.hbm_gib for c in seen["cands"])
