"""Exact AWS truth of a scenario's ``aws:`` block: the bill, Cost Explorer's answers, FSx's CloudWatch
datapoints and the budget (docs/design.md#the-sandbox). ``moto_server.py`` writes exactly this into moto, so a pipeline
run against it can be checked to the cent and to the byte.

The bill (on-demand only, so amortized = unblended), one line item per resource per hour of the scenario:

* EC2: every node is one instance (id from the node's name, ``instances``), usage = the hours of that
  hour it ran (a fraction where a window is not whole hours), cost = the price table's on-demand price ×
  usage. A ``node_lost`` incident replaces the instance: the old id is billed up to the loss, a new id
  from the incident's end, nothing in between; node_samples has no rows then either, so the live
  estimate (node-hours × price) equals the bill. Tagged with the default tags only (shared nodes).
  A ``stray_instance`` incident is one more instance outside the cluster (``stray_instances``): billed
  the same way, tagged with the defaults + its Experiment, on no node (nothing in Prometheus).
* FSx for Lustre: usage = storage_gib / hours in the month (GB-Mo), cost = the GB-month price of its
  deployment type and throughput tier × usage. Tagged with the defaults.
* S3 checkpoint buckets: usage = gb / hours in the month, cost = the STANDARD GB-month price × usage;
  tagged with the defaults + Experiment.
* The EKS control plane: 1 hour at the cluster price, NO tags (Cost Explorer's ``Project$`` group).

Costs are Decimal and unrounded; Cost Explorer's amounts are the per-group sums rounded to 10 places.
The resource ids, usage types and operations are CUR-like, not copied from a real bill.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal

import numpy as np

from foxhunt_obs.lib.analysis.prices import PriceTable, hours_in_month, load_price_table
from foxhunt_obs.lib.sources.aws import ce_service_name
from foxhunt_obs.sandbox.story.aws_scenario import COST_TAG_KEYS, GB, MINUTE_S, Aws, FileSystem
from foxhunt_obs.sandbox.story.scenario import Scenario

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
CE_PLACES = Decimal("1E-10")  # Cost Explorer's amounts: strings with 10 decimal places
CE_METRICS = ("UnblendedCost", "AmortizedCost", "UsageQuantity")
EC2, FSX, S3, EKS = "AmazonEC2", "AmazonFSx", "AmazonS3", "AmazonEKS"
# usage types carry a region prefix outside us-east-1 (USE2-BoxUsage:..., EU-BoxUsage:...)
_USAGE_PREFIX = {"us-east-1": "", "us-east-2": "USE2-", "us-west-2": "USW2-", "eu-west-1": "EU-"}
# AWS/FSx metrics written for every file system; FreeDataStorageCapacity once per OST per minute
IO_METRICS = (
    "DataReadBytes",
    "DataWriteBytes",
    "DataReadOperations",
    "DataWriteOperations",
    "MetadataOperations",
)
FREE = "FreeDataStorageCapacity"
UNITS = {
    "DataReadBytes": "Bytes",
    "DataWriteBytes": "Bytes",
    "DataReadOperations": "Count",
    "DataWriteOperations": "Count",
    "MetadataOperations": "Count",
    FREE: "Bytes",
}
FREE_JITTER_BYTES = 50_000_000  # ± per OST and minute (a live file system never stands still)


def _aws(scenario: Scenario) -> Aws:
    if scenario.aws is None:
        raise ValueError(f"scenario {scenario.name} has no aws: block")
    return scenario.aws


# ---- resources ----


@dataclass(frozen=True)
class Instance:
    """One EC2 instance standing for a node over [start, end)."""

    node: str
    instance_id: str
    instance_type: str
    start: datetime
    end: datetime
    experiment: str = ""  # its Experiment tag ('' for none: nodes are shared)
    name: str = ""  # a stray's name (its Name tag); a node's instance is named by the node


def instance_id(node: str, generation: int = 0) -> str:
    """``i-0`` + 16 hex digits from the node's name; ``generation`` counts replacements (node_lost)."""
    return "i-0" + hashlib.sha256(f"{node}#{generation}".encode()).hexdigest()[:16]


