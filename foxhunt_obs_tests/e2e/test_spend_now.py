"""spend_now end to end: the `small` scenario's real Prometheus with the live cost rules
backfilled, its day of cost_allocation built by the functions the assets call, two instances outside the
cluster, and a real Pushgateway. At 05:00 the cluster's today equals the batch allocation of 00:00-05:00
within 2 %, the run rate is the month so far + $/h x the hours left, the stray p5 is priced from its launch,
the unpriced box is named but not priced, and the days of the month nobody recorded are said, not $0.
The next day, the reconciliation compares the complete day with the live integral; budget_burn warns on
an experiment's run rate."""

import math
import re
from datetime import datetime, timedelta, timezone

import pytest

from foxhunt_obs.lib.alerts.collect import Sources, collect, fresh_spend_now
from foxhunt_obs.lib.alerts.evaluate import budget_burn
from foxhunt_obs.lib.alerts.rules import load_rules
from foxhunt_obs.lib.delivery.pushgateway import push_spend
from foxhunt_obs.lib.ingest.live_spend import live_rate
from foxhunt_obs.lib.ingest.untracked import UntrackedSpend
from foxhunt_obs.lib.names import CLUSTER_IDLE
from foxhunt_obs.lib.schemas import SPEND_NOW
from foxhunt_obs.lib.sources.ec2 import Ec2Error, Ec2Instance
from foxhunt_obs.lib.sources.prometheus import PrometheusClient
from foxhunt_obs.lib.tables import spend
from foxhunt_obs.sandbox.servers.pushgateway import PushgatewayServer

pytestmark = pytest.mark.timeout(600)

P5 = "i-0fffffffffffffff5"
G4 = "i-0fffffffffffffff4"


class Inventory:
    """A listing with launch times of the scenario's day (moto stamps its own clock's: the e2e replay of
    untracked_spend covers the describe_instances path)."""

    def __init__(self, start: datetime):
        self.start = start

    def running(self):
        t = self.start
        return [
            Ec2Instance("us-east-1", P5, "p5.48xlarge", "running", t + timedelta(hours=1, minutes=10), "on-demand", "us-east-1a", {"Name": "bench-p5", "Experiment": "ppo-humanoid"}),
            Ec2Instance("us-east-1", G4, "g4dn.xlarge", "running", t + timedelta(hours=4), "on-demand", "us-east-1a", {"Name": "notebook"}),
        ]  # fmt: skip


@pytest.fixture(scope="module")
def setting(small, prometheus, small_priced_lake, tmp_path_factory):
    lake, allocation = small_priced_lake
    with PushgatewayServer(workdir=tmp_path_factory.mktemp("gateway")) as gateway:
        yield small, PrometheusClient(prometheus.url), lake, allocation, gateway


@pytest.fixture(scope="module")
def at_five(setting):
    small, client, lake, _, gateway = setting
    now = small.start + timedelta(hours=5)
    built = spend.spend_now(
        lake, client, UntrackedSpend(Inventory(small.start), client), now, gateway.url, push_spend
    )
    return now, built


def test_today_is_the_batch_allocation_so_far(setting, at_five):
    _, _, _, allocation, _ = setting
    now, built = at_five
    rows = built.frame()
    cluster = rows[rows.source == "cluster"].set_index("experiment")
    before = allocation[allocation["hour"] < now]
    batch = before["allocated_usd"].sum() + before["unallocated_usd"].sum()
    assert abs(cluster["today_usd"].sum() - batch) / batch < 0.02
    assert {CLUSTER_IDLE, "ppo-humanoid", "dqn-atari"} <= set(cluster.index)
    # nothing of November before the 16th anywhere: the month is today, and the 15 days are said
    assert cluster["month_usd"].to_dict() == pytest.approx(cluster["today_usd"].to_dict())
    complete = next(c for c in built.checks if c.name == "month_complete")
    assert not complete.passed and complete.metadata["days_missing"] == 15
    assert complete.metadata["missing"].startswith("2026-11-01, 2026-11-02")


def test_the_run_rate_is_the_month_so_far_plus_the_rate_for_the_hours_left(setting, at_five):
    _, client, _, _, _ = setting
    now, built = at_five
    rows = built.frame()
    hours_left = (datetime(2026, 12, 1, tzinfo=timezone.utc) - now).total_seconds() / 3600
    assert hours_left == 355
    cluster = rows[rows.source == "cluster"].set_index("experiment")
    assert cluster["usd_per_hour"].to_dict() == pytest.approx(live_rate(client, now))
    assert cluster["run_rate_usd"].to_dict() == pytest.approx(
        (cluster["month_usd"] + cluster["usd_per_hour"] * hours_left).to_dict()
    )


