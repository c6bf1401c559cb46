"""Live metrics of a running job for Prometheus (``train.metrics_port``): rank 0 serves the latest
step, step time, tokens/s per GPU, MFU and peak memory over HTTP, on 127.0.0.1 unless
``train.metrics_host`` says otherwise. Each run has its own registry, so runs in one process never clash."""

from __future__ import annotations


class MetricsServer:
    """Gauges in Prometheus base units (seconds, bytes, ratios), labelled with run id, workload and rank."""

    def __init__(self, port: int, host: str, run_id: str, workload: str, rank: int = 0):
        self._server = None
        if not port:
            return
        from prometheus_client import CollectorRegistry, Gauge, start_http_server

        self.registry = CollectorRegistry()
        self._labels = {"run_id": run_id, "workload": workload, "rank": str(rank)}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"trainperf_{name}", doc, list(self._labels), registry=self.registry)

        self.step = gauge("step", "last completed optimizer step")
        self.samples = gauge("samples", "training samples consumed up to the last completed step")
        self.step_time = gauge("step_time_seconds", "wall time of the last step")
        self.tokens = gauge("tokens_per_second_per_gpu", "tokens per second per GPU in the last step")
        self.mfu = gauge("mfu_ratio", "model FLOPs utilisation of the last step (0..1; absent on CPU)")
        self.memory = gauge("peak_memory_bytes", "peak memory allocated so far on this rank")
        self.eval_loss = gauge("eval_loss", "loss of the last eval (absent before the first)")
        self.eval_target = gauge("eval_target_loss", "the eval loss the run must reach")
        self.eval_samples = gauge("eval_samples", "training samples at the last eval")
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)

    def _set(self, gauge, value: float) -> None:
        # the labelled sample is made at its first value: a gauge with no value yet exports no sample (a
        # 0.0 eval loss before any eval would read as a reached target, a 0.0 MFU on CPU as a measurement)
        gauge.labels(**self._labels).set(value)

    @property
    def enabled(self) -> bool:
        return self._server is not None

    @property
    def port(self) -> int | None:
        return self._server.server_port if self._server else None

    def update(self, step: int, step_time_s: float, tokens_per_s_per_gpu: float, mfu: float | None,
               peak_mem_gib: float, samples: int | None = None) -> None:
        if self._server is None:
            return
        self._set(self.step, step)
        if samples is not None:
            self._set(self.samples, samples)
        self._set(self.step_time, step_time_s)
        self._set(self.tokens, tokens_per_s_per_gpu)
        if mfu is not None:
            self._set(self.mfu, mfu)
        self._set(self.memory, peak_mem_gib * 2**30)

    def update_eval(self, samples: int, loss: float, target: float) -> None:
        if self._server is None:
            return
        self._set(self.eval_samples, samples)
        self._set(self.eval_loss, loss)
        self._set(self.eval_target, target)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
