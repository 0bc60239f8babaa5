"""lib/tracing.py: run ids as trace ids, scrubbed attributes, tracing off, and the logs and trace links
(Grafana Explore's URL, v1: grafana/grafana public/app/features/explore/hooks/useStateSync/migrators/v1.ts)
as alerts and their sinks carry them."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone
from urllib.parse import parse_qs, quote, urlsplit

import pytest

from foxhunt_obs.lib import tracing
from foxhunt_obs.lib.alerts import state as alert_state
from foxhunt_obs.lib.alerts.engine import alert_page, notification
from foxhunt_obs.lib.alerts.rules import load_rules
from foxhunt_obs.lib.delivery.alert_sinks import AlertmanagerSink, notification_dict, slack_alert_text

GRAFANA = "https://grafana.example.com"
START = datetime(2026, 11, 16, 3, 0, tzinfo=timezone.utc)


def explore(pane: dict) -> str:
    """A Grafana Explore URL template: the panes JSON URL-encoded whole, placeholders included."""
    return f"{GRAFANA}/explore?schemaVersion=1&orgId=1&panes=" + quote(json.dumps({"a": pane}), safe="")


LOGS = explore(
    {
        "datasource": "loki",
        "queries": [
            {
                "refId": "A",
                "datasource": {"type": "loki", "uid": "loki"},
                "expr": '{namespace="{namespace}", pod="{pod}"}',
            }
        ],
        "range": {"from": "{from_ms}", "to": "{to_ms}"},
    }
)
TRACE = explore(
    {
        "datasource": "tempo",
        "queries": [
            {
                "refId": "A",
                "datasource": {"type": "tempo", "uid": "tempo"},
                "queryType": "traceql",
                "query": "{trace_id}",
            }
        ],
        "range": {"from": "{from_ms}", "to": "{to_ms}"},
    }
)


def pane(url: str) -> dict:
    """What Grafana reads back: the panes parameter, decoded, as JSON."""
    query = parse_qs(urlsplit(url).query)
    assert query["schemaVersion"] == ["1"]
    (only,) = json.loads(query["panes"][0]).values()
    return only


def test_a_run_id_is_its_trace_id_and_names_its_root_span_in_every_process():
    run_id = str(uuid.uuid4())
    assert tracing.trace_hex(run_id) == uuid.UUID(run_id).hex
    assert (
        tracing.run_span_id(run_id) == tracing.run_span_id(run_id) != tracing.run_span_id(str(uuid.uuid4()))
    )
    assert 0 < tracing.run_span_id(run_id) < 2**64
    assert len(tracing.trace_hex("not-a-uuid")) == 32  # hashed, still 128 bits


def test_attributes_lose_every_configured_secret(monkeypatch):
    monkeypatch.setenv("FOXHUNT_PROMETHEUS_BEARER_TOKEN", "s3cr3t-t0ken-value")
    assert tracing.clean("Bearer s3cr3t-t0ken-value at http://u:pw1234@h/x") == "Bearer *** at http://***@h/x"
    assert tracing.http_attributes("POST", "http://u:pw1234@prom:9090/api/v1/query") == {
        "http.request.method": "POST",
        "url.full": "http://***@prom:9090/api/v1/query",
        "server.address": "prom",
        "server.port": 9090,
    }
    assert tracing.http_attributes("GET", "https://mlflow.example.com/api")["server.port"] == 443


def test_tracing_off_records_nothing(monkeypatch):
    for name in (*tracing.ENDPOINT_VARIABLES, "OTEL_TRACES_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    tracing.reset()
    try:
        with tracing.span("x", {"a": 1}) as span:
            assert span is tracing.NO_SPAN and not span.is_recording()
        with pytest.raises(ValueError), tracing.run_step_span("y", str(uuid.uuid4()), {}):
            raise ValueError("passes through untouched")
        tracing.emit_run_span(str(uuid.uuid4()), "run", 0, 1)
        tracing.flush()
        assert not tracing.enabled() and tracing._PROVIDER is False
    finally:
        tracing.reset()


def test_logs_link_opens_loki_on_the_pod_from_before_the_alert():
    links = tracing.LinkTemplates(logs=LOGS)
    end = START + timedelta(minutes=40)
    (url,) = links.pod_logs({"namespace": "training", "pod": "ppo-7f9c-0", "gpu": "3"}, START, end).values()
    p = pane(url)
    assert p["queries"][0]["expr"] == '{namespace="training", pod="ppo-7f9c-0"}'
    assert p["range"] == {
        "from": str(int((START - timedelta(minutes=15)).timestamp() * 1000)),
        "to": str(int(end.timestamp() * 1000)),
    }
    firing = pane(links.pod_logs({"namespace": "training", "pod": "ppo-7f9c-0"}, START, None)["logs"])
    assert firing["range"]["to"] == "now"


def test_trace_link_opens_tempo_on_the_runs_trace_id():
    run_id = str(uuid.uuid4())
    url = tracing.LinkTemplates(trace=TRACE).run_trace(run_id, START, START + timedelta(minutes=5))["trace"]
    assert pane(url)["queries"][0]["query"] == uuid.UUID(run_id).hex


def test_placeholders_in_a_plain_template_are_filled_url_encoded():
    links = tracing.LinkTemplates(
        logs="https://logs.example/q?ns={namespace}&pod={pod}&from={from_ms}&to={to_ms}"
    )
    url = links.pod_logs({"namespace": "a b", "pod": "p&q"}, START, None)["logs"]
    assert parse_qs(urlsplit(url).query) == {
        "ns": ["a b"],
        "pod": ["p&q"],
        "from": [str(int((START - timedelta(minutes=15)).timestamp() * 1000))],
        "to": ["now"],
    }


def test_no_template_or_no_pod_no_link():
    assert tracing.LinkTemplates().pod_logs({"namespace": "n", "pod": "p"}, START, None) == {}
    assert tracing.LinkTemplates(logs=LOGS).pod_logs({"node": "gpu-node-1"}, START, None) == {}
    assert tracing.LinkTemplates().run_trace(str(uuid.uuid4()), START, None) == {}


def _alert(links: tracing.LinkTemplates | None):
    rule = load_rules()[0]
    t = alert_state.Transition(
        "firing", "fp1", rule.id, {"namespace": "training", "pod": "ppo-0", "gpu": "1"}, 91.0, START, None, {}
    )
    return notification(rule, t, alert_page("http://dagster:3000"), links)


def test_alerts_carry_the_logs_link_to_every_sink_when_set():
    n = _alert(tracing.LinkTemplates(logs=LOGS, trace=TRACE))
    assert set(n.links) == {"logs"}  # a rule's alert is about a pod, not a run
    assert (
        pane(notification_dict(n)["links"]["logs"])["queries"][0]["expr"]
        == '{namespace="training", pod="ppo-0"}'
    )
    am = AlertmanagerSink("http://alertmanager:9093").alert(n)
    assert am["annotations"]["logs_url"] == n.links["logs"]
    assert "|Pod logs>" in slack_alert_text(n, START) and n.links["logs"].replace(
        "&", "&amp;"
    ) in slack_alert_text(n, START)


def test_alerts_carry_nothing_when_unset():
    n = _alert(None)
    assert n.links == {} and "links" not in notification_dict(n)
    assert not [
        k for k in AlertmanagerSink("http://alertmanager:9093").alert(n)["annotations"] if k.endswith("_url")
    ]
    assert "Pod logs" not in slack_alert_text(n, START)


def test_every_boto3_call_is_a_span_after_the_aws_sdk_conventions(moto_s3, monkeypatch):
    """A real moto server: a call that answers and one that fails, as OTLP spans a real receiver decodes."""
    from botocore.exceptions import ClientError

    from foxhunt_obs.lib.sources.aws import AwsConfig
    from foxhunt_obs_tests.otlp_receiver import OtlpReceiver

    url, _ = moto_s3
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        tracing.reset()
        try:
            s3 = AwsConfig(
                region_name="us-east-1",
                aws_access_key_id="AKIDTEST",
                aws_secret_access_key="aws-secret-9f8e7d6c",
            ).client("s3")
            s3.create_bucket(Bucket="lake")
            # moto's backend is per process: other tests' buckets are listed too
            buckets = len(s3.list_buckets()["Buckets"])
            assert buckets >= 1
            with pytest.raises(ClientError):
                s3.head_bucket(Bucket="no-such-bucket")
            tracing.flush()
        finally:
            tracing.reset()
    spans = {s["name"]: s for s in receiver.spans}
    listed = spans["S3.ListBuckets"]["attributes"]
    assert (
        listed["rpc.system"] == "aws-api"
        and listed["rpc.service"] == "S3"
        and listed["rpc.method"] == "ListBuckets"
    )
    assert listed["http.response.status_code"] == 200 and listed["foxhunt.rows"] == buckets
    assert listed["server.address"] == "127.0.0.1" and listed["aws.request_id"]
    failed = spans["S3.HeadBucket"]
    assert failed["status"] == 2 and failed["attributes"]["http.response.status_code"] == 404
    assert failed["events"][0]["name"] == "exception"
    assert "aws-secret-9f8e7d6c" not in json.dumps(receiver.spans)


@pytest.mark.servers
def test_a_flush_against_a_collector_that_never_answers_waits_at_most_flush_s(monkeypatch):
    """A collector that accepts connections and never answers: the SDK's own force_flush held the step for
    the exporter's whole timeout (10 s, retries included); ours gives up after FLUSH_S and the span stays
    with the background exporter."""
    import socket
    import time

    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(16)  # accepts (the kernel's backlog), never reads nor answers
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{hole.getsockname()[1]}")
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_TIMEOUT", raising=False)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")  # only the flush sends
        tracing.reset()
        with tracing.span("held"):
            pass
        t0 = time.monotonic()
        done = tracing.flush(timeout_s=1.0)
        waited = time.monotonic() - t0
        assert not done and 0.9 <= waited < 2.0, waited
    finally:
        hole.close()
        tracing._PROVIDER = None  # its exporter is stuck on the closed socket: dropped, not shut down


def test_a_runs_steps_follow_the_samplers_decision_for_the_run(monkeypatch):
    """OTEL_TRACES_SAMPLER: a run's steps are recorded exactly when its root would be (the same decision,
    from the trace id, in every process)."""
    run_id = str(uuid.uuid4())
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    for ratio, recorded in (("0", False), ("1", True)):
        monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", ratio)
        tracing.reset()
        with tracing.run_step_span("materialize x", run_id, {"dagster.asset": "x"}) as step:
            assert step.is_recording() is recorded, ratio
    tracing.reset()