def instances(scenario: Scenario) -> list[Instance]:
    """Every instance of every node, in node order: the scenario's window minus the node's outages."""
    out = []
    for node in scenario.nodes:
        lost = sorted(
            (i.start, i.end) for i in scenario.incidents if i.kind == "node_lost" and i.node == node.name
        )
        t, generation = scenario.start, 0
        for s, e in lost + [(scenario.end, scenario.end)]:
            if s > t:
                out.append(Instance(node.name, instance_id(node.name, generation), node.instance_type, t, s))
                generation += 1
            t = max(t, e)
    return out


def stray_instances(scenario: Scenario) -> list[Instance]:
    """The aws block's stray_instance incidents as instances on no node (``node`` is '')."""
    return [
        Instance("", instance_id(f"stray/{x.name}"), x.instance_type, x.start, x.end, x.experiment, x.name)
        for x in _aws(scenario).strays
    ]


def fsx_local_id(scenario: Scenario, fs: FileSystem) -> str:
    """A stand-in FileSystemId (``fs-0`` + 16 hex) where moto's own id is not known."""
    return "fs-0" + hashlib.sha256(f"{scenario.name}/{fs.name}".encode()).hexdigest()[:16]


def fsx_arn(aws: Aws, fs_id: str) -> str:
    return f"arn:aws:fsx:{aws.region}:{aws.account_id}:file-system/{fs_id}"


def eks_arn(aws: Aws, name: str) -> str:
    return f"arn:aws:eks:{aws.region}:{aws.account_id}:cluster/{name}"


# ---- line items ----


@dataclass(frozen=True)
class LineItem:
    hour: datetime  # line_item_usage_start_date (UTC); the line covers [hour, hour + 1 h)
    resource_id: str
    service: str  # product code: AmazonEC2, AmazonFSx, AmazonS3, AmazonEKS
    usage_type: str
    operation: str
    instance_type: str  # '' except for EC2
    usage_amount: Decimal  # hours (EC2, EKS) or GB-Mo (FSx, S3)
    cost: Decimal  # unblended = amortized (on-demand only), unrounded
    tags: dict[str, str] = field(default_factory=dict, hash=False)  # AWS tag keys; {} when untagged

    @property
    def amortized(self) -> Decimal:
        return self.cost

    @property
    def end(self) -> datetime:
        return self.hour + HOUR

    @property
    def day(self) -> date:
        return self.hour.date()

    @property
    def billing_period(self) -> str:
        return f"{self.hour:%Y-%m}"

    def tag(self, key: str) -> str:
        return self.tags.get(key, "")


def _hours(scenario: Scenario):
    return (scenario.start + k * HOUR for k in range(scenario.hours))


