"""Activation offload (train.offload_layers, parallel/offload.py) on CPU: which layers, what moves and
what stays, views restored exactly, training unchanged (eager and compiled), the planner's trade.
The GPU side (pinned memory, side streams) is in tests/gpu/test_gpu.py; the layouts (FSDP2, PP) in
tests/integration/test_layouts.py."""

from __future__ import annotations

import weakref

import pytest
import torch
from torch import nn

from trainperf.parallel.offload import ActivationOffloader
from trainperf.core.layout import layer_memory_modes


def test_offloaded_layers_are_spread_among_the_recomputed_ones():
    assert layer_memory_modes(4, "none", offload=2) == ["offload", "offload", "none", "none"]
    assert layer_memory_modes(8, "full", 4, "selective", offload=4) == \
        ["offload", "full", "offload", "full", "offload", "full", "offload", "full"]
    assert layer_memory_modes(8, "full", 2, "selective", offload=2) == \
        ["offload", "full", "offload", "full", "selective", "selective", "selective", "selective"]
    # recompute_layers=-1: every layer not offloaded is recomputed
    assert layer_memory_modes(6, "selective", -1, offload=2) == \
        ["offload", "selective", "selective", "offload", "selective", "selective"]
    assert layer_memory_modes(3, "full", -1) == ["full"] * 3  # nothing offloaded: as before
    assert layer_memory_modes(3, "full", 1, "selective") == ["full", "selective", "selective"]


class _SavesViews(torch.autograd.Function):
    """Saves two views of one storage (a slice and a transposed slice at an offset), as attention saves
    q/k/v views of one projection output, and a parameter-like tensor the offloader must leave alone;
    the backward checks what comes back against copies kept outside the hooks."""

    @staticmethod
    def forward(ctx, x, weight):
        y = x * 2
        ctx.save_for_backward(y[:, :3], y[:, 3:].t(), weight)
        ctx.expected = (y[:, :3].clone(), y[:, 3:].t().clone())  # not packed: plain attributes
        return (y[:, :3].sum(1, keepdim=True) + y[:, 3:].sum(1, keepdim=True)) * weight.sum()

    @staticmethod
    def backward(ctx, grad):
        a, b, weight = ctx.saved_tensors
        assert a.shape == (4, 3) and b.shape == (5, 4) and b.stride() == (1, 8)  # views restored as views
        assert a.storage_offset() == 0 and b.storage_offset() == 3
        assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()  # of one restored storage
        assert torch.equal(a, ctx.expected[0]) and torch.equal(b, ctx.expected[1])
        return grad.expand(4, 8) * 2 * weight.sum(), None


def test_pack_moves_each_storage_once_and_restores_views_keeping_parameters_in_place():
    layer = nn.Linear(2, 2)
    x = torch.randn(4, 8, requires_grad=True)
    off = ActivationOffloader(torch.device("cpu"))
    with off.layer_context(0, layer, (x,)):
        out = _SavesViews.apply(x, layer.weight)
    assert off.stats.tensors == 2 and off.stats.kept == 1  # the weight's storage stays
    assert off.stats.bytes == 4 * 8 * 4  # y's whole storage (fp32), once for both views
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((4, 8), 2.0) * layer.weight.sum().detach())


def test_backward_finds_every_offloaded_layer_but_the_top_one_already_fetched():
    """The first unpack of a layer's backward issues the copies back of the PREFETCH_DEPTH offloaded
    layers below it; walking on from every layer, only the top one of a pass is fetched on demand
    (a review found the walk stopping at layers already fetched: every third was fetched late)."""
    torch.manual_seed(0)
    layers = [nn.Linear(16, 16) for _ in range(7)]
    off = ActivationOffloader(torch.device("cpu"))
    x = torch.randn(4, 16)

    def grads(offloader):
        for layer in layers:
            layer.zero_grad()
        h = x
        for i, layer in enumerate(layers):
            if offloader is None:
                h = torch.tanh(layer(h))
            else:
                with offloader.layer_context(i, layer, (h,)):
                    h = torch.tanh(layer(h))
        h.sum().backward()
        return [layer.weight.grad.clone() for layer in layers]

    ref = grads(None)
    for micro_batch in range(2):
        got = grads(off)
        assert off.stats.fetched_on_demand == micro_batch + 1
        assert all(torch.equal(a, b) for a, b in zip(got, ref))
    assert off.stats.tensors > 0


