"""The contract's metrics in one prometheus_client registry, and the /metrics endpoint that serves it.

A registry of our own, not prometheus_client's default REGISTRY: building the metrics twice (a second
TrainingMetrics, a re-imported module) then never raises "Duplicated timeseries", whatever else the
trainer's libraries put in the default registry, and the endpoint shows the contract and the GPU figures
only. A trainer that wants more on :9094 registers into `TrainingMetrics.registry`.
"""

from __future__ import annotations

import logging

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

from ..server import MetricsServer
from .contract import CONTRACT, LABELS, MetricSpec

log = logging.getLogger(__name__)
DEFAULT_PORT = 9094  # the training metrics endpoint (docs/contracts/trainers.md)


def _make(spec: MetricSpec, registry: CollectorRegistry):
    if spec.kind == "counter":  # prometheus_client takes the name without _total and adds it back
        return Counter(spec.name.removesuffix("_total"), spec.help, LABELS, registry=registry)
    if spec.kind == "histogram":
        return Histogram(spec.name, spec.help, LABELS, registry=registry, buckets=spec.buckets)
    return Gauge(spec.name, spec.help, LABELS, registry=registry)


class TrainingMetrics:
    """Every metric of the contract, registered once in `registry`; `child(key, model, fold)` is one series."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.families = {spec.key: _make(spec, self.registry) for spec in CONTRACT}
        self.server: MetricsServer | None = None

    def child(self, key: str, model: str, fold: str):
        return self.families[key].labels(model=model, fold=fold)

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """The exposition for an Accept header (text 0.0.4 or OpenMetrics, as Prometheus negotiates)."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type

    def serve(self, port: int = DEFAULT_PORT, host: str = "") -> MetricsServer:
        """/metrics (and /healthz) on host:port in a daemon thread; once per process: a second call on the
        same port returns the running server, one on another port is refused."""
        if self.server is not None:
            if port in (0, self.server.port):
                return self.server
            raise RuntimeError(
                f"training metrics are already served on port {self.server.port}; not serving them on {port} too"
            )
        server = MetricsServer(self.render, lambda: (True, "ok"), f"{host}:{port}")
        server.start()
        self.server = server
        log.info("training metrics on %s/metrics", server.url)
        return server

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
