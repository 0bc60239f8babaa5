"""The tick's Alertmanager refresh against a real Alertmanager: a firing alert is re-posted every tick
(as Prometheus does), so it never expires there while it fires, and nobody is notified twice."""

import json
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from foxhunt_obs.lib.alerts import state as alert_state
from foxhunt_obs.lib.alerts.collect import Sources
from foxhunt_obs.lib.alerts.engine import tick
from foxhunt_obs.lib.alerts.evaluate import Finding
from foxhunt_obs.lib.alerts.rules import load_rules
from foxhunt_obs.lib.delivery.alert_sinks import AlertmanagerSink, WebhookSink
from foxhunt_obs.sandbox.servers.alertmanager import ALERTMANAGER, AlertmanagerServer
from foxhunt_obs.sandbox.servers.local_server import free_port

pytestmark = [
    pytest.mark.servers,
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        not Path(ALERTMANAGER).exists(), reason="prometheus-alertmanager not installed (make install)"
    ),
]


def _overheating(now: datetime) -> Finding:
    return Finding(
        "gpu_overheat", {"node": "ip-1", "gpu": "3", "uuid": "GPU-3"}, 91.0, now - timedelta(minutes=6), {}
    )


def _unnotified_cursor(rules, now: datetime) -> str:
    """A cursor holding gpu_overheat firing, not yet notified."""
    state, _ = alert_state.step(
        alert_state.loads(None), {"gpu_overheat"}, [_overheating(now)], now, rules=rules
    )
    return alert_state.dumps(state)


@contextmanager
def _webhook(delay_s: float = 0.0):
    """A local HTTP receiver: yields (url, the JSON bodies it received); answers 200 after `delay_s`."""
    received = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            time.sleep(delay_s)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):  # quiet test server
            pass

    hook = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{hook.server_port}/hook", received
    finally:
        hook.shutdown()
        hook.server_close()


def test_firing_alerts_are_refreshed_every_tick(tmp_path):
    rules = load_rules(overrides="")
    now = datetime.now(timezone.utc).replace(microsecond=0)
    state, transitions = alert_state.step(
        alert_state.loads(None), {"gpu_overheat"}, [_overheating(now)], now, rules=rules
    )
    assert [t.kind for t in transitions] == ["firing"]
    cursor = alert_state.dumps(alert_state.acknowledge(state, transitions))  # notified on an earlier tick

    with AlertmanagerServer(workdir=tmp_path) as am:
        sink = AlertmanagerSink(am.url, firing_ttl=timedelta(seconds=2))
        # a tick with no source configured evaluates nothing: the alert keeps firing, nothing new is sent
        cursor, report = tick(rules, Sources(), [sink], cursor, now)
        assert report.sent == [] and report.refreshed == 1
        assert [a["labels"]["alertname"] for a in am.alerts(active=True)] == ["gpu_overheat"]
        time.sleep(3)  # past the 2 s endsAt: without a refresh Alertmanager lets it lapse
        assert am.alerts(active=True) == []
        cursor, report = tick(rules, Sources(), [sink], cursor, now + timedelta(minutes=1))
        assert report.refreshed == 1 and [a["labels"]["alertname"] for a in am.alerts(active=True)] == [
            "gpu_overheat"
        ]


def test_a_sink_that_is_down_gets_it_later_and_the_others_only_once(tmp_path):
    """Per-sink acknowledgement: while Alertmanager is down the webhook receives the firing once; when
    Alertmanager is back it gets it on the next tick; then the transition leaves the cursor."""
    rules = load_rules(overrides="")
    now = datetime.now(timezone.utc).replace(microsecond=0)
    cursor = _unnotified_cursor(rules, now)
    port = free_port()
    with _webhook() as (url, received):
        sinks = [AlertmanagerSink(f"http://127.0.0.1:{port}"), WebhookSink(url, "s3cret")]
        cursor, report = tick(rules, Sources(), sinks, cursor, now)
        assert set(report.failed) == {"alertmanager"} and report.sent == [] and len(received) == 1
        cursor, report = tick(rules, Sources(), sinks, cursor, now + timedelta(minutes=1))
        assert (
            set(report.failed) == {"alertmanager"} and len(received) == 1
        )  # the webhook is not sent it twice
        with AlertmanagerServer(port=port, workdir=tmp_path) as am:
            cursor, report = tick(rules, Sources(), sinks, cursor, now + timedelta(minutes=2))
            assert report.failed == {} and [n.rule for n in report.sent] == ["gpu_overheat"]
            assert [a["labels"]["alertname"] for a in am.alerts(active=True)] == ["gpu_overheat"]
            assert len(received) == 1
            assert json.loads(cursor)["took"] == {}  # every sink took it: nothing pending


