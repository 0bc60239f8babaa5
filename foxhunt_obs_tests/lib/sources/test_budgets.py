"""BudgetsSource against a real moto server (Budgets and STS)."""

from __future__ import annotations

from datetime import date, datetime, timezone
from decimal import Decimal

import pytest

from foxhunt_obs.lib.schemas import BUDGETS
from foxhunt_obs.lib.sources.budgets import BudgetsError, BudgetsSource, account_id, forecast_table
from foxhunt_obs_tests.lib.sources.aws_fixtures import MotoServer

UTC = timezone.utc
DAY = date(2026, 11, 29)
SYNCED = datetime(2026, 11, 29, 12, 0, 0, 123000, tzinfo=UTC)


@pytest.fixture(scope="module")
def moto():
    server = MotoServer().start()
    yield server
    server.stop()


@pytest.fixture
def clients(moto):
    moto.reset()
    return moto.client("budgets"), moto.client("sts")


def _budget(name: str, **kw) -> dict:
    b = {"BudgetName": name, "TimeUnit": "MONTHLY", "BudgetType": "COST"}
    b.update(kw)
    return b


@pytest.mark.servers
def test_budgets_rows(clients):
    budgets, sts = clients
    account = account_id(sts)
    assert account == "123456789012"  # moto's default account
    november = {"Start": datetime(2026, 11, 1, tzinfo=UTC), "End": datetime(2026, 12, 1, tzinfo=UTC)}
    budgets.create_budget(
        AccountId=account,
        Budget=_budget(
            "gpu-monthly",
            BudgetLimit={"Amount": "50000.00", "Unit": "USD"},
            TimePeriod=november,
            CalculatedSpend={
                "ActualSpend": {"Amount": "41234.5678", "Unit": "USD"},
                "ForecastedSpend": {"Amount": "52100.10", "Unit": "USD"},
            },
        ),
    )
    # no CalculatedSpend given: moto reports 0 spent (AWS would report the real spend)
    budgets.create_budget(
        AccountId=account, Budget=_budget("fsx", BudgetLimit={"Amount": "900", "Unit": "USD"})
    )
    budgets.create_budget(
        AccountId=account,
        Budget=_budget("gpu-hours", BudgetType="USAGE", BudgetLimit={"Amount": "1000", "Unit": "Hrs"}),
    )

    table = BudgetsSource(budgets, account).budgets(DAY, partition="2026-11-29", synced_at=SYNCED)
    assert table.schema == BUDGETS.schema
    rows = {r["budget_name"]: r for r in table.to_pylist()}
    assert table.column("budget_name").to_pylist() == ["fsx", "gpu-hours", "gpu-monthly"]
    gpu = rows["gpu-monthly"]
    assert gpu == {
        "day": DAY,
        "source": "budgets",
        "account_id": account,
        "budget_name": "gpu-monthly",
        "budget_type": "COST",
        "time_unit": "MONTHLY",
        "period_start": datetime(2026, 11, 1, tzinfo=UTC),
        "period_end": datetime(2026, 12, 1, tzinfo=UTC),
        "limit_usd": 50000.0,
        "actual_usd": 41234.5678,
        "forecast_usd": 52100.10,
        "synced_at": SYNCED,
    }
    assert (rows["fsx"]["limit_usd"], rows["fsx"]["actual_usd"], rows["fsx"]["forecast_usd"]) == (
        900.0,
        0.0,
        0.0,
    )
    # an amount in hours is not dollars: kept out of the *_usd columns
    assert rows["gpu-hours"]["budget_type"] == "USAGE" and rows["gpu-hours"]["limit_usd"] is None


@pytest.mark.servers
def test_planned_limits_pick_the_period_of_the_day(clients):
    budgets, _ = clients
    nov, dec = (str(int(datetime(2026, m, 1, tzinfo=UTC).timestamp())) for m in (11, 12))
    budgets.create_budget(
        AccountId="123456789012",
        Budget=_budget(
            "planned",
            PlannedBudgetLimits={
                nov: {"Amount": "100", "Unit": "USD"},
                dec: {"Amount": "200", "Unit": "USD"},
            },
        ),
    )
    src = BudgetsSource(budgets, "123456789012")
    assert src.budgets(DAY).column("limit_usd").to_pylist() == [100.0]
    assert src.budgets(date(2026, 12, 2)).column("limit_usd").to_pylist() == [200.0]


@pytest.mark.servers
def test_synced_at_defaults_to_now_in_ms(clients):
    budgets, _ = clients
    budgets.create_budget(
        AccountId="123456789012", Budget=_budget("b", BudgetLimit={"Amount": "1", "Unit": "USD"})
    )
    before = datetime.now(UTC)
    synced = BudgetsSource(budgets, "123456789012").budgets(DAY).column("synced_at").to_pylist()[0]
    assert before.replace(microsecond=before.microsecond // 1000 * 1000) <= synced <= datetime.now(UTC)
    assert synced.microsecond % 1000 == 0


@pytest.mark.servers
def test_no_budgets_is_an_empty_table(clients):
    budgets, _ = clients
    table = BudgetsSource(budgets, "123456789012").budgets(DAY)
    assert table.num_rows == 0 and table.schema == BUDGETS.schema


@pytest.mark.servers
def test_an_aws_error_names_the_call_and_partition(moto):
    # a bad account id: Budgets validates it (12 digits), botocore before sending
    budgets = moto.client("budgets")
    with pytest.raises(
        BudgetsError, match=r"(?s)describe_budgets account 12 \(partition 2026-11-29\): .*AccountId"
    ):
        BudgetsSource(budgets, "12").budgets(DAY, partition="2026-11-29")


def test_cost_explorer_forecast_as_a_budgets_row():
    forecast = {"period_start": DAY, "period_end": date(2026, 12, 1), "forecast_usd": Decimal("1234.5678901")}
    table = forecast_table(forecast, DAY, "123456789012", synced_at=SYNCED)
    assert table.schema == BUDGETS.schema
    assert table.to_pylist() == [
        {
            "day": DAY,
            "source": "ce_forecast",
            "account_id": "123456789012",
            "budget_name": "Cost Explorer forecast",
            "budget_type": "COST",
            "time_unit": "MONTHLY",
            "period_start": datetime(2026, 11, 29, tzinfo=UTC),
            "period_end": datetime(2026, 12, 1, tzinfo=UTC),
            "limit_usd": None,
            "actual_usd": None,
            "forecast_usd": 1234.5678901,
            "synced_at": SYNCED,
        }
    ]
