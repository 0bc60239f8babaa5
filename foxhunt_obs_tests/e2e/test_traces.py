"""Traces end to end: a real Dagster materialization of gpu_samples against a real Prometheus, exported
over OTLP/HTTP to a receiver that decodes the real protobuf (opentelemetry-proto). The span tree is the
run, the asset partition under it, each Prometheus request under that; a failing source is an error
event; no configured secret appears in any attribute, event or status."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import dagster as dg
import pytest

from foxhunt_obs.defs.gpu.assets import gpu_samples
from foxhunt_obs.defs.resources import ClusterResource, LakeResource, PrometheusResource
from foxhunt_obs.defs.tracing import run_trace_sensor
from foxhunt_obs.lib import tracing
from foxhunt_obs_tests.otlp_receiver import OtlpReceiver

TOKEN = "prom-bearer-6f1d2c9a8b7e"
PASSWORD = "url-pass-91ab37cd"
STATUS_ERROR = 2  # opentelemetry.proto.trace.v1.Status.STATUS_CODE_ERROR
KIND_CLIENT = 3  # Span.SPAN_KIND_CLIENT


@pytest.fixture
def receiver(monkeypatch):
    with OtlpReceiver() as r:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", r.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")
        tracing.reset()
        yield r
        tracing.reset()


def _materialize(small, tmp_path, url: str, timeout_s: str = "120"):
    instance = dg.DagsterInstance.ephemeral()
    partition = (small.start + timedelta(hours=1)).strftime("%Y-%m-%d-%H:%M")
    result = dg.materialize(
        [gpu_samples],
        partition_key=partition,
        instance=instance,
        raise_on_error=False,
        resources={
            "lake": LakeResource(root=str(tmp_path / "lake")),
            "prometheus": PrometheusResource(url=url, bearer_token=TOKEN, timeout_s=timeout_s),
            "cluster": ClusterResource(),
        },
    )
    # the root span, as the run-trace sensor sends it once the run has ended
    run_trace_sensor(dg.build_sensor_context(instance=instance))
    tracing.flush()
    return result, partition


def _with_password(url: str) -> str:
    return url.replace("http://", f"http://reader:{PASSWORD}@")


def _no_secret(spans: list[dict]) -> None:
    text = json.dumps(spans)
    assert TOKEN not in text and PASSWORD not in text


def test_a_materialization_is_one_trace_run_partition_requests(small, prometheus, tmp_path, receiver):
    result, partition = _materialize(small, tmp_path, _with_password(prometheus.url))
    assert result.success
    trace_id = tracing.trace_hex(result.run_id)
    spans = [s for s in receiver.spans if s["trace_id"] == trace_id]
    by_id = {s["span_id"]: s for s in spans}

    (run,) = [s for s in spans if not s["parent"]]
    assert run["name"] == "run __ephemeral_asset_job__"
    assert run["span_id"] == f"{tracing.run_span_id(result.run_id):016x}"
    assert run["attributes"]["dagster.status"] == "SUCCESS" and run["status"] != STATUS_ERROR
    assert run["resource"]["service.name"] == "foxhunt_obs"

    (step,) = [s for s in spans if s["name"] == "materialize gpu_samples"]
    assert step["parent"] == run["span_id"]
    assert step["attributes"]["dagster.partition"] == partition
    assert step["attributes"]["dagster.run_id"] == result.run_id
    assert run["start"] <= step["start"] <= step["end"] <= run["end"]

    requests = [s for s in spans if s["attributes"].get("foxhunt.source") == "prometheus"]
    assert requests and all(by_id[s["parent"]] is step for s in requests)
    ranges = [s for s in requests if s["name"] == "POST /api/v1/query_range"]
    assert ranges, [s["name"] for s in requests]
    host, port = prometheus.url.removeprefix("http://").split(":")
    for s in ranges:
        a = s["attributes"]
        assert s["kind"] == KIND_CLIENT
        assert a["http.request.method"] == "POST" and a["http.response.status_code"] == 200
        assert a["url.full"] == f"http://***@{host}:{port}/api/v1/query_range"
        assert a["server.address"] == host and a["server.port"] == int(port)
        assert a["foxhunt.query"] and a["foxhunt.response.bytes"] > 0
        assert s["end"] > s["start"]
    # rows are the points parsed: a DCGM util series has one per 15 s step of the hour
    (util,) = [
        s
        for s in ranges
        if s["attributes"]["foxhunt.query"].startswith("last_over_time(DCGM_FI_DEV_GPU_UTIL[")
    ]
    assert util["attributes"]["foxhunt.series"] > 0
    assert util["attributes"]["foxhunt.rows"] == util["attributes"]["foxhunt.series"] * 240
    # the step's summary numbers are the materialization's metadata
    (materialized,) = result.asset_materializations_for_node("gpu_samples")
    rows = materialized.metadata["dagster/row_count"].value
    assert step["attributes"]["foxhunt.summary.dagster/row_count"] == rows > 0
    _no_secret(receiver.spans)


def test_a_failing_source_is_an_error_event_on_its_request_step_and_run(small, tmp_path, receiver):
    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    result, _ = _materialize(small, tmp_path, _with_password(dead), timeout_s="1")
    assert not result.success
    spans = [s for s in receiver.spans if s["trace_id"] == tracing.trace_hex(result.run_id)]
    request = next(s for s in spans if s["attributes"].get("foxhunt.source") == "prometheus")
    assert request["status"] == STATUS_ERROR
    (event,) = [e for e in request["events"] if e["name"] == "exception"]
    assert event["exception.type"] == "PrometheusError" and "cannot connect" in event["exception.message"]
    step = next(s for s in spans if s["name"] == "materialize gpu_samples")
    assert step["status"] == STATUS_ERROR and step["events"][0]["exception.type"] == "PrometheusError"
    run = next(s for s in spans if not s["parent"])
    assert run["status"] == STATUS_ERROR and run["attributes"]["dagster.status"] == "FAILURE"
    _no_secret(receiver.spans)


def test_tracing_off_sends_nothing_and_costs_nothing(small, prometheus, tmp_path, monkeypatch):
    with OtlpReceiver() as r:
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
        tracing.reset()
        result, _ = _materialize(small, tmp_path, prometheus.url)
        assert result.success and not tracing.enabled()
        skipped = run_trace_sensor(dg.build_sensor_context(instance=dg.DagsterInstance.ephemeral()))
        assert "tracing is off" in skipped.skip_message
        assert r.requests == 0
    tracing.reset()


def test_the_first_sensor_tick_covers_the_last_hour_then_its_cursor(receiver):
    """The sensor's cursor moves past the runs it sent: the next tick sends none again."""
    instance = dg.DagsterInstance.ephemeral()
    dg.materialize([_noop], instance=instance)
    context = dg.build_sensor_context(instance=instance)
    first = run_trace_sensor(context)
    assert first.skip_message == "1 run traces ended"
    again = run_trace_sensor(dg.build_sensor_context(instance=instance, cursor=context.cursor))
    assert again.skip_message == "0 run traces ended"
    cursor = json.loads(context.cursor)
    assert datetime.fromtimestamp(cursor["after"], timezone.utc) > datetime.now(timezone.utc) - timedelta(
        minutes=5
    )
    # a tag added after the run ended (a retry's) moves its update time: it is not sent again
    (run,) = instance.get_runs()
    instance.add_run_tags(run.run_id, {"dagster/will_retry": "false"})
    third = run_trace_sensor(dg.build_sensor_context(instance=instance, cursor=context.cursor))
    assert third.skip_message == "0 run traces ended"
    assert len([s for s in receiver.spans if s["name"].startswith("run ")]) == 1


