"""The scenario's optional ``aws:`` block: the account the sandbox bills and the FSx file systems it watches.

``scenario.py`` parses the block with :func:`parse_aws` (same strictness, errors naming file and item);
``bills.py`` turns it into exact truth (line items, Cost Explorer answers, CloudWatch datapoints, the
budget) and ``moto_server.py`` writes that truth into a moto server. YAML layout (see
scenarios/default.yaml for a commented example)::

    aws:
      account_id: "123456789012"               # 12 digits, quoted
      region: us-east-1
      tags: {Project: ..., Environment: ...}   # on every billed resource except the EKS cluster
      fsx:        [{name, storage_gib, deployment_type, throughput_mb_per_tib, osts,
                    free_gb: [one per OST, at the start], growth_gb_per_h,
                    io: {read_mb_s, write_mb_s, metadata_ops_s, amplitude?, period_h?, noise?, io_kib?}}]
      billed:
        s3_buckets: [{name, experiment, gb}]   # tagged with the defaults + Experiment=<experiment>
        eks_cluster: name                      # billed per hour, no tags at all
      budget:     {name, limit_usd, alert_pct?}
      incidents:  [{kind: fsx_fill, fsx, start_h, minutes, gb, recover_h?},
                   {kind: stray_instance, name, instance_type, start_h, hours, experiment?}]

Every node of the scenario is one EC2 instance billed from the scenario's start to its end, except while a
``node_lost`` incident has it replaced (see bills.py). Times here are offsets from the scenario's start as
everywhere else, but on CloudWatch's minute grid (FSx reports a datapoint a minute).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from foxhunt_obs.sandbox.story.scenario import ScenarioParser

COST_TAG_KEYS = ("Project", "Environment", "Experiment")  # the cost allocation tags
DEPLOYMENT_TYPES = ("PERSISTENT_1", "PERSISTENT_2", "SCRATCH_1", "SCRATCH_2")
AWS_INCIDENT_KINDS = ("fsx_fill", "stray_instance")
MINUTE_S = 60
GB = 10**9  # free space is in GB (decimal), as CloudWatch's bytes are; capacity in GiB, as FSx provisions
GIB = 2**30
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class IoProfile:
    """Per minute: bytes = rate × 60 × (1 + amplitude · sin(2π t / period_h) + noise · N(0, 1)), ≥ 0;
    operations = bytes / io_kib KiB; metadata operations = rate × 60 × (1 + noise · N(0, 1))."""

    read_mb_s: float
    write_mb_s: float
    metadata_ops_s: float
    amplitude: float = 0.0
    period_h: float = 0.0  # 0: no wave
    noise: float = 0.0
    io_kib: int = 1024


@dataclass(frozen=True)
class FileSystem:
    """An FSx for Lustre file system. Free space per OST starts at ``free_gb`` and shrinks by
    ``growth_gb_per_h`` (the whole file system's, spread evenly over the OSTs) plus any fsx_fill."""

    name: str
    index: int  # position in the file: part of its random seed
    storage_gib: int
    deployment_type: str
    throughput_mb_per_tib: int
    osts: int
    free_gb: tuple[float, ...]
    growth_gb_per_h: float
    io: IoProfile

    @property
    def price_key(self) -> str:
        """The price table's key: DEPLOYMENT_TYPE/throughput."""
        return f"{self.deployment_type}/{self.throughput_mb_per_tib}"


@dataclass(frozen=True)
class S3Bucket:
    name: str
    experiment: str
    gb: Decimal  # stored, constant: billed gb × the GB-month price / hours in the month, each hour


@dataclass(frozen=True)
class Budget:
    name: str
    limit_usd: Decimal
    alert_pct: float | None = None  # an ACTUAL > alert_pct % notification (e.g. 80)


@dataclass(frozen=True)
class FsxFill:
    """``gb`` of a file system's free space disappear linearly over [start, end) (spread evenly over its
    OSTs, and written: DataWriteBytes rises by the same amount); at ``recover`` (files deleted) it all
    comes back at once. No recover: it stays full to the end."""

    kind: str  # one of AWS_INCIDENT_KINDS
    fsx: str
    gb: float
    start: datetime
    end: datetime
    start_s: int
    end_s: int
    recover: datetime | None = None
    recover_s: int | None = None


@dataclass(frozen=True)
class StrayInstance:
    """An EC2 instance billed outside the cluster over [start, end): no node, no pods, nothing in
    Prometheus (someone's benchmark box left running). Tagged with the defaults + Experiment when given:
    its hours are the project's cost spike, and bill lines on no node-hour in the allocation."""

    kind: str  # "stray_instance"
    name: str
    instance_type: str
    experiment: str  # '' for no Experiment tag
    start: datetime
    end: datetime
    start_s: int
    end_s: int


@dataclass(frozen=True)
class Aws:
    account_id: str
    region: str
    tags: tuple[tuple[str, str], ...]  # default tags of billed resources (key, value), sorted
    fsx: tuple[FileSystem, ...]
    s3_buckets: tuple[S3Bucket, ...]
    eks_cluster: str | None
    budget: Budget | None
    incidents: tuple[FsxFill | StrayInstance, ...]

    @property
    def default_tags(self) -> dict[str, str]:
        return dict(self.tags)

    @property
    def fills(self) -> tuple[FsxFill, ...]:
        return tuple(i for i in self.incidents if isinstance(i, FsxFill))

    @property
    def strays(self) -> tuple[StrayInstance, ...]:
        return tuple(i for i in self.incidents if isinstance(i, StrayInstance))

    def file_system(self, name: str) -> FileSystem:
        for f in self.fsx:
            if f.name == name:
                return f
        raise KeyError(f"no FSx file system {name!r}")


def parse_aws(p: ScenarioParser, d: Any) -> Aws:
    """The ``aws:`` block; ``p`` is the scenario's parser (nodes, experiments and the window are known)."""
    d = p.fields(d, "aws", {"account_id", "region"}, {"tags", "fsx", "billed", "budget", "incidents"})
    account = d["account_id"]
    if not isinstance(account, str) or not re.fullmatch(r"\d{12}", account):
        raise p.fail("aws.account_id", f"expected 12 digits in quotes, got {account!r}")
    region = d["region"]
    if not isinstance(region, str) or not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", region):
        raise p.fail("aws.region", f"expected a region name like us-east-1, got {region!r}")
    tags = _tags(p, d.get("tags") or {})
    raw_fsx = d.get("fsx") or []
    if not isinstance(raw_fsx, list):
        raise p.fail("aws.fsx", "expected a list of file systems")
    fsx = tuple(_file_system(p, i, f) for i, f in enumerate(raw_fsx))
    p.unique(fsx, "aws.fsx file system")
    buckets, eks = _billed(p, d.get("billed") or {})
    budget = _budget(p, d["budget"]) if d.get("budget") is not None else None
    raw_inc = d.get("incidents") or []
    if not isinstance(raw_inc, list):
        raise p.fail("aws.incidents", "expected a list")
    by_name = {f.name: f for f in fsx}
    incidents = tuple(_incident(p, i, x, by_name) for i, x in enumerate(raw_inc))
    _check_fills(p, fsx, tuple(i for i in incidents if isinstance(i, FsxFill)))
    p.unique([i for i in incidents if isinstance(i, StrayInstance)], "aws.incidents stray_instance")
    return Aws(
        account_id=account,
        region=region,
        tags=tuple(sorted(tags.items())),
        fsx=fsx,
        s3_buckets=buckets,
        eks_cluster=eks,
        budget=budget,
        incidents=incidents,
    )


def _number(
    p: ScenarioParser, value: Any, where: str, what: str, minimum: float = 0.0, strict: bool = False
) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise p.fail(where, f"{what} must be a number, got {value!r}")
    if value < minimum or (strict and value == minimum):
        raise p.fail(where, f"{what} must be {'>' if strict else '>='} {minimum:g}, got {value!r}")
    return float(value)


def _whole(p: ScenarioParser, value: Any, where: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise p.fail(where, f"{what} must be a whole number > 0, got {value!r}")
    return value


def _decimal(p: ScenarioParser, value: Any, where: str, what: str) -> Decimal:
    try:
        v = Decimal(str(value)) if not isinstance(value, bool) else None
    except InvalidOperation:
        v = None
    if v is None or not v.is_finite() or v <= 0:
        raise p.fail(where, f"{what} must be a number > 0, got {value!r}")
    return v


def _tags(p: ScenarioParser, d: Any) -> dict[str, str]:
    if not isinstance(d, dict):
        raise p.fail("aws.tags", f"expected a mapping of tag key to value, got {d!r}")
    allowed = [k for k in COST_TAG_KEYS if k != "Experiment"]
    for k, v in d.items():
        if k not in allowed:
            raise p.fail(
                "aws.tags",
                f"tag {k!r} is not a default cost tag (one of {', '.join(allowed)}; Experiment is set per "
                "S3 bucket)",
            )
        if not isinstance(v, str) or not v:
            raise p.fail("aws.tags", f"tag {k!r} needs a non-empty string value, got {v!r}")
    return dict(d)


def _file_system(p: ScenarioParser, i: int, d: Any) -> FileSystem:
    where = f"aws.fsx[{i}]" + (f" ({d.get('name')!r})" if isinstance(d, dict) else "")
    d = p.fields(
        d,
        where,
        {"name", "storage_gib", "deployment_type", "throughput_mb_per_tib", "osts", "free_gb", "io"},
        {"growth_gb_per_h"},
    )
    if d["deployment_type"] not in DEPLOYMENT_TYPES:
        raise p.fail(
            where,
            f"deployment_type must be one of {', '.join(DEPLOYMENT_TYPES)}, got {d['deployment_type']!r}",
        )
    storage = _whole(p, d["storage_gib"], where, "storage_gib")
    osts = _whole(p, d["osts"], where, "osts")
    free = d["free_gb"]
    if not isinstance(free, list) or len(free) != osts:
        raise p.fail(where, f"free_gb must list one value per OST ({osts}), got {free!r}")
    free = tuple(_number(p, x, where, "free_gb", strict=True) for x in free)
    per_ost_gb = storage * GIB / osts / GB
    for k, x in enumerate(free):
        if x > per_ost_gb:
            raise p.fail(
                where,
                f"OST {k} has {x:g} GB free but holds only {per_ost_gb:.0f} GB ({storage} GiB / {osts})",
            )
    io = p.fields(
        d["io"],
        f"{where}: io",
        {"read_mb_s", "write_mb_s", "metadata_ops_s"},
        {"amplitude", "period_h", "noise", "io_kib"},
    )
    profile = IoProfile(
        read_mb_s=_number(p, io["read_mb_s"], where, "io.read_mb_s"),
        write_mb_s=_number(p, io["write_mb_s"], where, "io.write_mb_s"),
        metadata_ops_s=_number(p, io["metadata_ops_s"], where, "io.metadata_ops_s"),
        amplitude=_number(p, io.get("amplitude", 0.0), where, "io.amplitude"),
        period_h=_number(p, io.get("period_h", 0.0), where, "io.period_h"),
        noise=_number(p, io.get("noise", 0.0), where, "io.noise"),
        io_kib=_whole(p, io.get("io_kib", 1024), where, "io.io_kib"),
    )
    return FileSystem(
        name=str(d["name"]),
        index=i,
        storage_gib=storage,
        deployment_type=d["deployment_type"],
        throughput_mb_per_tib=_whole(p, d["throughput_mb_per_tib"], where, "throughput_mb_per_tib"),
        osts=osts,
        free_gb=free,
        growth_gb_per_h=_number(p, d.get("growth_gb_per_h", 0.0), where, "growth_gb_per_h"),
        io=profile,
    )


def _billed(p: ScenarioParser, d: Any) -> tuple[tuple[S3Bucket, ...], str | None]:
    d = p.fields(d, "aws.billed", set(), {"s3_buckets", "eks_cluster"})
    raw = d.get("s3_buckets") or []
    if not isinstance(raw, list):
        raise p.fail("aws.billed.s3_buckets", "expected a list of buckets")
    buckets = []
    for i, b in enumerate(raw):
        where = f"aws.billed.s3_buckets[{i}]" + (f" ({b.get('name')!r})" if isinstance(b, dict) else "")
        b = p.fields(b, where, {"name", "experiment", "gb"})
        if not isinstance(b["name"], str) or not _BUCKET.match(b["name"]):
            raise p.fail(where, f"{b['name']!r} is not an S3 bucket name (3-63 of a-z 0-9 . -)")
        exp = p.known(p.experiments, b["experiment"], "experiment", where)
        buckets.append(S3Bucket(b["name"], exp.name, _decimal(p, b["gb"], where, "gb")))
    p.unique(buckets, "aws.billed.s3_buckets bucket")
    eks = d.get("eks_cluster")
    if eks is not None and (not isinstance(eks, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", eks)):
        raise p.fail("aws.billed.eks_cluster", f"expected a cluster name, got {eks!r}")
    return tuple(buckets), eks


def _budget(p: ScenarioParser, d: Any) -> Budget:
    d = p.fields(d, "aws.budget", {"name", "limit_usd"}, {"alert_pct"})
    if not isinstance(d["name"], str) or not d["name"]:
        raise p.fail("aws.budget", f"name must be a non-empty string, got {d['name']!r}")
    alert = d.get("alert_pct")
    if alert is not None:
        alert = _number(p, alert, "aws.budget", "alert_pct", strict=True)
    return Budget(d["name"], _decimal(p, d["limit_usd"], "aws.budget", "limit_usd"), alert)


def _minute(p: ScenarioParser, value: Any, unit_s: int, where: str, what: str) -> int:
    """Seconds for hours/minutes (or "H:MM[:SS]"), on CloudWatch's minute grid (not the scrape grid)."""
    if isinstance(value, str) and ":" in value:
        try:
            s = sum(float(x) * u for x, u in zip(value.split(":"), (3600, 60, 1)))
        except ValueError:
            raise p.fail(where, f"{what}={value!r} is not H:MM[:SS]") from None
    else:
        s = _number(p, value, where, what) * unit_s
    k = round(s / MINUTE_S)
    if not math.isclose(k * MINUTE_S, s, abs_tol=1e-6):
        raise p.fail(where, f"{what}={value} is not on the {MINUTE_S} s CloudWatch minute grid")
    return k * MINUTE_S


def _incident(p: ScenarioParser, i: int, d: Any, fsx: dict[str, FileSystem]) -> FsxFill | StrayInstance:
    kind = d.get("kind") if isinstance(d, dict) else None
    where = f"aws.incidents[{i}] ({kind})"
    if kind not in AWS_INCIDENT_KINDS:
        raise p.fail(where, f"kind must be one of {', '.join(AWS_INCIDENT_KINDS)}")
    if kind == "stray_instance":
        return _stray(p, where, d)
    d = p.fields(d, where, {"kind", "fsx", "start_h", "minutes", "gb"}, {"recover_h"})
    fs = p.known(fsx, d["fsx"], "FSx file system", where)
    s = _minute(p, d["start_h"], 3600, where, "start_h")
    e = s + _minute(p, d["minutes"], 60, where, "minutes")
    if not 0 <= s < e <= p.hours * 3600:
        raise p.fail(where, f"window {s / 3600:g}h..{e / 3600:g}h is empty or outside 0..{p.hours}h")
    r = None
    if d.get("recover_h") is not None:
        r = _minute(p, d["recover_h"], 3600, where, "recover_h")
        if not e <= r < p.hours * 3600:
            raise p.fail(
                where,
                f"recover_h={d['recover_h']} must be at or after the fill's end ({e / 3600:g}h) and before "
                f"the scenario's end ({p.hours}h)",
            )
    return FsxFill(
        kind=kind,
        fsx=fs.name,
        gb=_number(p, d["gb"], where, "gb", strict=True),
        start=p.at(s),
        end=p.at(e),
        start_s=s,
        end_s=e,
        recover=p.at(r) if r is not None else None,
        recover_s=r,
    )


def _stray(p: ScenarioParser, where: str, d: dict) -> StrayInstance:
    d = p.fields(d, where, {"kind", "name", "instance_type", "start_h", "hours"}, {"experiment"})
    if not isinstance(d["name"], str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", d["name"]):
        raise p.fail(where, f"name must be a word (letters, digits, _ . -), got {d['name']!r}")
    if not isinstance(d["instance_type"], str) or not re.fullmatch(
        r"[a-z0-9-]+\.[a-z0-9]+", d["instance_type"]
    ):
        raise p.fail(where, f"instance_type must look like p5.48xlarge, got {d['instance_type']!r}")
    experiment = ""
    if d.get("experiment") is not None:
        experiment = p.known(p.experiments, d["experiment"], "experiment", where).name
    s = _minute(p, d["start_h"], 3600, where, "start_h")
    e = s + _minute(p, d["hours"], 3600, where, "hours")
    if not 0 <= s < e <= p.hours * 3600:
        raise p.fail(where, f"window {s / 3600:g}h..{e / 3600:g}h is empty or outside 0..{p.hours}h")
    return StrayInstance(
        kind="stray_instance",
        name=d["name"],
        instance_type=d["instance_type"],
        experiment=experiment,
        start=p.at(s),
        end=p.at(e),
        start_s=s,
        end_s=e,
    )


def _check_fills(p: ScenarioParser, fsx: tuple[FileSystem, ...], fills: tuple[FsxFill, ...]) -> None:
    end = p.hours * 3600
    for fs in fsx:
        mine = sorted((f for f in fills if f.fsx == fs.name), key=lambda f: f.start_s)
        for a, b in zip(mine, mine[1:]):
            if b.start_s < (a.recover_s if a.recover_s is not None else end):
                raise p.fail(
                    f"aws.incidents on {fs.name!r}",
                    f"fsx_fill at {b.start_s / 3600:g}h starts before the one at {a.start_s / 3600:g}h recovered",
                )
        # the lowest any OST gets: all growth to the end plus the biggest fill (fills never overlap)
        worst = fs.growth_gb_per_h * p.hours / fs.osts + max((f.gb for f in mine), default=0.0) / fs.osts
        for k, free in enumerate(fs.free_gb):
            if free - worst <= 1:  # 1 GB: room for the per-minute jitter
                raise p.fail(
                    f"aws.fsx {fs.name!r}",
                    f"OST {k} would run out of space ({free:g} GB free at the start, up to {worst:g} GB "
                    "used by growth and fills): give more free_gb or fill less",
                )
