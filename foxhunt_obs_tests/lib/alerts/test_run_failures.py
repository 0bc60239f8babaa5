"""Failed Dagster runs as alerts: a notice a sink refused is sent again next tick, a notice a
sink took is never sent twice (not even when the watermark's overlap reads its run again), a notice no
sink takes for PENDING_MAX is dropped loudly, and a hanging sink does not hold the tick. Real sinks (the
signed webhook, the lake's alerts table) against a local HTTP receiver."""

import json
import threading
import time
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from foxhunt_obs.lib.alerts import run_failures
from foxhunt_obs.lib.alerts.engine import PENDING_MAX
from foxhunt_obs.lib.delivery.alert_sinks import (
    AlertmanagerSink,
    LakeAlertSink,
    WebhookSink,
    slack_alert_text,
)
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.tracing import LinkTemplates

pytestmark = pytest.mark.timeout(60)

NOW = datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=timezone.utc)  # a run record keeps microseconds


class Receiver(ThreadingHTTPServer):
    """Answers 500 while `refusing`, sleeps `delay_s` before answering; keeps the bodies it took."""

    def __init__(self):
        self.refusing = False
        self.delay_s = 0.0
        self.took: list[dict] = []
        self.requests = 0
        server = self

        class Hook(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests += 1
                time.sleep(server.delay_s)
                if server.refusing:
                    self.send_response(500)
                else:
                    server.took.append(body)
                    self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):  # quiet test server
                pass

        super().__init__(("127.0.0.1", 0), Hook)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}/hook"

    def run_ids(self) -> list[str]:
        return [n["fingerprint"] for body in self.took for n in body["notifications"]]


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.shutdown()
    server.server_close()


def _failed(run_id: str, minutes_ago: float = 5) -> run_failures.FailedRun:
    return run_failures.FailedRun(
        run_id=run_id,
        job_name="gpu_ingest_job",
        failed_at=NOW - timedelta(minutes=minutes_ago),
        message='Execution of run for "gpu_ingest_job" failed.\ngpu_samples: Prometheus at http://prom: 503',
    )


def _sinks(receiver: Receiver, lake: Lake) -> list:
    return [WebhookSink(receiver.url, "s3cret", retries=0), LakeAlertSink(lake)]


