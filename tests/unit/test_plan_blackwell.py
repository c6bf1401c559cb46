"""Blackwell GPUs: every published device name resolves to a preset through one parser; GB200 / GB300
NVL72 presets carry their 72-GPU NVLink domain. In-process, no GPU."""

from __future__ import annotations

import pytest

from trainperf.plan.hardware import PRESETS, load_gpu, preset_for_device


@pytest.mark.parametrize("name, preset", [
    ("NVIDIA Blackwell GPU (B200-SXM-180GB)", "b200"), ("NVIDIA B200", "b200"), ("NVIDIA B200-SXM-180GB", "b200"),
    ("NVIDIA GB200", "gb200"), ("NVIDIA GB200 NVL72", "gb200"), ("NVIDIA GB300", "gb300"),
    ("NVIDIA H100-SXM5-80GB", "h100"), ("NVIDIA H200-SXM5-141GB", "h200"), ("NVIDIA H200 NVL", "h200-nvl"),
])
def test_device_names_resolve_to_their_preset(name, preset):
    assert preset_for_device(name) is PRESETS[preset]


def test_unknown_devices_resolve_to_none():
    assert preset_for_device("AMD Instinct MI355X") is None and preset_for_device("") is None


def test_nvl72_presets_span_the_rack_and_differ_in_memory_and_nic():
    gb200, gb300 = load_gpu("gb200"), load_gpu("gb300")
    assert gb200.nvlink_domain == gb300.nvlink_domain == 72
    assert gb300.hbm_gib > gb200.hbm_gib > PRESETS["h200"].hbm_gib
    assert gb300.inter_busbw_gbps == 2 * gb200.inter_busbw_gbps
