"""A run's progress outside a terminal: plain lines at a steady cadence, evals with their target."""

import io

from trainperf.core.spec import EvalSpec, MLPerfSpec, RunSpec, TrainSpec
from trainperf.train.progress import RunProgress, expected_samples, progress_mode


def _spec(comparable=False) -> RunSpec:
    return RunSpec(workload="w", train=TrainSpec(max_steps=100, global_batch_size=8),
                   eval=EvalSpec(target=2.5), mlperf=MLPerfSpec(benchmark="llama2_70b_lora", comparable=comparable))


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_expected_end_is_the_rcp_mean_for_a_comparable_run_else_max_steps():
    rcp = lambda benchmark, gbs: 480.0
    assert expected_samples(_spec(comparable=True), rcp) == (480, "RCP mean samples to converge")
    assert expected_samples(_spec(comparable=False), rcp) == (800, "train.max_steps")
    assert expected_samples(_spec(comparable=True), lambda b, g: 10_000.0)[0] == 800  # capped by max_steps
    assert expected_samples(_spec(comparable=True), lambda b, g: None)[1] == "train.max_steps"


def test_plain_lines_come_at_a_steady_cadence_with_eta_and_every_eval():
    out, clock = io.StringIO(), FakeClock()
    p = RunProgress("lines", _spec(), (800, "train.max_steps"), stream=out, every_s=10, clock=clock)
    p.start_clock()
    for step in range(1, 51):
        clock.t = step * 1.0  # one step a second
        p.step(step, step * 8, 3.0 - step / 100, 4096.0)
    p.eval(50, 400, 2.4, 2.5)
    lines = out.getvalue().splitlines()
    steps = [x for x in lines if " step " in x and "samples" in x and "eval" not in x]
    assert [x.split()[2] for x in steps] == ["1/100", "11/100", "21/100", "31/100", "41/100"]
    assert "ETA 0:01:29" in steps[1]  # 88 samples in 11 s: 712 more at 8 samples/s
    assert "tokens/s 4,096" in steps[0]
    assert lines[-1].endswith("loss 2.4000, target 2.5000: target reached")
    assert all(x.startswith("[trainperf] ") for x in lines)


def test_modes():
    assert progress_mode(True) == "bar" and progress_mode(False) == "off" and progress_mode("lines") == "lines"
    out = io.StringIO()
    p = RunProgress("off", _spec(), (800, "x"), stream=out)
    p.step(1, 8, 3.0, 1.0)
    p.eval(1, 8, 3.0, 2.5)
    assert out.getvalue() == ""


def test_json_runs_put_their_lines_on_stderr(capsys):
    p = RunProgress("stderr", _spec(), (800, "train.max_steps"))
    p.eval(1, 8, 3.0, 2.5)
    out, err = capsys.readouterr()
    assert out == "" and "eval at step 1, 8 samples: loss 3.0000, target 2.5000: not reached" in err
