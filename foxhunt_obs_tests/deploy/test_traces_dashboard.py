"""The traces dashboard (deploy/grafana/traces.json) and the fleet board's trace-health
row: the Tempo panels' queries as Grafana's Tempo data source sends them, and the figures the span-metrics
and service-graph panels compute from test_dashboards.py's synthetic history, against its known counts.

Where no Tempo can run here, the Tempo queries are checked for what Grafana needs (their data source, query
type and fields, from grafana/grafana public/app/plugins/datasource/tempo/dataquery.cue) and for TraceQL's
spanset syntax (grafana/tempo docs/sources/tempo/traceql/construct-traceql-queries.md); the service map's
own PromQL is run against the real Prometheus, built as the data source builds it from serviceMapQuery."""

from __future__ import annotations

import re

import pytest

from foxhunt_obs_tests.deploy.test_dashboards import (
    EDGES,
    FLEET,
    SPANS,
    SPANS_RECEIVED,
    STEP,
    TEMPO_DS,
    TRACES,
    VARIABLES,
    _query,
    load,
    panels,
    prometheus,  # noqa: F401  (the fixture: a real Prometheus holding the synthetic history)
    substitute,
    variables,
)

ALL_SERVICES = {**VARIABLES, "service": ".*"}  # the "All" choice: the variable's allValue

# What the Tempo data source asks its linked Prometheus for a service map (makePromServiceMapRequest in
# grafana/grafana public/app/plugins/datasource/tempo/datasource.ts; the metrics: serviceMapMetrics in
# graphTransform.ts): per metric, the rate per edge over the range and the edges' connection types, the
# panel's serviceMapQuery appended to the metric name as its label selector.
SERVICE_MAP_METRICS = (
    "traces_service_graph_request_server_seconds_sum",
    "traces_service_graph_request_total",
    "traces_service_graph_request_failed_total",
    "traces_service_graph_request_server_seconds_bucket",
)


def service_map_queries(selector: str, time_range: str = "30m") -> dict[str, tuple[str, str]]:
    """Per metric: (the rate per edge over $__range, the edges' connection types). The range is within the
    synthetic history's 40 minutes, so the rate is exact."""
    return {
        m: (
            f"sum by (client, server) (rate({m}{selector}[{time_range}]))",
            f"group by (client, connection_type, server) ({m}{selector})",
        )
        for m in SERVICE_MAP_METRICS
    }


def _tempo_panels(board: dict) -> list[dict]:
    return [p for p in panels(board) if p.get("datasource") == TEMPO_DS]


def _value(server, expr: str) -> dict[tuple, float]:
    """An instant query's answer as {label values (sorted by name): value}."""
    result, why = _query(server, expr)
    assert result is not None, f"{expr} -> {why}"
    return {tuple(v for _, v in sorted(s["metric"].items())): float(s["value"][1]) for s in result}


def _expr(board: dict, title: str, ref: str = "A") -> str:
    [panel] = [p for p in panels(board) if p["title"] == title]
    return next(t["expr"] for t in panel["targets"] if t["refId"] == ref)


# ---------------------------------------------------------------- the Tempo panels' structure

TRACEQL_FIELD = r"(?:resource|span)\.[A-Za-z_][\w.]*|status|name|duration|kind"
TRACEQL_VALUE = r'"(?:[^"\\]|\\.)*"|error|ok|unset|\d+(?:\.\d+)?(?:ns|us|ms|s|m|h)?'
TRACEQL_CONDITION = rf"\s*(?:{TRACEQL_FIELD})\s*(?:=~|!~|!=|>=|<=|=|>|<)\s*(?:{TRACEQL_VALUE})\s*"
TRACEQL_SPANSET = re.compile(rf"\{{{TRACEQL_CONDITION}(?:(?:&&|\|\|){TRACEQL_CONDITION})*\}}")


