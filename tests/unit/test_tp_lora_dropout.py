"""LoRA dropout under tensor parallel, the single-process half: how ranks' seeds follow the mesh
(tests/integration/test_tp_lora_dropout.py runs the 2-rank TP + SP case and says why the mask is
drawn as it is)."""

from __future__ import annotations


def test_tp_group_seed_is_shared_within_each_tp_group_and_distinct_across_groups():
    """The mesh's rank layout (init_device_mesh numbers ranks row-major over MESH_DIMS): the ranks of
    one TP group must share the dropout seed, every other pair of ranks must not."""
    import torch

    from trainperf.core.layout import MESH_DIMS, Layout

    sizes = {"pp": 2, "dp_replicate": 1, "dp_shard": 2, "cp": 2, "tp": 2}
    ranks = torch.arange(16).reshape([sizes[d] for d in MESH_DIMS])
    tp_axis = MESH_DIMS.index("tp")
    groups = ranks.movedim(tp_axis, -1).reshape(-1, sizes["tp"]).tolist()  # the TP groups, whatever the order
    seeds = [{Layout.from_sizes(sizes, 16).tp_group_seed(1234, r) for r in g} for g in groups]
    assert all(len(s) == 1 for s in seeds)
    assert len(set().union(*seeds)) == len(groups)
    assert [Layout(dp_shard=4).tp_group_seed(1234, r) for r in range(4)] == [1234, 1235, 1236, 1237]  # tp = 1: seed + rank
