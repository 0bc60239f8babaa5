"""Cost Explorer: daily cost by project, environment, experiment and service, without double counting.

GetCostAndUsage takes at most two GroupBy, and four dimensions are wanted. The call protocol is therefore
two-stage, and it is a contract (the sandbox queues moto's answers in exactly this order):

1. discovery: one paged chain grouped by (project tag, environment tag); it yields every pair seen on any
   day of the window and each pair's UnblendedCost per day;
2. detail: for each pair, in sorted order ('' first), one paged chain filtered to exactly that pair (a
   missing tag is matched with ABSENT, never with an empty value) and grouped by (experiment tag, SERVICE).

The pair filters partition the account's cost, so detail rows never overlap. That is checked, not
assumed: per day and pair the detail rows must add up to the discovery amount, else Cost Explorer restated
between the calls (or a filter does not match its group-by) and the run fails rather than store a day that
does not add up. Each call costs $0.01: `calls` counts them (every page is a call).

Amounts are Decimal until the table is built. Throttling (LimitExceededException) is retried by botocore's
standard/adaptive retry mode, set by AwsConfig; botocore's legacy mode would not retry it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from datetime import date, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

import pyarrow as pa
from botocore.exceptions import BotoCoreError, ClientError

from foxhunt_obs.lib.errors import InputError
from foxhunt_obs.lib.schemas import COSTS_DAILY
from foxhunt_obs.lib.settings import cost_tags, default
from foxhunt_obs.lib.sources.aws import product_code

SOURCE = "ce"
METRICS = ("UnblendedCost", "AmortizedCost", "UsageQuantity")
# Per day and pair, how far the detail rows may be from the discovery amount. Cost Explorer rounds every
# group's amount on its own (to ~10 decimals), so sums of many groups can miss the pair's amount by a few
# 1e-10: an exact Decimal comparison would fail on real answers. Half a cent is far above that rounding
# noise and below anything the reports show (cents), while a restatement or a wrong filter moves a
# day's pair by much more.
TOLERANCE_USD = Decimal("0.005")
_DEFAULT_TAGS = cost_tags(default("FOXHUNT_COST_TAGS"))


USD_PER_CALL = 0.01  # Cost Explorer's API price per request (every page is a request)


class CostExplorerError(InputError, RuntimeError):
    """A failed or inconsistent Cost Explorer answer; the message names the call, window and partition."""


# -- requests (module level so the sandbox can reason about the protocol) -----------------------------


def tag_expression(key: str, value: str) -> dict[str, Any]:
    """The Expression matching one tag value; '' (untagged) is matched with ABSENT."""
    if value == "":
        return {"Tags": {"Key": key, "MatchOptions": ["ABSENT"]}}
    return {"Tags": {"Key": key, "Values": [value], "MatchOptions": ["EQUALS"]}}


def _base_request(start: date, end: date) -> dict[str, Any]:
    return {
        "TimePeriod": {"Start": start.isoformat(), "End": end.isoformat()},
        "Granularity": "DAILY",
        "Metrics": list(METRICS),
    }


def discovery_request(
    start: date, end: date, tag_keys: Sequence[str], token: str | None = None
) -> dict[str, Any]:
    """Stage 1: the whole window grouped by the project and environment tags."""
    req = _base_request(start, end)
    req["GroupBy"] = [{"Type": "TAG", "Key": tag_keys[0]}, {"Type": "TAG", "Key": tag_keys[1]}]
    if token:
        req["NextPageToken"] = token
    return req


def detail_request(
    start: date, end: date, tag_keys: Sequence[str], pair: tuple[str, str], token: str | None = None
) -> dict[str, Any]:
    """Stage 2: one (project, environment) pair, grouped by the experiment tag and SERVICE."""
    req = _base_request(start, end)
    req["Filter"] = {"And": [tag_expression(tag_keys[0], pair[0]), tag_expression(tag_keys[1], pair[1])]}
    req["GroupBy"] = [{"Type": "TAG", "Key": tag_keys[2]}, {"Type": "DIMENSION", "Key": "SERVICE"}]
    if token:
        req["NextPageToken"] = token
    return req


def forecast_window(today: date) -> tuple[date, date]:
    """[today, first day of next month): End is always after Start, so on a month's last day the window is
    that one day (a valid forecast) and never spills into the next month."""
    return today, (today.replace(day=1) + timedelta(days=32)).replace(day=1)


# -- the source ------------------------------------------------------------------------------------------


class CostExplorerSource:
    def __init__(self, ce_client: Any, tag_keys: Sequence[str] = _DEFAULT_TAGS):
        if len(tag_keys) != 3 or not all(tag_keys):
            raise ValueError(
                f"tag_keys must name the project, environment and experiment tags, got {tag_keys!r}"
            )
        self._ce = ce_client
        self.tag_keys = tuple(tag_keys)
        self.calls = 0  # get_cost_and_usage requests of the last daily_costs() (USD_PER_CALL each)
        self.pages: dict[str, int] = {}  # per chain: "discovery", "Project='a' Environment=''", ...
        self.day_totals: dict[date, Decimal] = {}  # discovery's UnblendedCost per day of the last call

    @property
    def cost_usd(self) -> float:
        """What the last daily_costs() cost in Cost Explorer fees."""
        return self.calls * USD_PER_CALL

    def daily_costs(self, start: date, end: date, partition: str = "") -> pa.Table:
        """Every cost of [start, end) by day, project, environment, experiment and service (COSTS_DAILY)."""
        if end <= start:
            raise ValueError(f"Cost Explorer window {start}..{end}{_for(partition)}: end must be after start")
        self.calls, self.pages, self.day_totals = 0, {}, {}
        pk, ek, xk = self.tag_keys
        ctx = _Context(start, end, partition)

        # 1. discovery: (day, pair) -> UnblendedCost
        discovered: dict[tuple[date, tuple[str, str]], Decimal] = {}
        estimated: dict[date, bool] = {}
        for page in self._chain("discovery", lambda t: discovery_request(start, end, self.tag_keys, t), ctx):
            for day, flag, keys, metrics in _groups(page, ctx, "discovery"):
                estimated[day] = estimated.get(day, False) or flag
                pair = (
                    _tag_value(keys, 0, pk, day, ctx, "discovery"),
                    _tag_value(keys, 1, ek, day, ctx, "discovery"),
                )
                if (day, pair) in discovered:
                    raise ctx.error("discovery", f"{day}: group {keys} answered twice")
                discovered[(day, pair)] = _amount(metrics, "UnblendedCost", day, keys, ctx, "discovery")

        # 2. detail per pair; CE service names that share a product code are added up (one row per key)
        rows: dict[tuple[date, str, str, str, str], list[Decimal]] = {}
        detail_sum: dict[tuple[date, tuple[str, str]], Decimal] = {}
        for pair in sorted({p for _, p in discovered}):
            label = f"{pk}={pair[0]!r} {ek}={pair[1]!r}"
            seen: set[tuple[date, tuple[str, ...]]] = set()
            for page in self._chain(
                label, lambda t, p=pair: detail_request(start, end, self.tag_keys, p, t), ctx
            ):
                for day, flag, keys, metrics in _groups(page, ctx, label):
                    estimated[day] = estimated.get(day, False) or flag
                    if (day, tuple(keys)) in seen:
                        raise ctx.error(label, f"{day}: group {keys} answered twice")
                    seen.add((day, tuple(keys)))
                    experiment = _tag_value(keys, 0, xk, day, ctx, label)
                    if len(keys) < 2:
                        raise ctx.error(label, f"{day}: group {keys} has no SERVICE key")
                    amounts = [_amount(metrics, m, day, keys, ctx, label) for m in METRICS]
                    key = (day, pair[0], pair[1], experiment, product_code(keys[1]))
                    acc = rows.setdefault(key, [Decimal(0)] * len(METRICS))
                    for i, a in enumerate(amounts):
                        acc[i] += a
                    detail_sum[(day, pair)] = detail_sum.get((day, pair), Decimal(0)) + amounts[0]

        # 3. the detail rows of each day and pair add up to what discovery saw
        for day, pair in sorted(discovered.keys() | detail_sum.keys()):
            want = discovered.get((day, pair), Decimal(0))
            got = detail_sum.get((day, pair), Decimal(0))
            if abs(want - got) > TOLERANCE_USD:
                raise ctx.error(
                    "check",
                    f"{day} {pk}={pair[0]!r} {ek}={pair[1]!r}: the detail rows (by {xk} and SERVICE) sum to "
                    f"{got} USD but discovery (by {pk} and {ek}) says {want} USD; Cost Explorer restated "
                    "between the calls or the pair filter does not match its group-by. Re-run the partition.",
                )
        for (day, _), amount in discovered.items():
            self.day_totals[day] = self.day_totals.get(day, Decimal(0)) + amount
        return _table(rows, estimated)

    def forecast(self, today: date, partition: str = "") -> dict[str, Any]:
        """Cost Explorer's unblended forecast for the rest of this month, today included (one $0.01 call).

        The amount covers [period_start, period_end) only, not the month-to-date actuals."""
        start, end = forecast_window(today)
        what = f"get_cost_forecast {start}..{end} (end exclusive){_for(partition)}"
        try:
            out = self._ce.get_cost_forecast(
                TimePeriod={"Start": start.isoformat(), "End": end.isoformat()},
                Metric="UNBLENDED_COST",
                Granularity="MONTHLY",
            )
        except (ClientError, BotoCoreError) as e:
            raise CostExplorerError(f"Cost Explorer {what}: {e}") from e
        raw = (out.get("Total") or {}).get("Amount")
        amount = _decimal(raw)
        if amount is None:
            raise CostExplorerError(f"Cost Explorer {what}: Total.Amount is not a number: {raw!r}")
        return {"period_start": start, "period_end": end, "forecast_usd": amount}

    # -- calls -----------------------------------------------------------------------------------------------
    def _chain(self, label: str, build: Callable[[str | None], dict], ctx: _Context) -> Iterator[dict]:
        """One request and its NextPageToken pages (GetCostAndUsage has no boto3 paginator)."""
        token: str | None = None
        tokens: set[str] = set()
        while True:
            self.calls += 1
            try:
                page = self._ce.get_cost_and_usage(**build(token))
            except (ClientError, BotoCoreError) as e:
                raise ctx.error(label, f"get_cost_and_usage failed: {e}") from e
            self.pages[label] = self.pages.get(label, 0) + 1
            yield page
            token = page.get("NextPageToken") or None
            if token is None:
                return
            if token in tokens:  # the same token again would loop forever (and cost $0.01 a turn)
                raise ctx.error(label, f"NextPageToken {token!r} came back twice")
            tokens.add(token)


class _Context:
    def __init__(self, start: date, end: date, partition: str):
        self.start, self.end, self.partition = start, end, partition

    def error(self, chain: str, text: str) -> CostExplorerError:
        return CostExplorerError(
            f"Cost Explorer get_cost_and_usage ({chain}) {self.start}..{self.end} (end exclusive)"
            f"{_for(self.partition)}: {text}"
        )


def _groups(page: dict, ctx: _Context, chain: str) -> Iterator[tuple[date, bool, list[str], dict]]:
    """(day, estimated, group keys, metrics) for every group of a page; days without groups give none."""
    for rbt in page.get("ResultsByTime") or []:
        raw = (rbt.get("TimePeriod") or {}).get("Start", "")
        try:
            day = date.fromisoformat(raw[:10])
        except ValueError:
            raise ctx.error(chain, f"unreadable TimePeriod.Start {raw!r}") from None
        if not ctx.start <= day < ctx.end:
            raise ctx.error(chain, f"answered for {day}, outside the window")
        for g in rbt.get("Groups") or []:
            yield day, bool(rbt.get("Estimated", False)), list(g.get("Keys") or []), g.get("Metrics") or {}


def _tag_value(keys: list[str], i: int, tag_key: str, day: date, ctx: _Context, chain: str) -> str:
    """'Project$foxhunt-rl' -> 'foxhunt-rl'; 'Project$' (untagged) -> ''. Tag keys cannot contain '$'."""
    if i >= len(keys) or "$" not in keys[i]:
        raise ctx.error(chain, f"{day}: group keys {keys} lack the '{tag_key}$<value>' tag key")
    return keys[i].split("$", 1)[1]


def _decimal(raw: Any) -> Decimal | None:
    try:
        d = Decimal(str(raw).strip()) if raw is not None else None
    except InvalidOperation:
        return None
    return d if d is not None and d.is_finite() else None


def _amount(metrics: dict, metric: str, day: date, keys: list[str], ctx: _Context, chain: str) -> Decimal:
    raw = (metrics.get(metric) or {}).get("Amount")
    d = _decimal(raw)
    if d is None:
        what = "missing" if raw is None else f"not a number: {raw!r}"
        raise ctx.error(chain, f"{day} group {keys}: {metric} Amount {what}")
    return d


def _table(
    rows: dict[tuple[date, str, str, str, str], list[Decimal]], estimated: dict[date, bool]
) -> pa.Table:
    keys = sorted(rows)
    cols: dict[str, list] = {
        "day": [k[0] for k in keys],
        "source": [SOURCE] * len(keys),
        "project": [k[1] for k in keys],
        "environment": [k[2] for k in keys],
        "experiment": [k[3] for k in keys],
        "service": [k[4] for k in keys],
        "resource_id": [""] * len(keys),
        "cost_usd": [float(rows[k][0]) for k in keys],
        "amortized_usd": [float(rows[k][1]) for k in keys],
        "usage_quantity": [float(rows[k][2]) for k in keys],
        "estimated": [estimated.get(k[0], False) for k in keys],
    }
    return pa.table(cols, schema=COSTS_DAILY.schema)


def _for(partition: str) -> str:
    return f" (partition {partition})" if partition else ""