def test_traceql_check_accepts_the_docs_examples_and_rejects_mistakes():
    """The spanset check below is only worth something if it can fail."""
    for good in (
        '{resource.service.name = "frontend" && name = "POST /api/orders"}',
        '{resource.service.name="frontend" && status = error}',
        '{ span.http.request.header.Accept =~ "application.*" }',
        "{duration > 2s}",
    ):
        assert TRACEQL_SPANSET.fullmatch(good), good
    for bad in (
        '{resource.service.name = "frontend"',  # unclosed
        '{service.name = "frontend"}',  # unscoped attributes take a leading dot, this is neither
        '{resource.service.name == "frontend"}',  # no == in TraceQL
        "{resource.service.name = frontend}",  # an unquoted string
        '{resource.service.name = "a" and status = error}',  # && not and
    ):
        assert not TRACEQL_SPANSET.fullmatch(bad), bad


def test_traces_dashboard_picks_prometheus_and_tempo_through_variables():
    v = variables(load(TRACES))
    assert v["datasource"]["type"] == "datasource" and v["datasource"]["query"] == "prometheus"
    assert v["tempo"]["type"] == "datasource" and v["tempo"]["query"] == "tempo"
    service = v["service"]
    assert service["definition"] == "label_values(traces_spanmetrics_calls_total, service)"
    assert service["current"]["value"] == "foxhunt_obs" and service["allValue"] == ".*"
    # single-valued: the Tempo data source fills serviceMapQuery and TraceQL with the plain value
    assert service["multi"] is False


def test_trace_search_panels_are_well_formed_traceql():
    searches = [p for p in _tempo_panels(load(TRACES)) if p["type"] == "table"]
    assert len(searches) == 2
    for p in searches:
        [t] = p["targets"]
        assert t["queryType"] == "traceql" and t["tableType"] == "traces" and t["limit"] > 0, p["title"]
        query = substitute(t["query"])
        assert TRACEQL_SPANSET.fullmatch(query), f"{p['title']}: not a TraceQL spanset filter: {query}"
        assert 'resource.service.name=~"foxhunt_obs"' in query
    failed = next(p for p in searches if p["title"].startswith("Failed"))
    assert "status = error" in failed["targets"][0]["query"]


def test_service_graph_panel_is_tempo_service_map(prometheus):  # noqa: F811
    [graph] = [p for p in _tempo_panels(load(TRACES)) if p["type"] == "nodeGraph"]
    [t] = graph["targets"]
    assert t["queryType"] == "serviceMap" and t["datasource"] == TEMPO_DS
    # the selector Grafana appends to each service-graph metric: Prometheus must accept it and find edges
    for selector, wanted in (
        (substitute(t["serviceMapQuery"]), {e for e in EDGES if e[0] == "foxhunt_obs"}),
        (substitute(t["serviceMapQuery"], ALL_SERVICES), set(EDGES)),
    ):
        queries = service_map_queries(selector)
        totals = _value(prometheus, queries["traces_service_graph_request_total"][0])
        assert totals == pytest.approx({(c, s): n / STEP for c, s, _, n, _ in wanted}), selector
        kinds = _value(prometheus, queries["traces_service_graph_request_total"][1])
        assert set(kinds) == {(c, kind, s) for c, s, kind, _, _ in wanted}
        failed = _value(prometheus, queries["traces_service_graph_request_failed_total"][0])
        assert failed == pytest.approx({(c, s): f / STEP for c, s, _, _, f in wanted if f})
        for first, second in queries.values():  # the latency ones too: every query runs
            assert _query(prometheus, first)[0] is not None and _query(prometheus, second)[0] is not None


# ---------------------------------------------------------------- figures against the synthetic truth


def _spans(service=None, name=None, kind=None) -> tuple[float, float]:
    """(spans, errors) per STEP of the SPANS rows that match."""
    rows = [
        r
        for r in SPANS
        if (service is None or r[0] == service)
        and (name is None or re.fullmatch(name, r[1]))
        and (kind is None or r[2] == kind)
    ]
    return sum(r[3] + r[4] for r in rows), sum(r[4] for r in rows)