def line_items(
    scenario: Scenario, fsx_ids: dict[str, str] | None = None, prices: PriceTable | None = None
) -> list[LineItem]:
    """The scenario's bill, ordered by hour, then service, then resource id. ``fsx_ids`` (file system
    name → FileSystemId, as moto made them) names the FSx resources; missing ones get ``fsx_local_id``."""
    aws = _aws(scenario)
    prices = prices or load_price_table(region=aws.region)
    prefix = _USAGE_PREFIX.get(aws.region, "")
    defaults = aws.default_tags
    fsx_ids = fsx_ids or {}
    items: list[LineItem] = []
    for inst in instances(scenario) + stray_instances(scenario):
        price = prices.get(EC2, inst.instance_type).usd
        tags = {**defaults, "Experiment": inst.experiment} if inst.experiment else dict(defaults)
        for h in _hours(scenario):
            seconds = (min(inst.end, h + HOUR) - max(inst.start, h)).total_seconds()
            if seconds <= 0:
                continue
            usage = Decimal(int(seconds)) / 3600
            items.append(
                LineItem(
                    hour=h,
                    resource_id=inst.instance_id,
                    service=EC2,
                    usage_type=f"{prefix}BoxUsage:{inst.instance_type}",
                    operation="RunInstances",
                    instance_type=inst.instance_type,
                    usage_amount=usage,
                    cost=price * usage,
                    tags=dict(tags),
                )
            )
    for fs in aws.fsx:
        price = prices.get(FSX, fs.price_key).usd
        rid = fsx_arn(aws, fsx_ids.get(fs.name) or fsx_local_id(scenario, fs))
        usage_type = f"{prefix}Lustre-{fs.deployment_type}-{fs.throughput_mb_per_tib}MBps-Storage"
        for h in _hours(scenario):
            n = hours_in_month(h)
            items.append(
                LineItem(
                    hour=h,
                    resource_id=rid,
                    service=FSX,
                    usage_type=usage_type,
                    operation="CreateFileSystem",
                    instance_type="",
                    usage_amount=Decimal(fs.storage_gib) / n,
                    cost=price * fs.storage_gib / n,
                    tags=dict(defaults),
                )
            )
    if aws.s3_buckets:
        price = prices.get(S3, "STANDARD").usd
        for b in aws.s3_buckets:
            tags = {**defaults, "Experiment": b.experiment}
            for h in _hours(scenario):
                n = hours_in_month(h)
                items.append(
                    LineItem(
                        hour=h,
                        resource_id=b.name,
                        service=S3,
                        usage_type=f"{prefix}TimedStorage-ByteHrs",
                        operation="StandardStorage",
                        instance_type="",
                        usage_amount=b.gb / n,
                        cost=price * b.gb / n,
                        tags=dict(tags),
                    )
                )
    if aws.eks_cluster:
        price = prices.get(EKS, "cluster").usd
        rid = eks_arn(aws, aws.eks_cluster)
        for h in _hours(scenario):
            items.append(
                LineItem(
                    hour=h,
                    resource_id=rid,
                    service=EKS,
                    usage_type=f"{prefix}AmazonEKS-Hours:perCluster",
                    operation="CreateOperation",
                    instance_type="",
                    usage_amount=Decimal(1),
                    cost=price,
                    tags={},
                )
            )
    items.sort(key=lambda i: (i.hour, i.service, i.resource_id))
    return items


def _on(items: list[LineItem], day: date) -> list[LineItem]:
    return [i for i in items if i.day == day]


def daily_costs(
    scenario: Scenario, day: date, items: list[LineItem] | None = None
) -> dict[tuple[str, str, str, str], Decimal]:
    """(project, environment, experiment, service product code) → the day's unblended cost, '' for an
    absent tag: what costs_daily holds for source cur (summed over resources) and ce."""
    out: dict[tuple[str, str, str, str], Decimal] = defaultdict(Decimal)
    for i in _on(items if items is not None else line_items(scenario), day):
        out[(i.tag("Project"), i.tag("Environment"), i.tag("Experiment"), i.service)] += i.cost
    return dict(out)


def daily_totals(scenario: Scenario, day: date, items: list[LineItem] | None = None) -> dict[str, Decimal]:
    """The day's total per costs_daily source: ``cur`` (the line items), ``ce`` (Cost Explorer's detail
    groups, each rounded to 10 places: equal to cur within 1e-9 per group) and ``estimate`` (what the
    price table estimate covers: EC2 and FSx only)."""
    on = _on(items if items is not None else line_items(scenario), day)
    ce = sum(
        (v.quantize(CE_PLACES) for v in _groups(on, ("Project", "Environment", "Experiment")).values()),
        Decimal(0),
    )
    return {
        "cur": sum((i.cost for i in on), Decimal(0)),
        "ce": ce,
        "estimate": sum((i.cost for i in on if i.service in (EC2, FSX)), Decimal(0)),
    }


def _groups(items: list[LineItem], keys: tuple[str, str, str]) -> dict[tuple[str, ...], Decimal]:
    out: dict[tuple[str, ...], Decimal] = defaultdict(Decimal)
    for i in items:
        out[(*(i.tag(k) for k in keys), ce_service_name(i.service))] += i.cost
    return out


# ---- Cost Explorer ----


def _amounts(cost: Decimal, usage: Decimal) -> dict:
    def q(x: Decimal) -> str:
        return str(x.quantize(CE_PLACES))

    return {
        "UnblendedCost": {"Amount": q(cost), "Unit": "USD"},
        "AmortizedCost": {"Amount": q(cost), "Unit": "USD"},  # on-demand only
        "UsageQuantity": {"Amount": q(usage), "Unit": "N/A"},
    }


