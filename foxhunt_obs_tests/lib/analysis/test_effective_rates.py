"""Effective rates from the bill: CUR 2.0 lines (real column names) through the CUR reader into
costs_hourly, then $ per instance-hour per (region, instance type), and the estimate priced with them."""

from __future__ import annotations

import io
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from foxhunt_obs.lib.analysis.cost_estimate import estimate_day
from foxhunt_obs.lib.analysis.effective_rates import (
    EffectiveRates,
    effective_rates,
    hourly_rate,
    region_of_usage_type,
)
from foxhunt_obs.lib.analysis.prices import load_price_table
from foxhunt_obs.lib.sources.cur import CurSource, Manifest

UTC = timezone.utc
DAY = datetime(2026, 11, 20, tzinfo=UTC)


def cur_line(hour: int, line_type: str, usage_type: str, instance_type: str, unblended: float, **kw) -> dict:
    """One CUR 2.0 line item (AWS Data Exports column names, see fixtures/real/cur/cur2_columns.txt)."""
    out = {
        "line_item_usage_start_date": DAY.replace(tzinfo=None) + timedelta(hours=hour),
        "line_item_line_item_type": line_type,
        "line_item_unblended_cost": unblended,
        "line_item_usage_amount": 1.0,
        "resource_tags": [("user_experiment", "ppo-a")],
        "line_item_usage_account_id": "111122223333",
        "line_item_product_code": "AmazonEC2",
        "line_item_usage_type": usage_type,
        "line_item_operation": "RunInstances",
        "line_item_resource_id": f"i-{instance_type.replace('.', '')}",
        "product_instance_type": instance_type,
        "savings_plan_savings_plan_effective_cost": 0.0,
        "reservation_effective_cost": 0.0,
    }
    out.update(kw)
    return out


# Hand-computed: us-east-2 p5.48xlarge on-demand $55.04/h.
# * a Savings Plan covers p5 hours 0-1 at $38.528/h (30 % off): SavingsPlanCoveredUsage carries the on-demand
#   cost as unblended and the SP rate as savings_plan_savings_plan_effective_cost; its SavingsPlanNegation
#   line cancels the unblended charge. Effective: 38.528.
# * a Reserved Instance covers p4d.24xlarge hour 0: DiscountedUsage, unblended 0, reservation_effective_cost
#   13.17 (the RI's amortized upfront + recurring fee for the hour). Effective: 13.17.
# * spot g6e.xlarge hours 0-2 at 0.61, 0.62, 0.63 (the spot price each hour). Effective: 0.62.
# * p5en.48xlarge: one SP hour (44.3072) and one on-demand hour (63.296). Effective: the blend, 53.8016.
BILL = [
    cur_line(0, "SavingsPlanCoveredUsage", "USE2-BoxUsage:p5.48xlarge", "p5.48xlarge", 55.04,
             savings_plan_savings_plan_effective_cost=38.528),
    cur_line(0, "SavingsPlanNegation", "USE2-BoxUsage:p5.48xlarge", "p5.48xlarge", -55.04),
    cur_line(1, "SavingsPlanCoveredUsage", "USE2-BoxUsage:p5.48xlarge", "p5.48xlarge", 55.04,
             savings_plan_savings_plan_effective_cost=38.528),
    cur_line(1, "SavingsPlanNegation", "USE2-BoxUsage:p5.48xlarge", "p5.48xlarge", -55.04),
    cur_line(0, "DiscountedUsage", "USE2-BoxUsage:p4d.24xlarge", "p4d.24xlarge", 0.0,
             reservation_effective_cost=13.17),
    cur_line(0, "Usage", "USE2-SpotUsage:g6e.xlarge", "g6e.xlarge", 0.61),
    cur_line(1, "Usage", "USE2-SpotUsage:g6e.xlarge", "g6e.xlarge", 0.62),
    cur_line(2, "Usage", "USE2-SpotUsage:g6e.xlarge", "g6e.xlarge", 0.63),
    cur_line(3, "SavingsPlanCoveredUsage", "USE2-BoxUsage:p5en.48xlarge", "p5en.48xlarge", 63.296,
             savings_plan_savings_plan_effective_cost=44.3072),
    cur_line(4, "Usage", "USE2-BoxUsage:p5en.48xlarge", "p5en.48xlarge", 63.296),
    # us-east-1 EC2 usage types carry no prefix
    cur_line(0, "Usage", "BoxUsage:p5.48xlarge", "p5.48xlarge", 55.04),
    # not instance-hours of a rate: an unused capacity reservation hour, an unknown region prefix
    cur_line(5, "Usage", "USE2-UnusedBox:p5.48xlarge", "p5.48xlarge", 55.04),
    cur_line(6, "Usage", "ZZZ9-BoxUsage:p5.48xlarge", "p5.48xlarge", 55.04),
]  # fmt: skip


