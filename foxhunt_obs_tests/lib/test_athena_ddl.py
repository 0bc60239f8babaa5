"""`foxhunt-obs lake ddl` (lib/athena.py): every statement parses as Athena DDL, declares each TableSpec's
columns with their exact types and a partition projection that generates the lake's own folders; and a lake
the Lake class wrote to a moto S3 server reads back, through exactly the LOCATION and Hive layout the DDL
declares, as the rows that were written (DuckDB over a pyarrow dataset on the S3 filesystem: DuckDB's httpfs
extension cannot be installed offline)."""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from foxhunt_obs.lib import athena
from foxhunt_obs.lib.athena import DdlError, create_table, ddl_script, ddl_statements
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.schemas import COSTS_DAILY, GPU_SAMPLES, LABEL, STR, TABLES, TS, TableSpec
from foxhunt_obs.lib.tables.training import SNAPSHOT

sqlglot = pytest.importorskip("sqlglot")
from sqlglot import exp  # noqa: E402

START = datetime(2026, 11, 1, tzinfo=timezone.utc)
LOCATION = "s3://lake-bucket/prod/lake"
T = exp.DataType.Type
# What each pyarrow type of the specs must be declared as, written out independently of athena.py.
EXPECTED = {TS: T.TIMESTAMP, LABEL: T.TEXT, pa.string(): T.TEXT, pa.int32(): T.INT, pa.int64(): T.BIGINT}
EXPECTED |= {pa.float64(): T.DOUBLE, pa.bool_(): T.BOOLEAN, pa.date32(): T.DATE}
# The Athena types back as Arrow, for reading the files as Athena would (the declared columns only).
ARROW_OF = {"timestamp": TS, "string": pa.string(), "int": pa.int32(), "bigint": pa.int64()}
ARROW_OF |= {"double": pa.float64(), "boolean": pa.bool_(), "date": pa.date32()}


def _parse(statement: str) -> exp.Expression:
    tree = sqlglot.parse_one(statement, dialect="athena")
    # Round trip: what sqlglot read is what was written (no token silently dropped).
    again = sqlglot.parse_one(tree.sql(dialect="athena"), dialect="athena")
    assert again == tree
    return tree


def _table(statement: str) -> dict:
    """The parts of a CREATE EXTERNAL TABLE that Athena acts on."""
    tree = _parse(statement)
    assert isinstance(tree, exp.Create) and tree.kind == "TABLE"
    props = tree.args["properties"].expressions
    assert any(isinstance(p, exp.ExternalProperty) for p in props)
    assert tree.args.get("exists") is True  # IF NOT EXISTS
    schema = tree.this
    columns = [(c.name, c.args["kind"]) for c in schema.expressions]
    (partitioned,) = [p for p in props if isinstance(p, exp.PartitionedByProperty)]
    parts = [(c.name, c.args["kind"]) for c in partitioned.this.expressions]
    (location,) = [p.this.name for p in props if isinstance(p, exp.LocationProperty)]
    (stored,) = [p.this.name for p in props if isinstance(p, exp.FileFormatProperty)]
    tblprops = {p.name: p.args["value"].name for p in props if type(p) is exp.Property}
    comments = [p.this.name for p in props if isinstance(p, exp.SchemaCommentProperty)]
    return {
        "database": schema.this.db,
        "name": schema.this.name,
        "columns": columns,
        "comments": {c.name: _comment(c) for c in schema.expressions},
        "comment": comments[0] if comments else None,
        "partitions": parts,
        "partition_comments": {c.name: _comment(c) for c in partitioned.this.expressions},
        "location": location,
        "stored": stored.upper(),
        "props": tblprops,
    }


def _comment(column: exp.ColumnDef) -> str | None:
    """A column's COMMENT, as the string sqlglot read (escapes undone)."""
    found = [c.kind.this.name for c in column.constraints if isinstance(c.kind, exp.CommentColumnConstraint)]
    assert len(found) <= 1
    return found[0] if found else None


def _java_to_strftime(pattern: str) -> str:
    """The few DateTimeFormatter letters the lake's keys need, and '...' literals (an independent reading
    of the projection format: any other letter fails the test)."""
    out, i = "", 0
    letters = {"yyyy": "%Y", "MM": "%m", "dd": "%d", "HH": "%H"}
    while i < len(pattern):
        if pattern[i] == "'":
            j = pattern.index("'", i + 1)
            out += pattern[i + 1 : j]
            i = j + 1
            continue
        for k, v in letters.items():
            if pattern.startswith(k, i):
                out, i = out + v, i + len(k)
                break
        else:
            assert not pattern[i].isalpha(), f"unexpected pattern letter in {pattern!r}"
            out, i = out + pattern[i], i + 1
    return out


