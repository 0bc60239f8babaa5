from datetime import date, timedelta
from decimal import Decimal

import pytest
import yaml

from foxhunt_obs.lib.analysis.cost_estimate import StorageCapacity, estimate_day
from foxhunt_obs.lib.analysis.prices import PRICES_FILE, PriceError, hours_in_month, load_price_table


def test_every_price_has_a_source_and_a_date():
    raw = yaml.safe_load(PRICES_FILE.read_text())["prices"]
    assert len(raw) >= 20
    for row in raw:
        assert str(row["source"]).startswith("https://"), row
        assert isinstance(row["as_of"], date), row
    table = load_price_table("us-east-1")
    assert len(table.prices) == len([r for r in raw if r["region"] == "us-east-1"])


def test_the_prices_the_issue_quotes():
    t = load_price_table("us-east-1")
    assert t.get("AmazonEC2", "p4d.24xlarge").usd == Decimal("21.957642")
    assert t.get("AmazonEC2", "p4de.24xlarge").usd == Decimal("27.44705")
    assert t.get("AmazonEC2", "p5.48xlarge").usd == Decimal("55.04")
    for family in ("g5", "g6e"):
        assert t.find("AmazonEC2", f"{family}.xlarge") and t.find("AmazonEC2", f"{family}.48xlarge")
    # 4.8 TiB PERSISTENT_2 at 125 MB/s/TiB is about $696 a month; S3 $23 per TB-month
    fsx = t.get("AmazonFSx", "PERSISTENT_2/125")
    month = sum(t.per_hour(fsx, 4800, date(2026, 11, 1)) for _ in range(hours_in_month(date(2026, 11, 1))))
    assert month == pytest.approx(Decimal(696), abs=Decimal("0.001"))
    assert t.get("AmazonS3", "STANDARD").usd * 1000 == Decimal(23)


def test_unknown_keys_and_regions_are_named():
    t = load_price_table("us-east-1")
    with pytest.raises(PriceError, match=r"no AmazonEC2 price for 'p9.huge' in us-east-1 \(known: .*p4de"):
        t.get("AmazonEC2", "p9.huge")
    with pytest.raises(PriceError, match="no prices for region 'mars-1'"):
        load_price_table("mars-1")


@pytest.mark.parametrize(
    "row, message",
    [
        ({"usd": "1.0"}, "missing as_of, source"),
        ({"usd": "abc", "as_of": date(2025, 1, 1), "source": "x"}, "usd 'abc' is not a number"),
        ({"usd": "-1", "as_of": date(2025, 1, 1), "source": "x"}, "non-negative"),
        ({"usd": "1", "as_of": "soon", "source": "x"}, "is not a date"),
        ({"usd": "1", "as_of": date(2025, 1, 1), "source": " "}, "empty source"),
    ],
)
def test_malformed_tables_are_refused(tmp_path, row, message):
    base = {"region": "us-east-1", "service": "AmazonEC2", "key": "p4de.24xlarge", "unit": "hour"}
    path = tmp_path / "prices.yaml"
    path.write_text(yaml.safe_dump({"prices": [{**base, **row}]}))
    with pytest.raises(PriceError, match=rf"{path}: prices\[0\]: .*{message}"):
        load_price_table("us-east-1", path)


def test_estimate_prices_node_hours_and_storage():
    t = load_price_table("us-east-1")
    day = date(2026, 11, 22)
    est = estimate_day(
        day,
        [("ip-a", "p4de.24xlarge", 24.0), ("ip-b", "p4de.24xlarge", 22.0), ("cpu-1", "m9.large", 24.0)],
        [
            StorageCapacity("fs-1", "PERSISTENT_2", 125, 4800),
            StorageCapacity("fs-gone", "PERSISTENT_2", 125, 4800, 0.0),
        ],
        t,
    )
    rows = {r["resource_id"]: r for r in est.table.to_pylist()}
    assert rows["ip-a"]["cost_usd"] == pytest.approx(24 * 27.44705)
    assert rows["ip-b"]["cost_usd"] == pytest.approx(22 * 27.44705)
    assert rows["fs-1"]["cost_usd"] == pytest.approx(4800 * 0.145 * 24 / 720)
    assert rows["fs-1"]["usage_quantity"] == pytest.approx(4800 * 24 / 720)  # GB-months
    assert all(r["source"] == "estimate" and r["estimated"] and r["day"] == day for r in rows.values())
    assert est.unpriced == ["cpu-1 (m9.large)"]
    assert est.node_hours == 70.0


def test_a_stale_table_warns_with_its_age(tmp_path):
    """costs_daily's price_table_current: a WARN once the newest row is older than max_age_days."""
    from foxhunt_obs.lib.tables.costs import price_table_check

    table = load_price_table("us-east-1")
    newest = max(p.as_of for p in table.prices)
    assert table.max_age_days == 90  # data/prices.yaml
    fresh = price_table_check(table, newest + timedelta(days=90))
    stale = price_table_check(table, newest + timedelta(days=91))
    assert fresh.passed and not stale.passed and stale.severity == "WARN"
    assert stale.metadata["age_days"] == 91 and stale.metadata["newest_as_of"] == newest.isoformat()
    raw = yaml.safe_load(PRICES_FILE.read_text())
    raw["max_age_days"] = 0
    broken = tmp_path / "prices.yaml"
    broken.write_text(yaml.safe_dump(raw))
    with pytest.raises(PriceError, match="max_age_days must be a positive whole number, got 0"):
        load_price_table("us-east-1", broken)
