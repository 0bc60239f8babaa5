"""Glue/Athena DDL for the lake on S3 (docs/design.md#the-lake): one ``CREATE EXTERNAL TABLE`` per TableSpec.

Each table is Parquet under ``<root>/<table>/`` with one Hive partition folder per value
(``<partition>=<value>/part-0.parquet``, lake.py), so a statement declares the spec's columns with their
exact Athena types, the partition column as a STRING, and partition projection: Athena computes the
partition folders from table properties instead of listing partitions in the Glue catalog, so there is no
``MSCK REPAIR TABLE`` or crawler to run after a write.

AWS documentation this follows (checked 2026-12-02):

* Projection types and property names (``projection.<col>.type`` enum / date / injected,
  ``.values``, ``.format``, ``.range`` with ``NOW``, ``.interval``, ``.interval.unit``): "Supported types for
  partition projection", https://docs.aws.amazon.com/athena/latest/ug/partition-projection-supported-types.html
  — the date ``format`` is a Java ``DateTimeFormatter`` pattern, so the lake's ``2026-11-29T13`` is
  ``yyyy-MM-dd'T'HH`` (the literal T quoted, as that Java class requires); both ``range`` ends use that
  format; ``interval`` and ``interval.unit`` are required below single-day precision; projected dates are
  generated in UTC, which the lake's keys are.
* ``projection.enabled`` and ``storage.location.template`` with ``${column}`` placeholders: "Set up partition
  projection", https://docs.aws.amazon.com/athena/latest/ug/partition-projection-setting-up.html, and the
  Kinesis Data Firehose example (a STRING partition key projected as a date, double-quoted TBLPROPERTIES):
  https://docs.aws.amazon.com/athena/latest/ug/partition-projection-kinesis-firehose-example.html
* A STRING partition column is pruned in the metastore ("Considerations and limitations for SQL queries",
  https://docs.aws.amazon.com/athena/latest/ug/other-notable-limitations.html), and matches the lake's own
  DuckDB views, which show the partition as a VARCHAR.
* DDL types (``int`` in DDL, ``bigint``, ``double``, ``boolean``, ``date``, ``timestamp``, ``string``,
  ``array<>``, ``map<>``, ``struct<>``): https://docs.aws.amazon.com/athena/latest/ug/data-types.html
* Identifiers in DDL are escaped with backticks (``user``, ``date``, ``timestamp`` ... are DDL reserved
  words): https://docs.aws.amazon.com/athena/latest/ug/reserved-words.html — every name is quoted here.
* ``COMMENT`` on each column, the partition column and the table (``col_name data_type [COMMENT col_comment]``,
  ``[COMMENT table_comment]`` after the column list, before ``PARTITIONED BY``):
  https://docs.aws.amazon.com/athena/latest/ug/create-table.html. Athena's DDL is Hive's, whose string
  literals use C-style escapes ("Hive uses C-style escaping within the strings",
  https://hive.apache.org/docs/latest/literals_27829682): a quote and a backslash are escaped with a
  backslash, not by doubling the quote as in standard SQL. Glue keeps a column's comment up to 255 characters
  on one line (https://docs.aws.amazon.com/glue/latest/webapi/API_Column.html) and a table's
  description up to 2048 (https://docs.aws.amazon.com/glue/latest/webapi/API_TableInput.html).

Plain Python: no Dagster, no environment reads; the CLI (``foxhunt-obs lake ddl``) passes the values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

import pyarrow as pa

from foxhunt_obs.lib.schemas import PARTITIONS, TABLES, TableSpec


class DdlError(ValueError):
    """A table the DDL cannot declare exactly (an unmapped type, a name Athena would not take)."""


@dataclass(frozen=True)
class TimeProjection:
    """A date-typed projection of one of the time partitions (schemas.PARTITIONS, whose strftime pattern
    TableSpec.key writes)."""

    java_format: str  # the same pattern as a Java DateTimeFormatter's
    unit: str  # ChronoUnit name for projection.<col>.interval.unit


TIME_PROJECTIONS = {
    "hour": TimeProjection("yyyy-MM-dd'T'HH", "HOURS"),
    "day": TimeProjection("yyyy-MM-dd", "DAYS"),
}
# Partition columns that are not time: one with a single value (a snapshot table's one folder,
# schemas.SNAPSHOT) is an enum of that value; one whose values no range can generate (training_history's
# MLflow run ids) is `injected`: Athena takes the value from the query's WHERE (run = '...'), and refuses a
# query without one.
ENUM_VALUES = {c: (k.value,) for c, k in PARTITIONS.items() if k.value and not k.strftime}
INJECTED = tuple(c for c, k in PARTITIONS.items() if not k.value)

_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")  # Glue stores names lower case; keep them plain
# The partition column's comment where the spec has no note for it (it is not a column of the files).
PARTITION_NOTES = {
    c: f"the partition: {k.describe()}" + (f" (a query names it: WHERE {c} = '...')" if c in INJECTED else "")
    for c, k in PARTITIONS.items()
}
COLUMN_COMMENT_MAX, TABLE_COMMENT_MAX = 255, 2048  # characters Glue keeps (Column.Comment, Description)
_SIMPLE = {
    pa.bool_(): "boolean",
    pa.int8(): "tinyint",
    pa.int16(): "smallint",
    pa.int32(): "int",  # Athena: INT in DDL, INTEGER in queries
    pa.int64(): "bigint",
    pa.float32(): "float",
    pa.float64(): "double",
    pa.string(): "string",
    pa.large_string(): "string",
    pa.binary(): "binary",
    pa.large_binary(): "binary",
    pa.date32(): "date",
}


def athena_type(t: pa.DataType, where: str = "column") -> str:
    """The Athena DDL type that reads a Parquet column written from pyarrow type ``t`` exactly; raises
    DdlError (naming ``where``) for any type without one (unsigned integers, ns timestamps, ...)."""
    if pa.types.is_dictionary(t):
        # Dictionary encoding is Parquet's page encoding; the column's logical type is the value type.
        return athena_type(t.value_type, where)
    if t in _SIMPLE:
        return _SIMPLE[t]
    if pa.types.is_timestamp(t):
        # Parquet INT64 TIMESTAMP(MILLIS, adjustedToUTC): Athena's timestamp has millisecond precision, and
        # the lake's timestamps are UTC instants (docs/design.md#the-lake). Other units or zones would change values.
        if t.unit == "ms" and t.tz in ("UTC", "+00:00"):
            return "timestamp"
    elif pa.types.is_decimal128(t) and 1 <= t.precision <= 38:
        return f"decimal({t.precision},{t.scale})"
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"array<{athena_type(t.value_type, where)}>"
    elif pa.types.is_map(t):
        return f"map<{athena_type(t.key_type, where)},{athena_type(t.item_type, where)}>"
    elif pa.types.is_struct(t):
        fields = []
        for f in t:
            if not _NAME.match(f.name):
                raise DdlError(f"{where}: struct field {f.name!r} is not a plain lower-case name")
            fields.append(f"{f.name}:{athena_type(f.type, where)}")
        return f"struct<{','.join(fields)}>"
    raise DdlError(f"{where}: pyarrow type {t} has no exact Athena type")


def _ident(name: str, what: str) -> str:
    if not _NAME.match(name):
        raise DdlError(f"{what} {name!r} is not a plain lower-case name Athena and Glue keep as is")
    return f"`{name}`"


def _q(value: str) -> str:
    """A double-quoted DDL string (the form AWS's projection examples use; ours hold single quotes)."""
    if '"' in value or "\\" in value or "\n" in value:
        raise DdlError(f"property value {value!r}: quotes, backslashes and newlines are not supported")
    return f'"{value}"'


def comment(text: str, where: str, limit: int = COLUMN_COMMENT_MAX) -> str:
    """``COMMENT '<text>'``, the text as a Hive string literal (C-style escapes); raises DdlError for text
    Glue would refuse: longer than ``limit`` characters, or with a line break or other control character."""
    if len(text) > limit:
        raise DdlError(f"{where}: comment of {len(text)} characters; Glue keeps at most {limit}")
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in text):
        raise DdlError(f"{where}: comment {text!r} has a line break or control character")
    return "COMMENT '" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def data_columns(spec: TableSpec) -> list[pa.Field]:
    """The columns declared before PARTITIONED BY: the spec's, less the partition column.

    A table may store its partition key in the files too (costs_daily.day and the other day tables: see
    lake._add_view's ``in_files``). Athena refuses a partition column named like a table column ("Partitioned
    columns don't exist within the table data itself, so if you use a column name that has the same name as
    a column in the table itself, you get an error": ALTER TABLE ADD PARTITION,
    https://docs.aws.amazon.com/athena/latest/ug/alter-table-add-partition.html). So it is declared once, as
    the STRING partition column, and Athena reads its value from the folder name; the copy in the file goes
    unread (Parquet columns are matched by name, and an undeclared one is skipped). The folder holds the same
    day (lake writes each day's rows to that day's folder), and the lake's own views show it as a string too.
    """
    return [f for f in spec.schema if f.name != spec.partition]