@pytest.fixture(scope="module")
def statements() -> list[str]:
    return ddl_statements(LOCATION, "foxhunt", START)


def test_every_table_parses_with_its_columns_types_and_partition(statements):
    db = _parse(statements[0])
    assert isinstance(db, exp.Create) and db.kind in ("DATABASE", "SCHEMA") and db.this.name == "foxhunt"
    tables = [_table(s) for s in statements[1:]]
    assert [t["name"] for t in tables] == list(TABLES)
    for t in tables:
        spec = TABLES[t["name"]]
        assert t["database"] == "foxhunt" and t["stored"] == "PARQUET"
        assert t["location"] == f"{LOCATION}/{spec.name}/"
        # every spec column, in order, with its type; the partition column once, as the STRING partition
        want = [(f.name, EXPECTED[f.type]) for f in spec.schema if f.name != spec.partition]
        assert [(n, k.this) for n, k in t["columns"]] == want, spec.name
        assert [(n, k.this) for n, k in t["partitions"]] == [(spec.partition, T.TEXT)]
        assert spec.partition not in {n for n, _ in t["columns"]}
        # each column's note and the table's text from lib/schemas.py, read back exactly
        assert t["comments"] == {n: spec.columns[n] for n in spec.schema.names if n != spec.partition}
        assert t["comment"] == spec.doc
        assert t["partition_comments"][spec.partition], spec.name
        if spec.partition in spec.columns:  # a day table's `day`: the file's column note
            assert t["partition_comments"][spec.partition] == spec.columns[spec.partition]
    # the tables that store their partition key in the files too (lake._add_view's in_files)
    in_files = [t["name"] for t in tables if TABLES[t["name"]].partition in TABLES[t["name"]].schema.names]
    assert "costs_daily" in in_files


def test_partition_projection_generates_the_lakes_folders(statements):
    t0 = datetime(2026, 11, 29, 13, tzinfo=timezone.utc)
    kinds = set()
    for t in (_table(s) for s in statements[1:]):
        spec, props, col = TABLES[t["name"]], t["props"], t["partitions"][0][0]
        kinds.add(props[f"projection.{col}.type"])
        assert props["projection.enabled"] == "true"
        # Athena needs a projection for every partition column, and a ${col} in the template for each.
        assert {
            k.split(".")[1] for k in props if k.startswith("projection.") and k != "projection.enabled"
        } == {col}
        assert props["storage.location.template"] == f"{t['location']}{col}=${{{col}}}/"
        kind = props[f"projection.{col}.type"]
        if col in ("hour", "day"):
            assert kind == "date"
            fmt = _java_to_strftime(props[f"projection.{col}.format"])
            for t1 in (t0, t0 + timedelta(days=40, hours=7)):
                assert t1.strftime(fmt) == spec.key(t1)  # the lake's own partition value
            low, high = props[f"projection.{col}.range"].split(",")
            assert (low, high) == (spec.key(START), "NOW")
            assert props[f"projection.{col}.interval"] == "1"
            assert props[f"projection.{col}.interval.unit"] == {"hour": "HOURS", "day": "DAYS"}[col]
            assert len(props) == 7
        elif col == "snapshot":
            assert (kind, props["projection.snapshot.values"]) == ("enum", SNAPSHOT) and len(props) == 4
        else:
            assert (col, kind) == ("run", "injected") and len(props) == 3
    assert kinds == {"date", "enum", "injected"}
    assert _table(statements[1])["props"]["projection.hour.format"] == "yyyy-MM-dd'T'HH"


def test_script_and_location_forms(tmp_path):
    script = ddl_script(LOCATION + "/", "foxhunt", START)
    assert script == ddl_script(
        "s3://lake-bucket/prod/lake", "foxhunt", START
    )  # root normalised as Lake does
    parts = [p for p in script.split(";\n\n") if p.strip()]
    assert len(parts) == 1 + len(TABLES) and script.endswith(");\n")
    assert [_parse(p.rstrip(";\n")).sql() for p in parts] == [
        _parse(s).sql() for s in ddl_statements(LOCATION, "foxhunt", START)
    ]
    bucket_only = _table(ddl_statements("s3://bucket", "db", START)[1])
    assert bucket_only["location"] == "s3://bucket/gpu_samples/" and bucket_only["database"] == "db"
    for bad in ("/tmp/lake", "s3://", "s3://b/it's", "gs://b/p"):
        with pytest.raises(DdlError, match="location"):
            ddl_statements(bad, "foxhunt", START)
    with pytest.raises(DdlError, match="database"):
        ddl_statements(LOCATION, "my-db", START)


