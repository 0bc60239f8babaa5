"""How a value reads in the report and in the messages that carry it: money, percentages, numbers and UTC
timestamps as text, and an em dash wherever the value is unknown, never "nan"."""

from __future__ import annotations

import math

import pandas as pd

NO_VALUE = "—"


def finite(value) -> bool:
    """A number, neither NaN nor infinite (False for what is no number at all)."""
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def money(value, signed: bool = False) -> str:
    """$1,234.56; -$12.00; +$3.10 when signed; an em dash when unknown."""
    if not finite(value):
        return NO_VALUE
    value = float(value)
    sign = "-" if value < 0 and round(value, 2) != 0 else ("+" if signed else "")
    return f"{sign}${abs(value):,.2f}"


def pct(value, digits: int = 1, signed: bool = False) -> str:
    """A percentage already on the 0-100 scale."""
    if not finite(value):
        return NO_VALUE
    return f"{float(value):{'+' if signed else ''},.{digits}f}%"


def util(value) -> str:
    """A utilization on the 0-1 scale, shown as a percentage."""
    return pct(float(value) * 100.0) if finite(value) else NO_VALUE


def number(value, digits: int = 1) -> str:
    """1,234.5 with `digits` decimals; an em dash when unknown."""
    return f"{float(value):,.{digits}f}" if finite(value) else NO_VALUE


def _missing(value) -> bool:
    return value is None or (not isinstance(value, str) and bool(pd.isna(value)))


def plain_text(value) -> str:
    """A data string for a cell, blank when missing."""
    return "" if _missing(value) else str(value)


def utc_timestamp(value) -> str:
    """2026-11-16 09:00 UTC (a naive time is taken as UTC), blank when missing."""
    if _missing(value):
        return ""
    ts = pd.Timestamp(value)
    ts = ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")
    return f"{ts:%Y-%m-%d %H:%M} UTC"
