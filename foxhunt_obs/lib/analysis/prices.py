"""The price table (``data/prices.yaml``): dated on-demand list prices per region, service and key.

Used for the live cost estimate before the bill lands (Cost Explorer and CUR are about a day late) and by
the sandbox to price its synthetic bill, so the two agree by construction. Amounts stay Decimal.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path

import yaml

from foxhunt_obs.lib.errors import InputError
from foxhunt_obs.lib.settings import default
from foxhunt_obs.lib.yaml_text import load_yaml

PRICES_FILE = Path(__file__).resolve().parents[2] / "data" / "prices.yaml"
UNITS = ("hour", "GB-month")


class PriceError(InputError, ValueError):
    """A malformed price table, or a price it does not have."""


@dataclass(frozen=True)
class Price:
    region: str
    service: str  # AWS product code: AmazonEC2, AmazonFSx, AmazonS3, AmazonEKS
    key: str  # instance type, DEPLOYMENT_TYPE/throughput, storage class, ...
    usd: Decimal
    unit: str  # one of UNITS
    as_of: date
    source: str


def hours_in_month(t: date | datetime) -> int:
    """AWS prorates GB-month prices by the hours of the month the usage falls in."""
    return calendar.monthrange(t.year, t.month)[1] * 24


@dataclass(frozen=True)
class PriceTable:
    region: str
    prices: tuple[Price, ...]
    path: str
    max_age_days: int | None = None  # the file's max_age_days: older than this, the table is stale

    def age_days(self, today: date) -> int:
        """Days since the newest row's as_of: how long ago anyone last checked a price here."""
        return (today - max(p.as_of for p in self.prices)).days

    def get(self, service: str, key: str) -> Price:
        for p in self.prices:
            if p.service == service and p.key == key:
                return p
        known = ", ".join(sorted(p.key for p in self.prices if p.service == service)) or "none"
        raise PriceError(
            f"price table {self.path}: no {service} price for {key!r} in {self.region} "
            f"(known: {known}); add a dated row with its source"
        )

    def find(self, service: str, key: str) -> Price | None:
        try:
            return self.get(service, key)
        except PriceError:
            return None

    def per_hour(self, price: Price, quantity: Decimal | float | int, at: date | datetime) -> Decimal:
        """Cost of one hour of ``quantity`` units (instances, GB) at ``at``."""
        q = Decimal(str(quantity))
        if price.unit == "hour":
            return price.usd * q
        return price.usd * q / hours_in_month(at)


def load_price_table(
    region: str = default("FOXHUNT_PRICE_REGION"), path: Path | str | None = None
) -> PriceTable:
    path = Path(path) if path else PRICES_FILE
    try:
        raw = load_yaml(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise PriceError(f"price table {path}: cannot read: {e}") from e
    rows = raw.get("prices") if isinstance(raw, dict) else None
    if not isinstance(rows, list):
        raise PriceError(f"price table {path}: expected a `prices:` list")
    out, seen = [], set()
    for i, r in enumerate(rows):
        where = f"price table {path}: prices[{i}]"
        missing = {"region", "service", "key", "usd", "unit", "as_of", "source"} - set(r or {})
        if missing:
            raise PriceError(f"{where}: missing {', '.join(sorted(missing))}")
        try:
            usd = Decimal(str(r["usd"]))
        except InvalidOperation:
            raise PriceError(f"{where}: usd {r['usd']!r} is not a number") from None
        if not usd.is_finite() or usd < 0:
            raise PriceError(f"{where}: usd {r['usd']!r} must be a non-negative number")
        if r["unit"] not in UNITS:
            raise PriceError(f"{where}: unit {r['unit']!r} is not one of {', '.join(UNITS)}")
        as_of = r["as_of"]
        if not isinstance(as_of, date):
            raise PriceError(f"{where}: as_of {as_of!r} is not a date (YYYY-MM-DD)")
        if not str(r["source"]).strip():
            raise PriceError(f"{where}: empty source")
        ident = (r["region"], r["service"], r["key"])
        if ident in seen:
            raise PriceError(f"{where}: {'/'.join(ident)} listed twice")
        seen.add(ident)
        if r["region"] == region:
            out.append(
                Price(r["region"], r["service"], str(r["key"]), usd, r["unit"], as_of, str(r["source"]))
            )
    if not out:
        regions = ", ".join(sorted({r["region"] for r in rows}))
        raise PriceError(f"price table {path}: no prices for region {region!r} (regions: {regions})")
    max_age = raw.get("max_age_days")
    if not isinstance(max_age, int) or max_age <= 0:
        raise PriceError(f"price table {path}: max_age_days must be a positive whole number, got {max_age!r}")
    return PriceTable(region, tuple(out), str(path), max_age)
