"""One OpenTelemetry span per fold, when OpenTelemetry is there.

The span goes to whatever tracer provider the process has. When none is configured and
OTEL_EXPORTER_OTLP_ENDPOINT is set, one is set up here: the SDK's TracerProvider (its Resource reads
OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES) with a batch OTLP exporter for the protocol that
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL / OTEL_EXPORTER_OTLP_PROTOCOL names, `http/protobuf` when unset (the
OTLP exporter spec's default: opentelemetry.io/docs/specs/otel/protocol/exporter/). Without the API, the
SDK or that protocol's exporter package: one log line, no spans, never an error.
"""

from __future__ import annotations

import logging
import os

from .redact import redact_uri

log = logging.getLogger(__name__)
TRACER_NAME = "foxhunt_gpu_exporter.training"
SPAN_NAME = "training.fold"

_EXPORTERS = {  # OTLP protocol -> the module of its span exporter (opentelemetry-exporter-otlp-proto-*)
    "grpc": "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
    "http/protobuf": "opentelemetry.exporter.otlp.proto.http.trace_exporter",
}


def tracer_from_env(provider=None):
    """A tracer for fold spans, or None (said once in the log) when tracing is off or impossible."""
    try:
        from opentelemetry import trace
    except ImportError:
        if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            log.warning(
                "OTEL_EXPORTER_OTLP_ENDPOINT is set but opentelemetry-api is not installed: no fold spans"
            )
        return None
    if provider is not None:
        return provider.get_tracer(TRACER_NAME)
    if _configured(trace.get_tracer_provider()):
        return trace.get_tracer(TRACER_NAME)
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        log.info("OTEL_EXPORTER_OTLP_ENDPOINT not set and no tracer provider configured: no fold spans")
        return None
    provider = _otlp_provider()
    if provider is None:
        return None
    trace.set_tracer_provider(provider)
    return trace.get_tracer(TRACER_NAME)


def _configured(provider) -> bool:
    """Whether the process has a real provider (the API's default is a proxy that records nothing)."""
    from opentelemetry import trace

    return not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def _otlp_provider():
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()  # fmt: skip
    module = _EXPORTERS.get(protocol)
    if module is None:
        log.warning("OTLP protocol %r is not one of %s: no fold spans", protocol, sorted(_EXPORTERS))
        return None
    try:
        import importlib

        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        # endpoint, headers and timeout come from the OTEL_EXPORTER_OTLP_* variables
        exporter = importlib.import_module(module).OTLPSpanExporter()
    except ImportError as e:
        log.warning(
            "OTLP over %s needs opentelemetry-sdk and its exporter package (%s): no fold spans", protocol, e
        )
        return None
    provider = TracerProvider(resource=Resource.create())
    provider.add_span_processor(BatchSpanProcessor(exporter))
    log.info(
        "fold spans over OTLP (%s) to %s", protocol, redact_uri(os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"])
    )
    return provider
