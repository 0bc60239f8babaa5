"""Test helpers: a manual clock, scraping and parsing the exposition (fixtures are in conftest.py)."""

from __future__ import annotations

import http.client
import ssl
import time
from collections.abc import Callable

from foxhunt_gpu_exporter.app import Exporter
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


class ManualClock:
    """Seconds that move only when a test says so (shared by a FakeBackend's time line and a Poller)."""

    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def render(exporter: Exporter, accept: str = "") -> str:
    return exporter.exposition.render(accept)[0].decode()


def families(text: str, openmetrics: bool = False) -> dict:
    parse = parse_openmetrics if openmetrics else text_string_to_metric_families
    return {f.name: f for f in parse(text)}


def samples(text: str, name: str) -> list:
    """Every sample called `name` (sample names: counters end in _total)."""
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def by_gpu(text: str, name: str, **match: str) -> dict[str, float]:
    return {
        s.labels["gpu"]: s.value
        for s in samples(text, name)
        if all(s.labels.get(k) == v for k, v in match.items())
    }


def wait_for(predicate: Callable[[], object], timeout: float = 5.0, what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def get(url_base: str, path: str, headers: dict | None = None, context: ssl.SSLContext | None = None):
    """(status, headers, body) of one GET."""
    host_port = url_base.split("://", 1)[1]
    if url_base.startswith("https"):
        conn = http.client.HTTPSConnection(host_port, timeout=5, context=context)
    else:
        conn = http.client.HTTPConnection(host_port, timeout=5)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()