@pytest.mark.servers
def test_a_refused_notice_is_sent_next_tick_and_never_twice(receiver, tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    cursor = run_failures.Cursor.load(None, NOW)
    assert cursor.after == NOW - run_failures.FIRST_LOOKBACK

    receiver.refusing = True
    cursor, report = run_failures.tick(cursor, [_failed("run-1")], _sinks(receiver, lake), NOW)
    assert receiver.requests == 1 and receiver.took == []
    assert set(report.failed) == {"webhook"} and report.sent == []
    assert list(cursor.pending.values())[0]["took"] == ["lake"]  # the lake took it, once

    # the next tick: the watermark's overlap reads run-1 again, the webhook answers now
    receiver.refusing = False
    cursor = run_failures.Cursor.load(cursor.dumps(), NOW)  # through the text the sensor stores
    later = NOW + timedelta(seconds=30)
    cursor, report = run_failures.tick(cursor, [_failed("run-1")], _sinks(receiver, lake), later)
    assert receiver.run_ids() == ["run-1"] and [n.fingerprint for n in report.sent] == ["run-1"]
    assert cursor.pending == {} and report.failed == {}
    [note] = receiver.took[0]["notifications"]
    assert note["rule"] == "dagster_run_failed" and note["labels"]["job"] == "gpu_ingest_job"
    assert "gpu_samples: Prometheus at http://prom: 503" in note["description"]

    # and again, with a second failure: run-1 is not sent again, run-2 is
    cursor, report = run_failures.tick(
        cursor, [_failed("run-1"), _failed("run-2", 1)], _sinks(receiver, lake), later
    )
    assert receiver.run_ids() == ["run-1", "run-2"]
    assert cursor.after == NOW - timedelta(minutes=1)  # the newest failure
    rows = lake.query("SELECT fingerprint, sent_to FROM alerts ORDER BY fingerprint").to_pylist()
    assert rows == [
        {"fingerprint": "run-1", "sent_to": ""},  # taken by the lake first, before the webhook
        {"fingerprint": "run-2", "sent_to": "webhook"},
    ]


@pytest.mark.servers
def test_a_notice_refused_for_pending_max_is_dropped_loudly(receiver, tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    receiver.refusing = True
    cursor, _ = run_failures.tick(
        run_failures.Cursor.load(None, NOW), [_failed("run-1")], _sinks(receiver, lake), NOW
    )
    assert len(cursor.pending) == 1
    cursor, report = run_failures.tick(
        cursor, [], _sinks(receiver, lake), NOW + PENDING_MAX + timedelta(minutes=1)
    )
    assert cursor.pending == {} and report.sent == []
    [dropped] = report.dropped
    assert "dagster_run_failed" in dropped and "refused by webhook" in dropped
    rows = lake.query("SELECT fingerprint, sent_to FROM alerts").to_pylist()
    assert rows == [{"fingerprint": "run-1", "sent_to": "lake,dropped"}]


@pytest.mark.servers
def test_a_hanging_sink_does_not_hold_the_tick(receiver, tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    receiver.delay_s = 8.0  # longer than the sink's budget; its socket timeout (10 s) never trips
    started = time.monotonic()
    cursor, report = run_failures.tick(
        run_failures.Cursor.load(None, NOW),
        [_failed("run-1")],
        _sinks(receiver, lake),
        NOW,
        budget_s=3.0,
        sink_budget_s=1.0,
    )
    assert time.monotonic() - started < 4.0
    assert "no answer within" in report.failed["webhook"]
    assert list(cursor.pending.values())[0]["took"] == ["lake"]  # the lake still took it
    # the given-up delivery still runs: let it end, or the next test's webhook would wait for it
    deadline = time.monotonic() + 15
    while not receiver.took and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)


def test_an_unreadable_cursor_says_so():
    with pytest.raises(ValueError, match="run_failure_alert: unreadable cursor"):
        run_failures.Cursor.load("{not json", NOW)


# A Grafana Explore URL on Tempo, encoded whole as docs/operating/traces.md shows it: every placeholder is %7B..%7D
TRACE_TEMPLATE = (
    "https://grafana.test/explore?schemaVersion=1&panes=%7B%22a%22%3A%7B%22queries%22%3A%5B%7B%22query%22%3A"
    "%22%7Btrace_id%7D%22%7D%5D%2C%22range%22%3A%7B%22from%22%3A%22%7Bfrom_ms%7D%22%2C%22to%22%3A%22%7Bto_ms%7D"
    "%22%7D%7D%7D"
)
RUN_ID = "0b6f1e2a-3c4d-4e5f-8a9b-0c1d2e3f4a5b"  # a Dagster run id: its trace id is these 32 hex digits


def _ms(t: datetime) -> str:
    return str(int(t.timestamp() * 1000))


@pytest.mark.servers
def test_a_failed_run_links_to_its_trace_in_every_sink(receiver, tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    started = NOW - timedelta(minutes=9, seconds=30)
    run = run_failures.FailedRun(RUN_ID, "gpu_ingest_job", NOW - timedelta(minutes=5), "it failed", started)
    links = LinkTemplates(trace=TRACE_TEMPLATE)
    expected = (
        TRACE_TEMPLATE.replace("%7Btrace_id%7D", RUN_ID.replace("-", ""))
        .replace("%7Bfrom_ms%7D", _ms(started))
        .replace("%7Bto_ms%7D", _ms(run.failed_at))
    )
    assert "%7B" + "trace_id" not in expected and "0b6f1e2a3c4d4e5f8a9b0c1d2e3f4a5b" in expected

    receiver.refusing = True  # refused first: the link must come back out of the cursor
    cursor, _ = run_failures.tick(
        run_failures.Cursor.load(None, NOW), [run], _sinks(receiver, lake), NOW, links=links
    )
    receiver.refusing = False
    cursor = run_failures.Cursor.load(cursor.dumps(), NOW)
    later = NOW + timedelta(seconds=30)
    cursor, report = run_failures.tick(cursor, [run], _sinks(receiver, lake), later, links=links)
    [note] = receiver.took[0]["notifications"]
    assert note["links"] == {"trace": expected}  # the webhook body
    [sent] = report.sent
    assert f"<{expected.replace('&', '&amp;')}|Run trace>" in slack_alert_text(sent, NOW)
    alert = AlertmanagerSink("http://127.0.0.1:9093").alert(sent, NOW)
    assert alert["annotations"]["trace_url"] == expected


@pytest.mark.servers
def test_without_a_trace_template_a_failed_run_carries_no_link(receiver, tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    run = run_failures.FailedRun(RUN_ID, "gpu_ingest_job", NOW - timedelta(minutes=5), "it failed", NOW)
    for links in (None, LinkTemplates(logs="https://grafana.test/logs?pod={pod}")):  # a logs one: no pod
        receiver.took.clear()
        _, report = run_failures.tick(
            run_failures.Cursor.load(None, NOW), [run], _sinks(receiver, lake), NOW, links=links
        )
        [note] = receiver.took[0]["notifications"]
        assert "links" not in note
        [sent] = report.sent
        assert sent.links == {} and "Run trace" not in slack_alert_text(sent, NOW)
        assert "trace_url" not in AlertmanagerSink("http://127.0.0.1:9093").alert(sent, NOW)["annotations"]


def test_a_run_that_never_started_links_from_its_failure():
    run = run_failures.FailedRun(RUN_ID, "gpu_ingest_job", NOW, "it failed")
    note = run_failures.notification(
        run, "http://dagster", LinkTemplates(trace="https://g/{from_ms}-{to_ms}")
    )
    assert note.links == {"trace": f"https://g/{_ms(NOW)}-{_ms(NOW)}"}
