"""One OpenTelemetry span per fold: in memory (the SDK's InMemorySpanExporter), and over the wire as OTLP/HTTP
protobuf to a receiver decoding the OTLP trace service's own request message."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading

import pytest
from foxhunt_gpu_exporter import training
from foxhunt_gpu_exporter.training.redact import scrub
from foxhunt_gpu_exporter.training.spans import SPAN_NAME, tracer_from_env

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import StatusCode  # noqa: E402


def test_one_span_per_fold_with_its_figures_and_an_error_status_when_it_raises():
    exporter = InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    t = training.Telemetry(mlflow=None, tracer=tracer_from_env(provider))
    with t.fold("ppo-policy", 0, epochs=2) as f:
        for epoch, loss in enumerate((0.8, 0.5)):
            f.epoch_started(epoch)
            f.batch(0.1)
            f.epoch_ended(loss)
        f.evaluated(0.55)
    with pytest.raises(ValueError, match="bad batch"), t.fold("ppo-policy", 1, epochs=2) as f:
        f.epoch_started(0)
        raise ValueError("bad batch")

    ok, failed = exporter.get_finished_spans()
    assert ok.name == failed.name == SPAN_NAME
    assert dict(ok.attributes) == {
        "training.model": "ppo-policy", "training.fold": "0", "training.epochs": 2, "training.workers": 1,
        "training.rank": 0, "training.epochs_completed": 2, "training.batches": 2, "training.nan_detected": 0,
        "training.epoch_loss": 0.5, "training.validation_loss": 0.55,
    }  # fmt: skip
    assert ok.status.status_code == StatusCode.UNSET
    assert failed.attributes["training.fold"] == "1" and failed.attributes["training.epochs_completed"] == 0
    assert failed.status.status_code == StatusCode.ERROR and "bad batch" in failed.status.description
    assert [e.name for e in failed.events] == ["exception"]


def in_memory():
    exporter = InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, provider


# A presigned S3 URL with the query parameters AWS documents (X-Amz-Credential, X-Amz-Signature, and
# X-Amz-Security-Token with temporary credentials: docs.aws.amazon.com/AmazonS3/latest/API/
# sigv4-query-string-auth.html); the values are made up here.
ACCESS_KEY, SIGNATURE, SESSION_TOKEN = (
    "AKIAFOXHUNTEXAMPLE7Q",
    "9f3c2b1a0d4e5f6a7b8c9d0e1f2a3b4c",
    "FwoGZXIvYXdzEXAMPLE",
)
PRESIGNED = (
    "https://ckpt.s3.amazonaws.com/ppo/fold-1.pt?X-Amz-Algorithm=AWS4-HMAC-SHA256"
    f"&X-Amz-Credential={ACCESS_KEY}%2F20250101%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20250101T000000Z"
    f"&X-Amz-Expires=3600&X-Amz-Security-Token={SESSION_TOKEN}&X-Amz-SignedHeaders=host"
    f"&X-Amz-Signature={SIGNATURE}"
)


class CheckpointUploadError(Exception):
    pass


def test_an_error_s_secrets_never_reach_the_span():
    exporter, provider = in_memory()
    t = training.Telemetry(mlflow=None, tracer=tracer_from_env(provider))
    message = f"PUT {PRESIGNED} failed: 403; run logged to http://alice:hunter2-pw@mlflow.internal:5000/api"
    with pytest.raises(CheckpointUploadError), t.fold("ppo-policy", 1, epochs=2):
        raise CheckpointUploadError(message)

    (span,) = exporter.get_finished_spans()
    everything = span.to_json()  # attributes, events, status: all the span would send
    for secret in (ACCESS_KEY, SIGNATURE, SESSION_TOKEN, "hunter2-pw", "alice"):
        assert secret not in everything, secret
    (event,) = span.events
    assert event.name == "exception"
    assert dict(event.attributes) == {
        "exception.type": f"{__name__}.CheckpointUploadError",
        "exception.message": (
            "PUT https://ckpt.s3.amazonaws.com/ppo/fold-1.pt?X-Amz-Algorithm=AWS4-HMAC-SHA256"
            "&X-Amz-Credential=***&X-Amz-Date=20250101T000000Z&X-Amz-Expires=3600&X-Amz-Security-Token=***"
            "&X-Amz-SignedHeaders=host&X-Amz-Signature=*** failed: 403; run logged to "
            "http://***@mlflow.internal:5000/api"
        ),
    }  # no exception.stacktrace: a stack's frames may hold the same URL
    assert span.status.status_code == StatusCode.ERROR
    assert span.status.description == f"CheckpointUploadError: {event.attributes['exception.message']}"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("http://bob:p@ss@mlflow:5000/api", "http://***@mlflow:5000/api"),  # a password holding @
        ("GET https://acct.blob.core.windows.net/c/f.pt?sv=2022-11-02&sig=abc%2Bdef failed",
         "GET https://acct.blob.core.windows.net/c/f.pt?sv=2022-11-02&sig=*** failed"),
        ("https://h/x?access_token=zzz&page=2#top", "https://h/x?access_token=***&page=2#top"),
        ("header Authorization: Bearer eyJhbGciOi.eyJzdWIi.c2ln", "header Authorization: Bearer ***"),
        ("no such file: /ckpt/step-100/model.pt", "no such file: /ckpt/step-100/model.pt"),  # left alone
    ],
)  # fmt: skip
def test_scrub_masks_credentials_and_keeps_the_rest(text, shown):
    assert scrub(text) == shown


def test_the_span_is_current_only_inside_with_and_start_end_may_run_on_two_threads(caplog):
    from opentelemetry import trace

    exporter, provider = in_memory()
    tracer = tracer_from_env(provider)
    t = training.Telemetry(mlflow=None, tracer=tracer)
    fold = t.fold("ppo-policy", 0, epochs=1).start()
    assert trace.get_current_span() is trace.INVALID_SPAN  # start() attaches nothing to this thread
    with caplog.at_level(logging.ERROR, logger="opentelemetry.context"):
        ender = threading.Thread(target=fold.end)
        ender.start()
        ender.join()
    assert "Failed to detach context" not in caplog.text
    assert [s.name for s in exporter.get_finished_spans()] == [SPAN_NAME]
    assert trace.get_current_span() is trace.INVALID_SPAN

    with t.fold("ppo-policy", 1, epochs=1), tracer.start_as_current_span("optimizer.step"):
        pass  # the trainer's own span, inside the fold's block
    assert trace.get_current_span() is trace.INVALID_SPAN  # nothing left attached after the block
    step, fold_1 = exporter.get_finished_spans()[1:]
    assert fold_1.attributes["training.fold"] == "1"
    assert step.parent is not None and step.parent.span_id == fold_1.context.span_id


def test_no_endpoint_no_provider_no_spans(monkeypatch, caplog):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    with caplog.at_level(logging.INFO, logger="foxhunt_gpu_exporter.training.spans"):
        assert tracer_from_env() is None
    assert "no fold spans" in caplog.text


def test_an_unavailable_protocol_is_said_once_and_gives_no_spans(monkeypatch, caplog):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")  # a protocol the library does not speak
    with caplog.at_level(logging.WARNING, logger="foxhunt_gpu_exporter.training.spans"):
        assert tracer_from_env() is None
    assert "'http/json'" in caplog.text and "no fold spans" in caplog.text


TRAINER = """
from foxhunt_gpu_exporter import training
t = training.start(port=None, gpu_interval=None)
for fold in range(2):
    with t.fold("ppo-policy", fold, epochs=1) as f:
        f.epoch_started(0)
        f.epoch_ended(0.25 * (fold + 1))
"""


@pytest.mark.servers
def test_fold_spans_reach_an_otlp_http_receiver_in_the_wire_format(tmp_path):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    # the repo's receiver: it takes only POST /v1/traces as application/x-protobuf, decoded with
    # opentelemetry-proto's ExportTraceServiceRequest
    otlp = pytest.importorskip("foxhunt_obs_tests.otlp_receiver")
    with otlp.OtlpReceiver() as receiver:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MLFLOW_"))}
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, OTEL_SERVICE_NAME="foxhunt-trainer-test")
        r = subprocess.run(
            [sys.executable, "-c", TRAINER], env=env, capture_output=True, text=True, timeout=60
        )
    assert r.returncode == 0, r.stderr[-2000:]
    assert receiver.requests, f"no OTLP request arrived; trainer log:\n{r.stderr[-2000:]}"
    spans = receiver.spans
    assert {s["resource"]["service.name"] for s in spans} == {"foxhunt-trainer-test"}
    assert [s["name"] for s in spans] == [SPAN_NAME, SPAN_NAME]
    folds = {s["attributes"]["training.fold"]: s["attributes"]["training.epoch_loss"] for s in spans}
    assert folds == {"0": 0.25, "1": 0.5}
