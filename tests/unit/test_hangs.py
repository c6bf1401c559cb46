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
        server.update(7, 0.5, 1234.0, 0.42, 3.5)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        server.close()
    assert 'trainperf_step{run_id="r1",workload="mini"} 7.0' in text
    assert 'trainperf_tokens_per_second_per_gpu{run_id="r1",workload="mini"} 1234.0' in text
    assert 'trainperf_mfu{run_id="r1",workload="mini"} 0.42' in text
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)  # closed with the run


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
