"""What an instance-hour actually costs the account, from the bill (CUR 2.0 line items in costs_hourly).

The price table holds on-demand list prices; an account with Savings Plans, Reserved Instances or spot pays
less. Once a bill has landed, the effective rate of an instance type in a region is the bill's amortized
cost of its instance-hours ÷ those hours (AWS's amortized view, as Cost Explorer's "amortized costs"):

* on-demand: ``line_item_line_item_type`` Usage, ``line_item_usage_type`` ``[<region>-]BoxUsage:<type>``,
  amortized = unblended;
* Savings Plans: SavingsPlanCoveredUsage, amortized = ``savings_plan_savings_plan_effective_cost`` (the
  SavingsPlanNegation line that cancels its on-demand charge is no instance-hour and is not counted);
* Reserved Instances: DiscountedUsage, amortized = ``reservation_effective_cost``;
* spot: Usage with ``[<region>-]SpotUsage:<type>``, amortized = unblended (the spot price paid).

costs_hourly's ``amortized_usd`` already holds that per line (lib/sources/cur.py, _amortize); this module
only sums. The rate of a (region, instance type) is that of the newest bill day in the rows that ran it,
and it prices every later hour until a newer bill lands (a blend: on a day an SP covered 16 of 24 hours,
the rate is the day's mix). Other instance-hour lines (Capacity Blocks, dedicated hosts, capacity
reservations' unused hours: usage types other than BoxUsage/SpotUsage) are not rates of this kind and are
left out; where no bill says anything, the price table's list price stays the rate (``basis`` list).

costs_hourly keeps no region column: the region is read from the usage type's prefix, AWS's billing code
of the region (``USE2-BoxUsage:p5.48xlarge``; no prefix = us-east-1, eu-west-1 is ``EU-``). A prefix
not in REGION_CODES is not guessed: such lines are counted in ``unknown_region_lines`` and left out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from decimal import Decimal

import pyarrow as pa

from foxhunt_obs.lib.analysis.prices import PriceTable

# AWS usage-type region prefixes (billing codes) of the regions GPU clusters run in and their neighbours.
# The same table is in AWS's Price List usagetype attributes ("USW2-HostBoxUsage:c5.4xlarge", location
# "US West (Oregon)") and in the public CUR tooling that decodes usage types; us-east-1's EC2 usage types
# usually carry no prefix, eu-west-1's the legacy "EU-".
REGION_CODES = {
    "USE1": "us-east-1", "USE2": "us-east-2", "USW1": "us-west-1", "USW2": "us-west-2",
    "CAN1": "ca-central-1", "SAE1": "sa-east-1",
    "EU": "eu-west-1", "EUW1": "eu-west-1", "EUW2": "eu-west-2", "EUW3": "eu-west-3",
    "EUC1": "eu-central-1", "EUC2": "eu-central-2", "EUN1": "eu-north-1", "EUS1": "eu-south-1",
    "EUS2": "eu-south-2",
    "APN1": "ap-northeast-1", "APN2": "ap-northeast-2", "APN3": "ap-northeast-3",
    "APS1": "ap-southeast-1", "APS2": "ap-southeast-2", "APS3": "ap-south-1", "APS4": "ap-southeast-3",
    "APE1": "ap-east-1", "MEC1": "me-central-1", "MES1": "me-south-1", "AFS1": "af-south-1",
}  # fmt: skip

# line_item_line_item_type of a line that is an instance-hour used (not a fee, negation or credit)
INSTANCE_HOUR_LINE_TYPES = ("Usage", "DiscountedUsage", "SavingsPlanCoveredUsage")
# [prefix-]BoxUsage:<type> (on-demand, shared tenancy) or [prefix-]SpotUsage:<type>[:<az>]
_USAGE = re.compile(r"^(?:(?P<prefix>[A-Z0-9]+)-)?(?P<kind>BoxUsage|SpotUsage):")
BASES = ("effective", "list")
# a rate is kept to 10 decimal places (CUR's rates have at most that many): sums of float64 amounts
# divided by hours would otherwise carry noise in the 15th digit into the estimate
_QUANTUM = Decimal("1e-10")


@dataclass(frozen=True)
class EffectiveRate:
    """$ per instance-hour the bill shows for one (region, instance type) on one bill day."""

    region: str
    instance_type: str
    usd_per_hour: Decimal
    day: date  # the UTC bill day the rate is from (the newest one with this type's instance-hours)
    hours: float  # instance-hours it averages over
    # instance-hours by how they were paid: on_demand, savings_plan, reserved, spot
    hours_by_option: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class EffectiveRates:
    rates: Mapping[tuple[str, str], EffectiveRate]  # (region, instance type) -> rate
    unknown_region_lines: int = 0  # instance-hour lines whose usage-type prefix names no known region

    def get(self, region: str, instance_type: str) -> EffectiveRate | None:
        return self.rates.get((region, instance_type))

    def for_region(self, region: str) -> dict[str, EffectiveRate]:
        return {t: r for (reg, t), r in self.rates.items() if reg == region}


@dataclass(frozen=True)
class HourlyRate:
    """The rate one instance-hour is priced at, and where it came from."""

    usd_per_hour: Decimal
    basis: str  # effective (the bill) / list (the price table)
    source: str  # "cur <bill day>" or "price table <region> <as_of>"


def region_of_usage_type(usage_type: str) -> str | None:
    """The region a usage type's prefix names ('' prefix: us-east-1); None when unknown or not EC2 box/spot."""
    m = _USAGE.match(usage_type or "")
    if not m:
        return None
    prefix = m.group("prefix")
    return "us-east-1" if prefix is None else REGION_CODES.get(prefix)