class _S3:
    """get_object of one in-memory object: the CUR reader's only S3 call for a data file."""

    def __init__(self, body: bytes):
        self.body = body

    def get_object(self, Bucket, Key):  # noqa: N803 (boto3's argument names)
        return {"Body": io.BytesIO(self.body)}


def costs_hourly(lines: list[dict]) -> pa.Table:
    """The lines as costs_hourly rows, through the project's CUR 2.0 reader (amortization included)."""
    cols = {}
    for k in lines[0]:
        vals = [ln[k] for ln in lines]
        if k == "resource_tags":
            cols[k] = pa.array(vals, pa.map_(pa.string(), pa.string()))
        elif k == "line_item_usage_start_date":
            cols[k] = pa.array(vals, pa.timestamp("ms"))
        else:
            cols[k] = pa.array(vals)
    buf = io.BytesIO()
    pq.write_table(pa.table(cols), buf)
    uri = "s3://cur/exports/foxhunt/data/BILLING_PERIOD=2026-11/foxhunt-00001.snappy.parquet"
    manifest = Manifest(uri, "2026-11", DAY, "exec-1", "", (uri,), (), "", "")
    cur = CurSource(_S3(buf.getvalue()), "s3://cur/exports/foxhunt")
    return cur._read_file(uri, manifest, DAY, DAY + timedelta(days=1), "test", set())


def test_region_from_the_usage_type_prefix():
    assert region_of_usage_type("BoxUsage:p5.48xlarge") == "us-east-1"
    assert region_of_usage_type("USE1-BoxUsage:p5.48xlarge") == "us-east-1"
    assert region_of_usage_type("USE2-BoxUsage:p5.48xlarge") == "us-east-2"
    assert region_of_usage_type("USW2-SpotUsage:g5.xlarge") == "us-west-2"
    assert region_of_usage_type("EU-BoxUsage:g5.xlarge") == "eu-west-1"
    assert region_of_usage_type("ZZZ9-BoxUsage:g5.xlarge") is None  # not guessed
    assert region_of_usage_type("USE2-UnusedBox:p5.48xlarge") is None  # no box or spot hour


def test_savings_plan_reserved_and_spot_hours_give_the_hand_computed_rates():
    rows = costs_hourly(BILL)
    rates = effective_rates(rows)
    got = {k: r.usd_per_hour for k, r in rates.rates.items()}
    assert got == {
        ("us-east-2", "p5.48xlarge"): Decimal("38.528"),
        ("us-east-2", "p4d.24xlarge"): Decimal("13.17"),
        ("us-east-2", "g6e.xlarge"): Decimal("0.62"),
        ("us-east-2", "p5en.48xlarge"): Decimal("53.8016"),
        ("us-east-1", "p5.48xlarge"): Decimal("55.04"),
    }
    p5 = rates.get("us-east-2", "p5.48xlarge")
    assert p5.hours == 2.0 and p5.day == DAY.date() and p5.hours_by_option == {"savings_plan": 2.0}
    assert rates.get("us-east-2", "p4d.24xlarge").hours_by_option == {"reserved": 1.0}
    assert rates.get("us-east-2", "g6e.xlarge").hours_by_option == {"spot": 3.0}
    assert rates.get("us-east-2", "p5en.48xlarge").hours_by_option == {"on_demand": 1.0, "savings_plan": 1.0}
    assert rates.unknown_region_lines == 1  # ZZZ9-: counted, left out


