"""CUR 2.0 (AWS Data Exports) reader: line items per resource-hour from the newest complete delivery.

Layout under the export root s3://<bucket>/<prefix>/<export-name> (AWS docs "Understanding export
delivery" and "Data Exports manifest file reference"):

    data/BILLING_PERIOD=YYYY-MM/[<executionId>/]<export-name>-<n>.snappy.parquet
    metadata/BILLING_PERIOD=YYYY-MM/[<executionId>/]<export-name>-Manifest.json

The <executionId>/ level exists with "create new" delivery; "overwrite" replaces the files in place.
Data Exports writes the manifest only after every data file of its execution, so a billing period without
a manifest is not complete and is skipped (reported, never half-read). The newest manifest (LastModified,
then key) says which files make up the delivery: its `dataFiles` (full s3:// URIs) are read and nothing
else in data/ (older executions, stray or half-written files).

Manifest fields used: executionId, exportArn, columns, dataFiles, billingPeriod {start, end}; all but
dataFiles may be absent.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, timezone
from decimal import Decimal, InvalidOperation
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from botocore.exceptions import BotoCoreError, ClientError

from foxhunt_obs.lib.errors import InputError
from foxhunt_obs.lib.schemas import COSTS_HOURLY, TS
from foxhunt_obs.lib.settings import cost_tags, default
from foxhunt_obs.lib.sources.aws import tag_column

_DEFAULT_TAGS = cost_tags(default("FOXHUNT_COST_TAGS"))
_PERIOD = re.compile(r"^\d{4}-(0[1-9]|1[0-2])$")

# CUR 2.0 column names. Required ones must be in every data file; optional ones default when absent.
USAGE_START = "line_item_usage_start_date"
LINE_TYPE = "line_item_line_item_type"
UNBLENDED = "line_item_unblended_cost"
TAGS = "resource_tags"
STRING_COLUMNS = {  # output column <- CUR 2.0 column
    "account_id": "line_item_usage_account_id",
    "service": "line_item_product_code",
    "usage_type": "line_item_usage_type",
    "operation": "line_item_operation",
    "resource_id": "line_item_resource_id",
    "instance_type": "product_instance_type",
}
REQUIRED = (
    USAGE_START,
    LINE_TYPE,
    UNBLENDED,
    "line_item_usage_amount",
    TAGS,
    "line_item_usage_account_id",
    "line_item_product_code",
    "line_item_usage_type",
    "line_item_operation",
    "line_item_resource_id",
)
# Amortization inputs: read when present. A line whose formula needs an absent (or null) one fails.
SP_EFFECTIVE = "savings_plan_savings_plan_effective_cost"
RI_EFFECTIVE = "reservation_effective_cost"
SP_TOTAL_COMMITMENT = "savings_plan_total_commitment_to_date"
SP_USED_COMMITMENT = "savings_plan_used_commitment"
RI_UNUSED_UPFRONT = "reservation_unused_amortized_upfront_fee_for_billing_period"
RI_UNUSED_RECURRING = "reservation_unused_recurring_fee"
RI_ARN = "reservation_reservation_a_r_n"
OPTIONAL = (
    "product_instance_type",
    SP_EFFECTIVE,
    RI_EFFECTIVE,
    SP_TOTAL_COMMITMENT,
    SP_USED_COMMITMENT,
    RI_UNUSED_UPFRONT,
    RI_UNUSED_RECURRING,
    RI_ARN,
)


class CurError(InputError, RuntimeError):
    """Unreadable CUR data; the message names the S3 object (and row and column where there is one)."""


@dataclass(frozen=True)
class Manifest:
    uri: str  # s3://bucket/key of the Manifest.json
    billing_period: str  # YYYY-MM, from its BILLING_PERIOD= folder
    last_modified: datetime
    execution_id: str  # '' when the manifest has none
    export_arn: str
    data_files: tuple[str, ...]  # full s3:// URIs
    columns: tuple[dict, ...]
    period_start: str  # billingPeriod.start as written ('' when absent)
    period_end: str

    @property
    def id(self) -> str:
        """What costs_hourly.manifest records: the execution, else the manifest's own URI."""
        return self.execution_id or self.uri


