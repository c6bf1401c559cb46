"""A misspelt key, section or workload names the closest valid one."""

import pytest

from trainperf.core.errors import SpecError
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