def test_the_newest_landed_bill_prices_later_hours():
    day2 = DAY + timedelta(days=1)
    on_demand = {"hour": DAY + timedelta(hours=3), "service": "AmazonEC2", "line_item_type": "Usage",
                 "usage_type": "USE2-BoxUsage:p5.48xlarge", "instance_type": "p5.48xlarge",
                 "usage_amount": 1.0, "amortized_usd": 55.04}  # fmt: skip
    covered = {**on_demand, "hour": day2 + timedelta(hours=5), "line_item_type": "SavingsPlanCoveredUsage",
               "amortized_usd": 38.528}  # fmt: skip
    rows = [on_demand, covered]
    assert effective_rates(rows).get("us-east-2", "p5.48xlarge").usd_per_hour == Decimal("38.528")
    first = effective_rates(rows, until=day2).get("us-east-2", "p5.48xlarge")
    assert first.usd_per_hour == Decimal("55.04") and first.day == DAY.date()
    assert effective_rates(rows, until=DAY).rates == {}  # no bill landed yet


@pytest.fixture
def us_east_2(tmp_path):
    """A us-east-2 price table: p5 and p4d as the price table has them, g5.xlarge for a type with no bill."""
    rows = [
        {"region": "us-east-2", "service": "AmazonEC2", "key": k, "usd": v, "unit": "hour",
         "as_of": date(2026, 12, 2), "source": "https://example.test/prices"}
        for k, v in (("p5.48xlarge", "55.04"), ("p4d.24xlarge", "21.95764"), ("g5.xlarge", "1.006"))
    ]  # fmt: skip
    path = tmp_path / "prices.yaml"
    path.write_text(yaml.safe_dump({"currency": "USD", "max_age_days": 90, "prices": rows}))
    return load_price_table("us-east-2", path)


def test_the_estimate_uses_the_effective_rates_and_says_so(us_east_2):
    rates = effective_rates(costs_hourly(BILL))
    later = date(2026, 11, 21)
    nodes = [("ip-a", "p5.48xlarge", 24.0), ("ip-b", "p4d.24xlarge", 10.0), ("ip-c", "g5.xlarge", 5.0),
             ("ip-d", "p5en.48xlarge", 2.0), ("ip-e", "m9.large", 3.0)]  # fmt: skip
    est = estimate_day(later, nodes, [], us_east_2, rates)
    cost = {r["resource_id"]: r["cost_usd"] for r in est.table.to_pylist()}
    assert cost["ip-a"] == pytest.approx(24 * 38.528)  # Savings Plan rate, not 24 × 55.04
    assert cost["ip-b"] == pytest.approx(10 * 13.17)  # RI rate
    assert cost["ip-c"] == pytest.approx(5 * 1.006)  # no bill for g5.xlarge: the list price
    assert cost["ip-d"] == pytest.approx(2 * 53.8016)  # billed, though not in the price table
    assert est.unpriced == ["ip-e (m9.large)"]
    assert est.basis == {"ip-a": "effective", "ip-b": "effective", "ip-c": "list", "ip-d": "effective"}
    assert est.ec2_rates["p5.48xlarge"] == ("effective", 38.528, "cur 2026-11-20")
    assert est.ec2_rates["g5.xlarge"] == ("list", 1.006, "price table us-east-2 2026-12-02")


def test_without_a_bill_the_list_price_prices_and_the_basis_says_list(us_east_2):
    nodes = [("ip-a", "p5.48xlarge", 24.0), ("ip-b", "p4d.24xlarge", 10.0)]
    for rates in (None, effective_rates([]), effective_rates(costs_hourly(BILL), until=DAY)):
        est = estimate_day(date(2026, 11, 21), nodes, [], us_east_2, rates)
        cost = {r["resource_id"]: r["cost_usd"] for r in est.table.to_pylist()}
        assert cost == {"ip-a": pytest.approx(24 * 55.04), "ip-b": pytest.approx(10 * 21.95764)}
        assert est.basis == {"ip-a": "list", "ip-b": "list"}
    # another region's bill does not price this region's hours
    only_east_1 = EffectiveRates({k: v for k, v in effective_rates(costs_hourly(BILL)).rates.items()
                                  if k[0] == "us-east-1"})  # fmt: skip
    assert hourly_rate("p5.48xlarge", us_east_2, only_east_1).basis == "list"


