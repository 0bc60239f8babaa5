"""Traces (OpenTelemetry): a Dagster run, each asset partition it builds, each request a source sends, and
each alert tick with one span per rule.

On when OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set: spans go out over
OTLP/HTTP protobuf from a background thread. OTEL_TRACES_EXPORTER=console prints them instead. Otherwise
tracing is off and every helper here returns at once, recording nothing. The OTel SDK reads its standard
OTEL_* variables itself (service name, headers, timeouts, sampler): the one exception to "lib/ never reads
the environment", since they are the SDK's own configuration.

A Dagster run id is a UUID: 128 bits, exactly an OTel trace id. So every step process of a run joins the
same trace without passing context, under a root span whose id is derived from the run id as well; the
run-trace sensor (defs/tracing.py) emits that root once the run has ended, with its real start and end.

Nothing here may block or fail a run: spans are exported in the background, a step flushes for at most
FLUSH_S, and every text attribute passes through lib/redact.scrub first.
"""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import quote, urlsplit

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from foxhunt_obs.lib.redact import redact_url, scrub

SERVICE = "foxhunt_obs"
FLUSH_S = 3.0  # the most a step waits at its end for its spans to leave (a collector down costs this)
MAX_TEXT = 4096  # longest text attribute kept (a long PromQL is cut, not dropped)
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
TIMEOUT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")

# Attribute names of OpenTelemetry's semantic conventions (HTTP client spans, stable:
# https://opentelemetry.io/docs/specs/semconv/http/http-spans/ ; AWS SDK spans:
# https://opentelemetry.io/docs/specs/semconv/cloud-providers/aws-sdk/ ; exceptions as span events:
# https://opentelemetry.io/docs/specs/semconv/exceptions/exceptions-spans/). The same strings are the
# constants of the opentelemetry-semantic-conventions package the SDK installs.
HTTP_METHOD = "http.request.method"
HTTP_STATUS = "http.response.status_code"
HTTP_RESEND_COUNT = "http.request.resend_count"  # retries: the conventions count resends
URL_FULL = "url.full"  # without credentials: the conventions forbid userinfo in it
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"
RPC_SYSTEM, RPC_SERVICE, RPC_METHOD = "rpc.system", "rpc.service", "rpc.method"
AWS_REQUEST_ID = "aws.request_id"
# Our own, where no convention applies (PromQL is no SQL database's query text)
SOURCE = "foxhunt.source"
QUERY = "foxhunt.query"
ROWS = "foxhunt.rows"
RESPONSE_BYTES = "foxhunt.response.bytes"  # the answer's bytes as read (after gzip; http.response.body.size
# is the compressed size, which requests does not show)

NO_SPAN = trace.INVALID_SPAN  # what a request gets when tracing is off: records nothing
CLIENT = SpanKind.CLIENT

_LOCK = threading.Lock()
_PROVIDER = None  # the SDK's TracerProvider once built; False once found off
_FORCED = threading.local()  # ids the next span of this thread must take (the run's root span)


def enabled() -> bool:
    """Whether spans are recorded at all (decided once per process, on first use)."""
    return bool(_provider())


def _provider():
    global _PROVIDER
    if _PROVIDER is None:
        with _LOCK:
            if _PROVIDER is None:
                _PROVIDER = _build() or False
    return _PROVIDER


def _build():
    otlp = any(os.environ.get(v) for v in ENDPOINT_VARIABLES)
    console = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "console"
    if not (otlp or console):
        return None
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    resource = Resource.create()  # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, read by the SDK
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: SERVICE}))
    provider = TracerProvider(resource=resource, id_generator=_RunIds())
    if otlp:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        # endpoint and headers: the SDK's OTEL_EXPORTER_OTLP_* variables. Its timeout (10 s by default) also
        # bounds the exit's last export, in every step process: FLUSH_S unless the user set one
        timeout_set = any(os.environ.get(v) for v in TIMEOUT_VARIABLES)
        exporter = OTLPSpanExporter(**({} if timeout_set else {"timeout": FLUSH_S}))
    else:
        exporter = ConsoleSpanExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def reset() -> None:
    """Flush and drop the provider, so the next span reads the variables again (tests)."""
    global _PROVIDER
    with _LOCK:
        if _PROVIDER:
            _PROVIDER.shutdown()
        _PROVIDER = None


