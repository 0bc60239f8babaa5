"""HTTP(S) serving: /metrics (text or OpenMetrics, as the client asks), /healthz, optional basic auth and TLS.

A small ThreadingHTTPServer of our own rather than prometheus_client's start_http_server, so that basic
auth, TLS and a health endpoint fit in one place. Bodies come from exposition.Exposition, which renders
the private registry (whose only collector reads the latest snapshot): serving never touches the device.
"""

from __future__ import annotations

import base64
import gzip
import hmac
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)
Health = Callable[[], tuple[bool, str]]
Render = Callable[[str], tuple[bytes, str]]  # Accept header -> (body, content type)


def parse_address(address: str) -> tuple[str, int]:
    """`:9094`, `0.0.0.0:9094`, `127.0.0.1:0`, `[::1]:9094` -> (host, port); an empty host is every IPv4 address."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"listen address {address!r}: expected HOST:PORT, e.g. :9094 or 127.0.0.1:9094")
    return host.strip("[]"), int(port)


MAX_CONNECTIONS = 32  # scrapers are a handful; more at once is a client gone wrong, not load to serve


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    ssl_context: ssl.SSLContext | None = None
    max_connections = MAX_CONNECTIONS

    def server_activate(self) -> None:
        super().server_activate()
        self._slots = threading.BoundedSemaphore(self.max_connections)

    def process_request(self, request, client_address):  # type: ignore[override]
        # One thread per connection, at most max_connections: past that a connection is closed at once
        # instead of a new thread (a flood of idle connections must not exhaust memory or threads).
        if not self._slots.acquire(blocking=False):
            log.warning(
                "%d connections open: closing the one from %s", self.max_connections, client_address[0]
            )
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):  # type: ignore[override]
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def finish_request(self, request, client_address):  # type: ignore[override]
        # TLS handshake in the per-connection thread, so one slow client cannot stall accept().
        if self.ssl_context is None:
            return super().finish_request(request, client_address)
        try:
            request.settimeout(_Handler.timeout)
            tls = self.ssl_context.wrap_socket(request, server_side=True)  # detaches `request`
        except (ssl.SSLError, OSError) as e:
            log.debug("TLS handshake with %s failed: %s", client_address[0], e)
            return
        try:
            super().finish_request(tls, client_address)
        finally:
            tls.close()


class MetricsServer:
    def __init__(
        self,
        render: Render,
        health: Health,
        address: str = ":9094",
        *,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        basic_auth: tuple[str, str] | None = None,
    ):
        host, port = parse_address(address)
        expected = None
        if basic_auth is not None:
            expected = b"Basic " + base64.b64encode(f"{basic_auth[0]}:{basic_auth[1]}".encode())

        class Handler(_Handler):
            pass

        Handler.render, Handler.health, Handler.expected_auth = (
            staticmethod(render),
            staticmethod(health),
            expected,
        )
        server_cls = _Server
        if ":" in host:
            server_cls = type("_Server6", (_Server,), {"address_family": socket.AF_INET6})
        self.httpd = server_cls((host, port), Handler)
        if tls_cert or tls_key:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            ctx.load_cert_chain(tls_cert, tls_key)
            self.httpd.ssl_context = ctx
        self.scheme = "https" if self.httpd.ssl_context else "http"
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def url(self) -> str:
        host = self.httpd.server_address[0]
        host = f"[{host}]" if ":" in host else host
        return f"{self.scheme}://{host}:{self.port}"

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.25}, name="foxhunt-http", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: Prometheus reuses its connection
    timeout = 30  # seconds a connection may sit idle or half-sent
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall
    server_version = "foxhunt-gpu-exporter"
    render: Render
    health: Health
    expected_auth: bytes | None = None

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        path = self.path.split("?", 1)[0]
        if path == "/healthz":  # open without credentials: kubelet probes send none, and it tells nothing
            ok, reason = self.health()
            return self._send(
                200 if ok else 503, (reason or "ok").encode() + b"\n", "text/plain; charset=utf-8"
            )
        if not self._authorized():
            return self._send(
                401, b"unauthorized\n", "text/plain", [("WWW-Authenticate", 'Basic realm="metrics"')]
            )
        if path == "/metrics":
            return self._metrics()
        if path == "/":
            return self._send(200, b"foxhunt-gpu-exporter: see /metrics and /healthz\n", "text/plain")
        return self._send(404, b"not found\n", "text/plain")

    def _authorized(self) -> bool:
        if self.expected_auth is None:
            return True
        given = (self.headers.get("Authorization") or "").encode()
        return hmac.compare_digest(given, self.expected_auth)

    def _metrics(self) -> None:
        try:
            body, content_type = self.render(self.headers.get("Accept", ""))
        except Exception:
            log.exception("rendering /metrics failed")
            return self._send(500, b"rendering metrics failed; see the exporter log\n", "text/plain")
        headers = []
        if "gzip" in (self.headers.get("Accept-Encoding") or ""):
            body, headers = gzip.compress(body, compresslevel=1), [("Content-Encoding", "gzip")]
        self._send(200, body, content_type, headers)

    def _send(self, code: int, body: bytes, content_type: str, headers: list | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers or ():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002
        log.debug(
            "%s %s", self.address_string(), format % args
        )  # access log only at debug: no per-scrape noise