def test_a_tick_past_its_budget_leaves_the_other_sinks_for_the_next_tick(tmp_path):
    """A slow sink uses up the tick's budget: the sinks after it are not tried (the cursor must be saved
    before Dagster's deadline), get the transition on the next tick, and the slow one never twice."""
    rules = load_rules(overrides="")
    now = datetime.now(timezone.utc).replace(microsecond=0)
    cursor = _unnotified_cursor(rules, now)
    with _webhook(delay_s=0.5) as (url, received), AlertmanagerServer(workdir=tmp_path) as am:
        sinks = [WebhookSink(url, "s3cret"), AlertmanagerSink(am.url)]
        cursor, report = tick(rules, Sources(), sinks, cursor, now, budget_s=0.2)
        assert len(received) == 1 and report.sent == [] and report.refreshed == 0
        assert report.failed == {"alertmanager": "not tried: the tick ran past its 0.2 s budget"}
        assert am.alerts(active=True) == []
        cursor, report = tick(rules, Sources(), sinks, cursor, now + timedelta(minutes=1), budget_s=0.2)
        assert report.failed == {} and [n.rule for n in report.sent] == ["gpu_overheat"]
        assert [a["labels"]["alertname"] for a in am.alerts(active=True)] == ["gpu_overheat"]
        assert len(received) == 1 and json.loads(cursor)["took"] == {}


def test_slack_taking_some_messages_of_a_batch_is_never_sent_them_again():
    """Slack posts one message per transition; when the second of two fails, the first is
    recorded as taken, so the next tick posts only the second (2 messages for 2 alerts, not 3)."""
    from foxhunt_obs.lib.delivery.alert_sinks import SlackAlertSink
    from foxhunt_obs.lib.delivery.slack_client import slack_web_client
    from foxhunt_obs.sandbox.servers.slack_standin import SlackStandIn

    rules = load_rules(overrides="")
    now = datetime.now(timezone.utc).replace(microsecond=0)
    hot = [
        Finding(
            "gpu_overheat",
            {"node": "ip-1", "gpu": g, "uuid": f"GPU-{g}"},
            91.0,
            now - timedelta(minutes=6),
            {},
        )
        for g in ("1", "2")
    ]
    state, _ = alert_state.step(alert_state.loads(None), {"gpu_overheat"}, hot, now, rules=rules)
    cursor = alert_state.dumps(state)
    slack = SlackStandIn()
    try:
        slack.fail_posts = {2}
        sink = SlackAlertSink("#gpu-costs", slack_web_client("xoxb-test-token", slack.url + "/api/"))
        cursor, report = tick(rules, Sources(), [sink], cursor, now)
        assert set(report.failed) == {"slack"} and "posted 1 of 2" in report.failed["slack"]
        assert len(report.sent) == 1  # the one Slack took is done (Slack is the only sink here)
        cursor, report = tick(rules, Sources(), [sink], cursor, now + timedelta(minutes=1))
        assert report.failed == {} and len(report.sent) == 1
        texts = [r["params"]["text"] for r in slack.requests if r["path"] == "/api/chat.postMessage"]
        assert len(texts) == 3  # 1 taken + 1 refused, then only the refused one again
        assert texts[1] == texts[2] and texts[0] != texts[1]
        assert json.loads(cursor)["took"] == {}
    finally:
        slack.close()


@contextmanager
def _refusing_webhook():
    """A webhook that answers 500 to everything, for good."""

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    hook = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{hook.server_port}/hook"
    finally:
        hook.shutdown()
        hook.server_close()


