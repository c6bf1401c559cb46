"""Sweeps: grid expansion, idempotent resumable local queue, failures recorded and skipped past."""

from __future__ import annotations

import pytest
from trainperf.runner.sweep import expand
from trainperf.core.errors import SpecError


def test_expand_spans_the_grid_with_stable_ids():
    data = {"name": "s", "runs": [{"workload": "mini-lora", "nproc_per_node": [1, 2], "seeds": [1, 2, 3],
                                   "set": {"train.global_batch_size": [16, 32], "train.lr": 0.01}}]}
    name, items = expand(data, "f")
    assert name == "s" and len(items) == 2 * 3 * 2
    assert len({i["item_id"] for i in items}) == len(items)
    assert {i["overrides"]["train.seed"] for i in items} == {1, 2, 3}
    assert all(i["overrides"]["train.lr"] == 0.01 for i in items)
    assert [i["item_id"] for i in expand(data, "f")[1]] == [i["item_id"] for i in items]  # stable across reads


@pytest.mark.parametrize("data, words", [
    ({"runs": [{"workload": "x"}]}, "needs a name"),
    ({"name": "s", "runs": []}, "non-empty list"),
    ({"name": "s", "runs": [{"nproc_per_node": 2}]}, "needs a workload"),
    ({"name": "s", "runs": [{"workload": "x", "gpus": 2}]}, "unknown keys"),
    ({"name": "s", "runs": [{"workload": "x", "set": ["a"]}]}, "must map"),
    ({"name": "s", "runs": [{"workload": "x", "nproc_per_node": "abc"}]}, "nproc_per_node must be a whole number"),
    ({"name": "s", "runs": [{"workload": "x", "nproc_per_node": [None]}]}, "nproc_per_node must be a whole number"),
    ({"name": "s", "runs": [{"workload": "x", "nproc_per_node": 0}]}, "nproc_per_node must be a whole number >= 1"),
    ({"name": "s", "runs": [{"workload": "x", "nproc_per_node": 1.7}]}, "nproc_per_node must be a whole number"),
    ({"name": "s", "runs": [{"workload": "x", "nproc_per_node": []}]}, "nproc_per_node must be a whole number"),
    ({"name": "s", "runs": [{"workload": "x", "seeds": ["one"]}]}, "seeds must be a whole number"),
])
def test_malformed_sweeps_are_refused(data, words):
    with pytest.raises(SpecError, match=words):
        expand(data, "f")


def test_a_typo_in_any_item_refuses_the_sweep_before_the_first_run(tmp_path):
    from trainperf.runner.sweep import load_sweep

    (tmp_path / "s.yaml").write_text("""name: t
runs:
  - workload: mini-pretrain
    set:
      train.micro_batch_size: [8, abc]
  - workload: no-such-workload
""")
    with pytest.raises(SpecError, match=r"mini-pretrain x1 train.micro_batch_size=abc: train.micro_batch_size"):
        load_sweep(str(tmp_path / "s.yaml"))
    (tmp_path / "s.yaml").write_text("name: t\nruns:\n  - workload: no-such-workload\n")
    with pytest.raises(SpecError, match="unknown workload 'no-such-workload'"):
        load_sweep(str(tmp_path / "s.yaml"))


def test_the_command_lines_set_joins_each_items_check(tmp_path):
    """An item valid only with the command line's --set passes; a typo there is refused up front."""
    from trainperf.runner.sweep import load_sweep

    (tmp_path / "s.yaml").write_text("name: t\nruns:\n  - workload: mini-pretrain\n    set:\n"
                                     "      model.num_kv_heads: [4, 8]\n")
    with pytest.raises(SpecError, match="model.num_heads=4 is not divisible by model.num_kv_heads=8"):
        load_sweep(str(tmp_path / "s.yaml"))
    assert len(load_sweep(str(tmp_path / "s.yaml"), ["model.num_heads=8"])[1]) == 2
    with pytest.raises(SpecError, match="train.lr: expected a number, got 'fast'"):
        load_sweep(str(tmp_path / "s.yaml"), ["model.num_heads=8", "train.lr=fast"])