def flush(timeout_s: float = FLUSH_S) -> bool:
    """Send what is buffered, waiting at most `timeout_s` (at a step's end: its process may exit next).
    The SDK's force_flush exports on the calling thread and does not honour its own timeout (a collector
    that accepts and never answers held it for the exporter's whole timeout), so it runs on a daemon
    thread that is waited for `timeout_s` and then left to finish or die with the process. False: not
    flushed in time."""
    provider = _provider()
    if not provider:
        return True
    worker = threading.Thread(target=provider.force_flush, name="foxhunt-trace-flush", daemon=True)
    worker.start()
    worker.join(timeout_s)
    return not worker.is_alive()


def tracer() -> trace.Tracer:
    provider = _provider()
    return provider.get_tracer("foxhunt_obs") if provider else trace.NoOpTracer()


# -- ids of a Dagster run's trace --------------------------------------------------------------------
def run_trace_id(run_id: str) -> int:
    """The run's trace id: its UUID's 128 bits (a run id that is no UUID is hashed to 128 bits)."""
    try:
        value = uuid.UUID(run_id).int
    except ValueError:
        value = int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:16], "big")
    return value or 1  # an all-zero trace id is invalid


def run_span_id(run_id: str) -> int:
    """The run's root span id: 64 bits of a hash of the run id, the same in every process."""
    return int.from_bytes(hashlib.sha256(f"run:{run_id}".encode()).digest()[:8], "big") or 1


def trace_hex(run_id: str) -> str:
    """The run's trace id as Tempo and Grafana write it: 32 lower-case hex digits."""
    return f"{run_trace_id(run_id):032x}"


def _run_context(run_id: str) -> otel_context.Context:
    """The run's root span as a remote parent. Sampled or not as the provider's sampler decides the root
    itself (emit_run_span, later, in another process): a trace-id-ratio sampler (OTEL_TRACES_SAMPLER)
    decides by the trace id, so every process of a run takes the same decision, and a run's steps are
    kept exactly when its root is."""
    trace_id = run_trace_id(run_id)
    decision = _provider().sampler.should_sample(None, trace_id, "run").decision
    flags = TraceFlags(TraceFlags.SAMPLED if decision.is_sampled() else TraceFlags.DEFAULT)
    parent = SpanContext(trace_id=trace_id, span_id=run_span_id(run_id), is_remote=True, trace_flags=flags)
    return trace.set_span_in_context(NonRecordingSpan(parent))


class _RunIds(RandomIdGenerator):
    """Random ids, except for the span a thread has asked `_FORCED` ids for: the run's root span."""

    def generate_span_id(self) -> int:
        return _FORCED.__dict__.pop("span_id", None) or super().generate_span_id()

    def generate_trace_id(self) -> int:
        return _FORCED.__dict__.pop("trace_id", None) or super().generate_trace_id()

    def is_trace_id_random(self) -> bool:
        return False  # a run's trace id is its run id: not the W3C random trace id


# -- spans -------------------------------------------------------------------------------------------
def clean(value: object) -> object:
    """An attribute value safe to send: text scrubbed of every configured secret and cut to MAX_TEXT."""
    if isinstance(value, str):
        return scrub(value)[:MAX_TEXT]
    if isinstance(value, (bool, int, float)):
        return value
    return scrub(str(value))[:MAX_TEXT]


def set_attributes(span: trace.Span, attributes: Mapping[str, object]) -> None:
    if span.is_recording():
        span.set_attributes({k: clean(v) for k, v in attributes.items() if v is not None})


def record_error(span: trace.Span, error: BaseException, error_type: str | None = None) -> None:
    """The error as the conventions' `exception` event and the span's status, its text scrubbed (the
    SDK's own record_exception would send the unscrubbed message and a stack trace)."""
    if not span.is_recording():
        return
    text = clean(str(error))
    kind = error_type or type(error).__name__
    span.add_event("exception", {"exception.type": kind, "exception.message": text})
    span.set_attribute(ERROR_TYPE, kind)
    span.set_status(Status(StatusCode.ERROR, str(text)[:500]))


@contextmanager
def span(
    name: str,
    attributes: Mapping[str, object] | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    parent: otel_context.Context | None = None,
) -> Iterator[trace.Span]:
    """A child of the current span (or of `parent`); an error leaving it is recorded, then re-raised."""
    if not enabled():
        yield trace.INVALID_SPAN
        return
    with tracer().start_as_current_span(
        name, context=parent, kind=kind, record_exception=False, set_status_on_exception=False
    ) as current:
        set_attributes(current, attributes or {})
        try:
            yield current
        except BaseException as e:
            record_error(current, e)
            raise


@contextmanager
def run_step_span(name: str, run_id: str | None, attributes: Mapping[str, object]) -> Iterator[trace.Span]:
    """A span of a Dagster step: in the run's trace, under its root span, when a run id is known."""
    parent = _run_context(run_id) if run_id and enabled() else None
    with span(name, {"dagster.run_id": run_id, **attributes}, parent=parent) as current:
        yield current


