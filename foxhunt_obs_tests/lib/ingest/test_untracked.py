"""Running EC2 instances outside the cluster: the provider-id join on real kube-state-metrics lines from an
EKS cluster, a real Prometheus holding them (and one holding none: an error, not "all untracked"), the
pricing, and the untracked_spend rule's thresholds, type selection and join grace."""

import math
import re
import subprocess
from datetime import datetime, timedelta, timezone

import pandas as pd
import pytest

from foxhunt_obs.lib.alerts.evaluate import untracked_spend
from foxhunt_obs.lib.alerts.rules import RuleCatalogError, load_rules
from foxhunt_obs.lib.ingest.untracked import COLUMNS, UntrackedError, UntrackedSpend, cluster_instance_ids
from foxhunt_obs.lib.sources.ec2 import Ec2Instance, instance_id_of
from foxhunt_obs.lib.sources.prometheus import PrometheusClient
from foxhunt_obs.sandbox.servers.prometheus import PROMTOOL, PrometheusServer
from foxhunt_obs_tests.paths import REAL

EKS_NODES = REAL / "kube_node_info_eks.prom"
NOW = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)


def test_instance_ids_from_real_eks_provider_ids():
    ids = re.findall(r'provider_id="([^"]*)"', EKS_NODES.read_text())
    assert [instance_id_of(p) for p in ids] == ["i-0410cf13f3a172fda", "i-0cb394de0d85bc21b"]
    # kube-state-metrics' own test value, GCE's and kind's forms, and no provider: not an EC2 instance
    for other in ("provider://i-uniqueid", "gce://proj/us-central1-a/node-1", "kind://docker/k/k-worker", ""):
        assert instance_id_of(other) is None


@pytest.fixture(scope="module")
def eks_prometheus(tmp_path_factory):
    """A real Prometheus holding the real EKS kube_node_info lines for the 20 minutes before NOW."""
    work = tmp_path_factory.mktemp("eks")
    lines = [line for line in EKS_NODES.read_text().splitlines() if line.startswith("kube_node_info")]
    start = int((NOW - timedelta(minutes=20)).timestamp())
    body = ["# TYPE kube_node_info gauge"]
    body += [f"{line} {t}" for t in range(start, int(NOW.timestamp()) + 1, 60) for line in lines]
    (work / "om.txt").write_text("\n".join(body) + "\n# EOF\n")
    subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(work / "om.txt"), str(work / "tsdb")],
        check=True,
        capture_output=True,
    )
    with PrometheusServer(work / "tsdb", workdir=work) as server:
        yield PrometheusClient(server.url)


@pytest.mark.servers
def test_cluster_instance_ids_read_from_a_real_prometheus(eks_prometheus):
    assert cluster_instance_ids(eks_prometheus, NOW) == {"i-0410cf13f3a172fda", "i-0cb394de0d85bc21b"}
    # 15 minutes after the last sample the nodes are gone from the look-back: an error, never "no nodes"
    with pytest.raises(UntrackedError, match=r"kube_node_info.*is empty.*kube-state-metrics scraped"):
        cluster_instance_ids(eks_prometheus, NOW + timedelta(minutes=16))


@pytest.mark.servers
def test_nodes_without_an_ec2_provider_id_are_an_error(tmp_path):
    """kube-state-metrics' own test line (provider_id="provider://i-uniqueid", fixtures/real): nodes, but
    no EC2 instance id among them; every instance would look like a stray, so nothing is judged."""
    (line,) = [
        x for x in (REAL / "kube_state_metrics.prom").read_text().splitlines()
        if x.startswith("kube_node_info{") and 'provider_id="provider://i-uniqueid"' in x
    ][:1]  # fmt: skip
    start = int((NOW - timedelta(minutes=5)).timestamp())
    body = "# TYPE kube_node_info gauge\n" + "".join(
        f"{line} {t}\n" for t in range(start, int(NOW.timestamp()) + 1, 60)
    )
    (tmp_path / "om.txt").write_text(body + "# EOF\n")
    subprocess.run(
        [
            PROMTOOL,
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(tmp_path / "om.txt"),
            str(tmp_path / "tsdb"),
        ],
        check=True,
        capture_output=True,
    )
    with PrometheusServer(tmp_path / "tsdb", workdir=tmp_path) as server:
        with pytest.raises(
            UntrackedError, match=r"1 nodes, none with an EC2 provider id.*provider://i-uniqueid"
        ):
            cluster_instance_ids(PrometheusClient(server.url), NOW)


def instance(iid, itype, region="us-east-1", **tags):
    return Ec2Instance(
        region, iid, itype, "running", NOW - timedelta(hours=2), "on-demand", f"{region}a", tags
    )


class Inventory:
    """The listing an Ec2Inventory returns (its describe_instances paging runs against moto in e2e)."""

    def __init__(self, instances):
        self.instances = instances

    def running(self):
        return self.instances