def test_comments_escape_quotes_and_backslashes_and_glue_limits_are_kept():
    # text that naive quoting would break: quotes, a backslash, '' and ;
    doc = "It's a table; 'quoted', C:\\lake\\ and \"double\" — Σ ± ×"
    note = "'' = none; a \\ b; it's -- not a comment"
    spec = TableSpec.define("odd", "day", doc, [("day", pa.date32(), "the day"), ("x", pa.string(), note)])
    statement = create_table(spec, LOCATION, "foxhunt", START)
    t = _table(statement)
    assert (t["comment"], t["comments"], t["partition_comments"]) == (doc, {"x": note}, {"day": "the day"})
    assert "\\'" in statement and "''" not in statement.replace("\\'\\'", "")  # escaped, never doubled
    # the partition's own note where the files have no such column
    hourly = TableSpec.define("h", "hour", "hourly", [("ts", TS, "time")])
    assert _table(create_table(hourly, LOCATION, "foxhunt", START))["partition_comments"] == {
        "hour": athena.PARTITION_NOTES["hour"]
    }
    for bad_note, match in (("two\nlines", "line break"), ("x" * 256, "256 characters")):
        bad = TableSpec.define("odd", "day", "ok", [("day", pa.date32(), "d"), ("x", pa.string(), bad_note)])
        with pytest.raises(DdlError, match=f"table odd, column x: comment .*{match}"):
            create_table(bad, LOCATION, "foxhunt", START)
    with pytest.raises(DdlError, match="table odd: comment of 2049 characters"):
        create_table(TableSpec.define("odd", "day", "d" * 2049, [("x", STR, "x")]), LOCATION, "f", START)
    # the lake's own notes and texts fit Glue's limits
    assert max(len(n) for s in TABLES.values() for n in s.columns.values()) <= athena.COLUMN_COMMENT_MAX
    assert max(len(s.doc) for s in TABLES.values()) <= athena.TABLE_COMMENT_MAX


def _spec(*fields) -> TableSpec:
    return TableSpec(name="odd", partition="day", schema=pa.schema(fields), doc="test")


@pytest.mark.parametrize(
    "bad",
    [
        pa.uint32(),
        pa.timestamp("ns", tz="UTC"),
        pa.timestamp("ms"),  # naive: not the lake's UTC instants
        pa.timestamp("ms", tz="Europe/Paris"),
        pa.float16(),
        pa.null(),
        pa.list_(pa.uint8()),
        pa.map_(pa.string(), pa.time64("us")),
    ],
)
def test_an_unmappable_type_is_refused_naming_table_and_column(bad):
    with pytest.raises(DdlError, match=r"table odd, column weird: pyarrow type .* has no exact Athena type"):
        create_table(_spec(("ok", pa.int64()), ("weird", bad)), LOCATION, "foxhunt", START)


def test_nested_types_and_other_refusals():
    spec = _spec(
        ("tags", pa.list_(pa.string())),
        ("labels", pa.map_(pa.string(), pa.int64())),
        ("where", pa.struct([("node", pa.string()), ("gpu", pa.int32()), ("seen", TS)])),
        ("amount", pa.decimal128(18, 6)),
        ("small", pa.int16()),
    )
    t = _table(create_table(spec, LOCATION, "foxhunt", START))
    got = {n: k.sql(dialect="hive").lower().replace(" ", "") for n, k in t["columns"]}
    assert got == {
        "tags": "array<string>",
        "labels": "map<string,bigint>",
        "where": "struct<node:string,gpu:int,seen:timestamp>",
        "amount": "decimal(18,6)",
        "small": "smallint",
    }
    with pytest.raises(DdlError, match="Bad"):
        create_table(_spec(("Bad", pa.int64())), LOCATION, "foxhunt", START)
    with pytest.raises(DdlError, match="no partition projection for partition column 'week'"):
        create_table(TableSpec("w", "week", pa.schema([("x", pa.int64())]), "w"), LOCATION, "foxhunt", START)


