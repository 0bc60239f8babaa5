"""The cost spike end to end: the default scenario's bill (a stray p5.48xlarge billed 8 hours on
2026-11-21, every other day alike) in a real moto server, a real Dagster costs_job over its week, then
the alert sensor's code ticking once a day at midnight against the lake and a real Alertmanager. The
spike fires once, the morning after the expensive day, and resolves once the next day; the clean days
raise nothing."""

import os
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from foxhunt_obs.lib.alerts.collect import Sources
from foxhunt_obs.lib.alerts.engine import replay
from foxhunt_obs.lib.alerts.rules import load_rules
from foxhunt_obs.lib.delivery.alert_sinks import AlertmanagerSink, LakeAlertSink
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.schemas import ALERTS
from foxhunt_obs.sandbox.servers.alertmanager import AlertmanagerServer
from foxhunt_obs.sandbox.servers.moto_server import MotoServer, sandbox_env, seed
from foxhunt_obs.sandbox.story.scenario import load_scenario
from foxhunt_obs.sandbox.writers import bills
from foxhunt_obs_tests.e2e.test_aws_ingest import failure, run

pytestmark = pytest.mark.timeout(600)

SPIKE_DAY = date(2026, 11, 21)


def midnight(d: date) -> datetime:
    return datetime(d.year, d.month, d.day, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def default():
    return load_scenario("default")


@pytest.fixture(scope="module")
def replayed(default, tmp_path_factory):
    work = tmp_path_factory.mktemp("cost-spike")
    first, last = default.start.date(), (default.end - timedelta(hours=1)).date()
    with (
        MotoServer(workdir=work, account_id=default.aws.account_id) as moto,
        AlertmanagerServer(workdir=work) as alertmanager,
    ):
        values = {"FOXHUNT_LAKE": str(work / "lake"), **sandbox_env(seed(default, moto.url))}
        saved = {k: os.environ.get(k) for k in values}
        os.environ.update(values)
        try:
            result = run("costs_job", first.isoformat(), last.isoformat())
            assert result.success, failure(result)
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        lake = Lake(values["FOXHUNT_LAKE"])
        rules = [r for r in load_rules(overrides="") if r.id == "cost_spike"]
        sinks = [AlertmanagerSink(alertmanager.url), LakeAlertSink(lake)]
        # a tick each midnight, from the day after the first to the day after the last (end exclusive)
        day = timedelta(days=1)
        before, cursor = replay(
            rules, Sources(lake=lake), sinks, midnight(first) + day, midnight(SPIKE_DAY) + 2 * day, 86400
        )
        active = alertmanager.alerts(active=True)
        after, _ = replay(
            rules,
            Sources(lake=lake),
            sinks,
            midnight(last) + day,
            midnight(last) + 2 * day,
            86400,
            cursor=cursor,
        )
        yield before + after, active, alertmanager.alerts(active=True), lake


def test_the_spike_fires_once_and_resolves_once(default, replayed):
    sent, _, _, _ = replayed
    assert [(tick, n.status, n.labels) for tick, n in sent] == [
        (midnight(SPIKE_DAY + timedelta(days=1)), "firing", {"project": "foxhunt-rl"}),
        (midnight(SPIKE_DAY + timedelta(days=2)), "resolved", {"project": "foxhunt-rl"}),
    ]
    fired = sent[0][1]
    truth = bills.daily_costs(default, SPIKE_DAY)
    project = sum((v for (p, *_), v in truth.items() if p == "foxhunt-rl"), Decimal(0))
    assert fired.value == pytest.approx(float(project), abs=0.005)
    before = bills.daily_costs(default, SPIKE_DAY - timedelta(days=1))
    median = float(sum((v for (p, *_), v in before.items() if p == "foxhunt-rl"), Decimal(0)))
    # every earlier day costs the same: MAD 0, so the bar is the median + min_increase_pct (20 %)
    assert fired.summary == (
        f"foxhunt-rl spent ${float(project):,.2f} on 2026-11-21: above ${median * 1.2:,.2f} "
        f"(median ${median:,.2f} of 14 days)"
    )


def test_alertmanager_and_the_alerts_table(replayed):
    sent, active_after_spike, active_at_end, lake = replayed
    assert [(a["labels"]["alertname"], a["labels"]["project"]) for a in active_after_spike] == [
        ("cost_spike", "foxhunt-rl")
    ]
    assert active_at_end == []
    rows = lake.query("SELECT rule, status, sent_to FROM alerts ORDER BY ts", tables=[ALERTS]).to_pylist()
    assert rows == [
        {"rule": "cost_spike", "status": "firing", "sent_to": "alertmanager"},
        {"rule": "cost_spike", "status": "resolved", "sent_to": "alertmanager"},
    ]