def test_untracked_instances_are_priced_from_their_launch_and_pushed(setting, at_five):
    _, _, lake, _, gateway = setting
    now, built = at_five
    rows = built.frame()
    (p5,) = rows[rows.source == "untracked"].itertuples()
    assert (p5.experiment, p5.usd_per_hour) == ("ppo-humanoid", 55.04)
    assert p5.today_usd == pytest.approx(55.04 * (3 + 50 / 60))
    assert p5.run_rate_usd == pytest.approx(55.04 * (3 + 50 / 60 + 355))
    assert built.summary["untracked_instances"] == 2 and built.summary["untracked_unpriced"] == 1
    stored = lake.read_partition(SPEND_NOW, "2026-11-16").to_pandas()
    assert len(stored) == len(rows) and stored["run_rate_usd"].sum() == pytest.approx(
        rows["run_rate_usd"].sum()
    )
    text = gateway.metrics_text()
    (line,) = [x for x in text.splitlines() if x.startswith("foxhunt_untracked_instance_cost_usd_per_hour{")]
    assert f'instance_id="{P5}"' in line and float(line.rsplit(" ", 1)[1]) == 55.04
    assert G4 not in text  # unpriced: no made-up $/h
    assert not re.search(r"^foxhunt_lake_cost_usd\{", text, re.M)  # no complete day in the lake yet


def test_the_next_day_reconciles_the_complete_day(setting):
    small, client, lake, allocation, _ = setting
    table = spend.reconcile(lake, client, small.start + timedelta(days=1))
    assert set(table["day"]) == {"2026-11-16"}
    live, batch = table["live_usd"].sum(), table["batch_usd"].sum()
    assert batch == pytest.approx(allocation["allocated_usd"].sum() + allocation["unallocated_usd"].sum())
    assert abs(live - batch) / batch < 0.02
    print(
        f"reconciliation 2026-11-16: live ${live:.2f} vs cost_allocation ${batch:.2f} ({(live - batch) / batch:+.3%})"
    )


def test_budget_burn_warns_on_an_experiments_run_rate(setting, at_five, tmp_path):
    _, _, lake, _, _ = setting
    now, built = at_five
    rows = built.frame()
    projected = rows[rows.experiment == "ppo-humanoid"]["run_rate_usd"].sum()
    overrides = tmp_path / "rules.yaml"
    overrides.write_text(
        f"rules: {{budget_burn: {{budgets: {{ppo-humanoid: {math.ceil(projected)}, dqn-atari: 1000000}}}}}}\n"
    )
    (rule,) = [r for r in load_rules(overrides=overrides) if r.id == "budget_burn"]
    frame = fresh_spend_now(lake, now)
    (finding,) = budget_burn(rule, frame)
    assert finding.labels == {"budget_name": "ppo-humanoid (experiment)"}
    assert finding.value == pytest.approx(projected) and finding.extra["basis"] == "spend_now run rate"
    # older than 2 hours, a refresh is no run rate
    assert fresh_spend_now(lake, now + timedelta(hours=2, minutes=1)).empty


class Unlistable:
    """EC2 access denied: spend_now keeps the cluster's figures and says what is missing."""

    def frame(self, now):
        raise Ec2Error("EC2 us-east-1: describe_instances (states pending, running) failed: AccessDenied")


def test_without_ec2_access_the_cluster_figures_stand(setting):
    small, client, lake, _, _ = setting
    built = spend.spend_now(lake, client, Unlistable(), small.start + timedelta(hours=5, minutes=30))
    rows = built.frame()
    assert set(rows["source"]) == {"cluster"} and rows["today_usd"].sum() > 0
    listed = next(c for c in built.checks if c.name == "untracked_listed")
    assert not listed.passed and "AccessDenied" in listed.metadata["error"]


def test_live_budgets_without_a_fresh_spend_now_are_said_not_resolved(setting, at_five, tmp_path):
    small, _, lake, _, _ = setting
    overrides = tmp_path / "rules.yaml"
    overrides.write_text("rules: {budget_burn: {budgets: {ppo-humanoid: 1}}}\n")
    rules = [r for r in load_rules(overrides=overrides) if r.id == "budget_burn"]
    stale = collect(rules, Sources(lake=lake), small.start + timedelta(hours=9))
    assert "budget_burn" not in stale.evaluated  # its alerts keep their state
    assert "spend_now has no refresh" in stale.errors["lake (budget_burn)"]
    fresh = collect(rules, Sources(lake=lake), small.start + timedelta(hours=5, minutes=31))
    assert "budget_burn" in fresh.evaluated and not fresh.errors
    assert [f.labels["budget_name"] for f in fresh.findings] == ["ppo-humanoid (experiment)"]