def test_the_top_offloaded_layer_is_fetched_when_the_backward_reaches_a_layer_above_it():
    """With a layer PREFETCH_DEPTH above the highest offloaded one hooked (parallelize.wrap_layers
    does it), no layer's copy back waits for its own backward: none is fetched on demand, in every
    micro-batch, and the gradients do not change."""
    torch.manual_seed(0)
    layers = [nn.Linear(16, 16) for _ in range(6)]
    top = 3
    off = ActivationOffloader(torch.device("cpu"))
    layers[top + 2].register_forward_hook(off.fetch_top_ahead(top))
    x = torch.randn(4, 16)
    fetched_before_backward, freed_by_the_bottom = [], []

    def grads(offloader):
        for layer in layers:
            layer.zero_grad()
        h = h0 = x.clone().requires_grad_(True)
        for i, layer in enumerate(layers):
            if offloader is not None and i <= top:
                with offloader.layer_context(i, layer, (h,)):
                    h = torch.tanh(layer(h))
            else:
                h = torch.tanh(layer(h))
        if offloader is not None:
            top_call = weakref.ref(offloader._last())
            fetched_before_backward.append(top_call().fetched)
            # by the time the backward reaches the bottom, the offloaded layers' calls (and their device
            # copies) are gone, though the caller still holds the output the fetch hook hangs on
            h0.register_hook(lambda grad: freed_by_the_bottom.append(top_call() is None))
        h.sum().backward()
        return [layer.weight.grad.clone() for layer in layers]

    ref = grads(None)
    for _ in range(2):
        assert all(torch.equal(a, b) for a, b in zip(grads(off), ref))
    assert off.stats.fetched_on_demand == 0 and off.stats.tensors > 0
    assert fetched_before_backward == [False, False]  # fetched by the backward's hook, not in the forward
    assert freed_by_the_bottom == [True, True]


def test_a_new_forward_pass_starts_a_new_chain():
    """Each layer call links to the offloaded call that ran just before it in the same forward pass (its
    backward comes next); a lower or equal index starts a new pass (the next micro-batch)."""
    layer = nn.Linear(2, 2)
    off = ActivationOffloader(torch.device("cpu"))
    calls = []
    for index in (0, 2, 0):
        with off.layer_context(index, layer, (torch.zeros(1),)):
            calls.append(off._last())
    assert calls[0].below is None and calls[1].below is calls[0] and calls[2].below is None


def _plan_spec(*overrides: str):
    from trainperf.core.resolve import resolve_spec
    from trainperf.workloads import get_workload

    spec = resolve_spec(get_workload("llama2_70b_lora").defaults(), None,
                        ["train.compile=true", "parallel.dp_shard=2", "hardware.host_mem_gib=256", *overrides])
    spec.hardware.device = "cuda"
    return spec


def test_planner_offloaded_layer_costs_host_memory_not_recompute_time():
    from trainperf.plan.costs import GIB, PINNED_ROUNDING, activation_bytes_per_token_layer, estimate
    from trainperf.plan.hardware import PRESETS

    gpu = PRESETS["h200"]
    recomputed = estimate(_plan_spec("train.recompute=full", "train.recompute_layers=30"), gpu, 2)
    traded_spec = _plan_spec("train.recompute=full", "train.recompute_layers=20", "train.offload_layers=10")
    traded = estimate(traded_spec, gpu, 2)
    layer_set = activation_bytes_per_token_layer(_plan_spec(), "none") * 8192
    assert traded.host_offload_bytes == pytest.approx(10 * layer_set * PINNED_ROUNDING)
    assert recomputed.host_offload_bytes == 0
    assert traded.time["recompute"] < recomputed.time["recompute"]
    assert traded.memory["activations"] < recomputed.memory["activations"]  # a full layer keeps its input
    # spread among recomputed layers, the copies hide -- the top one's too: its copy is issued from the
    # two (recomputed) layers above it; 30 offloaded back to back they do not (PCIe)
    assert traded.time["offload_exposed"] == 0
    packed = estimate(_plan_spec("train.recompute=full", "train.recompute_layers=0", "train.offload_layers=30"), gpu, 2)
    assert packed.time["offload_exposed"] > 1.0
    assert 30 * layer_set / GIB > 45  # 70B: ~1.8 GiB per layer per sequence
    # two GPUs of a node share their PCIe switch's uplink (HGX): one GPU alone copies twice as fast
    alone = estimate(_plan_spec("train.recompute=full", "train.recompute_layers=0", "train.offload_layers=30",
                                "parallel.dp_shard=1"), gpu, 1)
    assert alone.time["offload_exposed"] < 0.6 * packed.time["offload_exposed"]


