"""The spend push against a real Pushgateway (Debian's prometheus-pushgateway) and a real
Prometheus scraping it: values read back exactly, a push replaces the group, failures name the gateway with
its password masked."""

from __future__ import annotations

import base64
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from foxhunt_obs.lib.delivery.pushgateway import (
    DEFAULT_JOB,
    LAKE_COST,
    LAKE_IDLE,
    UNTRACKED,
    PushgatewayError,
    push_spend,
)
from foxhunt_obs.sandbox.servers.local_server import free_port
from foxhunt_obs.sandbox.servers.prometheus import PrometheusServer
from foxhunt_obs.sandbox.servers.pushgateway import PUSHGATEWAY, PushgatewayServer

pytestmark = pytest.mark.skipif(
    not Path(PUSHGATEWAY).is_file(), reason=f"{PUSHGATEWAY} is missing (`make pushgateway` installs it)"
)

PASSWORD = "pgw-pass-do-not-log"
NOTEBOOK = {
    "region": "us-east-1",
    "instance_id": "i-0a1b2c3d4e5f60718",
    "instance_type": "g5.xlarge",
    "name": "alice-notebook",
    "experiment": "ppo",
    "usd_per_hour": 1.006,
}
BUILDER = {
    "region": "us-west-2",
    "instance_id": "i-0fedcba9876543210",
    "instance_type": "p4de.24xlarge",
    "name": "",
    "experiment": "unattributed",
    "usd_per_hour": 27.44705,
}
LAKE = [
    {"day": "2026-01-01", "experiment": "ppo", "cost_usd": 658.7292, "idle_usd": 164.6823},
    {"day": "2026-01-01", "experiment": "(cluster idle)", "cost_usd": 12.5, "idle_usd": 12.5},
    {"day": "2026-01-02", "experiment": "ppo", "cost_usd": 650.0, "idle_usd": None},  # activity unknown
]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with PushgatewayServer(workdir=tmp_path_factory.mktemp("pushgateway")) as server:
        yield server


def pushed(server: PushgatewayServer, job: str = DEFAULT_JOB) -> dict[tuple[str, tuple], float]:
    """(metric, sorted labels without job/instance) -> value of the group ``job`` on the gateway."""
    out = {}
    for family in text_string_to_metric_families(server.metrics_text()):
        for s in family.samples:
            if s.labels.get("job") != job or s.name in ("push_time_seconds", "push_failure_time_seconds"):
                continue
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("job", "instance") and v))
            out[(s.name, labels)] = s.value
    return out


def _key(metric: str, **labels: str) -> tuple[str, tuple]:
    """As ``pushed`` shows a sample: an empty label is no label (Prometheus drops it)."""
    return metric, tuple(sorted((k, v) for k, v in labels.items() if v))


def _untracked_key(row: dict) -> tuple[str, tuple]:
    return _key(UNTRACKED, **{k: v for k, v in row.items() if k != "usd_per_hour"})


@pytest.mark.servers
def test_pushed_values_read_back_exactly(gateway):
    n = push_spend(gateway.url, untracked=[NOTEBOOK, BUILDER], lake_daily=LAKE, timeout_s=5)
    assert n == 2 + 3 + 2  # no idle sample where idle is unknown
    assert pushed(gateway) == {
        _untracked_key(NOTEBOOK): 1.006,
        _untracked_key(BUILDER): 27.44705,
        _key(LAKE_COST, day="2026-01-01", experiment="ppo"): 658.7292,
        _key(LAKE_IDLE, day="2026-01-01", experiment="ppo"): 164.6823,
        _key(LAKE_COST, day="2026-01-01", experiment="(cluster idle)"): 12.5,
        _key(LAKE_IDLE, day="2026-01-01", experiment="(cluster idle)"): 12.5,
        _key(LAKE_COST, day="2026-01-02", experiment="ppo"): 650.0,
    }
    types = {f.name: f.type for f in text_string_to_metric_families(gateway.metrics_text())}
    assert types[UNTRACKED] == types[LAKE_COST] == types[LAKE_IDLE] == "gauge"


