"""One reader of GPU names (core.hardware.parse_gpu_name): the datasheet row, the planner's preset, the
report's GPU model and the importer's generation all come from it, and agree."""

from __future__ import annotations

import pytest

from trainperf.core.hardware import datasheet_key, gpu_generation, gpu_model, parse_gpu_name
from trainperf.mlperf.published import named_gpu_family
from trainperf.plan.engines import default_fp8_grid
from trainperf.plan.hardware import PRESETS, preset_for_device
from trainperf.report.scaling import gpu_family

# name -> (model, datasheet key, preset name, generation)
NAMES = {
    "NVIDIA H200-SXM5-141GB": ("H200", "h200", "NVIDIA H200 SXM", "hopper"),
    "NVIDIA H100-SXM5-80GB": ("H100", "h100", "NVIDIA H100 SXM", "hopper"),
    "NVIDIA H100 80GB HBM3": ("H100", "h100", "NVIDIA H100 SXM", "hopper"),
    "NVIDIA H100 PCIe": ("H100", "h100 pcie", "NVIDIA H100 SXM", "hopper"),
    "NVIDIA H100 NVL": ("H100", "h100 nvl", "NVIDIA H100 SXM", "hopper"),
    "NVIDIA H200 NVL": ("H200", "h200", "NVIDIA H200 NVL", "hopper"),
    "NVIDIA A100-SXM4-80GB": ("A100", "a100", "NVIDIA A100 SXM 80GB", None),
    "NVIDIA Blackwell GPU (B200-SXM-180GB)": ("B200", "b200", "NVIDIA B200", "blackwell"),
    "NVIDIA GB200 NVL72": ("GB200", "gb200", "NVIDIA GB200 NVL72", "blackwell"),
    "NVIDIA GB300": ("GB300", None, "NVIDIA GB300 NVL72", "blackwell"),
    "NVIDIA GH200 480GB": ("GH200", "h200", None, "hopper"),  # an H200-class die's datasheet, no preset
    "AMD Instinct MI300X": ("MI300X", None, None, "cdna3"),
    "config_DGXH100_8x8x1xtp4pp1cp2.sh": ("H100", "h100", "NVIDIA H100 SXM", "hopper"),
    "config_XE9680L_B200.sh": ("B200", "b200", "NVIDIA B200", "blackwell"),
    "cpu": (None, None, None, None),
    "": (None, None, None, None),
}


@pytest.mark.parametrize("name", sorted(NAMES))
def test_every_reader_of_a_gpu_name_agrees(name):
    model, sheet, preset, generation = NAMES[name]
    found = preset_for_device(name)
    assert (gpu_model(name), datasheet_key(name), found.name if found else None, gpu_generation(name)) \
        == (model, sheet, preset, generation)
    assert named_gpu_family(name) == generation
    assert gpu_family(name) == (model or name)  # the report groups by the model, else the name itself


def test_variants_need_their_words_and_the_model_first():
    assert parse_gpu_name("NVIDIA H200 NVL").best_key(["h200", "h200-nvl", "h100-nvl"]) == "h200-nvl"
    assert parse_gpu_name("NVIDIA H200").best_key(["h200-nvl"]) is None
    assert not parse_gpu_name("NVIDIA GB200").matches("b200")  # GB200 is not a B200


def test_the_packaged_fp8_grid_is_for_gh100_parts_only():
    assert {k for k, g in PRESETS.items() if default_fp8_grid(g)} == {"h100", "h200", "h100-sxm", "h200-sxm",
                                                                        "h200-nvl"}