def table_properties(spec: TableSpec, location: str, start: datetime) -> dict[str, str]:
    """TBLPROPERTIES of a table: partition projection over the lake's folder layout."""
    col, props = spec.partition, {"projection.enabled": "true"}
    if col in TIME_PROJECTIONS:
        p = TIME_PROJECTIONS[col]
        props |= {
            f"projection.{col}.type": "date",
            f"projection.{col}.format": p.java_format,
            f"projection.{col}.range": f"{start.strftime(PARTITIONS[col].strftime)},NOW",
            f"projection.{col}.interval": "1",
            f"projection.{col}.interval.unit": p.unit,
        }
    elif col in ENUM_VALUES:
        props |= {f"projection.{col}.type": "enum", f"projection.{col}.values": ",".join(ENUM_VALUES[col])}
    elif col in INJECTED:
        props |= {f"projection.{col}.type": "injected"}
    else:
        raise DdlError(f"table {spec.name}: no partition projection for partition column {col!r}")
    props["storage.location.template"] = f"{table_location(location, spec)}{col}=${{{col}}}/"
    return props


def table_location(location: str, spec: TableSpec) -> str:
    """``s3://bucket/prefix/<table>/``: the lake root the way lake.Lake normalises it, then the table."""
    if not location.startswith("s3://") or not location[5:].strip("/"):
        raise DdlError(f"location {location!r}: Athena reads S3; want s3://bucket[/prefix]")
    root = "s3://" + location[5:].strip("/")
    if re.search(r"[\s'\"\\`]", root):
        raise DdlError(f"location {location!r}: no quotes, backslashes or white space")
    return f"{root}/{spec.name}/"