def purchase_option(line_item_type: str, usage_type: str) -> str:
    if line_item_type == "SavingsPlanCoveredUsage":
        return "savings_plan"
    if line_item_type == "DiscountedUsage":
        return "reserved"
    m = _USAGE.match(usage_type or "")
    return "spot" if m and m.group("kind") == "SpotUsage" else "on_demand"


def effective_rates(rows: pa.Table | Iterable[Mapping], until: datetime | None = None) -> EffectiveRates:
    """costs_hourly rows (a day or a trailing window) -> the newest bill day's rate per (region, type).

    Only lines whose hour is before ``until`` count (the hours a bill had landed for by then); None: all."""
    if isinstance(rows, pa.Table):
        cols = [
            c for c in ("hour", "service", "line_item_type", "usage_type", "instance_type", "usage_amount",
                        "amortized_usd") if c in rows.column_names
        ]  # fmt: skip
        rows = rows.select(cols).to_pylist()
    if until is not None and until.tzinfo is None:
        until = until.replace(tzinfo=timezone.utc)
    # (region, type, day) -> [amortized $, hours, {option: hours}]
    sums: dict[tuple[str, str, date], list] = {}
    unknown = 0
    for r in rows:
        if r.get("service") != "AmazonEC2" or r.get("line_item_type") not in INSTANCE_HOUR_LINE_TYPES:
            continue
        itype, usage_type = r.get("instance_type") or "", r.get("usage_type") or ""
        hours, usd = r.get("usage_amount"), r.get("amortized_usd")
        if not itype or not _USAGE.match(usage_type) or not hours or hours <= 0 or usd is None or usd != usd:
            continue
        hour = r["hour"]
        if hour.tzinfo is None:
            hour = hour.replace(tzinfo=timezone.utc)
        if until is not None and hour >= until:
            continue
        region = region_of_usage_type(usage_type)
        if region is None:
            unknown += 1
            continue
        acc = sums.setdefault((region, itype, hour.astimezone(timezone.utc).date()), [0.0, 0.0, {}])
        acc[0] += usd
        acc[1] += hours
        option = purchase_option(r["line_item_type"], usage_type)
        acc[2][option] = acc[2].get(option, 0.0) + hours
    newest: dict[tuple[str, str], EffectiveRate] = {}
    for (region, itype, day), (usd, hours, options) in sorted(sums.items(), key=lambda kv: kv[0][2]):
        rate = (Decimal(repr(usd)) / Decimal(repr(hours))).quantize(_QUANTUM).normalize()
        newest[(region, itype)] = EffectiveRate(
            region, itype, rate, day, hours, dict(sorted(options.items()))
        )
    return EffectiveRates(newest, unknown)


def hourly_rate(
    instance_type: str, prices: PriceTable, rates: EffectiveRates | None = None
) -> HourlyRate | None:
    """An instance-hour's rate in the price table's region: the bill's effective rate once a bill has
    landed for the type, else the on-demand list price; None when neither knows the type."""
    if rates is not None:
        eff = rates.get(prices.region, instance_type)
        if eff is not None:
            return HourlyRate(eff.usd_per_hour, "effective", f"cur {eff.day.isoformat()}")
    price = prices.find("AmazonEC2", instance_type)
    if price is None or price.unit != "hour":
        return None
    return HourlyRate(price.usd, "list", f"price table {price.region} {price.as_of.isoformat()}")