def split_s3(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, key = uri[5:].partition("/")
    if not bucket:
        raise ValueError(f"no bucket in {uri!r}")
    return bucket, key


def billing_periods(start: datetime, end: datetime) -> list[str]:
    """The YYYY-MM billing periods that overlap [start, end)."""
    out: list[str] = []
    y, m = start.year, start.month
    while start < end and _month_start(y, m) < end:
        out.append(f"{y:04d}-{m:02d}")
        y, m = (y + 1, 1) if m == 12 else (y, m + 1)
    return out


def _month_start(y: int, m: int) -> datetime:
    return datetime(y, m, 1, tzinfo=timezone.utc)


class CurSource:
    def __init__(self, s3_client: Any, root_uri: str, tag_keys: Sequence[str] = _DEFAULT_TAGS):
        if len(tag_keys) != 3 or not all(tag_keys):
            raise ValueError(
                f"tag_keys must name the project, environment and experiment tags, got {tag_keys!r}"
            )
        self._s3 = s3_client
        self.root_uri = root_uri.rstrip("/")
        self.bucket, self.prefix = split_s3(self.root_uri)
        if not self.prefix:
            raise ValueError(f"CUR root {root_uri!r} must name the export: s3://bucket/prefix/export-name")
        self.tag_keys = tuple(tag_keys)
        self.tag_columns = tuple(tag_column(k) for k in tag_keys)
        self.files_read = 0  # data files and bytes read by the last line_items()
        self.bytes_read = 0
        # configured key -> billing periods read by the last line_items() whose delivery has resource tags but
        # none under that key (AWS spells CostCenter as user_cost_center: see aws.tag_column)
        self.unmatched_tag_keys: dict[str, list[str]] = {}

    # -- manifests ---------------------------------------------------------------------------------------
    def newest_manifest(self, billing_period: str) -> Manifest | None:
        """The newest Manifest.json of a billing period, or None while the period has no complete delivery."""
        if not _PERIOD.match(billing_period):
            raise ValueError(f"billing period must be YYYY-MM, got {billing_period!r}")
        prefix = f"{self.prefix}/metadata/BILLING_PERIOD={billing_period}/"
        where = f"CUR manifests under s3://{self.bucket}/{prefix}"
        found: list[tuple[datetime, str]] = []
        try:
            for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                for obj in page.get("Contents") or []:
                    if obj["Key"].endswith("Manifest.json"):
                        found.append((obj["LastModified"], obj["Key"]))
        except (ClientError, BotoCoreError) as e:
            raise CurError(f"{where}: list_objects_v2 failed: {e}") from e
        if not found:
            return None
        last_modified, key = max(found)
        uri = f"s3://{self.bucket}/{key}"
        body = self._get(uri, "manifest")
        try:
            doc = json.loads(body)
        except ValueError as e:
            raise CurError(f"CUR manifest {uri}: not JSON: {e}") from e
        files = doc.get("dataFiles") if isinstance(doc, dict) else None
        if not isinstance(files, list) or not all(
            isinstance(f, str) and f.startswith("s3://") for f in files
        ):
            raise CurError(f"CUR manifest {uri}: dataFiles must be a list of s3:// URIs, got {files!r:.300}")
        period = doc.get("billingPeriod") or {}
        return Manifest(
            uri=uri,
            billing_period=billing_period,
            last_modified=last_modified,
            execution_id=str(doc.get("executionId") or ""),
            export_arn=str(doc.get("exportArn") or ""),
            data_files=tuple(files),
            columns=tuple(doc.get("columns") or ()),
            period_start=str(period.get("start") or "") if isinstance(period, dict) else "",
            period_end=str(period.get("end") or "") if isinstance(period, dict) else "",
        )

    # -- line items --------------------------------------------------------------------------------------
    def line_items(self, start: datetime, end: datetime, partition: str = "") -> tuple[pa.Table, list[str]]:
        """Lines whose usage starts in [start, end), from each overlapping period's newest manifest.

        Returns (COSTS_HOURLY table, billing periods skipped for lack of a manifest). Each data file is
        read once, whatever the number of days asked for. Sets unmatched_tag_keys: each configured tag key
        that no resource_tags key of a period's delivery (all its lines, not just the window's) matches,
        while that delivery does carry tags, with those periods."""
        start, end = _utc(start), _utc(end)
        self.files_read = self.bytes_read = 0
        self.unmatched_tag_keys = {}
        parts: list[pa.Table] = []
        skipped: list[str] = []
        for period in billing_periods(start, end):
            manifest = self.newest_manifest(period)
            if manifest is None:
                skipped.append(period)
                continue
            seen: set[str] = set()  # normalised tag keys of the delivery
            for uri in manifest.data_files:
                parts.append(self._read_file(uri, manifest, start, end, partition, seen))
            if seen:
                for key, col in zip(self.tag_keys, self.tag_columns):
                    if col not in seen:
                        self.unmatched_tag_keys.setdefault(key, []).append(period)
        if not parts:
            return COSTS_HOURLY.schema.empty_table(), skipped
        table = pa.concat_tables(parts)
        return table.take(pc.sort_indices(table, [("hour", "ascending")])), skipped

    def _get(self, uri: str, what: str) -> bytes:
        bucket, key = split_s3(uri)
        try:
            return self._s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except (ClientError, BotoCoreError) as e:
            raise CurError(f"CUR {what} {uri}: get_object failed: {e}") from e

    def _read_file(
        self, uri: str, manifest: Manifest, start: datetime, end: datetime, partition: str, seen: set[str]
    ) -> pa.Table:
        where = f"CUR file {uri} (manifest {manifest.uri}{_for(partition)})"
        data = self._get(uri, f"data file (manifest {manifest.uri})")
        self.files_read += 1
        self.bytes_read += len(data)
        try:
            pf = pq.ParquetFile(io.BytesIO(data))
            names = set(pf.schema_arrow.names)
            missing = [c for c in REQUIRED if c not in names]
            if missing:
                raise CurError(f"{where}: lacks the CUR 2.0 column(s) {', '.join(missing)}")
            table = pf.read(columns=[c for c in (*REQUIRED, *OPTIONAL) if c in names])
        except CurError:
            raise
        except (pa.ArrowException, OSError) as e:
            raise CurError(f"{where}: unreadable Parquet: {e}") from e

        _check_tags_type(table.schema.field(TAGS).type, where)
        seen.update(tag_column(k) for k in _tag_keys(table.column(TAGS)))
        hours = _timestamps(table.column(USAGE_START), where)
        keep = pc.and_(pc.greater_equal(hours, pa.scalar(start, TS)), pc.less(hours, pa.scalar(end, TS)))
        keep = pc.fill_null(keep, False)
        rows = np.flatnonzero(keep.to_numpy(zero_copy_only=False))  # row numbers in the file, for errors
        table = table.take(rows)
        hours = hours.take(rows)
        n = table.num_rows

        def amounts(col: str, required: bool = True) -> np.ndarray:
            if col not in table.column_names:
                return np.full(n, np.nan)
            return _amounts(table.column(col), col, rows, where, required)

        line_type = _strings(table, LINE_TYPE, n)
        unblended = amounts(UNBLENDED)
        amortized = _amortize(line_type, unblended, table, amounts, rows, where)
        tag_col = table.column(TAGS)
        codes, firsts = _distinct(tag_col)
        distinct = [self._tags(tag_col[int(r)].as_py(), where, int(rows[r])) for r in firsts]
        cols: dict[str, Any] = {
            "hour": hours,
            "billing_period": pa.array([manifest.billing_period] * n, pa.string()),
            "line_item_type": line_type,
        }
        for out, col in STRING_COLUMNS.items():
            cols[out] = _strings(table, col, n)
        cols.update(
            usage_amount=pa.array(
                amounts("line_item_usage_amount", required=False), pa.float64(), from_pandas=True
            ),
            cost_usd=pa.array(unblended, pa.float64()),
            amortized_usd=pa.array(amortized, pa.float64()),
            project=pa.array([t[0] for t in distinct], pa.string()).take(codes),
            environment=pa.array([t[1] for t in distinct], pa.string()).take(codes),
            experiment=pa.array([t[2] for t in distinct], pa.string()).take(codes),
            tags=pa.array([t[3] for t in distinct], pa.string()).take(codes),
            manifest=pa.array([manifest.id] * n, pa.string()),
        )
        return pa.table({f.name: cols[f.name] for f in COSTS_HOURLY.schema}, schema=COSTS_HOURLY.schema)

    def _tags(self, raw: Any, where: str, row: int) -> tuple[str, str, str, str]:
        """resource_tags (map<string,string>, or a JSON object in a string) -> project, environment,
        experiment and the JSON of all tags under normalised keys (aws.tag_column: 'user_project' ->
        'project', 'user_cost_center' -> 'cost_center', 'aws_created_by' stays)."""
        if raw is None:
            items: list = []
        elif isinstance(raw, str):
            try:
                parsed = json.loads(raw) if raw.strip() else {}
            except ValueError as e:
                raise CurError(f"{where}: row {row}: {TAGS} is not a JSON object: {raw!r:.200}") from e
            if not isinstance(parsed, dict):
                raise CurError(f"{where}: row {row}: {TAGS} is not a JSON object: {raw!r:.200}")
            items = list(parsed.items())
        elif isinstance(raw, dict):
            items = list(raw.items())
        else:
            items = list(raw)
        tags: dict[str, str] = {}
        # Two spellings of one key on a line ('user_project', 'user:Project'): the first non-empty value in
        # key order wins, so the result does not depend on the map's order.
        for k, v in sorted(items, key=lambda kv: str(kv[0])):
            nk = tag_column(str(k))
            if v not in (None, "") and not tags.get(nk):
                tags[nk] = str(v)
            else:
                tags.setdefault(nk, "" if v is None else str(v))
        p, e, x = (tags.get(c, "") for c in self.tag_columns)
        return p, e, x, json.dumps(tags, sort_keys=True, separators=(",", ":"))


def _check_tags_type(t: pa.DataType, where: str) -> None:
    """resource_tags as AWS writes it (map<string,string>), as a JSON object in a string (a CSV-style
    export), or all null; any other type fails here, naming the file, the column and both types."""
    if pa.types.is_map(t):
        if not (pa.types.is_nested(t.key_type) or pa.types.is_nested(t.item_type)):
            return
    elif pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t):
        return
    raise CurError(
        f"{where}: column {TAGS} has type {t}, expected map<string,string> (or a JSON object as a string)"
    )


