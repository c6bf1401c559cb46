"""A hung collective ends the run as 'hung' (with the last completed step and a flight-recorder
location), never damages the store; live Prometheus metrics are served while a run trains."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from trainperf.train.live_metrics import MetricsServer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_metrics_server_exposes_the_latest_step():
    port = _free_port()
    server = MetricsServer(port, "127.0.0.1", "r1", "mini")
    try:
        server.update(7, 0.5, 1234.0, 0.42, 3.5, samples=56)
        server.update_eval(48, 2.25, 2.0)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        server.close()
    labels = '{rank="0",run_id="r1",workload="mini"}'
    assert f"trainperf_step{labels} 7.0" in text and f"trainperf_samples{labels} 56.0" in text
    assert f"trainperf_tokens_per_second_per_gpu{labels} 1234.0" in text
    assert f"trainperf_mfu_ratio{labels} 0.42" in text
    memory = next(line for line in text.splitlines() if line.startswith(f"trainperf_peak_memory_bytes{labels}"))
    assert float(memory.split()[-1]) == 3.5 * 2**30  # base units: bytes, not GiB
    assert f"trainperf_eval_loss{labels} 2.25" in text and f"trainperf_eval_target_loss{labels} 2.0" in text
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)  # closed with the run


def test_a_metric_without_a_value_exports_no_sample():
    """Before the first eval there is no eval loss (0.0 would read as a reached target), and on CPU no MFU."""
    port = _free_port()
    server = MetricsServer(port, "127.0.0.1", "r1", "mini")
    try:
        server.update(3, 0.5, 1234.0, None, 0.25, samples=24)  # a CPU step: no peak FLOP/s, no MFU
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        server.close()
    samples = {line.split("{")[0] for line in text.splitlines() if line and not line.startswith("#")}
    assert "trainperf_step" in samples and "trainperf_peak_memory_bytes" in samples
    assert not samples & {"trainperf_mfu_ratio", "trainperf_eval_loss", "trainperf_eval_target_loss",
                          "trainperf_eval_samples"}, sorted(samples)


def test_a_metrics_address_that_cannot_be_served_is_refused_before_launch():
    """Checked in prepare: the server binds it only after the model is built."""
    import socket

    import pytest

    from trainperf.runner.local import check_metrics_endpoint
    from trainperf.core.errors import SpecError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SpecError, match=f"train.metrics_port={port} on 127.0.0.1: cannot listen there"):
            check_metrics_endpoint("127.0.0.1", port)
    check_metrics_endpoint("127.0.0.1", port)  # free again
    with pytest.raises(SpecError, match="train.metrics_host='999.1.1.1' does not resolve"):
        check_metrics_endpoint("999.1.1.1", port)