def test_alertmanager_refresh_does_not_wait_for_a_sink_that_refuses(tmp_path):
    """A webhook that refuses for good must not let Alertmanager expire a live alert."""
    rules = load_rules(overrides="")
    now = datetime.now(timezone.utc).replace(microsecond=0)
    cursor = _unnotified_cursor(rules, now)
    with _refusing_webhook() as url, AlertmanagerServer(workdir=tmp_path) as am:
        sinks = [
            AlertmanagerSink(am.url, firing_ttl=timedelta(seconds=2)),
            WebhookSink(url, "s3cret", retries=1),
        ]
        cursor, report = tick(rules, Sources(), sinks, cursor, now)
        assert set(report.failed) == {"webhook"} and report.refreshed == 0
        time.sleep(3)  # past the 2 s endsAt
        assert am.alerts(active=True) == []
        cursor, report = tick(rules, Sources(), sinks, cursor, now + timedelta(minutes=1))
        assert set(report.failed) == {"webhook"} and report.refreshed == 1
        assert [a["labels"]["alertname"] for a in am.alerts(active=True)] == ["gpu_overheat"]


def test_a_transition_refused_for_days_is_dropped_loudly(tmp_path):
    """The cursor's pending list is bounded: after PENDING_MAX the transition leaves it, the tick's report
    says so, and the alerts table records it with the sinks that took it and 'dropped'."""
    from foxhunt_obs.lib.alerts.engine import PENDING_MAX
    from foxhunt_obs.lib.delivery.alert_sinks import LakeAlertSink
    from foxhunt_obs.lib.lake import Lake

    rules = load_rules(overrides="")
    now = datetime.now(timezone.utc).replace(microsecond=0)
    cursor = _unnotified_cursor(rules, now)
    lake = Lake(str(tmp_path / "lake"))
    with _refusing_webhook() as url:
        sinks = [LakeAlertSink(lake), WebhookSink(url, "s3cret", retries=1)]
        cursor, report = tick(rules, Sources(), sinks, cursor, now)
        assert list(json.loads(cursor)["took"].values()) == [["lake"]] and not report.dropped
        cursor, report = tick(rules, Sources(), sinks, cursor, now + PENDING_MAX - timedelta(minutes=1))
        assert not report.dropped and json.loads(cursor)["took"]
        cursor, report = tick(rules, Sources(), sinks, cursor, now + PENDING_MAX + timedelta(minutes=1))
        assert len(report.dropped) == 1 and "refused by webhook since" in report.dropped[0]
        assert json.loads(cursor)["took"] == {} and json.loads(cursor)["pending_since"] == {}
    # one row per transition: the drop replaced the first tick's record of it
    rows = lake.query("SELECT rule, status, sent_to FROM alerts").to_pylist()
    assert rows == [{"rule": "gpu_overheat", "status": "firing", "sent_to": "lake,dropped"}]


def test_alerts_link_to_the_sensor_page_under_the_deployments_location_name(tmp_path):
    """generatorURL, in Alertmanager and in every sink: the alert sensor's page in the Dagster UI, under the
    code location's name the sensor runs in (a deployment may name it otherwise than workspace.yaml)."""
    from foxhunt_obs.defs.alerts.sensors import alert_sensor
    from foxhunt_obs.lib.alerts.engine import LOCATION, SENSOR

    assert alert_sensor.name == SENSOR and LOCATION == "foxhunt_obs"
    rules = load_rules(overrides="")
    now = datetime.now(timezone.utc).replace(microsecond=0)
    page = "http://dagster.example:3000/locations/foxhunt-prod/sensors/alert_sensor?rule=gpu_overheat"
    with AlertmanagerServer(workdir=tmp_path) as am, _webhook() as (hook_url, received):
        sinks = [AlertmanagerSink(am.url), WebhookSink(hook_url, "s3cret")]
        cursor, report = tick(
            rules, Sources(), sinks, _unnotified_cursor(rules, now), now, "http://dagster.example:3000/",
            location="foxhunt-prod",
        )  # fmt: skip
        assert [n.generator_url for n in report.sent] == [page]
        assert [a["generatorURL"] for a in am.alerts(active=True)] == [page]
        assert [a["generator_url"] for body in received for a in body["notifications"]] == [page]
        # the refresh of a firing alert links the same way
        _, report = tick(
            rules, Sources(), sinks, cursor, now + timedelta(minutes=1), "http://dagster.example:3000",
            location="foxhunt-prod",
        )  # fmt: skip
        assert report.refreshed == 1 and [a["generatorURL"] for a in am.alerts(active=True)] == [page]
    # without a location: the one workspace.yaml names
    _, report = tick(rules, Sources(), [], _unnotified_cursor(rules, now), now, "http://d:3000")
    assert [n.generator_url for n in report.sent] == [
        f"http://d:3000/locations/{LOCATION}/sensors/{SENSOR}?rule=gpu_overheat"
    ]
