"""Bad input that says where and what: the closest valid name, the line and column of a parse error."""

import pytest

from trainperf.core.errors import SpecError
from trainperf.core.resolve import load_config_file
from trainperf.core.spec import RunSpec, did_you_mean, set_value
from trainperf.workloads import get_workload


def test_misspelt_names_get_the_closest_valid_one():
    with pytest.raises(SpecError, match=r"did you mean 'train.global_batch_size'\?"):
        set_value(RunSpec(workload="w"), "train.global_bach_size", 8)
    with pytest.raises(SpecError, match=r"did you mean 'train'\?"):
        set_value(RunSpec(workload="w"), "trian.seed", 1)
    with pytest.raises(SpecError, match=r"did you mean 'llama2_70b_lora'\?"):
        get_workload("llama2_70b_lor")
    assert did_you_mean("zzzz", ["train", "eval"]) == ""


@pytest.mark.parametrize(("name", "text", "where"), [
    ("bad.yaml", "train:\n  lr: 0.1\n  seed: [1, 2\nmodel:\n  x: 1\n", "line 4, column 6: expected ',' or ']'"),
    ("bad.toml", "[train]\nlr = 0.1\nseed 3\n", "line 3, column 6: Expected '=' after a key"),
])
def test_config_parse_errors_give_line_and_column(tmp_path, name, text, where):
    (tmp_path / name).write_text(text)
    with pytest.raises(SpecError, match=f"could not be parsed: {where}"):
        load_config_file(str(tmp_path / name))


def test_a_missing_package_is_one_line(monkeypatch, capsys):
    from trainperf.cli import workloads
    from trainperf.cli.main import main

    def needs_torch(args):
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    monkeypatch.setattr(workloads, "run", needs_torch)
    assert main(["workloads"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "`trainperf workloads` needs the 'torch' package" in err
