"""The alert sinks against real receivers: the Debian Alertmanager (v2 API), a local HTTP server for the
signed webhook (and for Alertmanager's error answers), the Slack stand-in (sandbox/servers/slack_standin.py), and a lake in a
temp folder. Secrets must reach neither a log nor an exception."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import threading
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from foxhunt_obs.lib.delivery.alert_sinks import (
    AlertmanagerSink,
    AlertSinkError,
    LakeAlertSink,
    Notification,
    SlackAlertSink,
    WebhookSink,
    configured_sinks,
    deliver_all,
    notification_dict,
)
from foxhunt_obs.lib.delivery.slack_client import slack_web_client
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.schemas import ALERTS
from foxhunt_obs.lib.settings import SETTINGS
from foxhunt_obs.sandbox.servers.alertmanager import ALERTMANAGER, AlertmanagerServer
from foxhunt_obs.sandbox.servers.local_server import free_port
from foxhunt_obs.sandbox.servers.slack_standin import SlackStandIn
from foxhunt_obs_tests.lib.delivery.test_send import unchained

SECRET = "whsec-do-not-log-0123456789"
TOKEN = "xoxb-0000-1111-alert-token-do-not-log"
AM_PASSWORD = "am-pass-do-not-log"
LINK = "http://127.0.0.1:3000/runs/b5c0?tab=sensor&x=<1>"
ALERT_VARS = [
    s.env
    for s in SETTINGS
    if s.env.startswith(("FOXHUNT_ALERT", "FOXHUNT_REPORT_SLACK"))
    or s.env in ("SLACK_BOT_TOKEN", "FOXHUNT_DAGSTER_URL")
]
needs_alertmanager = pytest.mark.skipif(
    not Path(ALERTMANAGER).is_file(), reason=f"{ALERTMANAGER} is missing (`make install` installs it)"
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ALERT_VARS:
        monkeypatch.delenv(name, raising=False)


def note(
    fingerprint: str = "fp-stall-a",
    status: str = "firing",
    starts_at: datetime | None = None,
    ends_at: datetime | None = None,
    rule: str = "gpu_training_stall",
    labels: dict | None = None,
    **kw,
) -> Notification:
    starts_at = starts_at or datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=40)
    return Notification(
        rule=rule,
        fingerprint=fingerprint,
        status=status,
        severity=kw.pop("severity", "critical"),
        labels={"namespace": "rl", "pod": "ppo-a-0"} if labels is None else labels,
        summary=kw.pop("summary", "Training stalled: ppo-a-0 holds 8 GPUs at 0% utilization"),
        description=kw.pop("description", "Mean GPU utilization has been <= 0% for 30 minutes."),
        value=kw.pop("value", 0.0),
        starts_at=starts_at,
        ends_at=ends_at,
        generator_url=kw.pop("generator_url", LINK),
    )


def resolved(n: Notification, at: datetime | None = None) -> Notification:
    return replace(n, status="resolved", ends_at=at or datetime.now(timezone.utc).replace(microsecond=0))


def _parse(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


# -- a local HTTP receiver -------------------------------------------------------------------------------------
class Receiver:
    """Records every POST; answers from ``script`` (status, body) in turn, then 200."""

    def __init__(self):
        self.requests: list[dict] = []
        self.script: list[tuple[int, str]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                status, text = receiver.script.pop(0) if receiver.script else (200, "")
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def fast_retries(monkeypatch):
    monkeypatch.setattr("foxhunt_obs.lib.delivery.alert_sinks.BACKOFF_S", 0.01)


# -- Alertmanager, the real one ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory):
    if not Path(ALERTMANAGER).is_file():
        pytest.skip(f"{ALERTMANAGER} is missing (`make install` installs it)")
    with AlertmanagerServer(workdir=tmp_path_factory.mktemp("alertmanager")) as am:
        yield am


def _by_fingerprint(am: AlertmanagerServer, **filters) -> dict[str, dict]:
    return {a["labels"]["foxhunt_fingerprint"]: a for a in am.alerts(**filters)}


@pytest.mark.servers
@needs_alertmanager
def test_alertmanager_shows_firing_alerts_then_drops_them_when_resolved(alertmanager):
    sink = AlertmanagerSink(alertmanager.url)
    a = note("fp-am-a", labels={"namespace": "rl", "pod": "ppo-a-0", "gpu-uuid": "GPU-1", "empty": ""})
    b = note("fp-am-b", rule="nan_loss", severity="warning", labels={"run_id": "r1"}, value=math.nan)
    before = datetime.now(timezone.utc)

    sink.send([a, b])

    got = _by_fingerprint(alertmanager)
    assert got.keys() == {"fp-am-a", "fp-am-b"}
    first = got["fp-am-a"]
    assert first["labels"] == {
        "alertname": "gpu_training_stall",
        "severity": "critical",
        "foxhunt_fingerprint": "fp-am-a",
        "namespace": "rl",
        "pod": "ppo-a-0",
        "gpu_uuid": "GPU-1",  # made a valid label name ("gpu-uuid" is refused with a 400)
    }  # the empty label: dropped by Alertmanager itself
    assert first["annotations"] == {"summary": a.summary, "description": a.description, "value": "0"}
    assert got["fp-am-b"]["annotations"]["value"] == "nan"
    assert first["generatorURL"] == LINK
    assert first["status"]["state"] == "active"
    assert _parse(first["startsAt"]) == a.starts_at
    # firing: endsAt is ours, 24 h ahead (not Alertmanager's resolve_timeout of 5 min)
    ends = _parse(first["endsAt"])
    assert (
        before + timedelta(hours=24) - timedelta(seconds=1)
        <= ends
        <= before + timedelta(hours=24, seconds=10)
    )

    # sending the same firing alert again changes nothing visible: merged by label set, first startsAt kept
    sink.send([replace(a, starts_at=a.starts_at + timedelta(minutes=5))])
    again = _by_fingerprint(alertmanager)
    assert again.keys() == {"fp-am-a", "fp-am-b"} and _parse(again["fp-am-a"]["startsAt"]) == a.starts_at

    # resolved: gone from the v2 API at once, whatever the filters (it lists no resolved alert)
    sink.send([resolved(a)])
    assert _by_fingerprint(alertmanager).keys() == {"fp-am-b"}
    sink.send([resolved(b)])
    assert alertmanager.alerts() == []
    assert alertmanager.alerts(active=False, silenced=True, inhibited=True, unprocessed=True) == []
    # a retried resolution is harmless; a replayed OLD firing notification re-opens the alert
    sink.send([resolved(b)])
    assert alertmanager.alerts() == []
    sink.send([a])
    assert _by_fingerprint(alertmanager).keys() == {"fp-am-a"}
    sink.send([resolved(a)])
    assert alertmanager.alerts() == []


@pytest.mark.servers
@needs_alertmanager
def test_alertmanager_resolves_a_firing_alert_when_its_ttl_lapses(alertmanager):
    sink = AlertmanagerSink(alertmanager.url, firing_ttl=timedelta(seconds=1.5))
    sink.send([note("fp-am-ttl")])
    assert "fp-am-ttl" in _by_fingerprint(alertmanager)
    time.sleep(2.0)
    assert "fp-am-ttl" not in _by_fingerprint(alertmanager)


@pytest.mark.servers
@needs_alertmanager
def test_alertmanager_4xx_is_raised_at_once_with_its_message(alertmanager):
    sink = AlertmanagerSink(alertmanager.url + "/no/such/prefix")
    started = time.monotonic()
    with pytest.raises(AlertSinkError) as info:
        sink.send([note("fp-am-404")])
    assert time.monotonic() - started < 1.0  # no retry
    assert str(info.value).startswith(f"alertmanager {alertmanager.url}/no/such/prefix: HTTP 404")
    assert info.value.sink == "alertmanager" and unchained(info.value)


def test_alertmanager_down_names_the_url_not_the_password(fast_retries, caplog):
    caplog.set_level(logging.DEBUG)
    port = free_port()
    sink = AlertmanagerSink(f"http://foxhunt:{AM_PASSWORD}@127.0.0.1:{port}/am/")
    with pytest.raises(AlertSinkError) as info:
        sink.send([note()])
    message = str(info.value)
    assert message.startswith(f"alertmanager http://127.0.0.1:{port}/am: ConnectionError")
    assert "(after 3 attempts)" in message
    assert AM_PASSWORD not in message + repr(sink) + caplog.text and unchained(info.value)


@pytest.mark.servers
def test_alertmanager_5xx_is_retried_4xx_is_not(receiver, fast_retries):
    sink = AlertmanagerSink(receiver.url)
    receiver.script = [(503, "busy"), (500, "oops")]
    sink.send([note()])
    assert len(receiver.requests) == 3 and {r["path"] for r in receiver.requests} == {"/api/v2/alerts"}
    assert len({r["body"] for r in receiver.requests}) == 1

    receiver.requests.clear()
    receiver.script = [(400, '"invalid label set: invalid name \\"bad-label\\""')]
    with pytest.raises(AlertSinkError, match=r'HTTP 400 Bad Request: "invalid label set: invalid name'):
        sink.send([note()])
    assert len(receiver.requests) == 1

    receiver.script = [(502, "bad gateway")] * 3
    with pytest.raises(AlertSinkError, match=r"HTTP 502 Bad Gateway: bad gateway \(after 3 attempts\)"):
        sink.send([note()])


# -- the signed webhook -----------------------------------------------------------------------------------------
@pytest.mark.servers
def test_webhook_body_is_signed_with_the_secret(receiver, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    a = note("fp-wh-a")
    b = resolved(note("fp-wh-b", value=math.inf, labels={"run_id": "r7"}))
    sink = WebhookSink(receiver.url + "/hooks/foxhunt", SECRET)

    sink.send([a, b])

    [req] = receiver.requests
    raw, headers = req["body"], req["headers"]
    assert req["path"] == "/hooks/foxhunt" and headers["Content-Type"] == "application/json"
    # the recipe of docs/contracts/webhook.md
    expected = "sha256=" + hmac.new(SECRET.encode(), raw, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(expected, headers["X-Foxhunt-Signature"])
    payload = json.loads(raw)
    assert payload["version"] == 1 and str(payload["timestamp"]) == headers["X-Foxhunt-Timestamp"]
    assert abs(time.time() - payload["timestamp"]) < 60
    assert payload["notifications"] == [notification_dict(a), notification_dict(b)]
    first, second = payload["notifications"]
    assert first["status"] == "firing" and first["ends_at"] is None and first["generator_url"] == LINK
    assert second["status"] == "resolved" and second["value"] is None  # +Inf: not JSON
    assert second["ends_at"] == b.ends_at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    # another key does not verify
    assert headers["X-Foxhunt-Signature"] != "sha256=" + hmac.new(b"other", raw, hashlib.sha256).hexdigest()
    assert SECRET.encode() not in raw and SECRET not in json.dumps(headers)
    assert SECRET not in caplog.text + "".join(capsys.readouterr()) + repr(sink)


@pytest.mark.servers
def test_webhook_errors_never_show_the_secret(receiver, fast_retries, caplog):
    caplog.set_level(logging.DEBUG)
    sink = WebhookSink(receiver.url + "/hook?token=q-token-do-not-log", SECRET)
    receiver.script = [(500, f"cannot verify with {SECRET}")] * 3
    with pytest.raises(AlertSinkError) as info:
        sink.send([note()])
    message = str(info.value)
    assert message.startswith(f"webhook {receiver.url}/hook: HTTP 500")
    assert "***" in message and SECRET not in message and "q-token-do-not-log" not in message
    # the retries are the same bytes with the same signature
    assert len(receiver.requests) == 3
    assert len({(r["body"], r["headers"]["X-Foxhunt-Signature"]) for r in receiver.requests}) == 1

    receiver.script = [(401, "bad signature")]
    with pytest.raises(AlertSinkError, match=r"HTTP 401 Unauthorized: bad signature$"):
        sink.send([note()])
    dead = WebhookSink(f"http://127.0.0.1:{free_port()}/hook", SECRET)
    with pytest.raises(AlertSinkError, match="webhook http://127.0.0.1:[0-9]+/hook: ConnectionError") as info:
        dead.send([note()])
    assert SECRET not in str(info.value) + caplog.text and unchained(info.value)
    with pytest.raises(AlertSinkError, match="FOXHUNT_ALERT_WEBHOOK_SECRET is empty"):
        WebhookSink(receiver.url, "")


# -- Slack -------------------------------------------------------------------------------------------------------
@pytest.fixture
def slack():
    stand_in = SlackStandIn()
    yield stand_in
    stand_in.close()


@pytest.mark.servers
def test_slack_posts_one_message_per_notification(slack, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    start = datetime(2026, 11, 29, 13, 0, tzinfo=timezone.utc)
    a = note("fp-sl-a", starts_at=start, summary="GPU <idle> & cold", value=0.25)
    b = resolved(note("fp-sl-b", starts_at=start, rule="nan_loss"), at=start + timedelta(hours=1, minutes=20))
    sink = SlackAlertSink("#gpu-costs", slack_web_client(TOKEN, slack.url + "/api/"))

    sink.send([a, b])

    assert [r["path"] for r in slack.requests] == ["/api/chat.postMessage"] * 2
    fired, done = (r["params"]["text"] for r in slack.requests)
    assert {r["params"]["channel"] for r in slack.requests} == {"#gpu-costs"}
    assert fired.startswith("🔥 *CRITICAL* `gpu_training_stall` — GPU &lt;idle&gt; &amp; cold\n")
    assert "Mean GPU utilization" in fired and "`namespace=rl` `pod=ppo-a-0`" in fired
    assert "value 0.25" in fired and "firing since 2026-11-29 13:00 UTC" in fired
    assert fired.endswith("<http://127.0.0.1:3000/runs/b5c0?tab=sensor&amp;x=%3C1%3E|Open in Dagster>")
    assert done.startswith("✅ *RESOLVED* `nan_loss` — Training stalled")
    assert "fired 2026-11-29 13:00–14:20 UTC (1 h 20 min)" in done
    for r in slack.requests:
        assert r["headers"]["Authorization"] == f"Bearer {TOKEN}" and TOKEN.encode() not in r["body"]
    assert TOKEN not in caplog.text + "".join(capsys.readouterr()) + repr(sink)


@pytest.mark.servers
def test_slack_error_names_the_channel_not_the_token(slack, caplog):
    caplog.set_level(logging.DEBUG)
    sink = SlackAlertSink("#no-such-channel", slack_web_client(TOKEN, slack.url + "/api/"))
    with pytest.raises(AlertSinkError) as info:
        sink.send([note(), note("fp-2")])
    message = str(info.value)
    assert message.startswith(f"slack #no-such-channel: chat.postMessage (via {slack.url}/api/) failed: ")
    assert "channel_not_found" in message
    assert "invite the bot" in message and len(slack.requests) == 1  # stops at the first refusal
    assert TOKEN not in message + caplog.text and unchained(info.value)
    with pytest.raises(AlertSinkError, match="slack #x: SLACK_BOT_TOKEN is empty"):
        SlackAlertSink("#x", slack_web_client(" ", slack.url))  # and SLACK_BOT_TOKEN unset


# -- the alerts table ----------------------------------------------------------------------------------------------
def test_lake_appends_transitions_once_per_day_partition(tmp_path):
    lake = Lake(tmp_path / "lake")
    sink = LakeAlertSink(lake)
    day1 = datetime(2026, 11, 28, 23, 50, tzinfo=timezone.utc)
    a = note("fp-lk-a", starts_at=day1, value=math.nan)
    b = note("fp-lk-b", starts_at=day1 + timedelta(minutes=5), labels={"run_id": "r1"})
    a_done = resolved(a, at=day1 + timedelta(minutes=30))  # the next day

    sink.send([a, b], sent_to=["slack"])
    assert lake.partitions(ALERTS) == ["2026-11-28"]
    sink.send([a, b], sent_to=["alertmanager", "slack"])  # a retry: no new row, sent_to widened
    sink.send([a_done])
    sink.send([a_done, a])  # and again, mixed

    assert lake.partitions(ALERTS) == ["2026-11-28", "2026-11-29"]
    first = lake.read_partition(ALERTS, "2026-11-28").to_pylist()
    assert [(r["fingerprint"], r["status"], r["sent_to"]) for r in first] == [
        ("fp-lk-a", "firing", "slack,alertmanager"),
        ("fp-lk-b", "firing", "slack,alertmanager"),
    ]
    row = first[0]
    assert row["day"].isoformat() == "2026-11-28" and row["ts"] == day1 and row["starts_at"] == day1
    assert row["ends_at"] is None and math.isnan(row["value"]) and row["severity"] == "critical"
    assert json.loads(row["labels"]) == {"namespace": "rl", "pod": "ppo-a-0"} and row["rule"] == a.rule
    [second] = lake.read_partition(ALERTS, "2026-11-29").to_pylist()
    assert (second["status"], second["ts"], second["ends_at"]) == ("resolved", a_done.ends_at, a_done.ends_at)
    assert second["sent_to"] == ""

    # the lake's view sees both days
    got = lake.query("SELECT day, count(*) AS n FROM alerts GROUP BY day ORDER BY day").to_pylist()
    assert got == [{"day": "2026-11-28", "n": 2}, {"day": "2026-11-29", "n": 1}]

    # a new firing of the same fingerprint (a later starts_at) is a new transition
    sink.send([replace(a, starts_at=day1 + timedelta(minutes=9))])
    assert lake.read_partition(ALERTS, "2026-11-28").num_rows == 3


def test_lake_sink_leaves_an_unchanged_partition_alone(tmp_path):
    lake = Lake(tmp_path / "lake")
    sink = LakeAlertSink(lake)
    n = note(starts_at=datetime(2026, 11, 28, 10, tzinfo=timezone.utc))
    sink.send([n])
    path = tmp_path / "lake" / "alerts" / "day=2026-11-28" / "part-0.parquet"
    stamp = path.stat().st_mtime_ns
    time.sleep(0.01)
    sink.send([n])
    assert path.stat().st_mtime_ns == stamp


# -- configuration and deliver_all -------------------------------------------------------------------------------
def test_configured_sinks(tmp_path):
    lake = Lake(tmp_path / "lake")

    def no_client():
        raise AssertionError("no Slack channel, so no Slack client either")

    assert [s.name for s in configured_sinks(lake)] == ["lake"]
    assert [s.name for s in configured_sinks(lake, slack_client=no_client)] == ["lake"]

    given = {
        "alertmanager_url": "http://am.example:9093/",
        "slack_channel": "#alerts",
        "webhook_url": "https://hooks.example/foxhunt",
        "webhook_secret": SECRET,
    }
    client = slack_web_client(TOKEN)
    sinks = configured_sinks(lake, **given, slack_client=lambda: client)
    assert [(s.name, s.target) for s in sinks] == [
        ("alertmanager", "http://am.example:9093"),
        ("slack", "#alerts"),
        ("webhook", "https://hooks.example/foxhunt"),
        ("lake", str(tmp_path / "lake")),
    ]
    assert sinks[1].api_url == "https://slack.com/api/"
    assert TOKEN not in repr(sinks) and SECRET not in repr(sinks)
    own = slack_web_client("xoxb-from-the-resource", "http://slack.example/api/")
    assert configured_sinks(lake, **given, slack_client=lambda: own)[1].api_url == "http://slack.example/api/"
    with pytest.raises(AlertSinkError, match="slack #alerts: .*SLACK_BOT_TOKEN is empty"):
        configured_sinks(lake, slack_channel="#alerts", slack_client=lambda: slack_web_client(""))

    with pytest.raises(
        AlertSinkError, match="webhook https://hooks.example/foxhunt: FOXHUNT_ALERT_WEBHOOK_SECRET"
    ):
        configured_sinks(lake, **{**given, "webhook_secret": ""}, slack_client=lambda: client)
    with pytest.raises(AlertSinkError, match="FOXHUNT_ALERTMANAGER_URL must be an http"):
        configured_sinks(
            lake, **{**given, "alertmanager_url": "am.example:9093"}, slack_client=lambda: client
        )


@pytest.mark.servers
def test_deliver_all_tries_every_sink_and_records_who_accepted(tmp_path, receiver, fast_retries):
    lake = Lake(tmp_path / "lake")
    dead = f"http://127.0.0.1:{free_port()}"
    sinks = [AlertmanagerSink(dead), WebhookSink(receiver.url, SECRET), LakeAlertSink(lake)]
    n = note(starts_at=datetime(2026, 11, 28, 10, tzinfo=timezone.utc))

    results = deliver_all(sinks, [n])

    assert results.keys() == {"alertmanager", "webhook", "lake"}
    assert results["alertmanager"].startswith(f"alertmanager {dead}: ConnectionError")
    assert results["webhook"] is None and results["lake"] is None
    [row] = lake.read_partition(ALERTS, "2026-11-28").to_pylist()
    assert row["sent_to"] == "webhook"
    assert deliver_all(sinks[1:], []) == {"webhook": None, "lake": None} and len(receiver.requests) == 1

    with pytest.raises(ValueError, match="status must be firing or resolved"):
        LakeAlertSink(lake).send([replace(n, status="pending")])