@pytest.mark.servers
def test_the_bills_effective_rates_are_pushed_for_the_live_rules(gateway):
    from foxhunt_obs.lib.names import EFFECTIVE_PRICE_METRIC

    rate = {
        "price_region": "us-east-1",
        "instance_type": "p4de.24xlarge",
        "bill_day": "2026-11-20",
        "usd_per_hour": 19.21,
    }
    assert push_spend(gateway.url, untracked=[], lake_daily=[], rates=[rate], timeout_s=5) == 1
    assert pushed(gateway) == {
        _key(EFFECTIVE_PRICE_METRIC, **{k: v for k, v in rate.items() if k != "usd_per_hour"}): 19.21
    }


@pytest.mark.servers
def test_a_push_replaces_the_group_so_a_stopped_instance_disappears(gateway):
    job = "spend-replace"
    push_spend(gateway.url, untracked=[NOTEBOOK, BUILDER], lake_daily=LAKE, job=job)
    assert _untracked_key(BUILDER) in pushed(gateway, job)
    n = push_spend(gateway.url, untracked=[NOTEBOOK], lake_daily=LAKE[:1], job=job)
    assert n == 1 + 2
    assert pushed(gateway, job) == {
        _untracked_key(NOTEBOOK): 1.006,
        _key(LAKE_COST, day="2026-01-01", experiment="ppo"): 658.7292,
        _key(LAKE_IDLE, day="2026-01-01", experiment="ppo"): 164.6823,
    }
    assert push_spend(gateway.url, untracked=[], lake_daily=[], job=job) == 0
    assert pushed(gateway, job) == {}  # nothing running, nothing in the lake: nothing shown


@pytest.mark.servers
def test_other_groups_are_left_alone(gateway):
    push_spend(gateway.url, untracked=[BUILDER], lake_daily=[], job="spend-a")
    push_spend(gateway.url, untracked=[NOTEBOOK], lake_daily=[], job="spend-b")
    assert list(pushed(gateway, "spend-a")) == [_untracked_key(BUILDER)]
    assert list(pushed(gateway, "spend-b")) == [_untracked_key(NOTEBOOK)]


def test_a_down_gateway_names_it_and_the_job_with_the_password_masked():
    port = free_port()  # nothing listens there
    url = f"http://user:{PASSWORD}@127.0.0.1:{port}"
    t0 = time.monotonic()
    with pytest.raises(PushgatewayError) as e:
        push_spend(url, untracked=[NOTEBOOK], lake_daily=LAKE, timeout_s=2)
    assert time.monotonic() - t0 < 2
    text = str(e.value)
    assert PASSWORD not in text and "user:" not in text
    assert f"http://***@127.0.0.1:{port}" in text and repr(DEFAULT_JOB) in text
    assert "unreachable" in text and "refused" in text.lower()  # ConnectionRefusedError
    assert e.value.__cause__ is None and e.value.__suppress_context__  # no chained source text


