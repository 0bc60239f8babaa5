"""FOXHUNT_PROMETHEUS_TIMEOUT bounds a whole request, against stand-in servers that drip,
hang or answer 502/504 first. Before, instant queries had no timeout at all and range queries one per
socket read, so a server dripping 16 bytes a second never failed."""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest

from foxhunt_obs.lib.sources.prometheus import PrometheusClient, PrometheusError

pytestmark = pytest.mark.servers

VECTOR = json.dumps(
    {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": {"g": "0"}, "value": [1, "7"]}]},
    }
).encode()
MATRIX = json.dumps(
    {
        "status": "success",
        "data": {"resultType": "matrix", "result": [{"metric": {"g": "0"}, "values": [[1, "7"]]}]},
    },
    separators=(",", ":"),
).encode()

ERROR_PAGE = b"<html><head><title>503 Service Temporarily Unavailable</title></head><body>" + b" " * 4000


class StandIn(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, mode: str):
        self.mode, self.calls = mode, 0
        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        server: StandIn = self.server
        server.calls += 1
        body = MATRIX if self.path.endswith("query_range") else VECTOR
        if server.mode == "gateway" and server.calls <= 2:
            self.send_response(502 if server.calls == 1 else 504)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if server.mode == "error-drip":  # a proxy's 503 page, 5 bytes a second (for 20 s at most)
            self.send_response(503)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(ERROR_PAGE)))
            self.end_headers()
            try:
                for i in range(100):  # each byte well inside the last try's socket timeout
                    self.wfile.write(ERROR_PAGE[i : i + 1])
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                pass
            return
        if server.mode == "hang":
            time.sleep(30)
            return
        if server.mode == "headers":  # the status line, then a header one byte every 0.5 s, forever
            try:
                self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Drip: ")
                for _ in range(120):
                    self.wfile.write(b"a")
                    self.wfile.flush()
                    time.sleep(0.5)
            except OSError:
                pass
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if server.mode == "drip":  # 16 bytes a second: each read well inside any socket timeout
            for i in range(0, len(body), 16):
                try:
                    self.wfile.write(body[i : i + 16])
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(1)
        else:
            self.wfile.write(body)

    do_GET = do_POST  # prometheus-api-client's GET, for comparison with the old client

    def log_message(self, *args):  # quiet
        pass


def _fails_timed(client: PrometheusClient, kind: str) -> tuple[pytest.ExceptionInfo, float]:
    """The PrometheusError an instant or a range query ends in, and the seconds it took."""
    t = time.monotonic()
    with pytest.raises(PrometheusError) as e:
        if kind == "query":
            client.query("up", 1.0, "gpu_samples partition 2026-11-16T00")
        else:
            client.query_range("up", 0, 60, 15, "gpu_samples partition 2026-11-16T00")
    return e, time.monotonic() - t


@pytest.mark.parametrize("mode", ["drip", "hang", "headers"])
@pytest.mark.parametrize("kind", ["query", "query_range"])
def test_a_stalling_server_fails_within_the_total_deadline(mode, kind):
    server = StandIn(mode)
    client = PrometheusClient(server.url, timeout_s=2, retries=3)  # the deadline spans the retries too
    e, took = _fails_timed(client, kind)
    # the deadline plus at most one socket read's wait (2 s here)
    assert took < 5, took
    assert server.url in str(e.value) and "2026-11-16T00" in str(e.value)
    # a read that times out at the deadline may say either
    late = "no complete answer within 2 s" in str(e.value)
    assert late if mode != "hang" else (late or "timed out" in str(e.value).lower()), str(e.value)
    server.shutdown()


@pytest.mark.parametrize("kind", ["query", "query_range"])
def test_an_error_answer_dripping_its_page_fails_within_the_total_deadline(kind):
    """The retries end on a 503 whose HTML page drips: the status and the page's first bytes are the
    error, by the deadline (before, the whole page was read, each byte within a socket read's timeout)."""
    server = StandIn("error-drip")
    client = PrometheusClient(server.url, timeout_s=2, retries=3)
    e, took = _fails_timed(client, kind)
    assert took < 3, took  # the deadline, plus a byte's wait
    text = str(e.value)
    assert server.url in text and "2026-11-16T00" in text and "HTTP 503 <" in text, text  # the page begun
    assert "no complete answer within 2 s (FOXHUNT_PROMETHEUS_TIMEOUT" in text, text
    assert server.calls == 3  # retried while time was left
    server.shutdown()


def test_502_and_504_are_retried_like_503():
    server = StandIn("gateway")
    client = PrometheusClient(server.url, timeout_s=5, retries=3)
    assert client.query("up", 1.0) == [({"g": "0"}, 7.0)]
    assert server.calls == 3
    server.calls = 0
    r = client.query_range("up", 0, 15, 15)
    assert r.values.tolist() == [7.0] and server.calls == 3
    server.shutdown()


def test_a_fast_server_is_unaffected():
    server = StandIn("fast")
    client = PrometheusClient(server.url, timeout_s=2)
    assert client.query("up", 1.0) == [({"g": "0"}, 7.0)]
    client.check()
    server.shutdown()


def test_the_environments_proxy_and_no_proxy_are_honoured(monkeypatch):
    """The client reads the proxy settings once, when built (requests would read them on every request):
    HTTP_PROXY carries a request to a host only the proxy knows; NO_PROXY sends one past a dead proxy."""
    server = StandIn("fast")
    seen = []
    handle = Handler.do_POST

    def recording(self):
        seen.append(self.path)
        handle(self)

    monkeypatch.setattr(Handler, "do_POST", recording)
    for var in ("HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    try:
        monkeypatch.setenv("HTTP_PROXY", server.url)
        client = PrometheusClient("http://prometheus.invalid:9090", timeout_s=5)
        assert client.query("up", 1.0) == [({"g": "0"}, 7.0)]
        assert seen == ["http://prometheus.invalid:9090/api/v1/query"]  # the absolute form a proxy is sent

        monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        assert PrometheusClient(server.url, timeout_s=5).query("up", 1.0) == [({"g": "0"}, 7.0)]
        assert seen[-1] == "/api/v1/query"
    finally:
        server.shutdown()