def test_cli_writes_the_ddl(tmp_path, monkeypatch, capsys):
    from foxhunt_obs.cli import main

    out = tmp_path / "athena" / "lake.sql"
    assert main(["lake", "ddl", "--location", LOCATION, "--database", "obs", "--out", str(out)]) == 0
    monkeypatch.delenv("FOXHUNT_PARTITIONS_START", raising=False)
    assert out.read_text() == ddl_script(LOCATION, "obs", START)  # the setting's default: 2026-11-01
    monkeypatch.setenv("FOXHUNT_PARTITIONS_START", "2026-11-20")
    monkeypatch.setenv("FOXHUNT_LAKE", "s3://from-env/lake/")
    capsys.readouterr()
    assert main(["lake", "ddl"]) == 0
    printed = capsys.readouterr().out
    assert printed == ddl_script("s3://from-env/lake", "foxhunt", datetime(2026, 11, 20, tzinfo=timezone.utc))
    assert '"projection.hour.range"         = "2026-11-20T00,NOW"' in printed
    monkeypatch.setenv("FOXHUNT_LAKE", str(tmp_path / "lake"))
    assert main(["lake", "ddl"]) == 2
    assert "pass --location s3://" in capsys.readouterr().err


# ---- the DDL's layout read back from a lake on moto S3 ----


def _rows(spec: TableSpec, n: int, seed: int) -> pa.Table:
    """n rows with a value of its type in every column (a null in some)."""
    base = datetime(2026, 11, 29, 13, tzinfo=timezone.utc)
    cols = {}
    for j, f in enumerate(spec.schema):
        t = f.type.value_type if pa.types.is_dictionary(f.type) else f.type
        vals = []
        for i in range(n):
            k = seed * 100 + i * 7 + j
            if i == 1 and j % 3 == 0 and f.name not in (spec.partition, "ts"):
                vals.append(None)
            elif pa.types.is_timestamp(t):
                vals.append(base + timedelta(seconds=15 * i, milliseconds=k))
            elif pa.types.is_date32(t):
                vals.append(None)  # set below: the partition day
            elif pa.types.is_string(t):
                vals.append(f"{f.name}-{k % 5}")
            elif pa.types.is_boolean(t):
                vals.append(k % 2 == 0)
            elif pa.types.is_integer(t):
                vals.append(k)
            else:
                vals.append(k / 4)  # exact in binary: sums and round(x, 2) agree everywhere
        cols[f.name] = pa.array(vals, t).cast(f.type)
    return pa.table(cols, schema=spec.schema)


@pytest.fixture
def moto_lake(moto_s3):
    url, s3 = moto_s3
    s3.create_bucket(Bucket="lake-bucket")
    return Lake(LOCATION, region="us-east-1", endpoint_url=url)


def _read_like_athena(lake: Lake, statement: str):
    """The table a CREATE EXTERNAL TABLE declares, read with DuckDB: the declared columns of every Parquet
    object under LOCATION, in Athena's types, plus the partition column from the folder the template names
    (not from the file: a copy of it in the file is not a declared column)."""
    import duckdb

    t = _table(statement)
    col = t["partitions"][0][0]
    prefix = f"{col}="
    assert t["props"]["storage.location.template"] == f"{t['location']}{prefix}${{{col}}}/"
    data = pa.schema([(n, ARROW_OF[k.sql(dialect="hive").lower()]) for n, k in t["columns"]])
    folder = pa.schema([("_folder", pa.string())])
    # One folder level under LOCATION, read whole (DirectoryPartitioning): the template's `<col>=` checked in
    # SQL below, so a folder the template would not generate fails the test instead of being skipped.
    dataset = ds.dataset(
        t["location"][len("s3://") :].rstrip("/"),
        filesystem=lake.fs,
        format="parquet",
        schema=pa.unify_schemas([data, folder]),
        partitioning=ds.DirectoryPartitioning(folder),
    )
    con = duckdb.connect(":memory:")
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.register("files", dataset)
        bad = con.execute(
            f"select count(*) from files where not starts_with(_folder, '{prefix}')"
        ).fetchone()[0]
        assert bad == 0
        names = ", ".join(f'"{n}"' for n, _ in t["columns"])
        sql = f'select {names}, substr(_folder, {len(prefix) + 1}) as "{col}" from files order by all'
        return con.execute(sql).to_arrow_table()
    finally:
        con.close()


def _expected(spec: TableSpec, written: dict[str, pa.Table]) -> list[dict]:
    rows = []
    for value, table in written.items():
        for r in table.to_pylist():  # dictionary columns come back as their strings
            r.pop(spec.partition, None)  # Athena's comes from the folder
            rows.append({**r, spec.partition: value})
    key = [f.name for f in spec.schema if f.name != spec.partition] + [spec.partition]
    return sorted(rows, key=lambda r: tuple((r[k] is None, r[k] if r[k] is not None else 0) for k in key))


