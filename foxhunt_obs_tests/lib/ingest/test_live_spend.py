"""live_spend, live_idle_spend and live_rate against a real Prometheus holding hand-made cost records
(backfilled with promtool, one sample a minute, 30 s into it, as the rules record with a phase): the
integral by hand, the window's edges, and an empty answer that is never read as $0 unless it is."""

from __future__ import annotations

import subprocess
from datetime import datetime, timedelta, timezone

import pytest

from foxhunt_obs.lib.ingest.live_spend import (
    LiveCostMissing,
    live_idle_spend,
    live_rate,
    live_spend,
)
from foxhunt_obs.lib.sources.prometheus import PrometheusClient
from foxhunt_obs.sandbox.servers.prometheus import PROMTOOL, PrometheusServer

pytestmark = pytest.mark.servers

T0 = datetime(2026, 1, 5, tzinfo=timezone.utc)  # on every step grid
H = timedelta(hours=1)
# What Prometheus holds (minutes from T0, a sample at +30 s of each):
#   0-60   the rules ran: prices, a node, experiments a (6 $/h, 9 $/h from minute 30) and b (4 $/h); idle a
#          3 $/h, b 1 $/h
#   120-180  the rules ran, no priced node: prices only                   -> {} (no node, nothing spent)
#   240-300  the rules ran, a priced node, no experiment (no GPU series)  -> an error
#   360-420  nothing: the rules were not loaded                           -> an error
NO_NODES, NO_GPUS, NO_RULES = 2 * H, 4 * H, 6 * H


def _samples() -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = {}

    def add(name: str, minutes: range, value) -> None:
        for m in minutes:
            series.setdefault(name, []).append((m, value(m) if callable(value) else value))

    price = 'foxhunt:instance_price:usd_per_hour{instance_type="p4de.24xlarge"}'
    node = 'foxhunt:node_cost:usd_per_hour{node="ip-1",instance_type="p4de.24xlarge"}'
    for minutes in (range(0, 60), range(120, 180), range(240, 300)):
        add(price, minutes, 27.5)
    for minutes in (range(0, 60), range(240, 300)):
        add(node, minutes, 27.5)
    add(
        'foxhunt:experiment_cost:usd_per_hour{experiment="a"}', range(0, 60), lambda m: 6.0 if m < 30 else 9.0
    )
    add('foxhunt:experiment_cost:usd_per_hour{experiment="b"}', range(0, 60), 4.0)
    add('foxhunt:experiment_idle_cost:usd_per_hour{experiment="a"}', range(0, 60), 3.0)
    add('foxhunt:experiment_idle_cost:usd_per_hour{experiment="b"}', range(0, 60), 1.0)
    return series


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    work = tmp_path_factory.mktemp("live-spend")
    # a family's samples together (the series above are grouped by name), no TYPE lines (unknown type)
    lines = [
        f"{name} {v} {int(T0.timestamp()) + 60 * m + 30}"
        for name, samples in _samples().items()
        for m, v in samples
    ]
    text = "\n".join(lines) + "\n# EOF\n"
    (work / "cost.om").write_text(text)
    out = subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(work / "cost.om"), str(work / "tsdb")],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    with PrometheusServer(work / "tsdb", workdir=work) as server:
        # user:password in the URL go as basic auth (Prometheus ignores them); messages must not show them
        yield PrometheusClient(server.url.replace("http://", "http://viewer:s3cret@"))


def test_dollars_are_the_integral_of_the_rate(client):
    # a: 30 min at 6 $/h + 30 min at 9 $/h = 7.5 $; b: 1 h at 4 $/h
    assert live_spend(client, T0, T0 + H) == pytest.approx({"a": 7.5, "b": 4.0}, rel=1e-12)
    assert live_idle_spend(client, T0, T0 + H) == pytest.approx({"a": 3.0, "b": 1.0}, rel=1e-12)
    # a coarser step samples the same rates: 6 points at 6 $/h, 6 at 9 $/h, each 5 minutes
    assert live_spend(client, T0, T0 + H, step_s=300) == pytest.approx({"a": 7.5, "b": 4.0}, rel=1e-12)


def test_the_window_is_half_open_and_adjacent_windows_add_up(client):
    """Each step's sample lands in exactly one window: (start, end] on the step grid, the rate recorded
    during the step before each point (the rules' phase: here 30 s)."""
    first = live_spend(client, T0, T0 + 30 * timedelta(minutes=1))
    second = live_spend(client, T0 + 30 * timedelta(minutes=1), T0 + H)
    assert first == pytest.approx({"a": 3.0, "b": 2.0}, rel=1e-12)
    assert second == pytest.approx({"a": 4.5, "b": 2.0}, rel=1e-12)
    # the off-by-a-step edge: the point at 00:31 carries the rate recorded at 00:30:30 (9 $/h)
    shifted = live_spend(client, T0 + timedelta(minutes=1), T0 + timedelta(minutes=31))
    assert shifted["a"] == pytest.approx((29 * 6 + 9) / 60, rel=1e-12)


def test_live_rate_is_the_last_recorded_rate(client):
    assert live_rate(client, T0 + timedelta(minutes=45)) == {"a": 9.0, "b": 4.0}
    assert live_rate(client, T0 + timedelta(minutes=15)) == {"a": 6.0, "b": 4.0}


def test_no_priced_node_is_genuinely_nothing(client):
    assert live_spend(client, T0 + NO_NODES, T0 + NO_NODES + H) == {}
    assert live_idle_spend(client, T0 + NO_NODES, T0 + NO_NODES + H) == {}
    assert live_rate(client, T0 + NO_NODES + timedelta(minutes=30)) == {}


def test_missing_rules_are_an_error_not_zero_dollars(client):
    start, end = T0 + NO_RULES, T0 + NO_RULES + H
    with pytest.raises(LiveCostMissing) as e:
        live_spend(client, start, end)
    text = str(e.value)
    assert "deploy/prometheus/foxhunt-cost-rules.yaml" in text
    assert "foxhunt:experiment_cost:usd_per_hour" in text  # the query
    assert "2026-01-05T06:00:00Z..2026-01-05T07:00:00Z" in text  # the window
    assert "127.0.0.1" in text and "s3cret" not in text and "viewer" not in text  # the URL, scrubbed
    with pytest.raises(LiveCostMissing, match="foxhunt-cost-rules.yaml"):
        live_rate(client, start + timedelta(minutes=30))
    with pytest.raises(LiveCostMissing, match="foxhunt:experiment_idle_cost"):
        live_idle_spend(client, start, end)


def test_nodes_without_experiment_cost_are_an_error(client):
    with pytest.raises(LiveCostMissing, match="foxhunt-recording-rules.yaml"):
        live_spend(client, T0 + NO_GPUS, T0 + NO_GPUS + H)


def test_bad_arguments(client):
    with pytest.raises(ValueError, match="timezone-aware"):
        live_spend(client, datetime(2026, 1, 5), datetime(2026, 1, 5, 1))
    with pytest.raises(ValueError, match="shorter than a step"):
        live_spend(client, T0, T0 + timedelta(seconds=30))
    with pytest.raises(ValueError, match="step_s"):
        live_spend(client, T0, T0 + H, step_s=0)
