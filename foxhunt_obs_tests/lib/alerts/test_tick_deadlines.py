"""A tick ends in time whatever its sources and sinks do, and the alerts that could be computed are
delivered to the sinks that answer. Stand-in servers hang, drip and rate-limit; the
budgets are the sensor's, scaled down so the tests are quick."""

from __future__ import annotations

import http.server
import json
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timezone

import pytest
import yaml

from foxhunt_obs.lib.alerts.collect import Sources
from foxhunt_obs.lib.alerts.engine import tick
from foxhunt_obs.lib.alerts.rules import load_rules
from foxhunt_obs.lib.delivery.alert_sinks import SlackAlertSink, WebhookSink
from foxhunt_obs.lib.delivery.slack_client import slack_web_client
from foxhunt_obs.lib.sources.mlflow import MlflowSource
from foxhunt_obs.lib.sources.prometheus import PrometheusClient
from foxhunt_obs.sandbox.servers.slack_standin import SlackStandIn

pytestmark = [pytest.mark.servers, pytest.mark.timeout(120)]
SOURCES_S, SINK_S, DELIVERY_S = 2.0, 2.0, 4.0
_STOP = threading.Event()  # set when a test ends: stalled handlers return, abandoned reads finish
HOT = [
    {"metric": {"node": "ip-1", "gpu": str(g), "uuid": f"GPU-{g}", "model": "A100"}, "value": [0, "93"]}
    for g in range(8)
]


@contextmanager
def _server(handler: type[http.server.BaseHTTPRequestHandler]):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


class _Hot(http.server.BaseHTTPRequestHandler):
    """Prometheus: 8 GPUs at 93 °C for gpu_overheat's query."""

    hang = False

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.hang:
            _STOP.wait(60)
            return
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": HOT}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class _Hang(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        _STOP.wait(60)

    do_POST = do_GET

    def log_message(self, *args):
        pass


class _NoRuns(http.server.BaseHTTPRequestHandler):
    """An MLflow with no experiment at all."""

    def do_GET(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_POST = do_GET

    def log_message(self, *args):
        pass


class _Drip(http.server.BaseHTTPRequestHandler):
    """A webhook answering one byte every 2 s: each read well inside any socket timeout."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Length", "30")
        self.end_headers()
        for _ in range(30):
            try:
                self.wfile.write(b" ")
                self.wfile.flush()
            except OSError:
                return
            if _STOP.wait(2):
                return

    def log_message(self, *args):
        pass


class _Hook(http.server.BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):
        type(self).received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


class _Slow(http.server.BaseHTTPRequestHandler):
    """A webhook that takes them all, 3 s after the request: past one sink's 2 s budget."""

    received: list = []

    def do_POST(self):
        type(self).received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        _STOP.wait(3)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(autouse=True)
def _release_stalls():
    """After each test the stand-ins stop stalling, and the reads and deliveries the tick gave up on
    finish, so nothing of this test lingers into the next (an MLflow call holds its env bounds)."""
    _STOP.clear()
    yield
    _STOP.set()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(
        t.name.startswith(("alert-source", "alert-sink")) for t in threading.enumerate()
    ):
        time.sleep(0.1)


def _rules(tmp_path, *enabled: str):
    overrides = {r.id: {"enabled": r.id in enabled} for r in load_rules(overrides="")}
    overrides["gpu_overheat"] = {"enabled": "gpu_overheat" in enabled, "for": "0s"}
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"rules": overrides}))
    return load_rules(overrides=path)


def _tick(rules, sources, sinks, cursor=None):
    t = time.monotonic()
    cursor, report = tick(
        rules, sources, sinks, cursor, datetime.now(timezone.utc),
        budget_s=DELIVERY_S, source_budget_s=SOURCES_S, sink_budget_s=SINK_S,
    )  # fmt: skip
    return cursor, report, time.monotonic() - t