@pytest.mark.servers
def test_frame_keeps_instances_outside_the_cluster_priced_by_region(eks_prometheus):
    spend = UntrackedSpend(
        Inventory(
            [
                instance("i-0410cf13f3a172fda", "p4de.24xlarge"),  # a node: not listed
                instance("i-0aaaaaaaaaaaaaaa1", "p5.48xlarge", Name="bench", Experiment="ppo"),
                instance("i-0aaaaaaaaaaaaaaa2", "g4dn.xlarge"),  # the table has no g4dn row
                instance("i-0aaaaaaaaaaaaaaa3", "p5.48xlarge", region="mars-north-1"),  # no such table
                # another EKS cluster's node in the same account: listed, with its cluster named
                instance("i-0aaaaaaaaaaaaaaa4", "g5.xlarge", **{"eks:cluster-name": "other", "Name": "n"}),
            ]
        ),
        eks_prometheus,
    )
    frame = spend.frame(NOW)
    assert list(frame.columns) == list(COLUMNS)
    rows = {r.instance_id: r for r in frame.itertuples()}
    assert set(rows) == {
        "i-0aaaaaaaaaaaaaaa1",
        "i-0aaaaaaaaaaaaaaa2",
        "i-0aaaaaaaaaaaaaaa3",
        "i-0aaaaaaaaaaaaaaa4",
    }
    assert rows["i-0aaaaaaaaaaaaaaa4"].cluster == "other" and rows["i-0aaaaaaaaaaaaaaa4"].cluster_tagged
    assert rows["i-0aaaaaaaaaaaaaaa1"].cluster == "" and not rows["i-0aaaaaaaaaaaaaaa1"].cluster_tagged
    assert (
        rows["i-0aaaaaaaaaaaaaaa1"].usd_per_hour == 55.04 and rows["i-0aaaaaaaaaaaaaaa1"].experiment == "ppo"
    )
    assert rows["i-0aaaaaaaaaaaaaaa1"].name == "bench"
    assert math.isnan(rows["i-0aaaaaaaaaaaaaaa2"].usd_per_hour) and math.isnan(
        rows["i-0aaaaaaaaaaaaaaa3"].usd_per_hour
    )


def rule():
    (r,) = [r for r in load_rules() if r.id == "untracked_spend"]
    return r


def frame(*rows):
    base = dict(
        region="us-east-1",
        name="",
        experiment="",
        lifecycle="on-demand",
        cluster_tagged=False,
        price_as_of="2025-06-01",
    )
    return pd.DataFrame([{**base, **r} for r in rows], columns=list(COLUMNS))


def fired(r, f, now=NOW):
    return [x for x in untracked_spend(r, f, now) if r.selects(x.labels)]


def test_the_rule_fires_on_gpu_instances_above_the_floor_and_on_unpriced_ones():
    r = rule()
    assert r.thresholds == {"usd_per_hour_min": 1.0, "join_grace_minutes": 10}
    f = frame(
        dict(
            instance_id="i-1",
            instance_type="p5.48xlarge",
            usd_per_hour=55.04,
            launch_time=NOW - timedelta(hours=3),
        ),
        dict(instance_id="i-2", instance_type="g4dn.xlarge", usd_per_hour=math.nan, launch_time=pd.NaT),
        dict(instance_id="i-3", instance_type="g5.xlarge", usd_per_hour=1.006, launch_time=NOW),
        dict(instance_id="i-4", instance_type="m7i.48xlarge", usd_per_hour=9.6768, launch_time=NOW),  # no GPU
        dict(instance_id="i-5", instance_type="g4ad.xlarge", usd_per_hour=0.5, launch_time=NOW),  # < $1/h
    )
    got = {x.labels["instance_id"]: x for x in fired(r, f)}
    assert set(got) == {"i-1", "i-2", "i-3"}
    assert got["i-1"].at == NOW - timedelta(hours=3) and got["i-1"].extra["spent_usd"] == pytest.approx(
        165.12
    )
    assert got["i-1"].extra["price"] == "$55.04/h"
    assert math.isnan(got["i-2"].value) and got["i-2"].at == NOW
    assert got["i-2"].extra["price"] == "unpriced (no price table row)"


def test_a_cluster_tagged_instance_gets_the_join_grace():
    r = rule()
    joining = dict(
        instance_id="i-9", instance_type="p4de.24xlarge", usd_per_hour=27.44705, cluster_tagged=True
    )
    assert fired(r, frame({**joining, "launch_time": NOW - timedelta(minutes=9)})) == []
    assert len(fired(r, frame({**joining, "launch_time": NOW - timedelta(minutes=10)}))) == 1
    # a launch time after `now` (a clock ahead, a replay of the past) counts from now
    assert fired(r, frame({**joining, "launch_time": NOW + timedelta(hours=1)})) == []


def test_select_is_overridable_and_checked(tmp_path):
    overrides = tmp_path / "rules.yaml"
    overrides.write_text(
        'rules: {untracked_spend: {select: {instance_type: ".*"}, thresholds: {usd_per_hour_min: 5}}}\n'
    )
    (r,) = [r for r in load_rules(overrides=overrides) if r.id == "untracked_spend"]
    f = frame(
        dict(instance_id="i-4", instance_type="m7i.48xlarge", usd_per_hour=9.6768, launch_time=NOW),
        dict(instance_id="i-3", instance_type="g5.xlarge", usd_per_hour=1.006, launch_time=NOW),
    )
    assert [x.labels["instance_id"] for x in fired(r, f)] == ["i-4"]
    overrides.write_text('rules: {untracked_spend: {select: {instance_type: "p[5"}}}\n')
    with pytest.raises(
        RuleCatalogError, match=r"untracked_spend.*select instance_type: bad regular expression"
    ):
        load_rules(overrides=overrides)
    overrides.write_text('rules: {gpu_overheat: {select: {node: "x"}}}\n')
    with pytest.raises(RuleCatalogError, match="a promql rule says it in its PromQL"):
        load_rules(overrides=overrides)