def test_error_rate_by_service_is_errors_over_spans(prometheus):  # noqa: F811
    board = load(TRACES)
    got = _value(prometheus, substitute(_expr(board, "Error rate by service"), ALL_SERVICES))
    spans, errors = _spans("foxhunt_obs")
    assert got[("foxhunt_obs",)] == pytest.approx(errors / spans)  # 4 / 78
    assert got[("ppo-trainer",)] == 0  # no error series at all: 0, not missing
    rate = _value(prometheus, substitute(_expr(board, "Spans per second by service"), ALL_SERVICES))
    assert rate == pytest.approx({(s,): _spans(s)[0] / STEP for s in ("foxhunt_obs", "ppo-trainer")})


def test_failed_share_per_edge(prometheus):  # noqa: F811
    got = _value(prometheus, substitute(_expr(load(TRACES), "Failed share per edge")))
    assert got == pytest.approx({(c, s): f / n for c, s, _, n, f in EDGES if c == "foxhunt_obs"})


def test_span_duration_panels_find_the_buckets_spans_fell_in(prometheus):  # noqa: F811
    board = load(TRACES)
    p95 = _value(prometheus, substitute(_expr(board, "p95 duration by span")))
    # every span of a name falls in one bucket: p95 interpolates 95 % into it; +Inf gives the last bound
    assert p95[("foxhunt_obs", "alert tick")] == pytest.approx(4.096 + 0.95 * (8.192 - 4.096))
    assert p95[("foxhunt_obs", "run gpu_ingest_job")] == pytest.approx(16.384)
    histogram = _value(prometheus, substitute(_expr(board, "Span duration histogram")))
    per_interval = 60 / STEP  # increase over $__rate_interval (1m)
    assert histogram[("+Inf",)] == pytest.approx(_spans("foxhunt_obs")[0] * per_interval)
    assert histogram[("0.002",)] == 0


def test_fleet_trace_health_row(prometheus):  # noqa: F811
    board = load(FLEET)
    row = next(p for p in board["panels"] if p["type"] == "row" and p["title"] == "Trace health")
    below = [p for p in board["panels"] if p["gridPos"]["y"] > row["gridPos"]["y"]]
    assert below and all(p["id"] > row["id"] for p in below), "the row is the board's last"
    assert variables(board)["service"]["query"] == "foxhunt_obs"

    def stat(title: str) -> float:
        [value] = _value(prometheus, substitute(_expr(board, title))).values()
        return value

    runs, steps, requests = (
        _spans("foxhunt_obs", r"run .*"),
        _spans("foxhunt_obs", r"materialize .*"),
        _spans("foxhunt_obs", kind="SPAN_KIND_CLIENT"),
    )
    assert stat("Spans per second") == pytest.approx(_spans("foxhunt_obs")[0] / STEP)
    assert stat("Run error rate") == pytest.approx(runs[1] / runs[0])  # 0.25
    assert stat("Step error rate") == pytest.approx(steps[1] / steps[0])  # 0.1
    assert stat("Request error rate") == pytest.approx(requests[1] / requests[0])  # 2 / 60
    assert stat("Alert tick p95") == pytest.approx(7.9872)
    assert stat("Spans received by Tempo") == pytest.approx(SPANS_RECEIVED / STEP)
    # the time series say the same as the stats
    errors = "Error rate: runs, steps, requests"
    for ref, (spans, failed) in zip("ABC", (runs, steps, requests)):
        [value] = _value(prometheus, substitute(_expr(board, errors, ref))).values()
        assert value == pytest.approx(failed / spans)


def test_a_service_that_sends_nothing_shows_no_rate(prometheus):  # noqa: F811
    """The fleet row filters on its $service: another name finds nothing (no plausible zero)."""
    expr = substitute(_expr(load(FLEET), "Spans per second"), {**VARIABLES, "service": "nobody"})
    assert _value(prometheus, expr) == {}