def test_offload_timeline_hides_copies_under_the_layers_above_and_queues_them_on_a_slow_link():
    """costs.offload_stall on hand-timed layers (forward 1 s each, backward 2 s): the top offloaded
    layer's copy back is issued two layers above it, but cannot start before its own copy out ends."""
    from trainperf.plan.costs import offload_stall

    bwd = {"offload": 2.0, "none": 2.0, "full": 3.0}
    # copy out of layer 0: 1 -> 4, still running when the backward begins at 3 (one set queued);
    # back: 4 -> 7 while layers 2 and 1 run their backward (3 -> 7): hidden
    assert offload_stall(["offload", "none", "none"], 3.0, 1.0, bwd) == (0.0, 1)
    assert offload_stall(["offload", "none", "none"], 2.0, 1.0, bwd) == (0.0, 0)  # out 1 -> 3
    # a slower link: the copy out ends at 5, the copy back at 9, layer 0's backward waits 2 s; one copy
    # out was still queued when the backward began (t = 3)
    assert offload_stall(["offload", "none", "none"], 4.0, 1.0, bwd) == (2.0, 1)
    # nothing above the top offloaded layer: its copy back is fetched on demand, after its copy out
    # (ends at 6): the backward waits 3 s for the copy out and 3 s for the copy back
    assert offload_stall(["none", "none", "offload"], 3.0, 1.0, bwd) == (6.0, 1)
    # two offloaded layers with a recomputed layer between: the lower one's copy back runs under the
    # backward of the upper one and of the recomputed layer (2 + 3 s >= 2.5 s): hidden; back to back
    # (nothing between), the upper one waits 0.5 s for its copy out (3.5 -> 6, back 6 -> 8.5, needed
    # at 8) and the lower one 0.5 s beyond the upper one's backward (back 8.5 -> 11, needed at 10.5)
    assert offload_stall(["offload", "full", "offload", "none", "none"], 2.5, 1.0, bwd)[0] == 0.0
    assert offload_stall(["offload", "offload", "none", "none"], 2.5, 1.0, bwd)[0] == pytest.approx(1.0)
    assert offload_stall([], 3.0, 1.0, bwd) == (0.0, 0)
    # exactly zero when hidden, whatever the order of the sums (was t - ideal: 1e-15 in a third of cases)
    assert offload_stall(["offload", "full", "offload", "none", "none"], 0.1, 0.3, {"offload": 0.7, "full": 1.1, "none": 0.7}) == (0.0, 0) and offload_stall(["none"], 3.0, 1.0, bwd) == (0.0, 0)


def test_interleaved_ranks_pay_the_offload_stall_of_each_of_their_stages():
    from trainperf.plan.costs import estimate
    from trainperf.plan.hardware import PRESETS

    slow = dict(PRESETS["h200"].__dict__, pcie_gbps=5.0)  # link-bound: every copy waits
    gpu = type(PRESETS["h200"])(**slow)
    common = ["parallel.pp=2", "parallel.dp_shard=1", "train.global_batch_size=8", "train.recompute=full"]
    one = estimate(_plan_spec(*common, "parallel.pp_schedule=1F1B", "train.offload_layers=8"), gpu, 2)
    two = estimate(_plan_spec(*common, "parallel.pp_schedule=Interleaved1F1B", "train.offload_layers=4"), gpu, 2)
    # 8 offloaded layers per rank either way (one stage of 40 layers, or two of 20 with 4 each)
    assert two.time["offload_exposed"] == pytest.approx(one.time["offload_exposed"], rel=0.25)


def test_plan_trades_recompute_for_offload_only_where_host_memory_allows():
    from trainperf.plan.hardware import PRESETS
    from trainperf.plan.search import plan

    gpu = PRESETS["h200"]
    roomy, _ = plan(_plan_spec("hardware.fp8=tensorwise", "hardware.frozen_dtype=fp8"), gpu, 2, 2, objective="throughput")
    tight, _ = plan(_plan_spec("hardware.fp8=tensorwise", "hardware.frozen_dtype=fp8", "hardware.host_mem_gib=8"), gpu, 2,
                    2, objective="throughput")
    best = roomy[0]
    assert best.overrides.get("train.offload_layers", 0) > 0 and best.est.host_offload_bytes > 0
    assert best.est.host_offload_bytes <= 0.5 * 256 * 2**30 / 2
    assert all(c.overrides.get("train.offload_layers", 0) == 0 for c in tight)  # 2 GiB per GPU: not one layer
    assert best.est.step_time_s < tight[0].est.step_time_s


def test_host_memory_over_budget_is_refused_before_launch():
    from trainperf.plan.costs import check_memory
    from trainperf.plan.hardware import PRESETS
    from trainperf.core.errors import SpecError

    spec = _plan_spec("hardware.fp8=tensorwise", "hardware.frozen_dtype=fp8", "train.recompute=full",
                      "train.recompute_layers=0", "train.offload_layers=60", "hardware.host_mem_gib=128")
    with pytest.raises(SpecError) as err:
        check_memory(spec, PRESETS["h200"], 2)
    msg = str(err.value)
    assert "train.offload_layers=60" in msg and "train.offload_layers <= 14" in msg and "\n" not in msg
