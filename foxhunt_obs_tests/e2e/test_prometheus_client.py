"""The Prometheus client against a real Prometheus (and, for 503s and dead ports, a real socket)."""

import http.server
import threading
from datetime import timedelta

import pytest

from foxhunt_obs.lib.sources.prometheus import PrometheusClient, PrometheusError
from foxhunt_obs.sandbox.servers.local_server import free_port
from foxhunt_obs.sandbox.servers.prometheus import PrometheusServer, copy_tsdb
from foxhunt_obs.sandbox.story import truth

UTIL = "last_over_time(DCGM_FI_DEV_GPU_UTIL[14999ms])"


def test_chunked_range_equals_one_request(small, prometheus):
    start = small.start.timestamp()
    end = start + 3 * 3600
    whole = PrometheusClient(prometheus.url).query_range(UTIL, start, end, 15)
    chunked = PrometheusClient(prometheus.url, max_points=97).query_range(UTIL, start, end, 15)
    assert _by_series(whole) == _by_series(chunked)
    assert whole.ts.max() < end  # half-open: the point at `end` belongs to the next window
    expected = truth.gpu_samples(small)
    expected = expected[expected["gpu_instance"].isna()]  # whole GPUs: MIG slices have no GPU_UTIL
    assert whole.n_points == (expected["ts"] < small.start + timedelta(hours=3)).sum()


def _by_series(r) -> dict:
    return {
        tuple(sorted(lab.items())): (r.ts[a:b].tolist(), r.values[a:b].tolist())
        for lab, a, b in zip(r.labels, r.offsets[:-1], r.offsets[1:])
    }


def test_gzip_gives_the_same_points(small, prometheus):
    start = small.start.timestamp()
    plain = PrometheusClient(prometheus.url).query_range(UTIL, start, start + 3600, 15)
    gz = PrometheusClient(prometheus.url, gzip=True).query_range(UTIL, start, start + 3600, 15)
    assert _by_series(plain) == _by_series(gz)


def test_instant_query_and_connection_check(small, prometheus):
    client = PrometheusClient(prometheus.url)
    client.check()
    at = (small.start + timedelta(hours=1)).timestamp()
    rows = client.query("count(DCGM_FI_DEV_GPU_UTIL)", at)
    # whole GPUs only (a MIG GPU's slices report no GPU_UTIL), a time-sliced one once per pod on it
    whole = sum(n.gpus for n in small.nodes) - sum(n.is_mig(0) for n in small.nodes)
    samples = truth.gpu_samples(small)
    at_hour = samples[(samples["ts"] == small.start + timedelta(hours=1)) & samples["gpu_instance"].isna()]
    assert len(at_hour) == whole + 1  # ip-10-0-1-12's GPU 1 is shared by two pods at 01:00
    assert rows == [({}, float(len(at_hour)))]


def test_too_many_points_names_url_query_window_step_and_prometheus_error(small, prometheus):
    client = PrometheusClient(prometheus.url, max_points=20_000)  # above Prometheus's 11,000
    start = small.start.timestamp()
    with pytest.raises(PrometheusError) as e:
        client.query_range(UTIL, start, start + 12_000, 1, "gpu_samples partition 2026-11-16T00")
    msg = str(e.value)
    assert prometheus.url in msg and UTIL in msg and "step 1s" in msg and "2026-11-16T00:00:00Z" in msg
    assert "HTTP 400" in msg and "11,000 points" in msg and "gpu_samples partition 2026-11-16T00" in msg


def test_too_many_samples_is_a_422_with_a_hint(small, small_tsdb, tmp_path):
    copy_tsdb(small_tsdb, tmp_path / "tsdb")
    with PrometheusServer(
        tmp_path / "tsdb", workdir=tmp_path, extra_args=("--query.max-samples=50",)
    ) as prom:
        client = PrometheusClient(prom.url)
        with pytest.raises(PrometheusError) as e:
            client.query_range(UTIL, small.start.timestamp(), small.start.timestamp() + 3600, 15)
    assert "HTTP 422" in str(e.value) and "too many samples" in str(e.value)
    assert "FOXHUNT_PROMETHEUS_MAX_POINTS" in str(e.value)


def test_bad_promql_is_refused_without_retries(prometheus):
    with pytest.raises(PrometheusError, match=r"HTTP 400 bad_data: .*parse error"):
        PrometheusClient(prometheus.url).query_range("rate(", 0, 60, 15)


class _Flaky(http.server.BaseHTTPRequestHandler):
    """Answers 503 `fail` times, then a real (empty) matrix."""

    fail = 0
    calls = 0

    def do_POST(self):  # noqa: N802
        type(self).calls += 1
        self.rfile.read(int(self.headers["Content-Length"]))
        if type(self).calls <= type(self).fail:
            body, code = b'{"status":"error","errorType":"unavailable","error":"overloaded"}', 503
        else:
            body, code = b'{"status":"success","data":{"resultType":"matrix","result":[]}}', 200
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def flaky():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Flaky.calls = 0
    yield server
    server.shutdown()


def test_503_is_retried_then_succeeds(flaky):
    _Flaky.fail = 2
    client = PrometheusClient(f"http://127.0.0.1:{flaky.server_port}", retries=3)
    assert client.query_range("up", 0, 60, 15).labels == []
    assert _Flaky.calls == 3


def test_503_gives_up_after_bounded_retries(flaky):
    _Flaky.fail = 10
    client = PrometheusClient(f"http://127.0.0.1:{flaky.server_port}", retries=3)
    with pytest.raises(PrometheusError, match="HTTP 503 unavailable: overloaded"):
        client.query_range("up", 0, 60, 15)
    assert _Flaky.calls == 3


def test_nothing_listening_is_a_clear_connection_error():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(PrometheusError, match=r"cannot connect after 2 tries") as e:
        PrometheusClient(url, retries=2).query_range("up", 0, 60, 15, "node_samples partition 2026-11-16T05")
    assert url in str(e.value) and "node_samples partition 2026-11-16T05" in str(e.value)
