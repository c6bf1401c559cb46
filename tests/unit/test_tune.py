"""`trainperf tune`: real short trials of planned layouts; the measured fastest wins."""

from __future__ import annotations


def test_recalibrated_planner_abandons_clearly_slower_layouts():
    """After each trial the predictions are scaled by measured/predicted; a layout predicted (so scaled)
    above 1.25 x the best measured step is not run."""
    from types import SimpleNamespace

    from trainperf.runner.tune import Trial, successive_halving

    def cand(i, predicted):
        return SimpleNamespace(id=f"P{i}", est=SimpleNamespace(step_time_s=predicted), set_line="")

    cands = [cand(1, 1.0), cand(2, 1.1), cand(3, 2.0), cand(4, 1.15)]
    actual = {"P1": 2.0, "P2": 2.4, "P3": 4.0, "P4": 2.3}  # the machine runs everything 2x slower than planned
    ran = []

    def fake_run(workload, gpus, c, steps, db, out, extra, left):
        ran.append((c.id, steps))
        return Trial(c, steps, step_time_s=actual[c.id])

    res = successive_halving("w", 1, cands, "db", "out", [], 3600, first_steps=3, echo=lambda s: None, run=fake_run)
    assert ("P3", 3) not in ran  # 2.0 planned x 2.0 measured/planned = 4.0 > 1.25 x 2.0: never tried
    assert [t.candidate.id for t in res.trials if t.error and "not tried" in t.error] == ["P3"]
    assert res.winner.id == "P1"
    res_all = successive_halving("w", 1, cands, "db", "out", [], 3600, first_steps=3, echo=lambda s: None,
                                 run=fake_run, abandon_factor=0)
    assert all(t.step_time_s for t in res_all.trials)  # 0: every layout is tried


def test_later_rounds_only_remeasure_close_contenders():
    """A layout clearly ahead after round 1 wins without a second round; close ones are re-measured
    with twice the steps; keep_within=0 is plain successive halving (the faster half goes on)."""
    from types import SimpleNamespace

    from trainperf.runner.tune import Trial, successive_halving

    cands = [SimpleNamespace(id=f"P{i}", est=SimpleNamespace(step_time_s=1.0), set_line="") for i in range(4)]

    def runner(actual):
        ran = []

        def fake_run(workload, gpus, c, steps, db, out, extra, left):
            ran.append((c.id, steps))
            return Trial(c, steps, step_time_s=actual[c.id])
        return ran, fake_run

    ran, fake = runner({"P0": 1.00, "P1": 1.10, "P2": 1.12, "P3": 1.15})
    res = successive_halving("w", 1, cands, "db", "out", [], 3600, first_steps=3, echo=lambda s: None, run=fake)
    assert res.winner.id == "P0" and ran == [("P0", 3), ("P1", 3), ("P2", 3), ("P3", 3)]

    ran, fake = runner({"P0": 1.00, "P1": 1.02, "P2": 1.12, "P3": 1.15})
    res = successive_halving("w", 1, cands, "db", "out", [], 3600, first_steps=3, echo=lambda s: None, run=fake)
    assert ran[4:] == [("P0", 6), ("P1", 6)]

    ran, fake = runner({"P0": 1.00, "P1": 1.10, "P2": 1.12, "P3": 1.15})
    successive_halving("w", 1, cands, "db", "out", [], 3600, first_steps=3, echo=lambda s: None, run=fake,
                       keep_within=0)
    assert ran[4:] == [("P0", 6), ("P1", 6)]  # the faster half, though P1 is 10% behind
