"""FSx for Lustre: file systems from the FSx API, their AWS/FSx metrics from CloudWatch GetMetricData.

Which metrics and statistics are read is data (data/fsx_metrics.yaml). Every query has the single
dimension FileSystemId: CloudWatch aggregates the file system's disks under it, so FreeDataStorageCapacity's
Minimum is the fullest OST and its Sum the whole file system. Periods are aligned to the period grid
(start floored, end ceiled) so that re-reading a partition asks CloudWatch exactly the same question and
gets the same rows; the table keeps only periods starting inside the aligned window.

GetMetricData takes at most 500 queries a call; longer lists are sent in batches, each read through the
paginator (a large answer comes back in several pages, a query's points spread over them).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

import pyarrow as pa
from botocore.exceptions import BotoCoreError, ClientError

from foxhunt_obs.lib.errors import InputError
from foxhunt_obs.lib.schemas import FSX_METRICS
from foxhunt_obs.lib.yaml_text import load_yaml

MAX_QUERIES = 500  # GetMetricData's limit of MetricDataQueries per call
MAX_IDS = 50  # DescribeFileSystems' limit of FileSystemIds per call
_ID = re.compile(r"^fs-[0-9a-f]{8,}$")  # the API's own pattern: a bad id fails before any request
_METRICS_FILE = Path(__file__).resolve().parents[2] / "data" / "fsx_metrics.yaml"


@dataclass(frozen=True)
class FileSystem:
    id: str
    name: str  # its Name tag, '' when untagged
    deployment_type: str  # LustreConfiguration.DeploymentType (SCRATCH_2, PERSISTENT_2, ...), '' if absent
    storage_capacity_gib: int
    per_unit_storage_throughput: int | None  # MB/s per TiB; None for SCRATCH deployments
    tags: dict[str, str] = field(default_factory=dict, hash=False, compare=True)


@dataclass(frozen=True)
class FsxMetric:
    name: str  # CloudWatch metric name
    statistic: str  # Sum / Minimum / ...
    per_second: bool  # derive per_second = value / period (Sums of bytes and operations)


@dataclass(frozen=True)
class FsxMetricList:
    namespace: str
    dimension: str
    metrics: tuple[FsxMetric, ...]  # one entry per (metric, statistic), in the file's order


class FsxSourceError(InputError, RuntimeError):
    """A failed read; the message names the endpoint, the call, the file system, metric, statistic, window
    and partition, and AWS's own error text (never credentials)."""


@lru_cache(maxsize=4)
def load_metric_list(path: Path = _METRICS_FILE) -> FsxMetricList:
    raw = load_yaml(Path(path).read_text())
    metrics = []
    for m in raw["metrics"]:
        per_second = bool(m.get("per_second", False))
        for stat in m["statistics"]:
            # a rate only makes sense for a Sum: Minimum/Maximum/Average are per-disk values
            metrics.append(FsxMetric(m["name"], stat, per_second and stat == "Sum"))
    return FsxMetricList(raw["namespace"], raw["dimension"], tuple(metrics))