@pytest.mark.timeout(120)
def test_a_moto_s3_lake_reads_back_through_the_ddl_layout(moto_lake):
    lake = moto_lake
    hours = {
        GPU_SAMPLES.key(datetime(2026, 11, 29, h, tzinfo=timezone.utc)): _rows(GPU_SAMPLES, 4, h)
        for h in (13, 14)
    }
    days = {}
    for d in (date(2026, 11, 21), date(2026, 11, 22)):
        t = _rows(COSTS_DAILY, 3, d.day)
        days[COSTS_DAILY.key(d)] = t.set_column(0, "day", pa.array([d] * t.num_rows, pa.date32()))
    for spec, written in ((GPU_SAMPLES, hours), (COSTS_DAILY, days)):
        for value, table in written.items():
            res = lake.write_partition(spec, value, table)
            assert res.path == f"{LOCATION}/{spec.name}/{spec.partition}={value}/part-0.parquet"
    # the lake's own files: the partition column only where the spec has it (costs_daily.day)
    with lake.fs.open_input_file(_object_path(COSTS_DAILY, "2026-11-21")) as f:
        assert pq.read_schema(f).field("day").type == pa.date32()

    statements = {s.split("`.`")[1].split("`")[0]: s for s in ddl_statements(LOCATION, "foxhunt", START)[1:]}
    for spec, written in ((GPU_SAMPLES, hours), (COSTS_DAILY, days)):
        got = _read_like_athena(lake, statements[spec.name])
        assert got.num_rows == sum(t.num_rows for t in written.values()) > 0
        assert got.to_pylist() == _expected(spec, written), spec.name
        # and the Parquet types in the objects are the ones the DDL declares, column by column
        declared = dict(
            (n, k.sql(dialect="hive").lower()) for n, k in _table(statements[spec.name])["columns"]
        )
        with lake.fs.open_input_file(_object_path(spec, next(iter(written)))) as f:
            parquet = pq.ParquetFile(f).schema
        for i in range(len(parquet)):
            c = parquet.column(i)
            if c.name in declared:
                assert _athena_of_parquet(c) == declared[c.name], (spec.name, c.name)

    # docs/operating/lake.md's example query, over the table read that way (DuckDB runs this plain SQL as
    # Athena would)
    import duckdb

    page = (Path(__file__).resolve().parents[2] / "docs" / "operating" / "lake.md").read_text()
    section = page.split("## Querying from Athena", 1)[1].split("\n## ", 1)[0]
    (query,) = re.findall(r"```sql\n(.*?)```", section, re.S)
    _parse(query)
    con = duckdb.connect(":memory:")
    try:
        con.execute("CREATE SCHEMA foxhunt")
        con.register("_costs_daily", _read_like_athena(lake, statements["costs_daily"]))
        con.execute("CREATE VIEW foxhunt.costs_daily AS SELECT * FROM _costs_daily")
        got = con.execute(query).fetchall()
    finally:
        con.close()
    want: dict[tuple, float] = {}
    for value, table in days.items():
        for r in table.to_pylist():
            want[(value, r["source"])] = want.get((value, r["source"]), 0.0) + (r["cost_usd"] or 0.0)
    assert [(d, s, c) for d, s, c in got] == [(d, s, round(c, 2)) for (d, s), c in sorted(want.items())]


def _object_path(spec: TableSpec, value: str) -> str:
    return f"{LOCATION[5:]}/{spec.name}/{spec.partition}={value}/part-0.parquet"


def _athena_of_parquet(c) -> str:
    """The Athena type a Parquet column's physical and logical type reads as (Parquet's own terms)."""
    logical = str(c.logical_type)
    if c.physical_type == "INT64" and logical.startswith("Timestamp("):
        assert "isAdjustedToUTC=true" in logical and "timeUnit=milliseconds" in logical
        return "timestamp"
    if c.physical_type == "INT32" and logical == "Date":
        return "date"
    if c.physical_type == "BYTE_ARRAY" and logical == "String":
        return "string"
    plain = {"BOOLEAN": "boolean", "DOUBLE": "double", "INT32": "int", "INT64": "bigint"}
    assert logical in ("None", "Int(bitWidth=32, isSigned=true)", "Int(bitWidth=64, isSigned=true)")
    return plain[c.physical_type]


def test_module_reads_no_environment_and_imports_no_dagster():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(athena))
    names = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "os" not in names and not any("dagster" in (m or "") for m in mods | names)
    assert "os.environ" not in inspect.getsource(athena) and "getenv" not in inspect.getsource(athena)