def _tag_keys(col: pa.ChunkedArray) -> set[str]:
    """Every resource_tags key in a file, as written. A JSON text that does not parse is skipped here (a line
    in the window that carries one fails in _tags)."""
    arr = col.combine_chunks()
    if isinstance(arr, pa.MapArray):
        return {str(k) for k in pc.unique(arr.keys).to_pylist() if k is not None}
    keys: set[str] = set()
    values = (
        pc.unique(arr).to_pylist()
        if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)
        else arr.to_pylist()
    )
    for raw in values:
        if isinstance(raw, str):
            try:
                raw = json.loads(raw) if raw.strip() else {}
            except ValueError:
                continue
        if isinstance(raw, dict):
            keys.update(str(k) for k in raw)
        elif isinstance(raw, list):
            keys.update(str(kv[0]) for kv in raw if isinstance(kv, (list, tuple)) and kv)
    return keys


def _distinct(col: pa.ChunkedArray) -> tuple[pa.Array, np.ndarray]:
    """Lines of one resource repeat its tags: (code per row, first row of each distinct tag set), so each
    distinct set is normalised once. A map is keyed by its entries joined with separators that AWS tag
    keys and values cannot hold; a null map and an empty one are the same (no tags)."""
    arr = col.combine_chunks()
    if isinstance(arr, pa.MapArray):
        entries = pc.binary_join_element_wise(
            arr.keys.cast(pa.string()), pc.fill_null(arr.items.cast(pa.string()), ""), "\x1f"
        )
        arr = pc.binary_join(pa.ListArray.from_arrays(arr.offsets, entries), "\x1e")
    encoded = pc.dictionary_encode(arr).indices
    codes = pc.fill_null(encoded, -1).to_numpy(zero_copy_only=False)  # null (JSON string column) -> -1
    uniq, firsts = np.unique(codes, return_index=True)
    remap = np.empty(int(uniq.max()) + 2 if len(uniq) else 1, np.int64)
    remap[uniq] = np.arange(len(uniq))  # -1 lands in the last slot
    return pa.array(remap[codes]), firsts


