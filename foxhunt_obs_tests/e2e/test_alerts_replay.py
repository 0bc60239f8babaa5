"""The alert rules end to end: the `small` scenario's six hours replayed through the sensor's own code
(lib/alerts/engine.tick every 5 minutes, as of that time) against a real Prometheus (history plus the
recording rules backfilled), a real mlflow server, a real moto server and a real Alertmanager. Every
injected incident fires once and resolves once (or still fires at the end), at the right time; nothing
else fires: not on ip-10-0-1-13 either (NVIDIA's Helm chart exporter, MIG slices held by two pods).
gpu_node_missing expects the scenario's 3 nodes (expected_alerts.rule_overrides, as FOXHUNT_ALERT_RULES
would set it)."""

from datetime import datetime, timedelta, timezone

import pytest

from foxhunt_obs.lib.alerts.collect import Sources
from foxhunt_obs.lib.alerts.engine import replay
from foxhunt_obs.lib.alerts.rules import load_rules
from foxhunt_obs.lib.delivery.alert_sinks import AlertmanagerSink, LakeAlertSink
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.schemas import ALERTS
from foxhunt_obs.lib.sources.aws import AwsConfig
from foxhunt_obs.lib.sources.fsx import FsxSource
from foxhunt_obs.lib.sources.mlflow import MlflowSource
from foxhunt_obs.lib.sources.prometheus import PrometheusClient
from foxhunt_obs.sandbox.servers.alertmanager import AlertmanagerServer
from foxhunt_obs.sandbox.servers.mlflow_server import MlflowServer, copy_store
from foxhunt_obs.sandbox.servers.moto_server import MotoServer, seed
from foxhunt_obs.sandbox.story import expected_alerts

pytestmark = pytest.mark.timeout(600)

T0 = datetime(2026, 11, 16, tzinfo=timezone.utc)


def at(hhmm: str) -> datetime:
    h, m = hhmm.split(":")
    return T0 + timedelta(hours=int(h), minutes=int(m))


# (rule, identifying label, fires no earlier than, no later than, resolves no earlier than, no later than)
EXPECTED = [
    # 5 SBE 01:30-01:34; one DBE at 02:10
    ("ecc_errors", "ip-10-0-1-11/0", "01:30", "01:40", "01:40", "01:50"),
    ("ecc_errors", "ip-10-0-1-12/0", "02:10", "02:20", "02:15", "02:25"),
    # dqn-atari-f0: entropy ~0.01 from 01:30, NaN loss from 02:15, FAILED at 02:30
    ("entropy_collapse", "dqn-atari-f0", "01:30", "01:45", "02:30", "02:35"),
    ("nan_loss", "dqn-atari-f0", "02:15", "02:20", "02:30", "02:35"),
    # the hour's mean below 70 % for 15 minutes: pods at ~45 % and ~55 % (the last still firing at the
    # end), and the stall dragging ppo-humanoid-trainer-0's hour down
    ("gpu_underutilized", "dqn-atari-learner-0", "00:30", "00:40", "02:45", "03:00"),
    ("gpu_underutilized", "ppo-humanoid-trainer-0", "02:30", "03:05", "03:15", "03:40"),
    ("gpu_underutilized", "dqn-atari-learner-1", "05:15", "05:25", None, None),
    # < 500 GB free 02:09-04:00, for 10 minutes
    ("fsx_low_space", "foxhunt-scratch", "02:19", "02:25", "04:00", "04:05"),
    # util 0 02:00-02:40; its run logs nothing during the hang (last point 01:55) and from 04:30 on
    ("gpu_training_stall", "ppo-humanoid-trainer-0", "02:30", "02:40", "02:40", "02:45"),
    ("training_run_silent", "ppo-humanoid-f0", "02:26", "02:35", "02:40", "02:45"),
    ("training_run_silent", "ppo-humanoid-f0", "04:56", "05:05", None, None),
    # the sweep run's success rate drops at 03:00; KILLED at 04:00
    ("success_rate_drop", "ppo-humanoid-sweep", "03:00", "03:15", "04:00", "04:05"),
    # dqn-atari-learner-1's container restarts 3 times over 05:10-05:20 (the last at 05:16:40)
    ("gpu_oom_restarts", "dqn-atari-learner-1", "05:10", "05:20", "05:30", "05:40"),
    # node 2 lost 03:00-05:00, for 10 minutes
    ("gpu_node_missing", "", "03:10", "03:20", "05:00", "05:05"),
    # the Ray cluster's worker-1 lost 00:10-00:20 (actor restarting, scrape failing), for 2 minutes
    ("ray_worker_lost", "ppo-humanoid-ray", "00:12", "00:15", "00:20", "00:25"),
]


def ident(n) -> str:
    labels = n.labels
    if n.rule == "ecc_errors":
        return f"{labels['node']}/{labels['gpu']}"
    for key in ("run_name", "pod", "ray_io_cluster", "file_system_name"):
        if labels.get(key):
            return labels[key]
    return ""


