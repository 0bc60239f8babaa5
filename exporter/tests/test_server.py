"""Serving: /metrics, /healthz 200/503, basic auth, TLS with a self-signed cert, OpenMetrics negotiation."""

from __future__ import annotations

import base64
import datetime
import gzip
import ipaddress
import ssl
import subprocess
from pathlib import Path

import pytest
from exporter_helpers import OPENMETRICS, get, wait_for
from foxhunt_gpu_exporter.server import parse_address


@pytest.fixture
def served(make_exporter):
    exporter, fake = make_exporter({"gpus": 2}, interval=0.05)
    exporter.start()
    server = exporter.serve("127.0.0.1:0")
    wait_for(lambda: exporter.poller.snapshot.nvml_up, what="first poll")
    return exporter, server


@pytest.mark.servers
def test_metrics_and_healthz(served):
    exporter, server = served
    status, headers, body = get(server.url, "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert b'foxhunt_gpu_up{gpu="0"' in body and b"# EOF" not in body
    assert get(server.url, "/healthz")[:3:2] == (200, b"ok\n")
    assert get(server.url, "/nope")[0] == 404
    assert get(server.url, "/")[0] == 200


@pytest.mark.servers
def test_openmetrics_negotiation(served):
    _, server = served
    # what Prometheus sends: OpenMetrics preferred, text as a fallback
    accept = f"{OPENMETRICS},text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    status, headers, body = get(server.url, "/metrics", {"Accept": accept})
    assert status == 200 and headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n") and b"# UNIT foxhunt_gpu_power_draw_watts watts" in body
    status, headers, body = get(server.url, "/metrics", {"Accept": "text/plain"})
    assert b"# EOF" not in body


@pytest.mark.servers
def test_gzip_when_asked(served):
    _, server = served
    status, headers, body = get(server.url, "/metrics", {"Accept-Encoding": "gzip"})
    assert headers.get("Content-Encoding") == "gzip" and b"foxhunt_gpu_up" in gzip.decompress(body)


@pytest.mark.servers
def test_healthz_503_when_the_poller_is_not_running(make_exporter):
    exporter, _ = make_exporter({"gpus": 1})
    server = exporter.serve("127.0.0.1:0")  # never started: no poller thread
    status, _, body = get(server.url, "/healthz")
    assert status == 503 and b"poller thread not running" in body
    assert get(server.url, "/metrics")[0] == 200  # /metrics still serves what it has


@pytest.mark.servers
def test_healthz_503_when_the_poll_is_stuck(make_exporter):
    exporter, fake = make_exporter({"gpus": 1}, interval=0.05, stuck_after=0.2, on_stuck=lambda: None)
    exporter.start()
    server = exporter.serve("127.0.0.1:0")
    assert wait_for(lambda: get(server.url, "/healthz")[0] == 200, what="healthy")
    fake.inject_fault("hang")
    wait_for(lambda: get(server.url, "/healthz")[0] == 503, what="503 once stuck")
    assert get(server.url, "/healthz")[2] == b"poll stuck in the driver\n"


@pytest.mark.servers
def test_basic_auth(make_exporter, caplog):
    exporter, _ = make_exporter({"gpus": 1})
    exporter.poller.poll_once()
    server = exporter.serve("127.0.0.1:0", basic_auth=("prom", "s3cret-pw"))
    status, headers, _ = get(server.url, "/metrics")
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
    wrong = "Basic " + base64.b64encode(b"prom:nope").decode()
    assert get(server.url, "/metrics", {"Authorization": wrong})[0] == 401
    right = "Basic " + base64.b64encode(b"prom:s3cret-pw").decode()
    status, _, body = get(server.url, "/metrics", {"Authorization": right})
    assert status == 200 and b"foxhunt_gpu_up" in body
    assert get(server.url, "/healthz")[0] == 503  # open without credentials (the poller is not started here)
    assert "s3cret-pw" not in caplog.text


def _self_signed(tmp_path: Path) -> tuple[str, str]:
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:  # fall back to the openssl CLI
        cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                        "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)  # fmt: skip
        return str(cert), str(key)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(cert_path), str(key_path)


@pytest.mark.servers
def test_tls_with_a_self_signed_certificate(make_exporter, tmp_path):
    cert, key = _self_signed(tmp_path)
    exporter, _ = make_exporter({"gpus": 1})
    exporter.poller.poll_once()
    server = exporter.serve("127.0.0.1:0", tls_cert=cert, tls_key=key, basic_auth=("prom", "pw"))
    assert server.url.startswith("https://127.0.0.1:")
    trusted = ssl.create_default_context(cafile=cert)
    auth = {"Authorization": "Basic " + base64.b64encode(b"prom:pw").decode()}
    status, _, body = get(server.url, "/metrics", auth, context=trusted)
    assert status == 200 and b"foxhunt_gpu_up" in body
    with pytest.raises(ssl.SSLError):  # the default trust store does not know our cert
        get(server.url, "/metrics", auth, context=ssl.create_default_context())
    with pytest.raises(ConnectionError):  # plain HTTP to a TLS port gets nothing back
        get(server.url.replace("https", "http"), "/metrics")
    assert get(server.url, "/metrics", auth, context=trusted)[0] == 200  # a failed handshake hurt nothing


@pytest.mark.parametrize(
    "address, expected",
    [(":9094", ("", 9094)), ("127.0.0.1:0", ("127.0.0.1", 0)), ("[::1]:9400", ("::1", 9400)),
     ("0.0.0.0:9094", ("0.0.0.0", 9094))],
)  # fmt: skip
def test_parse_address(address, expected):
    assert parse_address(address) == expected


@pytest.mark.parametrize("address", ["9094", "host:", "host:port"])
def test_parse_address_rejects(address):
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_address(address)


@pytest.mark.servers
def test_connection_threads_are_capped(served):
    """A client that opens connections and sends nothing holds a thread each: past the cap a new
    connection is closed at once, and the slots come back when the idle ones go."""
    import socket
    import time

    from foxhunt_gpu_exporter import server as server_mod

    _, server = served
    host, port = "127.0.0.1", int(server.url.rsplit(":", 1)[1])
    idle = [socket.create_connection((host, port), timeout=5) for _ in range(server_mod.MAX_CONNECTIONS)]
    time.sleep(0.3)  # every one accepted and holding its thread
    extra = socket.create_connection((host, port), timeout=5)
    extra.settimeout(5)
    assert extra.recv(1) == b""  # closed by the server without an answer
    extra.close()
    for s in idle:
        s.close()
    wait_for(lambda: get(server.url, "/metrics")[0] == 200, what="a slot free again")