def _amortize(
    line_type: pa.Array, unblended: np.ndarray, table: pa.Table, amounts, rows, where
) -> np.ndarray:
    """Amortized (effective) cost per line, AWS's convention: the formula of the AWS Well-Architected CUR
    query "amortized_cost_by_charge_type" (it matches Cost Explorer's "amortized costs" view):
    SavingsPlanCoveredUsage -> savings_plan_savings_plan_effective_cost; DiscountedUsage ->
    reservation_effective_cost; SavingsPlanNegation and SavingsPlanUpfrontFee -> 0 (already spread onto the
    covered usage); SavingsPlanRecurringFee -> the unused commitment (total_commitment_to_date -
    used_commitment), RIFee -> the unused reservation (unused amortized upfront + unused recurring fee), both
    0 when the export lacks those columns; a Fee carrying a reservation ARN (an RI's upfront payment) -> 0;
    everything else -> unblended."""
    types = np.asarray(line_type.to_numpy(zero_copy_only=False), dtype=object)
    out = unblended.copy()

    def set_from(kind: str, col: str) -> None:
        m = types == kind
        if m.any():
            if col not in table.column_names:
                i = int(np.flatnonzero(m)[0])
                raise CurError(f"{where}: row {int(rows[i])}: a {kind} line needs column {col}, absent")
            vals = amounts(col, required=False)
            bad = m & np.isnan(vals)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise CurError(f"{where}: row {int(rows[i])}: column {col} is null on a {kind} line")
            out[m] = vals[m]

    set_from("SavingsPlanCoveredUsage", SP_EFFECTIVE)
    set_from("DiscountedUsage", RI_EFFECTIVE)
    out[(types == "SavingsPlanNegation") | (types == "SavingsPlanUpfrontFee")] = 0.0

    m = types == "SavingsPlanRecurringFee"
    if m.any():
        if SP_TOTAL_COMMITMENT in table.column_names and SP_USED_COMMITMENT in table.column_names:
            unused = np.nan_to_num(amounts(SP_TOTAL_COMMITMENT, False)) - np.nan_to_num(
                amounts(SP_USED_COMMITMENT, False)
            )
            out[m] = unused[m]
        else:
            out[m] = 0.0
    m = types == "RIFee"
    if m.any():
        if RI_UNUSED_UPFRONT in table.column_names or RI_UNUSED_RECURRING in table.column_names:
            unused = np.nan_to_num(amounts(RI_UNUSED_UPFRONT, False)) + np.nan_to_num(
                amounts(RI_UNUSED_RECURRING, False)
            )
            out[m] = unused[m]
        else:
            out[m] = 0.0
    if RI_ARN in table.column_names:
        arn = np.asarray(_strings(table, RI_ARN, len(types)).to_numpy(zero_copy_only=False), dtype=object)
        out[(types == "Fee") & (arn != "")] = 0.0
    return out


