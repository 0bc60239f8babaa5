"""Live spend: dollars per experiment from the live cost recording rules (cost_rules.py), for
the hours the bill and cost_allocation have not reached yet.

The rules (deploy/prometheus/foxhunt-cost-rules.yaml) record each experiment's $/h once a minute:
``foxhunt:experiment_cost:usd_per_hour`` and ``foxhunt:experiment_idle_cost:usd_per_hour``. Dollars over
[start, end) are their integral, one instant query at ``end``::

    sum_over_time(foxhunt:experiment_cost:usd_per_hour[<end - start - 1ms>:<step>s]) / (3600 / step)

The subquery samples the rate at the multiples of ``step`` in (start, end] (the 1 ms makes the range
left-open on Prometheus 2 as on 3, so no step is counted twice across adjacent windows); each sample is the
rate the rules last recorded (the look-back), i.e. the rate of the step before it; each stands for
``step`` seconds. The edge, off by a step: a window's dollars are the rates recorded in [start, end)
shifted by the rules' evaluation phase (less than a step: Prometheus offsets a group's evaluations by a
hash of its name), so a rate change within a step of ``start`` or ``end`` lands in the window before or
after; a window not on the step grid is taken to it. Adjacent windows add up exactly.

No answer is not $0: without the rules Prometheus answers an empty vector, so an empty answer is checked
(``foxhunt:instance_price:usd_per_hour`` is recorded whenever the rules are loaded, nodes or not;
``foxhunt:node_cost:usd_per_hour`` whenever a priced node exists) and read as {} only when the rules ran
and no priced node existed over the window.

Plain Python: the caller (the spend_now asset, tests) passes a PrometheusClient.
"""

from __future__ import annotations

from datetime import datetime

from foxhunt_obs.lib.errors import InputError
from foxhunt_obs.lib.sources.prometheus import PrometheusClient, iso

COST = "foxhunt:experiment_cost:usd_per_hour"
IDLE_COST = "foxhunt:experiment_idle_cost:usd_per_hour"
PRICE = "foxhunt:instance_price:usd_per_hour"  # one constant series per priced instance type
NODE_COST = "foxhunt:node_cost:usd_per_hour"
RULES_FILE = "deploy/prometheus/foxhunt-cost-rules.yaml"


class LiveCostMissing(InputError, RuntimeError):
    """The live cost series are not there to answer: the message names the Prometheus (credentials
    scrubbed), the query, the window and what to do."""


def live_spend(
    client: PrometheusClient, start: datetime, end: datetime, step_s: int = 60
) -> dict[str, float]:
    """Dollars per experiment over [start, end) from foxhunt:experiment_cost:usd_per_hour ((cluster idle)
    included: what no pod held), on the module's integral. {} only when no priced node existed then."""
    return _integral(client, COST, start, end, step_s)


def live_idle_spend(
    client: PrometheusClient, start: datetime, end: datetime, step_s: int = 60
) -> dict[str, float]:
    """Idle dollars per experiment over [start, end) from foxhunt:experiment_idle_cost:usd_per_hour: a
    holder's $ x (1 - util) where util is known, all of (cluster idle); the same integral as live_spend."""
    return _integral(client, IDLE_COST, start, end, step_s)


def live_rate(client: PrometheusClient, at: datetime) -> dict[str, float]:
    """$/h per experiment at ``at`` (the rules' last evaluation at or before it)."""
    t = _seconds(at, "at")
    rates = _by_experiment(client.query(COST, t, "live $/h"))
    if not rates:
        _check_empty(client, COST, t, None, f"at {iso(t)}")
    return rates


def _integral(client: PrometheusClient, record: str, start: datetime, end: datetime, step_s: int) -> dict:
    t0, t1 = _seconds(start, "start"), _seconds(end, "end")
    if not (isinstance(step_s, int) and step_s > 0):
        raise ValueError(f"step_s must be a positive whole number of seconds, got {step_s!r}")
    if t1 - t0 < step_s:
        raise ValueError(f"window {iso(t0)}..{iso(t1)} is shorter than a step ({step_s} s)")
    subquery = f"[{round((t1 - t0) * 1000) - 1}ms:{step_s}s]"
    query = f"sum_over_time({record}{subquery}) / {3600 / step_s:g}"
    window = f"window {iso(t0)}..{iso(t1)} at {step_s} s"
    dollars = _by_experiment(client.query(query, t1, f"live $ over the {window}"))
    if not dollars:
        _check_empty(client, query, t1, subquery, window)
    return dollars


def _check_empty(client: PrometheusClient, query: str, at: float, subquery: str | None, window: str) -> None:
    """Raise unless the rules were evaluated and no priced node existed (then {} is the truth)."""

    def present(record: str) -> bool:
        probe = f"count_over_time({record}{subquery})" if subquery else record
        return bool(client.query(probe, at, f"why live cost is empty, {window}"))

    where = f"Prometheus at {client.url}: query {query} at {iso(at)} ({window})"
    if not present(PRICE):
        raise LiveCostMissing(
            f"{where}: no answer and no {PRICE} either: the live cost rules were not evaluated then. "
            f"Load {RULES_FILE} into this Prometheus (rule_files, or the PrometheusRule "
            "foxhunt-cost-rules.prometheusrule.yaml); it records from then on, not before."
        )
    if present(NODE_COST):
        raise LiveCostMissing(
            f"{where}: no answer although {NODE_COST} shows priced nodes: no GPU reported on them (the "
            "cost rules read the canonical foxhunt:gpu_* records: load "
            "deploy/prometheus/foxhunt-recording-rules.yaml too), or the nodes had no GPUs (the live "
            "rules charge a GPU-less node to nobody; cost_allocation charges it to (cluster idle))."
        )


def _by_experiment(rows: list[tuple[dict[str, str], float]]) -> dict[str, float]:
    return {labels.get("experiment", ""): value for labels, value in rows}


def _seconds(t: datetime, name: str) -> float:
    if t.tzinfo is None:
        raise ValueError(f"{name} must be timezone-aware (UTC), got naive {t.isoformat()}")
    return t.timestamp()
