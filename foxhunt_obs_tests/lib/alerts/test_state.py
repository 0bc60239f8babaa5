import json
import math
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pandas as pd
import pytest

from foxhunt_obs.lib.alerts.evaluate import Finding, fsx_low_space
from foxhunt_obs.lib.alerts.rules import Rule, load_rules
from foxhunt_obs.lib.alerts.state import (
    VERSION,
    AlertState,
    acknowledge,
    dumps,
    firing,
    loads,
    step,
    transitions,
)

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=timezone.utc)


def rule(rid="hot", for_minutes=10, key=("node",)):
    return Rule(
        id=rid,
        severity="warning",
        source="prometheus",
        for_seconds=60.0 * for_minutes,
        thresholds={},
        key=key,
        summary="{node} hot",
        description="d",
    )


HOT = rule()
NOW_RULE = rule("now", for_minutes=0)
RULES = [HOT, NOW_RULE]


def t(m):
    return T0 + timedelta(minutes=m)


def hot(m, node="a", value=90.0, at=None):
    return Finding(rule="hot", labels={"node": node}, value=value, at=t(m) if at is None else at)


class Sensor:
    """A sensor's loop over ticks: the cursor is a string, as Dagster keeps it."""

    def __init__(self, rules=RULES, cursor=None):
        self.rules, self.cursor, self.sent = rules, cursor, []

    def tick(self, m, findings, evaluated=("hot", "now"), accept=True):
        state = loads(self.cursor)
        state, ts = step(state, set(evaluated), findings, t(m), rules=self.rules)
        if accept:
            self.sent += ts
            state = acknowledge(state, ts)
        self.cursor = dumps(state)
        return state, ts


def kinds(ts):
    return [(x.kind, x.labels.get("node"), x.starts_at, x.ends_at) for x in ts]


def test_scripted_timeline_pending_firing_resolve_refire():
    s = Sensor()
    state, ts = s.tick(0, [hot(0)])
    assert ts == [] and state.active[HOT.fingerprint({"node": "a"})].status == "pending"
    assert s.tick(5, [hot(5)])[1] == []  # 5 min < for 10 min
    state, ts = s.tick(10, [hot(10, value=93.0)])
    assert kinds(ts) == [("firing", "a", t(0), None)]  # since: the first finding's at
    assert ts[0].value == 93.0 and ts[0].rule == "hot"
    assert s.tick(15, [hot(15)])[1] == []  # notified once only
    state, ts = s.tick(20, [])  # evaluated, gone
    assert kinds(ts) == [("resolved", "a", t(0), t(20))]
    assert state == AlertState() and s.tick(25, [])[1] == []
    # the condition returns later: a new alert with a new since
    assert s.tick(30, [hot(30)])[1] == []
    assert kinds(s.tick(40, [hot(40)])[1]) == [("firing", "a", t(30), None)]
    assert [x.kind for x in s.sent] == ["firing", "resolved", "firing"]