def _amounts(col: pa.ChunkedArray, name: str, rows: np.ndarray, where: str, required: bool) -> np.ndarray:
    """A money or quantity column (double, decimal, integer or string) as float64; null -> NaN.

    A value that is not a finite number fails, naming the file's row; so does a null in a required column."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    t = arr.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        trimmed = pc.utf8_trim_whitespace(arr)
        trimmed = pc.if_else(pc.equal(trimmed, ""), pa.scalar(None, trimmed.type), trimmed)
        try:
            values = trimmed.cast(pa.float64())
        except pa.ArrowInvalid:
            for i, raw in enumerate(arr.to_pylist()):
                if raw is not None and raw.strip() and _number(raw) is None:
                    raise CurError(_bad(where, rows[i], name, raw)) from None
            raise
    elif pa.types.is_floating(t) or pa.types.is_integer(t) or pa.types.is_decimal(t) or pa.types.is_null(t):
        values = arr.cast(pa.float64())
    else:
        raise CurError(f"{where}: column {name} has type {t}, not a number")
    out = values.to_numpy(zero_copy_only=False).astype(np.float64)
    valid = values.is_valid().to_numpy(zero_copy_only=False)
    bad = valid & ~np.isfinite(out)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise CurError(_bad(where, rows[i], name, arr[i].as_py()))
    if required and not valid.all():
        i = int(np.flatnonzero(~valid)[0])
        raise CurError(_bad(where, rows[i], name, None))
    out[~valid] = np.nan
    return out


def _number(raw: str) -> Decimal | None:
    try:
        d = Decimal(raw.strip())
    except InvalidOperation:
        return None
    return d if d.is_finite() else None


def _bad(where: str, row: Any, col: str, raw: Any) -> str:
    return f"{where}: row {int(row)}: column {col} is not a finite number: {raw!r}"


def _timestamps(col: pa.ChunkedArray, where: str) -> pa.Array:
    """line_item_usage_start_date as timestamp[ms, UTC]: a timestamp (naive = UTC), a date or an ISO string."""
    arr = col.combine_chunks()
    t = arr.type
    try:
        if pa.types.is_timestamp(t):
            if t.tz is None:
                arr = arr.cast(pa.timestamp(t.unit, tz="UTC"))
            return arr.cast(TS, safe=False)
        if pa.types.is_date(t):
            return arr.cast(pa.timestamp("ms")).cast(TS)
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            try:
                return arr.cast(pa.timestamp("ms", tz="UTC"))
            except pa.ArrowInvalid:  # no zone offset: the value is UTC
                return arr.cast(pa.timestamp("ms")).cast(TS)
    except pa.ArrowInvalid as e:
        raise CurError(f"{where}: column {USAGE_START} is unreadable: {e}") from e
    raise CurError(f"{where}: column {USAGE_START} has type {t}, not a timestamp")


def _strings(table: pa.Table, col: str, n: int) -> pa.Array:
    if col not in table.column_names:
        return pa.array([""] * n, pa.string())
    return pc.fill_null(table.column(col).combine_chunks().cast(pa.string()), "")


def _utc(t: datetime) -> datetime:
    if isinstance(t, datetime):
        return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)
    if isinstance(t, date):
        return datetime(t.year, t.month, t.day, tzinfo=timezone.utc)
    raise TypeError(f"expected a datetime, got {t!r}")


def _for(partition: str) -> str:
    return f", partition {partition}" if partition else ""
