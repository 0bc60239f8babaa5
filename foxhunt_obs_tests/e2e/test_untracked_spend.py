"""untracked_spend end to end: the `small` scenario's real Prometheus (its nodes'
kube_node_info provider ids, ip-10-0-1-12's instance replaced after its outage) and a real moto server
whose running EC2 instances follow the scenario tick by tick (moto_server.set_ec2_as_of), with three
instances outside the cluster added for this test: a p5.48xlarge, a g4dn.xlarge the price table has no
row for, and a t3.micro (no GPU: not selected). The alert sensor's own code replays the six hours every 5
minutes. The p5 fires at the first tick of its hours and resolves at the first tick after it stopped;
the unpriced GPU box fires as unpriced; no cluster node ever fires, not even the replacement instance
that joins at 05:00."""

import dataclasses
from datetime import datetime, timedelta, timezone

import pytest

from foxhunt_obs.lib.alerts.collect import Sources
from foxhunt_obs.lib.alerts.engine import replay
from foxhunt_obs.lib.alerts.rules import load_rules
from foxhunt_obs.lib.delivery.alert_sinks import LakeAlertSink
from foxhunt_obs.lib.ingest.untracked import UntrackedSpend
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.sources.aws import AwsConfig
from foxhunt_obs.lib.sources.ec2 import Ec2Inventory
from foxhunt_obs.lib.sources.prometheus import PrometheusClient
from foxhunt_obs.sandbox.servers.moto_server import MotoServer, set_ec2_as_of
from foxhunt_obs.sandbox.story.aws_scenario import StrayInstance
from foxhunt_obs.sandbox.writers import bills

pytestmark = pytest.mark.timeout(300)

T0 = datetime(2026, 11, 16, tzinfo=timezone.utc)
EVERY_S = 300


def at(hhmm: str) -> datetime:
    h, m = hhmm.split(":")
    return T0 + timedelta(hours=int(h), minutes=int(m))


def stray(name: str, instance_type: str, start: str, end: str, experiment: str = "") -> StrayInstance:
    s, e = at(start), at(end)
    return StrayInstance(
        "stray_instance", name, instance_type, experiment, s, e, int((s - T0).total_seconds()),
        int((e - T0).total_seconds()),
    )  # fmt: skip


@pytest.fixture(scope="module")
def with_strays(small):
    extra = (
        stray("bench-p5", "p5.48xlarge", "01:10", "03:40", "ppo-humanoid"),
        stray("notebook-g4dn", "g4dn.xlarge", "04:00", "06:00"),
        stray("bastion", "t3.micro", "00:00", "06:00"),
    )
    return dataclasses.replace(
        small, aws=dataclasses.replace(small.aws, incidents=small.aws.incidents + extra)
    )


@pytest.fixture(scope="module")
def replayed(with_strays, prometheus, tmp_path_factory):
    work = tmp_path_factory.mktemp("untracked")
    scenario = with_strays
    with MotoServer(workdir=work, account_id=scenario.aws.account_id) as moto:
        aws = AwsConfig(
            region_name=scenario.aws.region,
            endpoint_url=moto.url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        client = PrometheusClient(prometheus.url)
        lake = Lake(str(work / "lake"))
        sources = Sources(
            prometheus=client,
            ec2=UntrackedSpend(Ec2Inventory({scenario.aws.region: aws.client("ec2")}), client),
        )
        rules = [r for r in load_rules() if r.id == "untracked_spend"]
        worlds = []
        sent, _ = replay(
            rules,
            sources,
            [LakeAlertSink(lake)],
            scenario.start,
            scenario.end,
            EVERY_S,
            before_tick=lambda now: worlds.append((now, set_ec2_as_of(scenario, moto.url, now))),
        )
        yield scenario, sent, worlds


def test_the_stray_p5_fires_at_its_first_tick_and_resolves_when_it_stops(replayed):
    scenario, sent, _ = replayed
    p5 = [(tick, n) for tick, n in sent if n.labels.get("name") == "bench-p5"]
    assert [(tick, n.status) for tick, n in p5] == [(at("01:10"), "firing"), (at("03:40"), "resolved")]
    firing = p5[0][1]
    (inst,) = [i for i in bills.stray_instances(scenario) if i.name == "bench-p5"]
    assert firing.labels["instance_id"] == inst.instance_id
    assert firing.labels["instance_type"] == "p5.48xlarge" and firing.labels["experiment"] == "ppo-humanoid"
    assert firing.value == pytest.approx(55.04)
    assert firing.summary == f"p5.48xlarge {inst.instance_id} (bench-p5) runs outside the cluster: $55.04/h"
    # latency: the first tick at or after the instance started (the bill-based cost_spike: the next day)
    assert p5[0][0] - inst.start < timedelta(seconds=EVERY_S)


def test_an_unpriced_gpu_instance_fires_as_unpriced(replayed):
    _, sent, _ = replayed
    g4 = [(tick, n) for tick, n in sent if n.labels.get("name") == "notebook-g4dn"]
    assert [(tick, n.status) for tick, n in g4] == [(at("04:00"), "firing")]  # still running at the end
    assert g4[0][1].summary.endswith("runs outside the cluster: unpriced (no price table row)")


def test_no_cluster_node_and_no_cpu_box_fires(replayed):
    scenario, sent, worlds = replayed
    assert {n.labels["name"] for _, n in sent} == {"bench-p5", "notebook-g4dn"}
    # the world did change under the replay: ip-10-0-1-12's instance stopped at 03:00, its new one at 05:00
    node_ids = [i.instance_id for i in bills.instances(scenario) if i.node == "ip-10-0-1-12"]
    assert len(node_ids) == 2
    changes = {now: w for now, w in worlds if w["started"] or w["terminated"]}
    assert changes[at("03:00")]["terminated"] == [node_ids[0]]
    assert changes[at("05:00")]["started"] == [node_ids[1]]