@pytest.fixture(scope="module")
def replayed(small, prometheus, small_mlflow_store, tmp_path_factory):
    work = tmp_path_factory.mktemp("alerts")
    copy_store(small_mlflow_store, work / "mlflow")
    with (
        MlflowServer(work / "mlflow", workdir=work) as mlflow,
        MotoServer(workdir=work, account_id=small.aws.account_id) as moto,
        AlertmanagerServer(workdir=work) as alertmanager,
    ):
        seed(small, moto.url)
        aws = AwsConfig(
            region_name=small.aws.region,
            endpoint_url=moto.url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        lake = Lake(str(work / "lake"))
        sources = Sources(
            prometheus=PrometheusClient(prometheus.url),
            mlflow=MlflowSource(mlflow.url),
            fsx=FsxSource(aws.client("fsx"), aws.client("cloudwatch")),
            lake=lake,
        )
        sinks = [AlertmanagerSink(alertmanager.url), LakeAlertSink(lake)]
        overrides = expected_alerts.write_rule_overrides(small, work / "alert-rules.yaml")
        rules = load_rules(overrides=overrides)
        assert next(r for r in rules if r.id == "gpu_node_missing").thresholds["expected_nodes"] == 3
        # first half: up to the stall's firing, when Alertmanager must show what is firing
        first, cursor = replay(rules, sources, sinks, small.start, at("02:40"))
        active = {a["labels"]["alertname"] for a in alertmanager.alerts(active=True)}
        rest, _ = replay(rules, sources, sinks, at("02:40"), small.end, cursor=cursor)
        active_at_end = alertmanager.alerts(active=True)
        yield first + rest, active, active_at_end, lake


def test_every_incident_fires_once_and_resolves_once(replayed):
    sent, _, _, _ = replayed
    got = {}
    for tick, n in sent:
        got.setdefault((n.rule, ident(n)), []).append((n.status, tick))
    want = {}
    for rule, who, *window in EXPECTED:
        want.setdefault((rule, who), []).append(window)
    assert set(got) == set(want), f"clean spans must raise nothing: {got}"
    for (rule, who), episodes in want.items():
        expected_statuses = [
            s for *_, r0, _ in episodes for s in (["firing"] if r0 is None else ["firing", "resolved"])
        ]
        assert [status for status, _ in got[(rule, who)]] == expected_statuses, (rule, who, got[(rule, who)])
        ticks = iter(tick for _, tick in got[(rule, who)])
        for f0, f1, r0, r1 in episodes:
            fired_at = next(ticks)
            assert at(f0) <= fired_at <= at(f1), (rule, who, fired_at)
            if r0 is not None:
                resolved_at = next(ticks)
                assert at(r0) <= resolved_at <= at(r1), (rule, who, resolved_at)


def test_the_scenario_itself_says_what_must_fire(small, replayed):
    """expected_alerts derives the same story from the scenario file (what make demo checks on the
    default scenario): all 12 incidents found, and only the low-utilization pods besides."""
    sent, _, _, _ = replayed
    verdict = expected_alerts.check(expected_alerts.expected(small), sent, small.start, sent[-1][0])
    assert verdict.ok, verdict.missed
    assert len(verdict.found) == 12 == len(EXPECTED) - 3
    assert sorted({(n.rule, ident(n)) for _, n in verdict.other}) == sorted(
        (rule, who) for rule, who, *_ in EXPECTED if rule == "gpu_underutilized"
    )


def test_notifications_carry_their_story(replayed):
    sent, _, _, _ = replayed
    by_rule = {n.rule: n for _, n in sent if n.status == "firing"}
    stall = by_rule["gpu_training_stall"]
    assert stall.severity == "critical" and "ppo-humanoid-trainer-0 holds 2 GPUs at 0%" in stall.summary
    assert by_rule["fsx_low_space"].summary.startswith("FSx foxhunt-scratch")
    assert by_rule["gpu_node_missing"].summary == "2 GPU nodes reporting, 3 expected"
    resolved = [n for _, n in sent if n.status == "resolved"]
    assert all(n.ends_at is not None and n.ends_at > n.starts_at for n in resolved)


def test_the_mig_and_helm_chart_node_raises_nothing(small, replayed):
    """Its pods busy (~80 % GR_ENGINE_ACTIVE on the slices), never an hour without a pod: no alert is
    about ip-10-0-1-13 or one of its pods, although its rules read slices (foxhunt:gpu_util:ratio from
    GR_ENGINE_ACTIVE there)."""
    sent, _, _, _ = replayed
    node = "ip-10-0-1-13"
    pods = {p.name for p in small.pods if p.node == node}
    assert len(pods) == 3
    assert not [n for _, n in sent if n.labels.get("node") == node or n.labels.get("pod") in pods]


def test_alertmanager_saw_them(replayed):
    _, active_at_0240, active_at_end, _ = replayed
    # at 02:40 (before that tick): the ECC on node 2 resolved, the stall and FSx firing, the NaN resolved
    assert {"gpu_training_stall", "fsx_low_space"} <= active_at_0240
    assert "nan_loss" not in active_at_0240 and "ecc_errors" not in active_at_0240
    # every alert resolved by the end of the scenario but the last pod's low utilization and the silent run
    assert sorted(
        (a["labels"]["alertname"], a["labels"].get("pod") or a["labels"].get("run_name"))
        for a in active_at_end
    ) == [("gpu_underutilized", "dqn-atari-learner-1"), ("training_run_silent", "ppo-humanoid-f0")]


def test_the_alerts_table_matches(replayed):
    sent, _, _, lake = replayed
    rows = lake.query(
        "SELECT rule, status, fingerprint, sent_to FROM alerts ORDER BY ts, rule, status", tables=[ALERTS]
    ).to_pylist()
    assert len(rows) == len(sent) == 2 * len(EXPECTED) - sum(1 for e in EXPECTED if e[4] is None)
    assert sorted((r["rule"], r["status"], r["fingerprint"]) for r in rows) == sorted(
        (n.rule, n.status, n.fingerprint) for _, n in sent
    )
    assert all(r["sent_to"] == "alertmanager" for r in rows)
