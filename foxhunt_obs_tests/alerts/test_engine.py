"""The tick's Alertmanager refresh against a real Alertmanager: a firing alert is re-posted every tick
(as Prometheus does), so it never expires there while it fires, and nobody is notified twice."""

import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from foxhunt_obs.lib.alerts import state as alert_state
from foxhunt_obs.lib.alerts.catalog import load_rules
from foxhunt_obs.lib.alerts.collect import Sources
from foxhunt_obs.lib.alerts.engine import tick
from foxhunt_obs.lib.alerts.evaluate import Finding
from foxhunt_obs.lib.delivery.alert_sinks import AlertmanagerSink
from foxhunt_obs.sandbox.alertmanager import ALERTMANAGER, AlertmanagerServer

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        not Path(ALERTMANAGER).exists(), reason="prometheus-alertmanager not installed (make install)"
    ),
]


def test_firing_alerts_are_refreshed_every_tick(tmp_path):
    rules = load_rules(overrides="")
    now = datetime.now(timezone.utc).replace(microsecond=0)
    finding = Finding(
        "gpu_overheat", {"node": "ip-1", "gpu": "3", "uuid": "GPU-3"}, 91.0, now - timedelta(minutes=6), {}
    )
    state, transitions = alert_state.step(
        alert_state.loads(None), {"gpu_overheat"}, [finding], now, rules=rules
    )
    assert [t.kind for t in transitions] == ["firing"]
    cursor = alert_state.dumps(alert_state.acknowledge(state, transitions))  # notified on an earlier tick

    with AlertmanagerServer(workdir=tmp_path) as am:
        sink = AlertmanagerSink(am.url, firing_ttl=timedelta(seconds=2))
        # a tick with no source configured evaluates nothing: the alert keeps firing, nothing new is sent
        cursor, report = tick(rules, Sources(), [sink], cursor, now)
        assert report.sent == [] and report.refreshed == 1
        assert [a["labels"]["alertname"] for a in am.alerts(active=True)] == ["gpu_overheat"]
        time.sleep(3)  # past the 2 s endsAt: without a refresh Alertmanager lets it lapse
        assert am.alerts(active=True) == []
        cursor, report = tick(rules, Sources(), [sink], cursor, now + timedelta(minutes=1))
        assert report.refreshed == 1 and [a["labels"]["alertname"] for a in am.alerts(active=True)] == [
            "gpu_overheat"
        ]
