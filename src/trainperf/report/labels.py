"""What the terminal table and the page say of one stored run: its status (a throughput probe is not a
failure), division, MFU against which peak, and names made safe to show.

MFU is the model's FLOPs against the GPU's dense bf16 peak for every run, so runs compare on one
scale; a run whose GEMMs ran in float8 (``hardware.fp8``, or a submission's FP8 config) can exceed
what bf16 allows, so its MFU against the dense fp8 peak is shown beside it.
"""

from __future__ import annotations

from trainperf.core.hardware import DATASHEETS, datasheet_key
from trainperf.core.untrusted import printable
from trainperf.mlperf.score import precision_of, run_set_of

THROUGHPUT_PROBE = "throughput probe"  # how the trainer's status_reason starts for a run without an eval

__all__ = ["MFU_HEADER", "MFU_NOTE", "THROUGHPUT_PROBE", "division_label", "fp8_peak_mfu", "is_probe", "mfu_text", "name", "plot_text",
           "precision_of", "run_set_of", "status_label"]


def name(value, limit: int = 200) -> str:
    """A name from a row (a run id, GPU, system, layout) as text safe for a terminal or a page."""
    return "-" if value is None else printable(value, limit)


def plot_text(value, limit: int = 120) -> str:
    """A label matplotlib draws: printable, with ``$`` escaped so that no name is read as mathtext (an
    undefined ``$\\command$`` would stop the figure from rendering)."""
    return printable(value, limit).replace("$", r"\$")


def is_probe(run: dict) -> bool:
    """A throughput probe: steps measured, no eval asked for; stored ``failed`` (it has no time to train),
    yet nothing went wrong."""
    return run.get("status") == "failed" and str(run.get("status_reason") or "").startswith(THROUGHPUT_PROBE)


def status_label(run: dict) -> str:
    base = "probe (no eval)" if is_probe(run) else str(run.get("status"))
    return base + (" (trial)" if run.get("purpose") == "trial" else "")


def division_label(run: dict) -> str:
    """closed, open; an imported closed run is a published result; this engine's runs that do not meet
    the closed rules (a shrunk model, another dataset) say so."""
    division = str(run.get("division") or "-")
    if run.get("engine"):
        return f"{division} (published)" if division == "closed" else division
    return division + ("" if run.get("comparable") else " (not comparable)")


def fp8_peak_mfu(mfu: float | None, gpu: str | None, precision: str) -> float | None:
    """The MFU of an fp8 run against the GPU's dense fp8 peak (MFU is against the bf16 peak); None for a
    bf16 run or a GPU without an fp8 figure."""
    key = datasheet_key(gpu or "") if precision == "fp8" and mfu is not None else None
    sheet = DATASHEETS.get(key) if key else None
    if not sheet or not sheet.fp8_tflops:
        return None
    return mfu * sheet.bf16_tflops / sheet.fp8_tflops


def mfu_text(mfu: float | None, gpu: str | None = None, precision: str = "bf16") -> str:
    """'42.0%' (against the bf16 peak); an fp8 run: '85.3% (fp8 peak 42.6%)'."""
    if mfu is None:
        return "-"
    if precision != "fp8":
        return f"{100 * mfu:.1f}%"
    fp8 = fp8_peak_mfu(mfu, gpu, precision)
    return f"{100 * mfu:.1f}% (fp8 peak {'unknown' if fp8 is None else f'{100 * fp8:.1f}%'})"

MFU_HEADER = "MFU (bf16 peak)"
MFU_NOTE = ("MFU: the model's FLOPs against the GPU's dense bf16 peak, for every run (runs compare on one "
            "scale); an fp8 run (GEMMs in float8) also against the dense fp8 peak, in brackets.")