def test_the_sandbox_bill_is_on_demand_so_effective_equals_list():
    """The sandbox bills every instance-hour at the price table's on-demand price (fractions of hours
    where a node was lost): its effective rates are the list prices exactly, so its estimate is unchanged."""
    from foxhunt_obs.sandbox.story.scenario import load_scenario
    from foxhunt_obs.sandbox.writers import bills

    scenario = load_scenario("default")
    items = bills.line_items(scenario)
    rows = [
        {"hour": i.hour, "service": i.service, "line_item_type": "Usage", "usage_type": i.usage_type,
         "instance_type": i.instance_type, "usage_amount": float(i.usage_amount),
         "amortized_usd": float(i.amortized)}
        for i in items
    ]  # fmt: skip
    region = scenario.aws.region
    prices = load_price_table(region)
    rates = effective_rates(rows)
    ec2 = rates.for_region(region)
    assert ec2 and rates.unknown_region_lines == 0
    assert {t for t in ec2} == {i.instance_type for i in items if i.service == "AmazonEC2"}
    for itype, rate in ec2.items():
        assert rate.usd_per_hour == prices.get("AmazonEC2", itype).usd, itype
        assert rate.hours_by_option.keys() == {"on_demand"}
    nodes = [(f"node-{t}", t, 24.0) for t in ec2]
    with_bill = estimate_day(date(2026, 11, 22), nodes, [], prices, rates)
    without = estimate_day(date(2026, 11, 22), nodes, [], prices)
    assert with_bill.table.equals(without.table)
    assert set(with_bill.basis.values()) == {"effective"} and set(without.basis.values()) == {"list"}


def test_the_cost_allocation_prices_node_hours_at_the_rates_the_estimate_used(us_east_2, tmp_path):
    """cost_allocation's ec2_prices view (before a day's own bill is in) holds the same rates the estimate
    priced the day with: the bill's effective rate per type, else the list price, so the allocation still
    sums to the estimate."""
    from foxhunt_obs.lib.lake import Lake
    from foxhunt_obs.lib.schemas import COSTS_HOURLY, NODE_SAMPLES
    from foxhunt_obs.lib.tables.cost_model import bill_rates, register_node_instances, register_prices

    lake = Lake(str(tmp_path / "lake"))
    # an on-demand p5 outside the cluster (no node_samples row): it must not pull the nodes' SP rate up
    stray = cur_line(
        6, "Usage", "USE2-BoxUsage:p5.48xlarge", "p5.48xlarge", 55.04, line_item_resource_id="i-stray"
    )
    lake.write_partition(COSTS_HOURLY, COSTS_HOURLY.key(DAY), costs_hourly(BILL + [stray]))
    nodes = sorted({line["line_item_resource_id"] for line in BILL})
    rows = [
        {"ts": DAY, "node": f"ip-{i}", "instance_id": iid, "step_seconds": 15.0}
        for i, iid in enumerate(nodes)
    ]
    lake.write_partition(
        NODE_SAMPLES, NODE_SAMPLES.key(DAY), pa.Table.from_pylist(rows, schema=NODE_SAMPLES.schema)
    )
    con = lake.connect([COSTS_HOURLY, NODE_SAMPLES])
    try:
        register_prices(con, us_east_2, bill_rates(con, DAY + timedelta(days=1)))
        view = dict(con.execute("SELECT instance_type, usd_per_hour FROM ec2_prices").fetchall())
        assert view == pytest.approx(
            {"p5.48xlarge": 38.528, "p4d.24xlarge": 13.17, "g5.xlarge": 1.006, "p5en.48xlarge": 53.8016,
             "g6e.xlarge": 0.62}
        )  # fmt: skip
        # the day before the bill: list prices only
        register_prices(con, us_east_2, bill_rates(con, DAY - timedelta(days=1)))
        view = dict(con.execute("SELECT instance_type, usd_per_hour FROM ec2_prices").fetchall())
        assert view == pytest.approx({"p5.48xlarge": 55.04, "p4d.24xlarge": 21.95764, "g5.xlarge": 1.006})
        # a run of several days reads the instances once (register_node_instances): the same rates
        days = [DAY - timedelta(days=1), DAY, DAY + timedelta(days=1)]
        register_node_instances(con, days)
        for day in days:
            assert bill_rates(con, day, node_instances=True) == bill_rates(con, day)
    finally:
        con.close()