class _Recorder(BaseHTTPRequestHandler):
    """A gateway stand-in: records each request, answers with the server's ``answer`` (status, body)."""

    def do_PUT(self):  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.requests.append((self.path, dict(self.headers), body))
        status, text = self.server.answer
        if status in ("drip-headers", "drip-503"):  # 5 bytes a second, for 20 s at most
            head = b"HTTP/1.1 200 OK\r\nX-Drip: " + b"a" * 200
            page = b"<html><title>503 Service Temporarily Unavailable</title>" + b" " * 200
            dripped = head if status == "drip-headers" else page
            try:
                if status == "drip-503":
                    self.wfile.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/html\r\n")
                    self.wfile.write(f"Content-Length: {len(page)}\r\n\r\n".encode())
                for i in range(100):  # each byte well inside the client's socket timeout
                    self.wfile.write(dripped[i : i + 1])
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                pass
            return
        if status is None:
            time.sleep(3)  # slower than the client's timeout
            status = 200
        self.send_response(status)
        self.end_headers()
        self.wfile.write(text.encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def stand_in():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    echoed = base64.b64encode(f"ops:{PASSWORD}".encode()).decode()
    server.requests, server.answer = [], (401, f"bad credentials {PASSWORD} / {echoed}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.servers
def test_credentials_go_as_basic_auth_and_a_refusal_is_clear(stand_in):
    port = stand_in.server_address[1]
    with pytest.raises(PushgatewayError) as e:
        push_spend(f"http://ops:{PASSWORD}@127.0.0.1:{port}/", untracked=[NOTEBOOK], lake_daily=[], job="j1")
    ((path, headers, body),) = stand_in.requests
    assert path == "/metrics/job/j1"  # PUT: the whole group replaced
    assert headers["Authorization"] == "Basic " + base64.b64encode(f"ops:{PASSWORD}".encode()).decode()
    assert b"i-0a1b2c3d4e5f60718" in body
    text = str(e.value)
    assert f"http://***@127.0.0.1:{port}/" in text and "'j1'" in text and "HTTP 401" in text
    assert "bad credentials *** / ***" in text and PASSWORD not in text  # echoed credentials masked too


@pytest.mark.servers
def test_a_slow_gateway_is_cut_at_the_timeout(stand_in):
    stand_in.answer = (None, "")
    t0 = time.monotonic()
    with pytest.raises(PushgatewayError, match="timeout 0.5 s"):
        push_spend(
            f"http://127.0.0.1:{stand_in.server_address[1]}", untracked=[], lake_daily=[], timeout_s=0.5
        )
    assert time.monotonic() - t0 < 2.5


@pytest.mark.servers
@pytest.mark.parametrize("answer", ["drip-headers", "drip-503"])
def test_a_dripping_gateway_is_cut_at_the_timeout_as_a_whole(stand_in, answer):
    """A gateway (or its proxy) dripping its headers or an error page: each byte arrives within the socket
    timeout, so only the whole push's deadline ends it (before, spend_now waited for the whole drip)."""
    stand_in.answer = (answer, "")
    port = stand_in.server_address[1]
    t0 = time.monotonic()
    with pytest.raises(PushgatewayError) as e:
        push_spend(
            f"http://ops:{PASSWORD}@127.0.0.1:{port}", untracked=[NOTEBOOK], lake_daily=[], timeout_s=1
        )
    assert time.monotonic() - t0 < 2
    text = str(e.value)
    assert text.startswith(f"Pushgateway http://***@127.0.0.1:{port} ") and PASSWORD not in text, text
    if answer == "drip-headers":
        assert "did not take the push of job 'foxhunt_obs_spend' within its timeout 1 s" in text, text
    else:
        assert "HTTP 503 Service Unavailable: <html" in text and "cut at the timeout, 1 s" in text, text


@pytest.mark.servers
def test_a_gateway_that_rejects_the_figures_says_why(tmp_path):
    with PushgatewayServer(workdir=tmp_path) as fresh:
        # another group holds the same name as a counter: the gateway refuses our gauge as inconsistent
        r = requests.put(
            f"{fresh.url}/metrics/job/someone-else",
            data=f"# TYPE {LAKE_COST} counter\n{LAKE_COST} 1\n",
            timeout=5,
        )
        assert r.status_code == 200, r.text
        with pytest.raises(PushgatewayError) as e:
            push_spend(fresh.url, untracked=[], lake_daily=LAKE[:1], job="spend-x")
    text = str(e.value)
    assert text.startswith(f"Pushgateway {fresh.url} refused the push of job 'spend-x': HTTP 400"), text
    assert "inconsistent" in text and LAKE_COST in text  # the gateway's own explanation


@pytest.mark.parametrize(
    "untracked, lake, message",
    [
        ([{**NOTEBOOK, "usd_per_hour": "n/a"}], [], r"untracked\[0\]\['usd_per_hour'\] is not a number"),
        ([{k: v for k, v in NOTEBOOK.items() if k != "region"}], [], r"untracked\[0\] has no 'region'"),
        ([], [{**LAKE[0], "day": "01/02/2026"}], r"lake_daily\[0\]\['day'\] is not YYYY-MM-DD"),
        (
            [],
            [{"day": "2026-01-01", "experiment": "ppo", "idle_usd": 1}],
            r"lake_daily\[0\] has no 'cost_usd'",
        ),
    ],
)
def test_bad_rows_are_named_before_anything_is_sent(untracked, lake, message):
    with pytest.raises(ValueError, match=message):
        push_spend(f"http://127.0.0.1:{free_port()}", untracked=untracked, lake_daily=lake)


@pytest.mark.servers
def test_rows_as_a_dataframe_gives_them(gateway):
    """What a lake query hands over: Timestamp days at midnight, NaN for unknown idle and missing names."""
    import pandas as pd

    job = "spend-pandas"
    lake = pd.DataFrame(
        {
            "day": pd.to_datetime(["2026-01-01", "2026-01-02"], utc=True),
            "experiment": ["ppo", "ppo"],
            "cost_usd": [658.7292, 650.0],
            "idle_usd": [164.6823, float("nan")],
        }
    )
    untracked = [{**NOTEBOOK, "name": float("nan")}]
    n = push_spend(gateway.url, untracked=untracked, lake_daily=lake.to_dict("records"), job=job)
    assert n == 1 + 2 + 1
    assert pushed(gateway, job) == {
        _untracked_key({**NOTEBOOK, "name": ""}): 1.006,
        _key(LAKE_COST, day="2026-01-01", experiment="ppo"): 658.7292,
        _key(LAKE_IDLE, day="2026-01-01", experiment="ppo"): 164.6823,
        _key(LAKE_COST, day="2026-01-02", experiment="ppo"): 650.0,
    }
    with pytest.raises(ValueError, match="is a time, not a UTC day"):
        push_spend(
            gateway.url, untracked=[], lake_daily=[{**LAKE[0], "day": pd.Timestamp("2026-01-01 06:00")}]
        )


@pytest.mark.servers
def test_prometheus_scraping_the_gateway_answers_the_pushed_series(gateway, tmp_path):
    job = "spend-scraped"
    push_spend(gateway.url, untracked=[NOTEBOOK, BUILDER], lake_daily=LAKE, job=job)
    host = gateway.url.removeprefix("http://")
    prom = PrometheusServer(  # its scrape jobs have honor_labels: true, as deploy/grafana/README.md says
        tmp_path / "tsdb", workdir=tmp_path, scrape_jobs={"pushgateway": [host]}, scrape_interval="1s"
    )
    with prom:
        deadline = time.monotonic() + 30
        while True:
            r = requests.get(
                f"{prom.url}/api/v1/query",
                params={"query": f'{{job="{job}", __name__=~"foxhunt_.*"}}'},
                timeout=5,
            ).json()
            assert r["status"] == "success", r
            if len(r["data"]["result"]) == 7 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        got = {
            (s["metric"]["__name__"], s["metric"].get("instance_id") or s["metric"].get("day"),
             s["metric"]["experiment"]): float(s["value"][1])
            for s in r["data"]["result"]
        }  # fmt: skip
        assert got == {
            (UNTRACKED, NOTEBOOK["instance_id"], "ppo"): 1.006,
            (UNTRACKED, BUILDER["instance_id"], "unattributed"): 27.44705,
            (LAKE_COST, "2026-01-01", "ppo"): 658.7292,
            (LAKE_IDLE, "2026-01-01", "ppo"): 164.6823,
            (LAKE_COST, "2026-01-01", "(cluster idle)"): 12.5,
            (LAKE_IDLE, "2026-01-01", "(cluster idle)"): 12.5,
            (LAKE_COST, "2026-01-02", "ppo"): 650.0,
        }
        # honor_labels kept the pushed job (not the scrape job's name) and every pushed label
        ((s,),) = [
            [s for s in r["data"]["result"] if s["metric"].get("instance_id") == NOTEBOOK["instance_id"]]
        ]
        assert s["metric"]["job"] == job
        assert {k: s["metric"][k] for k in ("region", "instance_type", "name")} == {
            "region": "us-east-1",
            "instance_type": "g5.xlarge",
            "name": "alice-notebook",
        }
        # the dashboard's sum of untracked $/h
        r = requests.get(
            f"{prom.url}/api/v1/query",
            params={"query": f'sum(foxhunt_untracked_instance_cost_usd_per_hour{{job="{job}"}})'},
            timeout=5,
        ).json()
        assert float(r["data"]["result"][0]["value"][1]) == pytest.approx(1.006 + 27.44705)
