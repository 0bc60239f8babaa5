"""Live cost against the batch path (the live $/h summed over a day matches that day's
cost_allocation within 2 % on the sandbox): the `small` scenario's TSDB holds the live cost rules'
records backfilled over its six hours (sandbox/servers/prometheus.py backfill_cost_rules); live_spend
integrates them, and the day's cost_allocation is built from the same Prometheus by the functions the
assets call (gpu_samples, node_samples, gpu_hourly, cost_allocation on the price table: no bill yet, as
the live estimate stands in for). Both are compared per experiment and in total, and with the scenario's
ground truth (truth.gpu_allocations, charged from the bill's line items)."""

from datetime import datetime, timedelta

import pandas as pd
import pytest

from foxhunt_obs.lib.analysis.prices import load_price_table
from foxhunt_obs.lib.ingest.live_spend import live_idle_spend, live_rate, live_spend
from foxhunt_obs.lib.names import CLUSTER_IDLE
from foxhunt_obs.lib.sources.prometheus import PrometheusClient
from foxhunt_obs.sandbox.story import truth

pytestmark = pytest.mark.timeout(600)

TOLERANCE = 0.02  # within 2 %


def _midnight(t: datetime) -> datetime:
    return t.replace(hour=0, minute=0, second=0, microsecond=0)


@pytest.fixture(scope="module")
def client(prometheus):
    return PrometheusClient(prometheus.url)


@pytest.fixture(scope="module")
def allocation(small_priced_lake) -> pd.DataFrame:
    """The scenario's day of cost_allocation, on the price table (the estimate: empty bill tables)."""
    return small_priced_lake[1]


def _batch(allocation: pd.DataFrame) -> tuple[dict[str, float], dict[str, float]]:
    """cost_allocation's dollars and idle dollars per experiment; what no pod held is (cluster idle)."""
    df = allocation.assign(experiment=allocation["experiment"].replace("", CLUSTER_IDLE))
    dollars = df.groupby("experiment")[["allocated_usd", "unallocated_usd"]].sum().sum(axis=1)
    # idle $: a holder's idle_usd; (cluster idle)'s dollars are idle whole (as the live rules have it)
    idle = df.groupby("experiment")["idle_usd"].sum() + df.groupby("experiment")["unallocated_usd"].sum()
    return dollars.to_dict(), idle.to_dict()


def _gaps(live: dict[str, float], batch: dict[str, float], what: str) -> dict[str, float]:
    assert set(live) == set(batch), f"{what}: experiments differ: live {sorted(live)}, batch {sorted(batch)}"
    gaps = {e: (live[e] - batch[e]) / batch[e] for e in sorted(batch)}
    gaps["total"] = (sum(live.values()) - sum(batch.values())) / sum(batch.values())
    for e, g in gaps.items():
        lv = sum(live.values()) if e == "total" else live[e]
        bv = sum(batch.values()) if e == "total" else batch[e]
        print(f"{what}: {e:>16}: live ${lv:10.4f}  vs ${bv:10.4f}  relative gap {g:+.3e}")
    return gaps


def test_live_spend_matches_the_days_cost_allocation(small, client, allocation):
    live = live_spend(client, small.start, small.end)
    batch, _ = _batch(allocation)
    gaps = _gaps(live, batch, "live vs cost_allocation")
    assert {CLUSTER_IDLE, "ppo-humanoid", "dqn-atari"} <= set(live)
    assert all(abs(g) < TOLERANCE for g in gaps.values()), gaps


def test_live_idle_spend_matches_the_days_idle_dollars(small, client, allocation):
    """Idle $ within the same 2 %, not exactly: the rules read util once a minute (one scrape in four of
    the 15 s grid), cost_allocation every scrape; dollars do not depend on util and match exactly."""
    live = live_idle_spend(client, small.start, small.end)
    _, batch = _batch(allocation)
    gaps = _gaps(live, batch, "live idle vs cost_allocation idle")
    assert all(abs(g) < TOLERANCE for g in gaps.values()), gaps


def test_live_spend_matches_the_ground_truth(small, client):
    alloc = truth.gpu_allocations(small)
    alloc = alloc.assign(experiment=alloc["experiment"].replace("", CLUSTER_IDLE))
    dollars = alloc.groupby("experiment")[["allocated_usd", "unallocated_usd"]].sum().sum(axis=1).to_dict()
    gaps = _gaps(live_spend(client, small.start, small.end), dollars, "live vs truth")
    assert all(abs(g) < TOLERANCE for g in gaps.values()), gaps


def test_adjacent_windows_add_up_to_the_whole(small, client):
    """The integral's edges: each step is counted in exactly one of two adjacent windows."""
    middle = small.start + timedelta(hours=3, minutes=20)
    whole = live_spend(client, small.start, small.end)
    first, second = live_spend(client, small.start, middle), live_spend(client, middle, small.end)
    for e, usd in whole.items():
        assert first.get(e, 0) + second.get(e, 0) == pytest.approx(usd, rel=1e-9), e


def test_live_rate_is_the_hours_price_share(small, client):
    """At 01:30 every node reports: the rates add up to three p4de.24xlarge nodes' $/h."""
    at = small.start + timedelta(hours=1, minutes=30)
    rates = live_rate(client, at)
    price = float(load_price_table("us-east-1").get("AmazonEC2", "p4de.24xlarge").usd)
    assert sum(rates.values()) == pytest.approx(3 * price, rel=1e-9)
    assert set(rates) == {CLUSTER_IDLE, "ppo-humanoid", "dqn-atari"}
