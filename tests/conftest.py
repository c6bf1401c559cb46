"""Shared test setup: a repo-local cache for generated datasets and base checkpoints (built once per
machine, reused by later runs), the tiers' markers, and a one-process gloo group for tests that need
torch.distributed in this process.

Tiers (one directory each): ``unit`` starts no process; ``integration`` starts processes (the CLI in a
fresh interpreter, torchrun, multi-process gloo) and is marked ``integration`` here; ``gpu`` is marked
``gpu`` and skipped where no CUDA device is visible; ``slurm`` installs and starts a real Slurm cluster
(it changes the host) and is skipped unless selected with ``-m slurm`` or ``TRAINPERF_TEST_SLURM=1``;
``long`` (minutes of CPU per test, e.g. a full-size MLPerf eval set) likewise, with ``-m long`` or
``TRAINPERF_TEST_LONG=1`` (make test-long).
Helpers shared between tiers live in ``tests/fixtures``.

Order: modules run longest test first, as ``tests/durations.json`` last measured them (``pytest
--record-durations`` rewrites it), so that with two workers the long multi-process tests start early
and the many short unit tests fill the end; a module's tests stay together, so module fixtures are
built once per worker."""

import json
import os
import socket
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
os.environ.setdefault("TRAINPERF_CACHE", str(REPO / ".cache" / "trainperf"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

pytest_plugins = ["tests.fixtures.store"]  # its `db` fixture

TIER_MARKERS = {"integration": "integration", "gpu": "gpu", "slurm": "slurm"}
DURATIONS = TESTS / "durations.json"
UNMEASURED_S = {"integration": 5.0, "gpu": 1.0, "slurm": 1.0}  # a test not in durations.json; unit: 0.05


def pytest_addoption(parser):
    parser.addoption("--record-durations", action="store_true",
                     help="write each test's call time to tests/durations.json (the next runs start the longest first)")


def _tier(item) -> str | None:
    try:
        rel = Path(str(item.path)).resolve().relative_to(TESTS)
    except ValueError:
        return None
    return rel.parts[0] if len(rel.parts) > 1 else None


def _opt_in_selected(config, marker: str) -> bool:
    markexpr = config.getoption("markexpr", "") or ""
    return (os.environ.get(f"TRAINPERF_TEST_{marker.upper()}") == "1"
            or (marker in markexpr and f"not {marker}" not in markexpr))


OPT_IN = {  # marker: why it is skipped unless selected
    "slurm": "changes the host (installs and starts Slurm): run with -m slurm or TRAINPERF_TEST_SLURM=1 (make test-slurm)",
    "long": "minutes of CPU per test: run with -m long or TRAINPERF_TEST_LONG=1 (make test-long)",
}


@pytest.hookimpl(tryfirst=True)  # the tier markers must be on the items before -m selects by them
def pytest_collection_modifyitems(config, items):
    for item in items:
        marker = TIER_MARKERS.get(_tier(item) or "")
        if marker and item.get_closest_marker(marker) is None:
            item.add_marker(getattr(pytest.mark, marker))
    _longest_first(items)
    for marker, why in OPT_IN.items():
        if not _opt_in_selected(config, marker):
            for item in items:
                if item.get_closest_marker(marker) is not None:
                    item.add_marker(pytest.mark.skip(reason=why))
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


def _longest_first(items) -> None:
    known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}

    def seconds(item) -> float:
        return known.get(item.nodeid, UNMEASURED_S.get(_tier(item) or "", 0.05))

    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(str(item.path), []).append(item)
    groups = [sorted(group, key=seconds, reverse=True) for group in modules.values()]
    groups.sort(key=lambda group: seconds(group[0]), reverse=True)
    items[:] = [item for group in groups for item in group]


_MEASURED: dict[str, float] = {}
_RECORD: list[bool] = [False]


def pytest_configure(config):
    _RECORD[0] = bool(config.getoption("record_durations"))


def pytest_runtest_logreport(report):  # with xdist, the controller sees every worker's reports here
    if report.when == "call" and _RECORD[0]:
        _MEASURED[report.nodeid] = round(report.duration, 2)


def pytest_sessionfinish(session):
    if session.config.getoption("record_durations") and _MEASURED and not hasattr(session.config, "workerinput"):
        known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
        known.update(_MEASURED)
        DURATIONS.write_text(json.dumps(dict(sorted(known.items())), indent=0) + "\n")


@pytest.fixture
def gloo_group():
    """A world of one gloo process (DeviceMesh, FSDP2 and the engine need an initialised group)."""
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