def _token(*parts: object) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:32]


def ce_results(
    scenario: Scenario,
    start_day: date,
    end_day: date,
    tag_keys: tuple[str, str, str] = COST_TAG_KEYS,
    items: list[LineItem] | None = None,
) -> list[dict]:
    """Cost Explorer's answers to ONE ``CostExplorerSource.daily_costs(start_day, end_day)`` call (end
    exclusive, as CE's TimePeriod), in the order the source asks (the protocol shared with
    lib/sources/cost_explorer.py; moto hands queued answers out in request order):

    1. discovery: DAILY, UnblendedCost/AmortizedCost/UsageQuantity, GroupBy TAG:<key 0> + TAG:<key 1>;
    2. for each (key 0, key 1) value pair seen on any day, sorted ('' first): the same filtered to the
       pair, GroupBy TAG:<key 2> + DIMENSION:SERVICE.

    Each chain pages ONE day per answer; every answer but a chain's last carries a NextPageToken. Group
    keys are "Project$foxhunt-rl" ("Project$" when untagged) and Cost Explorer's service names."""
    if end_day <= start_day:
        raise ValueError(f"empty Cost Explorer window {start_day}..{end_day} (end is exclusive)")
    items = items if items is not None else line_items(scenario)
    days = [start_day + timedelta(days=k) for k in range((end_day - start_day).days)]
    by_day = {d: _on(items, d) for d in days}
    k0, k1, k2 = tag_keys

    def page(chain: str, k: int, defs: list[dict], groups: list[dict]) -> dict:
        d = days[k]
        out = {
            "GroupDefinitions": defs,
            "ResultsByTime": [
                {
                    "TimePeriod": {"Start": d.isoformat(), "End": (d + DAY).isoformat()},
                    "Total": {},  # Cost Explorer leaves Total empty when grouping
                    "Groups": groups,
                    "Estimated": False,
                }
            ],
            "DimensionValueAttributes": [],
        }
        if k + 1 < len(days):
            out["NextPageToken"] = _token(scenario.name, start_day, end_day, chain, k + 1)
        return out

    def grouped(rows: list[LineItem], key) -> list[dict]:
        cost: dict[tuple[str, ...], Decimal] = defaultdict(Decimal)
        usage: dict[tuple[str, ...], Decimal] = defaultdict(Decimal)
        for i in rows:
            cost[key(i)] += i.cost
            usage[key(i)] += i.usage_amount
        return [{"Keys": list(g), "Metrics": _amounts(cost[g], usage[g])} for g in sorted(cost)]

    results = []
    defs = [{"Type": "TAG", "Key": k0}, {"Type": "TAG", "Key": k1}]
    pairs: set[tuple[str, str]] = set()
    for k, d in enumerate(days):
        pairs |= {(i.tag(k0), i.tag(k1)) for i in by_day[d]}
        groups = grouped(by_day[d], lambda i: (f"{k0}${i.tag(k0)}", f"{k1}${i.tag(k1)}"))
        results.append(page("discovery", k, defs, groups))
    defs = [{"Type": "TAG", "Key": k2}, {"Type": "DIMENSION", "Key": "SERVICE"}]
    for pair in sorted(pairs):
        for k, d in enumerate(days):
            rows = [i for i in by_day[d] if (i.tag(k0), i.tag(k1)) == pair]
            groups = grouped(rows, lambda i: (f"{k2}${i.tag(k2)}", ce_service_name(i.service)))
            results.append(page(json.dumps(pair), k, defs, groups))
    return results


# ---- budget ----


@dataclass(frozen=True)
class BudgetTruth:
    name: str
    limit_usd: Decimal
    actual_usd: Decimal  # the month's bill up to the scenario's end
    forecast_usd: Decimal  # actual + daily run rate × days left in the month
    period_start: datetime  # the month the scenario ends in
    period_end: datetime  # exclusive: the next month's first day
    as_of: datetime  # the scenario's end
    alert_pct: float | None