class FsxSource:
    def __init__(
        self,
        fsx_client: Any,
        cloudwatch_client: Any,
        period_s: int = 60,
        *,
        max_queries: int = MAX_QUERIES,
        metric_list: FsxMetricList | None = None,
    ):
        # FSx publishes one datapoint a minute: a shorter period has no data, and CloudWatch only takes
        # sub-minute periods for high-resolution metrics anyway.
        if period_s < 60 or period_s % 60:
            raise ValueError(f"FSx period_s must be a positive multiple of 60 seconds, got {period_s}")
        if not 1 <= max_queries <= MAX_QUERIES:
            raise ValueError(
                f"max_queries must be 1..{MAX_QUERIES} (GetMetricData's limit), got {max_queries}"
            )
        self._fsx = fsx_client
        self._cw = cloudwatch_client
        self.period_s = int(period_s)
        self.max_queries = max_queries
        self.metric_list = metric_list or load_metric_list()
        self.calls = 0  # AWS API calls made (pages included, retries inside botocore not)

    # -- file systems --------------------------------------------------------------------------------
    def file_systems(self, ids: list[str] | None = None) -> list[FileSystem]:
        """Lustre file systems, sorted by id: all of them, or exactly `ids` (an empty list means all).

        An unknown id or one that is not Lustre is an error: a configured file system that silently
        disappeared would leave holes in fsx_metrics.
        """
        wanted = sorted({i.strip() for i in ids or [] if i.strip()})
        bad = [i for i in wanted if not _ID.match(i)]
        if bad:
            raise FsxSourceError(
                f"{self._where(self._fsx)}: not FSx file system ids (fs-<hex>): {', '.join(bad)}"
            )
        found: dict[str, dict[str, Any]] = {}
        # an empty list asks for every file system; FileSystemIds takes at most 50 ids a call
        for chunk in [wanted[i : i + MAX_IDS] for i in range(0, len(wanted), MAX_IDS)] or [[]]:
            for fs in self._describe(chunk):
                found[fs["FileSystemId"]] = fs
        if wanted:
            missing = [i for i in wanted if i not in found]
            if missing:
                raise FsxSourceError(
                    f"{self._where(self._fsx)}: file systems not found: {', '.join(missing)}"
                )
            other = [f"{i} ({found[i].get('FileSystemType')})" for i in wanted if not _lustre(found[i])]
            if other:
                raise FsxSourceError(
                    f"{self._where(self._fsx)}: not Lustre file systems: {', '.join(other)} "
                    "(only FSx for Lustre publishes the metrics read here)"
                )
        return [_file_system(found[i]) for i in sorted(found) if _lustre(found[i])]

    def _describe(self, ids: list[str]) -> list[dict[str, Any]]:
        kwargs = {"FileSystemIds": ids} if ids else {}
        what = f"describe_file_systems {', '.join(ids)}" if ids else "describe_file_systems (all)"
        out: list[dict[str, Any]] = []
        try:
            for page in self._fsx.get_paginator("describe_file_systems").paginate(**kwargs):
                self.calls += 1
                out.extend(page.get("FileSystems", []))
        except ClientError as e:
            self.calls += 1
            if _code(e) == "FileSystemNotFound":  # real FSx; moto answers an empty list instead
                raise FsxSourceError(
                    f"{self._where(self._fsx)}: file systems not found: {', '.join(ids)} ({_aws_text(e)})"
                ) from e
            raise FsxSourceError(f"{self._where(self._fsx)}: {what}: {_aws_text(e)}") from e
        except BotoCoreError as e:
            self.calls += 1
            raise FsxSourceError(f"{self._where(self._fsx)}: {what}: {e}") from e
        return out

    # -- metrics -------------------------------------------------------------------------------------
    def metrics(
        self, file_systems: list[FileSystem], start: datetime, end: datetime, partition: str = ""
    ) -> pa.Table:
        """One row per (file system, metric, statistic, period start) CloudWatch has in [start, end),
        both ends aligned outward to the period; exactly FSX_METRICS.schema, sorted."""
        t0, t1 = self.window(start, end)
        fss = sorted({fs.id: fs for fs in file_systems}.values(), key=lambda fs: fs.id)
        if not fss or t0 == t1:
            return FSX_METRICS.schema.empty_table()
        queries = [(fs, m) for fs in fss for m in self.metric_list.metrics]
        rows: dict[str, list] = {k: [] for k in ("ts", "fs", "name", "metric", "stat", "value", "rate")}
        for first in range(0, len(queries), self.max_queries):
            batch = list(enumerate(queries[first : first + self.max_queries], start=first))
            results = self._get_metric_data(batch, t0, t1, partition)
            for i, (fs, m) in batch:
                timestamps, values = results[f"q{i}"]
                for ts, value in zip(timestamps, values):
                    sec = ts.timestamp()
                    if not t0 <= sec < t1:  # CloudWatch (and moto) may answer a period at or past the end
                        continue
                    rows["ts"].append(round(sec * 1000))
                    rows["fs"].append(fs.id)
                    rows["name"].append(fs.name)
                    rows["metric"].append(m.name)
                    rows["stat"].append(m.statistic)
                    rows["value"].append(float(value))
                    rows["rate"].append(float(value) / self.period_s if m.per_second else None)
        n = len(rows["ts"])
        table = pa.table(
            {
                "ts": pa.array(rows["ts"], pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
                "file_system_id": pa.array(rows["fs"], pa.string()),
                "file_system_name": pa.array(rows["name"], pa.string()),
                "metric": pa.array(rows["metric"], pa.string()),
                "statistic": pa.array(rows["stat"], pa.string()),
                "period_seconds": pa.array([self.period_s] * n, pa.int32()),
                "value": pa.array(rows["value"], pa.float64()),
                "per_second": pa.array(rows["rate"], pa.float64()),
            }
        )
        # sorted on plain strings first, then dictionary-encoded: the dictionaries come out in the
        # same order for the same rows, so a re-read gives an identical table
        keys = ("file_system_id", "metric", "statistic", "ts", "value")
        table = table.sort_by([(k, "ascending") for k in keys])
        return table.cast(FSX_METRICS.schema)

    def window(self, start: datetime, end: datetime) -> tuple[int, int]:
        """[start, end) as epoch seconds, start floored and end ceiled to the period."""
        for name, t in (("start", start), ("end", end)):
            if t.tzinfo is None or t.utcoffset() is None:
                raise ValueError(
                    f"FSx metrics {name} must be timezone-aware (UTC), got naive {t.isoformat()}"
                )
        p = self.period_s
        t0 = math.floor(start.timestamp() / p) * p
        t1 = math.ceil(end.timestamp() / p) * p
        if t1 < t0:
            raise ValueError(f"FSx metrics window ends before it starts: {_iso(t0)}..{_iso(t1)}")
        return t0, t1

    def _get_metric_data(
        self, batch: list[tuple[int, tuple[FileSystem, FsxMetric]]], t0: int, t1: int, partition: str
    ) -> dict[str, tuple[list[datetime], list[float]]]:
        ml = self.metric_list
        queries = [
            {
                "Id": f"q{i}",
                "MetricStat": {
                    "Metric": {
                        "Namespace": ml.namespace,
                        "MetricName": m.name,
                        # sorted by name: moto matches dimensions in the order they were put
                        "Dimensions": sorted(
                            [{"Name": ml.dimension, "Value": fs.id}], key=lambda d: d["Name"]
                        ),
                    },
                    "Period": self.period_s,
                    "Stat": m.statistic,
                },
                "ReturnData": True,
            }
            for i, (fs, m) in batch
        ]
        got: dict[str, tuple[list[datetime], list[float]]] = {}
        status: dict[str, str] = {}
        notes: dict[str, list[str]] = {}
        top: list[str] = []
        try:
            pages = self._cw.get_paginator("get_metric_data").paginate(
                MetricDataQueries=queries,
                StartTime=datetime.fromtimestamp(t0, timezone.utc),
                EndTime=datetime.fromtimestamp(t1, timezone.utc),
                ScanBy="TimestampAscending",
            )
            for page in pages:
                self.calls += 1
                top += [_message(msg) for msg in page.get("Messages") or []]
                for r in page.get("MetricDataResults", []):
                    ts, vals = got.setdefault(r["Id"], ([], []))
                    ts.extend(r.get("Timestamps", []))
                    vals.extend(r.get("Values", []))
                    status[r["Id"]] = r.get("StatusCode", "")  # the last page's status is the final one
                    notes.setdefault(r["Id"], []).extend(_message(msg) for msg in r.get("Messages") or [])
        except ClientError as e:
            self.calls += 1
            raise FsxSourceError(f"{self._batch_where(batch, t0, t1, partition)}: {_aws_text(e)}") from e
        except BotoCoreError as e:
            self.calls += 1
            raise FsxSourceError(f"{self._batch_where(batch, t0, t1, partition)}: {e}") from e
        if top:
            # as much as possible is still answered, but not all of it: an incomplete partition
            raise FsxSourceError(f"{self._batch_where(batch, t0, t1, partition)}: {'; '.join(top)}")
        for i, (fs, m) in batch:
            qid = f"q{i}"
            if qid not in got:
                raise FsxSourceError(f"{self._query_where(fs, m, t0, t1, partition)}: no result for {qid}")
            if status[qid] != "Complete" or notes[qid]:
                text = f"status {status[qid] or 'missing'}" + (
                    f": {'; '.join(notes[qid])}" if notes[qid] else ""
                )
                raise FsxSourceError(f"{self._query_where(fs, m, t0, t1, partition)}: {text}")
        return got

    # -- error context -------------------------------------------------------------------------------
    @staticmethod
    def _where(client: Any) -> str:
        meta = client.meta
        return f"{meta.service_model.service_id} at {meta.endpoint_url} ({meta.region_name})"

    def _window_text(self, t0: int, t1: int, partition: str) -> str:
        text = f"{_iso(t0)}..{_iso(t1)} period {self.period_s}s"
        return text + (f" (partition {partition})" if partition else "")

    def _query_where(self, fs: FileSystem, m: FsxMetric, t0: int, t1: int, partition: str) -> str:
        return (
            f"{self._where(self._cw)}: get_metric_data {self.metric_list.namespace} {m.name} {m.statistic} "
            f"of {_fs_text(fs)} {self._window_text(t0, t1, partition)}"
        )

    def _batch_where(
        self, batch: list[tuple[int, tuple[FileSystem, FsxMetric]]], t0: int, t1: int, partition: str
    ) -> str:
        fss = {fs.id: fs for _, (fs, _) in batch}
        metrics = {f"{m.name} {m.statistic}": None for _, (_, m) in batch}
        return (
            f"{self._where(self._cw)}: get_metric_data {self.metric_list.namespace} "
            f"{_some(metrics)} of {_some(_fs_text(fs) for fs in fss.values())} "
            f"{self._window_text(t0, t1, partition)}"
        )


def _file_system(fs: dict[str, Any]) -> FileSystem:
    tags = {t["Key"]: t.get("Value", "") for t in fs.get("Tags") or []}
    lustre = fs.get("LustreConfiguration") or {}
    throughput = lustre.get("PerUnitStorageThroughput")
    return FileSystem(
        id=fs["FileSystemId"],
        name=tags.get("Name", ""),
        deployment_type=lustre.get("DeploymentType", ""),
        storage_capacity_gib=int(fs.get("StorageCapacity") or 0),
        per_unit_storage_throughput=int(throughput) if throughput is not None else None,
        tags=dict(sorted(tags.items())),
    )


def _lustre(fs: dict[str, Any]) -> bool:
    return fs.get("FileSystemType") == "LUSTRE"


def _code(e: ClientError) -> str:
    return e.response.get("Error", {}).get("Code", "")


def _aws_text(e: ClientError) -> str:
    err = e.response.get("Error", {})
    status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return f"{err.get('Code', 'error')}: {err.get('Message', '')}".rstrip(": ") + (
        f" (HTTP {status})" if status else ""
    )


def _message(msg: dict[str, Any]) -> str:
    return f"{msg.get('Code', '')}: {msg.get('Value', '')}".strip(": ")


def _fs_text(fs: FileSystem) -> str:
    return f"{fs.id} ({fs.name})" if fs.name else fs.id


def _some(items: Iterable[str], n: int = 5) -> str:
    items = list(items)
    more = f" and {len(items) - n} more" if len(items) > n else ""
    return ", ".join(items[:n]) + more


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