def test_flapping_within_for_never_fires():
    s = Sensor()
    for m in range(0, 120, 5):
        _, ts = s.tick(m, [hot(m)] if (m // 5) % 2 == 0 else [])
        assert ts == []
    # ticks every 3 min, the condition seen on 3 ticks of 4 (6 minutes each time): never for 10
    s = Sensor()
    for m in range(0, 120, 3):
        assert s.tick(m, [hot(m)] if (m // 3) % 4 != 3 else [])[1] == []
    assert s.sent == []


def test_unacknowledged_firing_is_sent_again_until_accepted():
    s = Sensor()
    s.tick(0, [hot(0)])
    _, first = s.tick(10, [hot(10)], accept=False)  # the sink failed: the cursor keeps notified=None
    _, again = s.tick(15, [hot(15, value=95.0)], accept=False)
    assert kinds(first) == kinds(again) == [("firing", "a", t(0), None)]
    assert again[0].value == 95.0  # the latest value
    _, third = s.tick(20, [hot(20)])
    assert kinds(third) == kinds(first)
    assert s.tick(25, [hot(25)])[1] == []  # accepted: never again


def test_partial_acknowledge():
    state, ts = step(
        AlertState(),
        {"now"},
        [
            Finding("now", {"node": "a"}, 1.0, t(0)),
            Finding("now", {"node": "b"}, 1.0, t(0)),
        ],
        t(0),
        rules=RULES,
    )
    assert len(ts) == 2
    state = acknowledge(state, [x for x in ts if x.labels["node"] == "a"])
    assert [x.labels["node"] for x in transitions(state)] == ["b"]


def test_resolve_is_sent_again_until_accepted_and_even_if_firing_never_was():
    s = Sensor()
    s.tick(0, [hot(0)])
    s.tick(10, [hot(10)], accept=False)  # firing, never accepted
    _, ts = s.tick(15, [], accept=False)
    assert kinds(ts) == [("resolved", "a", t(0), t(15))]  # the incident is not lost
    _, ts = s.tick(20, [])
    assert kinds(ts) == [("resolved", "a", t(0), t(15))]  # same resolve, same ends_at
    assert s.tick(25, [])[1] == []
    assert loads(s.cursor) == AlertState()


def test_refire_while_the_resolve_is_unacknowledged_keeps_both():
    s = Sensor(rules=[NOW_RULE])
    f = lambda m: Finding("now", {"node": "a"}, 1.0, t(m))  # noqa: E731
    s.tick(0, [f(0)], evaluated={"now"})
    s.tick(5, [], evaluated={"now"}, accept=False)  # resolve not accepted
    _, ts = s.tick(10, [f(10)], evaluated={"now"})
    assert [(x.kind, x.starts_at, x.ends_at) for x in ts] == [
        ("resolved", t(0), t(5)),
        ("firing", t(10), None),
    ]
    assert s.tick(15, [f(15)], evaluated={"now"})[1] == []


def test_rule_not_evaluated_keeps_its_alerts():
    s = Sensor()
    s.tick(0, [hot(0)])
    s.tick(10, [hot(10)])
    state, ts = s.tick(15, [], evaluated={"now"})  # Prometheus down: hot not evaluated
    assert ts == [] and [a.status for a in firing(state)] == ["firing"]
    assert s.tick(20, [], evaluated=())[1] == []
    assert kinds(s.tick(25, [])[1]) == [("resolved", "a", t(0), t(25))]


def test_pending_survives_a_tick_without_data_but_not_one_without_the_condition():
    s = Sensor()
    s.tick(0, [hot(0)])
    s.tick(5, [], evaluated=())  # source down: still pending since 0
    assert kinds(s.tick(10, [hot(10)])[1]) == [("firing", "a", t(0), None)]


def test_rule_removed_from_the_catalog_resolves_its_alerts():
    s = Sensor()
    s.tick(0, [hot(0)])
    s.tick(10, [hot(10)])
    s.rules = [NOW_RULE]
    _, ts = s.tick(15, [hot(15)], evaluated={"now"})  # its findings are ignored too
    assert kinds(ts) == [("resolved", "a", t(0), t(15))]
    s.rules = [replace(HOT, enabled=False), NOW_RULE]
    s.tick(20, [hot(20)])
    assert s.tick(30, [hot(30)])[1] == []


def test_for_counts_from_the_findings_at_and_duplicates_merge():
    # an evaluator that knows since when (FSx: the first point below) fires on the first tick
    state, ts = step(AlertState(), {"hot"}, [hot(0, at=t(-12))], t(0), rules=RULES)
    assert kinds(ts) == [("firing", "a", t(-12), None)]
    # at in the future (clock skew) is clamped to now; two findings of one alert are one
    state, ts = step(AlertState(), {"hot"}, [hot(0, at=t(5)), hot(0, at=t(-3), value=1.0)], t(0), rules=RULES)
    assert ts == [] and list(state.active.values())[0].since == t(-3)
    # at None: now
    state, _ = step(AlertState(), set(), [Finding("now", {"node": "x"}, 1.0, None)], t(0), rules=RULES)
    assert list(state.active.values())[0].since == t(0)


def test_several_alerts_keyed_by_fingerprint():
    s = Sensor()
    s.tick(0, [hot(0, "a")])
    s.tick(5, [hot(5, "a"), hot(5, "b")])
    assert kinds(s.tick(10, [hot(10, "a"), hot(10, "b")])[1]) == [("firing", "a", t(0), None)]
    assert kinds(s.tick(15, [hot(15, "b")])[1]) == [
        ("resolved", "a", t(0), t(15)),
        ("firing", "b", t(5), None),
    ]


def test_step_does_not_change_its_input():
    state, _ = step(AlertState(), {"hot"}, [hot(0)], t(0), rules=RULES)
    before = dumps(state)
    step(state, {"hot"}, [], t(20), rules=RULES)
    step(state, {"hot"}, [hot(20)], t(20), rules=RULES)
    assert dumps(state) == before


def test_restart_from_the_cursor_sends_nothing_twice():
    s = Sensor()
    s.tick(0, [hot(0)])
    s.tick(10, [hot(10)])
    restarted = Sensor(cursor=s.cursor)
    assert restarted.tick(15, [hot(15)])[1] == []
    # a crash after sending but before the cursor was written: sent again (at least once)
    s2 = Sensor()
    s2.tick(0, [hot(0)])
    _, ts = s2.tick(10, [hot(10)], accept=False)
    assert kinds(Sensor(cursor=s2.cursor).tick(15, [hot(15)])[1]) == kinds(ts)


def test_cursor_round_trip_is_compact_versioned_json():
    findings = [
        hot(0),
        Finding("now", {"node": "n"}, math.nan, t(0), {"step": 3, "day": t(0).date(), "x": math.inf}),
    ]
    state, ts = step(AlertState(), {"hot", "now"}, findings, t(0), rules=RULES)
    state = acknowledge(state, ts)
    state, _ = step(state, {"hot", "now"}, [hot(5)], t(5), rules=RULES)  # now resolved, unacknowledged
    cursor = dumps(state)
    doc = json.loads(cursor)  # strict JSON
    assert doc["v"] == VERSION and ", " not in cursor and ": " not in cursor
    back = loads(cursor)
    assert dumps(back) == cursor
    assert back.active.keys() == state.active.keys()
    (gone,) = back.resolved
    assert math.isnan(gone.value) and gone.extra == {"step": 3, "day": "2026-11-22", "x": "+Inf"}
    assert gone.ends_at == t(5) and gone.since == t(0)
    assert [(x.kind, x.fingerprint, x.starts_at) for x in transitions(back)] == [
        (x.kind, x.fingerprint, x.starts_at) for x in transitions(state)
    ]
    assert len(cursor) < 700


@pytest.mark.parametrize(
    "cursor, says",
    [
        ('{"v": 99, "active": []}', "version 99"),
        ("not json", "not JSON"),
        ("[1, 2]", "no version"),
        ('{"v": 1, "active": [{"fp": "x"}]}', "malformed"),
        (
            '{"v": 1, "active": [{"fp": "x", "rule": "r", "status": "odd", "since": "2026-01-01T00:00:00+00:00", "value": 1}]}',
            "malformed",
        ),
    ],
)
def test_unknown_or_broken_cursor_starts_fresh_and_says_so(cursor, says, caplog):
    state = loads(cursor)
    assert state.active == {} and state.resolved == ()
    assert says in state.note and says in caplog.text


def test_no_cursor_is_an_empty_state_without_a_note():
    assert loads(None) == AlertState() and loads("") == AlertState()
    assert loads(None).note is None


def test_fsx_low_space_end_to_end_with_its_for():
    """The evaluator's `at` (first point below) drives the rule's for (10 minutes)."""
    rule = {r.id: r for r in load_rules(overrides="")}["fsx_low_space"]
    values = [900e9, 450e9, 440e9, 430e9]  # below from 10:05 on, points every 5 min
    frame = pd.DataFrame(
        [
            (pd.Timestamp(t(5 * i)), "fs-1", "lake", "FreeDataStorageCapacity", "Minimum", v)
            for i, v in enumerate(values)
        ],
        columns=["ts", "file_system_id", "file_system_name", "metric", "statistic", "value"],
    )
    state, sent = AlertState(), []
    for m in (6, 11, 16):
        found = fsx_low_space(rule, frame[frame.ts <= pd.Timestamp(t(m))], t(m))
        state, ts = step(state, {rule.id}, found, t(m), rules=[rule])
        state = acknowledge(state, ts)
        sent.append([(x.kind, x.starts_at) for x in ts])
    assert sent == [[], [], [("firing", t(5))]]  # 16 − 5 = 11 min ≥ 10 (at 11: 6 min)