def budget_truth(scenario: Scenario, items: list[LineItem] | None = None) -> BudgetTruth:
    """The budget as AWS Budgets reports it at the scenario's end. actual = month-to-date cost of the
    month the scenario's last hour falls in. forecast = actual + the last day's cost × the days left
    in the month, where the last day's cost is the cost of the trailing 24 hours (scaled up to 24 h when
    the scenario is shorter) and days left = (next month's start − scenario end) / 24 h, fractional
    when the scenario does not end at midnight."""
    aws = _aws(scenario)
    if aws.budget is None:
        raise ValueError(f"scenario {scenario.name} has no aws.budget")
    items = items if items is not None else line_items(scenario)
    last = scenario.end - HOUR
    month = datetime(last.year, last.month, 1, tzinfo=timezone.utc)
    nxt = datetime(month.year + month.month // 12, month.month % 12 + 1, 1, tzinfo=timezone.utc)
    actual = sum((i.cost for i in items if i.hour >= month), Decimal(0))
    window = max(scenario.start, scenario.end - DAY)
    trailing = sum((i.cost for i in items if i.hour >= window), Decimal(0))
    daily = trailing * 24 / int((scenario.end - window) / HOUR)
    days_left = Decimal(int((nxt - scenario.end) / HOUR)) / 24
    return BudgetTruth(
        name=aws.budget.name,
        limit_usd=aws.budget.limit_usd,
        actual_usd=actual,
        forecast_usd=actual + daily * days_left,
        period_start=month,
        period_end=nxt,
        as_of=scenario.end,
        alert_pct=aws.budget.alert_pct,
    )


# ---- FSx CloudWatch datapoints ----


@dataclass(frozen=True)
class FsxSeries:
    """One file system's CloudWatch datapoints: a value a minute over [start, start + minutes).
    ``io[metric]`` has one integer per minute; ``free`` one per minute and OST (bytes)."""

    name: str
    start: datetime
    minutes: int
    io: dict[str, np.ndarray] = field(hash=False)
    free: np.ndarray = field(hash=False)  # int64 (minutes, osts)

    @property
    def seconds(self) -> np.ndarray:
        """Unix seconds of every minute."""
        return int(self.start.timestamp()) + np.arange(self.minutes, dtype=np.int64) * MINUTE_S

    def values(self, metric: str) -> np.ndarray:
        """(minutes, k) int64: k = 1 for the I/O metrics, the OST count for FreeDataStorageCapacity."""
        return self.free if metric == FREE else self.io[metric][:, None]

    @property
    def datapoints(self) -> int:
        return self.minutes * (len(self.io) + self.free.shape[1])


def _fill_used(scenario: Scenario, fs: FileSystem, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Bytes taken by fsx_fill incidents at each minute's timestamp, and bytes written in each minute."""
    used = np.zeros(n, dtype=np.int64)
    written = np.zeros(n, dtype=np.int64)
    for f in _aws(scenario).fills:
        if f.fsx != fs.name:
            continue
        total = int(round(f.gb * GB))
        s, e = f.start_s // MINUTE_S, f.end_s // MINUTE_S
        r = f.recover_s // MINUTE_S if f.recover_s is not None else n
        ramp = total * np.arange(0, e - s + 1, dtype=np.int64) // (e - s)  # at s, s+1, ..., e
        used[s:e] = ramp[:-1]
        used[e:r] = total
        written[s:e] = np.diff(ramp)
    return used, written


def fsx_series(scenario: Scenario, fs: FileSystem) -> FsxSeries:
    n = scenario.hours * 60
    rng = np.random.default_rng((scenario.seed, 3_000_000, fs.index))
    # all draws up front, in a fixed order: the numbers depend only on the seed and the file system
    noise = rng.standard_normal((3, n))
    jitter = rng.integers(-FREE_JITTER_BYTES, FREE_JITTER_BYTES + 1, (n, fs.osts), dtype=np.int64)
    p = fs.io
    hours = np.arange(n) / 60.0
    wave = p.amplitude * np.sin(2 * np.pi * hours / p.period_h) if p.period_h else np.zeros(n)

    def amount(rate: float, row: int, shaped: bool = True) -> np.ndarray:
        level = 1 + (wave if shaped else 0) + p.noise * noise[row]
        return np.round(np.clip(rate * 60 * level, 0, None)).astype(np.int64)

    used, written = _fill_used(scenario, fs, n)
    read = amount(p.read_mb_s * 1e6, 0)
    write = amount(p.write_mb_s * 1e6, 1) + written
    op = p.io_kib * 1024
    io = {
        "DataReadBytes": read,
        "DataWriteBytes": write,
        "DataReadOperations": (read + op // 2) // op,
        "DataWriteOperations": (write + op // 2) // op,
        "MetadataOperations": amount(p.metadata_ops_s, 2, shaped=False),
    }
    start_free = np.array([int(round(g * GB)) for g in fs.free_gb], dtype=np.int64)
    growth = int(round(fs.growth_gb_per_h * GB)) * np.arange(n, dtype=np.int64) // (60 * fs.osts)
    free = start_free[None, :] - growth[:, None] - (used // fs.osts)[:, None] + jitter
    if (free <= 0).any():  # the parser keeps a margin, so this is a bug here
        raise ValueError(f"scenario {scenario.name}: FSx {fs.name} ran out of free space")
    return FsxSeries(fs.name, scenario.start, n, io, free)


def fsx_datapoints(scenario: Scenario) -> dict[str, FsxSeries]:
    """Every file system's CloudWatch datapoints, by file system name."""
    return {fs.name: fsx_series(scenario, fs) for fs in _aws(scenario).fsx}


_STATS = {
    "Sum": np.sum,
    "Minimum": np.min,
    "Maximum": np.max,
    "Average": np.mean,
    "SampleCount": np.size,
}


def fsx_statistic(
    scenario: Scenario,
    fs_name: str,
    metric: str,
    stat: str,
    start: datetime,
    end: datetime,
    period_s: int = 60,
    series: FsxSeries | None = None,
) -> list[tuple[datetime, float]]:
    """What CloudWatch answers for ``metric`` of one file system (dimension FileSystemId only): one
    (period start, value) per period from ``start`` on that holds datapoints in [start, end)."""
    s = series or fsx_series(scenario, _aws(scenario).file_system(fs_name))
    t = s.seconds
    v = s.values(metric)
    t0, t1 = int(start.timestamp()), int(end.timestamp())
    out = []
    for p in range(t0, t1, period_s):
        sel = (t >= p) & (t < min(p + period_s, t1))
        if sel.any():
            out.append((datetime.fromtimestamp(p, timezone.utc), float(_STATS[stat](v[sel]))))
    return out


def fsx_free_min(scenario: Scenario, fs_name: str, start: datetime, end: datetime, period_s: int = 60):
    """FreeDataStorageCapacity Minimum: the fullest OST's free bytes, per period."""
    return fsx_statistic(scenario, fs_name, FREE, "Minimum", start, end, period_s)


def fsx_free_sum(scenario: Scenario, fs_name: str, start: datetime, end: datetime, period_s: int = 60):
    """FreeDataStorageCapacity Sum: the file system's free bytes at a 60 s period (one value per OST)."""
    return fsx_statistic(scenario, fs_name, FREE, "Sum", start, end, period_s)


def fsx_low_windows(
    scenario: Scenario, fs_name: str, threshold_bytes: float = 500 * GB, stat: str = "Minimum"
) -> list[tuple[datetime, datetime]]:
    """[start, end) windows of whole minutes in which the per-minute ``stat`` (Minimum or Sum) of
    FreeDataStorageCapacity is below ``threshold_bytes`` (fsx_low_space's default: 500 GB)."""
    s = fsx_series(scenario, _aws(scenario).file_system(fs_name))
    low = (s.free.min(axis=1) if stat == "Minimum" else s.free.sum(axis=1)) < threshold_bytes
    edges = np.flatnonzero(np.diff(np.concatenate([[0], low.astype(np.int8), [0]])))
    return [
        (s.start + timedelta(minutes=int(a)), s.start + timedelta(minutes=int(b)))
        for a, b in zip(edges[::2], edges[1::2])
    ]


def day_window(d: date) -> tuple[datetime, datetime]:
    start = datetime.combine(d, time(), timezone.utc)
    return start, start + DAY