def emit_run_span(
    run_id: str,
    name: str,
    start_s: float,
    end_s: float,
    error: str | None = None,
    attributes: Mapping[str, object] | None = None,
) -> None:
    """The run's root span, with the run's own start and end (seconds since the epoch) and its ids
    derived from the run id, so the steps' spans (sent earlier, from other processes) hang under it."""
    if not enabled():
        return
    _FORCED.trace_id, _FORCED.span_id = run_trace_id(run_id), run_span_id(run_id)
    try:
        root = tracer().start_span(
            name, context=otel_context.Context(), kind=SpanKind.INTERNAL, start_time=int(start_s * 1e9)
        )
    finally:
        _FORCED.__dict__.clear()
    set_attributes(root, {"dagster.run_id": run_id, **(attributes or {})})
    if error is not None:
        root.set_status(Status(StatusCode.ERROR, str(clean(error))[:500]))
        root.add_event(
            "exception", {"exception.type": "DagsterRunFailure", "exception.message": clean(error)}
        )
    root.end(end_time=int(max(end_s, start_s) * 1e9))


def http_attributes(method: str, url: str) -> dict[str, object]:
    """The HTTP client conventions' request attributes of `url`, its credentials left out."""
    parts = urlsplit(url)
    default_port = {"http": 80, "https": 443}.get(parts.scheme)
    return {
        HTTP_METHOD: method,
        URL_FULL: redact_url(url),
        SERVER_ADDRESS: parts.hostname,
        SERVER_PORT: parts.port or default_port,
    }


# -- links to a pod's logs and a run's trace (Grafana Explore) ----------------------------------------
LOGS_LEAD = timedelta(minutes=15)  # a logs link opens this long before the alert began


@dataclass(frozen=True)
class LinkTemplates:
    """FOXHUNT_LOGS_URL_TEMPLATE and FOXHUNT_TRACE_URL_TEMPLATE: URLs with placeholders, each filled with
    its value URL-encoded ({namespace}, {pod}, {from_ms}, {to_ms}; {trace_id}). A Grafana Explore URL is
    /explore?schemaVersion=1&panes=<JSON, URL-encoded>&orgId=1, the panes JSON {"<id>": {"datasource":
    <uid>, "queries": [...], "range": {"from": <ms>, "to": <ms>}}} (Grafana's explore URL v1, parsed by
    public/app/features/explore/hooks/useStateSync/migrators/v1.ts in grafana/grafana). Empty: no link."""

    logs: str = ""
    trace: str = ""

    def pod_logs(self, labels: Mapping[str, str], start: datetime, end: datetime | None) -> dict[str, str]:
        """{"logs": url} for a series' namespace and pod over [start - LOGS_LEAD, end or now]; {} when
        no template or the labels name no pod."""
        namespace, pod = labels.get("namespace", ""), labels.get("pod", "")
        if not (self.logs and namespace and pod):
            return {}
        values = {"namespace": namespace, "pod": pod, **_range(start - LOGS_LEAD, end)}
        return {"logs": _fill(self.logs, values)}

    def logs_between(self, namespace: str, pod: str, start: datetime, end: datetime) -> dict[str, str]:
        """{"logs": url} for a pod's logs over exactly [start, end] (the weekly report's week); {} when no
        template or no namespace or pod."""
        if not (self.logs and namespace and pod):
            return {}
        return {"logs": _fill(self.logs, {"namespace": namespace, "pod": pod, **_range(start, end)})}

    def run_trace(self, run_id: str, start: datetime, end: datetime | None) -> dict[str, str]:
        """{"trace": url} for a Dagster run's trace (its id from the run id); {} when no template."""
        if not self.trace:
            return {}
        return {"trace": _fill(self.trace, {"trace_id": trace_hex(run_id), **_range(start, end)})}


def _range(start: datetime, end: datetime | None) -> dict[str, str]:
    ms = lambda t: str(int(t.timestamp() * 1000))  # noqa: E731
    return {"from_ms": ms(start), "to_ms": ms(end) if end is not None else "now"}


def _fill(template: str, values: Mapping[str, str]) -> str:
    """Each {name} (or its URL-encoded %7Bname%7D, in a template whose JSON was encoded whole) replaced."""
    for name, value in values.items():
        encoded = quote(str(value), safe="")
        for token in ("{" + name + "}", "%7B" + name + "%7D", "%7b" + name + "%7d"):
            template = template.replace(token, encoded)
    return template