@pytest.mark.parametrize("hanging", ["mlflow", "prometheus"])
def test_a_hanging_source_is_not_evaluated_and_the_others_are_delivered(tmp_path, hanging):
    """MLflow never answering while GPUs overheat took 184 s and skipped every sink; Prometheus' instant
    queries hanging never returned."""
    import mlflow.tracking  # noqa: F401 - imported once per process (seconds): not the source's answer time

    rules = _rules(tmp_path, "gpu_overheat", "nan_loss")
    hot = type("Hot", (_Hot,), {"hang": hanging == "prometheus"})
    _Hook.received = []
    with (
        _server(hot) as prom,
        _server(_Hang if hanging == "mlflow" else _NoRuns) as mlflow,
        _server(_Hook) as hook,
    ):
        sources = Sources(
            prometheus=PrometheusClient(
                prom, timeout_s=100
            ),  # the tick's deadline, not the client's, bounds it
            mlflow=MlflowSource(mlflow, timeout_s=100, retries=1),
        )
        cursor, report, took = _tick(rules, sources, [WebhookSink(f"{hook}/h", "s3cret")])
    assert took < SOURCES_S + SINK_S + 2, took
    assert set(report.source_errors) == {hanging} and "no answer within" in report.source_errors[hanging]
    if hanging == "mlflow":  # the Prometheus alerts still reach the webhook
        assert len(report.sent) == 8 and len(_Hook.received[0]["notifications"]) == 8
    else:
        assert report.sent == [] and "nan_loss" in report.evaluated  # MLflow (empty) was evaluated


def test_slack_rate_limiting_leaves_the_rest_for_the_next_tick_and_the_cursor_is_saved(tmp_path):
    """8 alerts with Slack answering 429 Retry-After: 10 took 80 s; Dagster dropped the tick."""
    rules = _rules(tmp_path, "gpu_overheat")
    slack = SlackStandIn()
    _Hook.received = []
    try:
        slack.rate_limit_next = 100  # 429 for everything (Retry-After 0 here; the sink caps it at 10 s)
        with _server(_Hot) as prom, _server(_Hook) as hook:
            sinks = [
                SlackAlertSink("#gpu-costs", slack_web_client("xoxb-test", slack.url + "/api/")),
                WebhookSink(f"{hook}/h", "s3cret"),
            ]
            cursor, report, took = _tick(rules, Sources(prometheus=PrometheusClient(prom)), sinks)
        assert took < DELIVERY_S + SINK_S + 2, took
        assert "slack" in report.failed and len(_Hook.received) == 1  # the webhook got all 8 at once
        pending = json.loads(cursor)["took"]
        assert len(pending) == 8 and all(v == ["webhook"] for v in pending.values())
    finally:
        slack.close()


def test_a_dripping_webhook_is_given_up_and_the_other_sinks_deliver(tmp_path):
    """A webhook answering one byte every 2 s held the tick for 78 s."""
    rules = _rules(tmp_path, "gpu_overheat")
    _Hook.received = []
    with _server(_Hot) as prom, _server(_Drip) as drip, _server(_Hook) as hook:
        sinks = [WebhookSink(f"{drip}/h", "s3cret"), WebhookSink(f"{hook}/h", "s3cret")]
        sinks[1].name = "webhook2"
        cursor, report, took = _tick(rules, Sources(prometheus=PrometheusClient(prom)), sinks)
        assert took < SINK_S + 3, took
        assert "no answer within" in report.failed["webhook"] and len(_Hook.received) == 1
        assert all(v == ["webhook2"] for v in json.loads(cursor)["took"].values())
        # the given-up delivery still runs: the next tick does not send it again (no duplicate)
        cursor, report, _ = _tick(rules, Sources(prometheus=PrometheusClient(prom)), sinks, cursor)
        assert report.failed["webhook"] == "still delivering an earlier tick's notifications"
        assert len(_Hook.received) == 1  # webhook2 took them on the first tick: not sent twice


def test_a_delivery_given_up_that_ends_later_is_recorded_not_sent_again(tmp_path):
    """A webhook answering after the sink's budget took the transitions all the same: the next tick
    learns that from the ended delivery and does not post them a second time."""
    rules = _rules(tmp_path, "gpu_overheat")
    _Slow.received = []
    with _server(_Hot) as prom, _server(_Slow) as slow:
        sinks = [WebhookSink(f"{slow}/h", "s3cret")]
        cursor, report, _ = _tick(rules, Sources(prometheus=PrometheusClient(prom)), sinks)
        assert "no answer within" in report.failed["webhook"] and report.sent == []
        assert len(json.loads(cursor)["took"]) == 8  # pending: the webhook has not answered yet
        time.sleep(2.5)  # the given-up delivery ends (200) meanwhile
        cursor, report, _ = _tick(rules, Sources(prometheus=PrometheusClient(prom)), sinks, cursor)
        assert report.failed == {} and len(report.sent) == 8
        assert len(_Slow.received) == 1 and len(_Slow.received[0]["notifications"]) == 8
        assert json.loads(cursor)["took"] == {}