def create_table(spec: TableSpec, location: str, database: str, start: datetime) -> str:
    """One ``CREATE EXTERNAL TABLE IF NOT EXISTS`` statement (no trailing semicolon). IF NOT EXISTS leaves
    an existing table as it is: after a spec gains columns, DROP TABLE it first, which for an external table
    removes only the catalog entry (https://docs.aws.amazon.com/athena/latest/ug/drop-table.html)."""
    cols = []
    for f in data_columns(spec):
        where = f"table {spec.name}, column {f.name}"
        note = f" {comment(spec.columns[f.name], where)}" if f.name in spec.columns else ""
        cols.append(f"  {_ident(f.name, where)} {athena_type(f.type, where)}{note}")
    props = table_properties(spec, location, start)
    width = max(len(k) for k in props) + 2
    part = f"table {spec.name}, partition"
    part_note = spec.columns.get(spec.partition) or PARTITION_NOTES.get(spec.partition)
    part_note = f" {comment(part_note, part)}" if part_note else ""
    lines = [
        f"CREATE EXTERNAL TABLE IF NOT EXISTS {_ident(database, 'database')}.{_ident(spec.name, 'table')} (",
        ",\n".join(cols),
        ")",
        *([comment(spec.doc, f"table {spec.name}", TABLE_COMMENT_MAX)] if spec.doc else []),
        f"PARTITIONED BY ({_ident(spec.partition, part)} string{part_note})",
        "STORED AS PARQUET",
        f"LOCATION '{table_location(location, spec)}'",
        "TBLPROPERTIES (",
        ",\n".join(f"  {_q(k).ljust(width)} = {_q(v)}" for k, v in props.items()),
        ")",
    ]
    return "\n".join(lines)


def ddl_statements(
    location: str, database: str, start: datetime, tables: dict[str, TableSpec] | None = None
) -> list[str]:
    """``CREATE DATABASE IF NOT EXISTS`` then one CREATE EXTERNAL TABLE per table (default: every table in
    schemas.TABLES), in TABLES' order. ``start``: the first partition (FOXHUNT_PARTITIONS_START), the
    projections' lower bound; their upper bound is NOW, so new hours and days need no DDL."""
    specs = TABLES if tables is None else tables
    out = [f"CREATE DATABASE IF NOT EXISTS {_ident(database, 'database')}"]
    out += [create_table(spec, location, database, start) for spec in specs.values()]
    return out


def ddl_script(
    location: str, database: str, start: datetime, tables: dict[str, TableSpec] | None = None
) -> str:
    """The statements as one file: each ends with ``;`` and a blank line follows it."""
    return "".join(f"{s};\n\n" for s in ddl_statements(location, database, start, tables)).rstrip("\n") + "\n"


__all__ = ["DdlError", "athena_type", "create_table", "data_columns", "ddl_script", "ddl_statements"]