def test_a_run_committed_behind_the_cursor_is_still_sent(receiver):
    """A run's update time is stamped by its own process and committed later: a run that lands behind a
    cursor another run already moved past is read again within the overlap, and sent once."""
    instance = dg.DagsterInstance.ephemeral()
    dg.materialize([_noop], instance=instance)
    ahead = datetime.now(timezone.utc) + timedelta(minutes=2)  # a later run's update, already seen
    cursor = json.dumps({"after": ahead.timestamp(), "sent": {}})
    context = dg.build_sensor_context(instance=instance, cursor=cursor)
    assert run_trace_sensor(context).skip_message == "1 run traces ended"
    again = run_trace_sensor(dg.build_sensor_context(instance=instance, cursor=context.cursor))
    assert again.skip_message == "0 run traces ended"


@dg.asset
def _noop() -> None:
    return None


def test_an_alert_tick_is_a_span_with_one_child_per_rule(small, prometheus, receiver):
    """The Prometheus rules evaluated against the small scenario: the tick's span, one child per rule,
    each rule's instant query under it; a source that cannot be read is an event of the tick."""
    from foxhunt_obs.lib.alerts.collect import Sources
    from foxhunt_obs.lib.alerts.engine import tick
    from foxhunt_obs.lib.alerts.rules import load_rules
    from foxhunt_obs.lib.sources.mlflow import MlflowSource
    from foxhunt_obs.lib.sources.prometheus import PrometheusClient

    rules = [r for r in load_rules() if r.enabled and r.source in ("prometheus", "mlflow")]
    wanted = sorted(r.id for r in rules if r.source == "prometheus")
    sources = Sources(
        prometheus=PrometheusClient(_with_password(prometheus.url), bearer_token=TOKEN),
        mlflow=MlflowSource("http://127.0.0.1:9", timeout_s=1, retries=1),  # down: not evaluated
    )
    _, report = tick(rules, sources, [], None, small.start + timedelta(hours=3), source_budget_s=20)
    tracing.flush()
    assert sorted(report.evaluated) == wanted and "mlflow" in report.source_errors

    (root,) = [s for s in receiver.spans if s["name"] == "alert tick"]
    spans = [s for s in receiver.spans if s["trace_id"] == root["trace_id"]]
    children = [s for s in spans if s["parent"] == root["span_id"]]
    rule_spans = {
        s["attributes"]["foxhunt.alert.rule"]: s for s in children if s["name"].startswith("alert rule")
    }
    assert sorted(rule_spans) == wanted
    assert root["attributes"]["foxhunt.alert.rules_evaluated"] == len(wanted)
    for rule_id, span in rule_spans.items():
        queries = [s for s in spans if s["parent"] == span["span_id"]]
        assert queries and all(q["name"] == "POST /api/v1/query" for q in queries), rule_id
        assert queries[0]["attributes"]["foxhunt.purpose"] == f"alert rule {rule_id}"
    assert sum(s["attributes"]["foxhunt.alert.findings"] for s in rule_spans.values()) == report.findings
    (event,) = [e for e in root["events"] if e["name"] == "source not evaluated"]
    assert event["foxhunt.source"] == "mlflow"
    mlflow = next(s for s in children if s["name"] == "alert source mlflow")
    assert mlflow["status"] == STATUS_ERROR
    _no_secret(receiver.spans)
