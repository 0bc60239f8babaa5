"""AWS Budgets as seen on a day (limit, actual and forecasted spend), plus Cost Explorer's forecast as a row
of the same table.

Money columns hold US dollars only: an amount in another unit (a USAGE budget counts hours or GB) is
left null rather than stored under a *_usd name; budget_type says what kind of budget the row is.
"""

from __future__ import annotations

from datetime import date, datetime, timezone
from decimal import Decimal, InvalidOperation
from typing import Any

import pyarrow as pa
from botocore.exceptions import BotoCoreError, ClientError

from foxhunt_obs.lib.errors import InputError
from foxhunt_obs.lib.schemas import BUDGETS

SOURCE = "budgets"
FORECAST_SOURCE = "ce_forecast"
FORECAST_NAME = "Cost Explorer forecast"


class BudgetsError(InputError, RuntimeError):
    """A failed or unreadable Budgets answer; the message names the call, account and partition."""


def account_id(sts_client: Any) -> str:
    """The account the credentials belong to (Budgets wants it on every call)."""
    try:
        return str(sts_client.get_caller_identity()["Account"])
    except (ClientError, BotoCoreError) as e:
        raise BudgetsError(f"STS get_caller_identity: {e}") from e


def now_ms() -> datetime:
    t = datetime.now(timezone.utc)
    return t.replace(microsecond=t.microsecond // 1000 * 1000)


class BudgetsSource:
    def __init__(self, budgets_client: Any, account_id: str):
        self._budgets = budgets_client
        self.account_id = account_id

    def budgets(self, day: date, partition: str = "", synced_at: datetime | None = None) -> pa.Table:
        """One BUDGETS row per budget of the account, as Budgets reports it now."""
        synced_at = synced_at or now_ms()
        where = f"AWS Budgets describe_budgets account {self.account_id}{_for(partition)}"
        found: list[dict] = []
        try:
            for page in self._budgets.get_paginator("describe_budgets").paginate(AccountId=self.account_id):
                found.extend(page.get("Budgets") or [])
        except (ClientError, BotoCoreError) as e:
            raise BudgetsError(f"{where}: {e}") from e
        rows = [_row(b, day, self.account_id, synced_at, where) for b in found]
        rows.sort(key=lambda r: r["budget_name"])
        return pa.Table.from_pylist(rows, schema=BUDGETS.schema)


def forecast_table(
    forecast: dict[str, Any], day: date, account_id: str, synced_at: datetime | None = None
) -> pa.Table:
    """CostExplorerSource.forecast() as a one-row BUDGETS table (source ce_forecast).

    Its period is the forecast's own [today, first of next month) and forecast_usd covers that span only;
    limit and actual are null (Cost Explorer has neither)."""
    row = {
        "day": day,
        "source": FORECAST_SOURCE,
        "account_id": account_id,
        "budget_name": FORECAST_NAME,
        "budget_type": "COST",
        "time_unit": "MONTHLY",
        "period_start": _midnight(forecast["period_start"]),
        "period_end": _midnight(forecast["period_end"]),
        "limit_usd": None,
        "actual_usd": None,
        "forecast_usd": float(forecast["forecast_usd"]),
        "synced_at": synced_at or now_ms(),
    }
    return pa.Table.from_pylist([row], schema=BUDGETS.schema)


def _row(b: dict, day: date, account: str, synced_at: datetime, where: str) -> dict[str, Any]:
    name = b.get("BudgetName", "")
    period = b.get("TimePeriod") or {}
    spend = b.get("CalculatedSpend") or {}
    return {
        "day": day,
        "source": SOURCE,
        "account_id": account,
        "budget_name": name,
        "budget_type": b.get("BudgetType", ""),
        "time_unit": b.get("TimeUnit", ""),
        "period_start": _utc(period.get("Start")),
        "period_end": _utc(period.get("End")),
        "limit_usd": _usd(_limit(b, day), f"{where}: budget {name!r} limit"),
        "actual_usd": _usd(spend.get("ActualSpend"), f"{where}: budget {name!r} CalculatedSpend.ActualSpend"),
        "forecast_usd": _usd(
            spend.get("ForecastedSpend"), f"{where}: budget {name!r} CalculatedSpend.ForecastedSpend"
        ),
        "synced_at": synced_at,
    }


def _limit(b: dict, day: date) -> dict | None:
    """BudgetLimit, or for a budget with PlannedBudgetLimits the planned limit of the period holding `day`
    (its keys are the periods' start times in epoch seconds)."""
    if b.get("BudgetLimit"):
        return b["BudgetLimit"]
    planned = b.get("PlannedBudgetLimits") or {}
    t = datetime(day.year, day.month, day.day, tzinfo=timezone.utc).timestamp()
    starts = sorted((float(k), k) for k in planned if _is_number(k) and float(k) <= t)
    return planned[starts[-1][1]] if starts else None


def _usd(spend: dict | None, what: str) -> float | None:
    if not spend or spend.get("Amount") is None:
        return None
    if (spend.get("Unit") or "USD") != "USD":
        return None
    raw = spend["Amount"]
    try:
        d = Decimal(str(raw).strip())
    except InvalidOperation:
        d = None
    if d is None or not d.is_finite():
        raise BudgetsError(f"{what}: Amount is not a number: {raw!r}")
    return float(d)


def _utc(t: datetime | None) -> datetime | None:
    if t is None:
        return None
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)


def _midnight(d: date) -> datetime:
    return datetime(d.year, d.month, d.day, tzinfo=timezone.utc)


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _for(partition: str) -> str:
    return f" (partition {partition})" if partition else ""
