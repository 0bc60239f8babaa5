"""The lake: atomic, schema-checked partition writes and DuckDB reads, locally and on S3 (moto)."""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from foxhunt_obs.lib import lake as lake_mod
from foxhunt_obs.lib.lake import Lake, LakeError, SchemaMismatch, WriteResult
from foxhunt_obs.lib.schemas import GPU_SAMPLES, TS, TableSpec

SPEC = TableSpec(
    name="things",
    partition="hour",
    doc="test table",
    schema=pa.schema([("ts", TS), ("name", pa.string()), ("n", pa.int32()), ("v", pa.float64())]),
)
H1, H2, H3 = "2026-11-29T13", "2026-11-29T14", "2026-11-30T00"


def _ts(hour: int) -> datetime:
    return datetime(2026, 11, 29, hour, tzinfo=timezone.utc)


def _table(rows: int, hour: int = 13, v: float = 1.0) -> pa.Table:
    return pa.table(
        {
            "ts": pa.array([_ts(hour)] * rows, TS),
            "name": [f"n{i}" for i in range(rows)],
            "n": pa.array(range(rows), pa.int32()),
            "v": [v * i for i in range(rows)],
        }
    )


def _files(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


@pytest.fixture
def lake(tmp_path) -> Lake:
    return Lake(str(tmp_path / "lake"))


def test_round_trip_and_layout(lake, tmp_path):
    t = _table(5)
    res = lake.write_partition(SPEC, H1, t)
    assert isinstance(res, WriteResult) and res.rows == 5
    assert res.path == str(tmp_path / "lake" / "things" / f"hour={H1}" / "part-0.parquet")
    assert res.bytes == os.path.getsize(res.path)
    assert pq.ParquetFile(res.path).metadata.row_group(0).column(0).compression == "ZSTD"
    back = lake.read_partition(SPEC, H1)
    assert back.schema.equals(SPEC.schema) and back.equals(t)
    assert "hour" not in pq.read_schema(res.path).names  # the partition column lives in the path
    assert lake.read_partition(SPEC, H2) is None


def _footer_round_trip(lake: Lake) -> None:
    small = pa.table({"k": ["a", "b"], "x": [1.5, None]})
    assert lake.read_footer(SPEC, H1, "foxhunt.test.small") == (False, None)
    lake.write_partition(SPEC, H1, _table(5), footer={"foxhunt.test.small": small})
    assert lake.read_footer(SPEC, H1, "foxhunt.test.small") == (True, small)
    assert lake.read_footer(SPEC, H1, "foxhunt.test.other") == (True, None)
    back = lake.read_partition(SPEC, H1)
    assert back.equals(_table(5)) and back.schema.metadata is None  # the rows as without it
    with pytest.raises(ValueError, match="footer keys start with 'foxhunt.'"):
        lake.write_partition(SPEC, H2, _table(1), footer={"other": small})
    assert lake.query("select sum(v) as s from things", tables=[SPEC]).to_pylist() == [{"s": 10.0}]
    lake.write_partition(SPEC, H1, _table(3))  # rewritten without: the old footer goes with the old rows
    assert lake.read_footer(SPEC, H1, "foxhunt.test.small") == (True, None)


def test_a_footer_is_written_and_replaced_with_its_rows(lake, tmp_path):
    _footer_round_trip(lake)
    lake.write_partition(SPEC, H2, _table(2), footer={"foxhunt.test.small": pa.table({"k": ["c"]})})
    path = str(tmp_path / "lake" / "things" / f"hour={H2}" / "part-0.parquet")
    meta = pq.read_metadata(path).metadata
    assert (
        b"foxhunt.test.small" in meta
    )  # in the footer's key-value metadata, as base64 text, not in the Arrow schema
    meta[b"foxhunt.test.small"].decode("ascii")
    assert pq.read_schema(path).metadata is None or b"foxhunt.test.small" not in pq.read_schema(path).metadata


def test_a_footer_on_s3(s3_lake):
    lake, s3 = s3_lake
    s3.create_bucket(Bucket="footers")  # a bucket of its own: test_s3_lake lists "bucket"
    _footer_round_trip(Lake("s3://footers/lake", endpoint_url=lake.endpoint_url))


def test_relative_root_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert Lake("rel/lake").root == str(tmp_path / "rel" / "lake")
    assert Lake("s3://bucket/pre/fix/").root == "s3://bucket/pre/fix"


def test_rewrite_replaces_completely(lake):
    lake.write_partition(SPEC, H1, _table(10, v=1.0))
    lake.write_partition(SPEC, H1, _table(3, v=7.0))
    back = lake.read_partition(SPEC, H1)
    assert back.num_rows == 3 and back.column("v").to_pylist() == [0.0, 7.0, 14.0]
    assert lake.query("select count(*) as c from things", tables=[SPEC]).column("c").to_pylist() == [3]


def test_zero_rows_is_a_fact(lake):
    res = lake.write_partition(SPEC, H1, _table(0))
    assert res.rows == 0 and os.path.exists(res.path)
    back = lake.read_partition(SPEC, H1)
    assert back is not None and back.num_rows == 0 and back.schema.equals(SPEC.schema)
    assert lake.partitions(SPEC) == [H1]


def test_columns_reordered_and_safely_cast(lake):
    t = _table(2)
    t = t.select(["v", "n", "name", "ts"]).set_column(1, "n", pa.array([1, 2], pa.int64()))
    lake.write_partition(SPEC, H1, t)
    back = lake.read_partition(SPEC, H1)
    assert back.schema.equals(SPEC.schema) and back.column("n").to_pylist() == [1, 2]


def test_partition_column_in_input_is_dropped_when_it_matches(lake):
    lake.write_partition(SPEC, H1, _table(2).append_column("hour", pa.array([H1, H1])))
    assert lake.read_partition(SPEC, H1).schema.equals(SPEC.schema)
    with pytest.raises(SchemaMismatch, match="hour"):
        lake.write_partition(SPEC, H2, _table(2).append_column("hour", pa.array([H1, H1])))


@pytest.mark.parametrize(
    "bad, needle",
    [
        (_table(2).drop_columns(["v"]), "missing columns ['v']"),
        (_table(2).append_column("zzz", pa.array([1, 2])), "extra columns ['zzz']"),
        (_table(2).set_column(3, "v", pa.array(["a", "b"])), "column 'v'"),
        (_table(2).set_column(2, "n", pa.array([1, 2**40], pa.int64())), "column 'n'"),
        (_table(2).set_column(3, "v", pa.array([[1.0], [2.0]])), "column 'v'"),
    ],
    ids=["missing", "extra", "unparsable", "overflow", "list"],
)
def test_schema_mismatch_names_table_partition_column_and_writes_nothing(lake, bad, needle):
    with pytest.raises(SchemaMismatch) as e:
        lake.write_partition(SPEC, H1, bad)
    msg = str(e.value)
    assert needle in msg and "things" in msg and f"hour={H1}" in msg and lake.root in msg
    assert lake.read_partition(SPEC, H1) is None and lake.partitions(SPEC) == []
    assert not os.path.exists(os.path.join(lake.root, "things"))


@pytest.mark.parametrize("value", ["", "a/b", "..", "a\\b"])
def test_bad_partition_value(lake, value):
    with pytest.raises(LakeError, match="invalid partition value"):
        lake.write_partition(SPEC, value, _table(1))


@pytest.mark.parametrize("target", ["write_parquet", "replace"])
def test_failed_write_keeps_previous_version(lake, monkeypatch, target):
    first = lake.write_partition(SPEC, H1, _table(4))
    before = open(first.path, "rb").read()

    def boom(*a, **k):
        if target == "write_parquet":  # fail half-way: some bytes are already in the temp file
            a[0].write(b"PAR1 partial garbage")
        raise OSError("disk on fire")

    if target == "write_parquet":
        monkeypatch.setattr(lake_mod.pq, "ParquetWriter", boom)
    else:
        monkeypatch.setattr(lake_mod.os, "replace", boom)
    with pytest.raises(LakeError, match="disk on fire") as e:
        lake.write_partition(SPEC, H1, _table(9))
    assert "things" in str(e.value) and H1 in str(e.value)
    monkeypatch.undo()
    assert open(first.path, "rb").read() == before
    assert lake.read_partition(SPEC, H1).num_rows == 4
    assert _files(lake.root) == [f"things/hour={H1}/part-0.parquet"]


def test_idempotent_write(lake):
    a = lake.write_partition(SPEC, H1, _table(50))
    bytes_a = open(a.path, "rb").read()
    b = lake.write_partition(SPEC, H1, _table(50))
    assert open(b.path, "rb").read() == bytes_a and a == b


def test_partitions_sorted_and_delete(lake):
    for h in (H3, H1, H2):
        lake.write_partition(SPEC, h, _table(1))
    # a stray temp file and an unrelated folder are not partitions
    open(os.path.join(lake.root, "things", f"hour={H1}", "part-0.parquet.tmp-x"), "wb").close()
    os.makedirs(os.path.join(lake.root, "things", "junk"))
    assert lake.partitions(SPEC) == [H1, H2, H3]
    lake.delete_partition(SPEC, H2)
    lake.delete_partition(SPEC, H2)  # no-op when absent
    assert lake.partitions(SPEC) == [H1, H3] and lake.read_partition(SPEC, H2) is None
    assert lake.partitions(GPU_SAMPLES) == []


def test_duckdb_view_across_partitions(lake):
    lake.write_partition(SPEC, H1, _table(2, hour=13))
    lake.write_partition(SPEC, H2, _table(3, hour=14))
    lake.write_partition(SPEC, H3, _table(0))
    # a temp file left by a crashed writer is invisible to the glob
    open(os.path.join(lake.root, "things", f"hour={H1}", "part-0.parquet.tmp-x"), "wb").write(b"junk")
    out = lake.query("select hour, count(*) as c from things group by hour order by hour", tables=[SPEC])
    assert out.to_pylist() == [{"hour": H1, "c": 2}, {"hour": H2, "c": 3}]
    assert out.schema.field("hour").type == pa.string()  # VARCHAR, not auto-cast to a timestamp
    out = lake.query("select max(v) as m from things where hour = ?", [H2], tables=[SPEC])
    assert out.column("m").to_pylist() == [2.0]
    con = lake.connect([SPEC])
    try:
        types = dict(con.execute("select column_name, column_type from (describe things)").fetchall())
    finally:
        con.close()
    assert types["hour"] == "VARCHAR" and types["n"] == "INTEGER" and types["ts"].startswith("TIMESTAMP")


def test_duckdb_session_is_utc(lake, monkeypatch):
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        lake.write_partition(SPEC, "2026-11-29T03", _table(1, hour=3))
        out = lake.query("select ts, date_trunc('day', ts) as d from things", tables=[SPEC])
    finally:
        monkeypatch.undo()
        time.tzset()
    assert out.schema.field("ts").type.tz == "UTC"
    assert out.to_pylist()[0] == {"ts": _ts(3), "d": datetime(2026, 11, 29, tzinfo=timezone.utc)}


def test_empty_views_for_all_tables(lake):
    con = lake.connect()
    try:
        cols = [r[0] for r in con.execute("describe gpu_samples").fetchall()]
        assert cols == GPU_SAMPLES.schema.names + ["hour"]
        assert con.execute("select count(*) from gpu_samples").fetchone() == (0,)
        for name in ("node_samples", "gpu_hourly"):
            assert con.execute(f"select count(*) from {name}").fetchone() == (0,)
    finally:
        con.close()


def test_gpu_samples_round_trip(lake):
    row = {f.name: None for f in GPU_SAMPLES.schema}
    row.update(ts=_ts(13), node="n1", gpu=0, uuid="GPU-1", util=0.5, step_seconds=30.0)
    t = pa.Table.from_pylist([row, {**row, "gpu": 1, "util": 1.0}], schema=GPU_SAMPLES.schema)
    lake.write_partition(GPU_SAMPLES, H1, t)
    assert lake.read_partition(GPU_SAMPLES, H1).equals(t)
    out = lake.query("select hour, gpu, util from gpu_samples order by gpu")
    assert out.to_pylist() == [{"hour": H1, "gpu": 0, "util": 0.5}, {"hour": H1, "gpu": 1, "util": 1.0}]


@pytest.fixture
def s3_lake(moto_s3):
    url, s3 = moto_s3
    s3.create_bucket(Bucket="bucket")
    return Lake("s3://bucket/lake", endpoint_url=url), s3


@pytest.mark.timeout(60)
def test_s3_lake(s3_lake):
    lake, s3 = s3_lake
    assert lake.partitions(SPEC) == [] and lake.read_partition(SPEC, H1) is None
    assert lake.query("select count(*) as c from things", tables=[SPEC]).column("c").to_pylist() == [0]

    res = lake.write_partition(SPEC, H1, _table(10))
    assert res.path == f"s3://bucket/lake/things/hour={H1}/part-0.parquet" and res.rows == 10
    head = s3.head_object(Bucket="bucket", Key=f"lake/things/hour={H1}/part-0.parquet")
    assert head["ContentLength"] == res.bytes
    lake.write_partition(SPEC, H1, _table(3, v=7.0))  # replace
    lake.write_partition(SPEC, H2, _table(2, hour=14))
    lake.write_partition(SPEC, H3, _table(0))
    assert lake.read_partition(SPEC, H1).column("v").to_pylist() == [0.0, 7.0, 14.0]
    assert lake.read_partition(SPEC, H3).num_rows == 0
    assert lake.partitions(SPEC) == [H1, H2, H3]

    with pytest.raises(SchemaMismatch, match="bucket/lake"):
        lake.write_partition(SPEC, H1, _table(2).drop_columns(["n"]))
    assert lake.read_partition(SPEC, H1).num_rows == 3

    out = lake.query(
        "select hour, count(*) as c, sum(v) as s from things group by hour order by hour", tables=[SPEC]
    )
    assert out.to_pylist() == [{"hour": H1, "c": 3, "s": 21.0}, {"hour": H2, "c": 2, "s": 1.0}]
    assert out.schema.field("hour").type == pa.string()

    lake.delete_partition(SPEC, H2)
    assert lake.partitions(SPEC) == [H1, H3]
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="bucket")["Contents"])
    assert [k for k in keys if k.endswith(".parquet")] == [
        f"lake/things/hour={H1}/part-0.parquet",
        f"lake/things/hour={H3}/part-0.parquet",
    ]


DAY_SPEC = TableSpec(
    name="daily_things",
    partition="day",
    doc="a table that also stores its partition key as a column",
    schema=pa.schema([("day", pa.date32()), ("v", pa.float64())]),
)


def _check_partition_column_in_files(lake: Lake) -> None:
    import datetime as dt

    sql = "select day, typeof(day) as t, sum(v) as s from daily_things group by all order by day"
    assert lake.query(sql, tables=[DAY_SPEC]).to_pylist() == []
    for d in (dt.date(2026, 11, 21), dt.date(2026, 11, 22)):
        rows = [{"day": d, "v": 1.5}, {"day": d, "v": float(d.day)}]
        lake.write_partition(DAY_SPEC, d.isoformat(), pa.Table.from_pylist(rows, schema=DAY_SPEC.schema))
    assert lake.query(sql, tables=[DAY_SPEC]).to_pylist() == [
        {"day": "2026-11-21", "t": "VARCHAR", "s": 22.5},
        {"day": "2026-11-22", "t": "VARCHAR", "s": 23.5},
    ]


def test_partition_key_also_a_column_locally(tmp_path):
    _check_partition_column_in_files(Lake(str(tmp_path)))


@pytest.mark.timeout(60)
def test_partition_key_also_a_column_on_s3(s3_lake):
    _check_partition_column_in_files(s3_lake[0])


def test_a_column_added_later_reads_as_null_in_old_partitions(tmp_path):
    old = TableSpec("grown", "hour", pa.schema([("gpu", pa.int32())]), "before")
    new = TableSpec("grown", "hour", pa.schema([("gpu", pa.int32()), ("instance_id", pa.string())]), "after")
    lake = Lake(str(tmp_path))
    lake.write_partition(old, H1, pa.table({"gpu": pa.array([0], pa.int32())}))
    sql = "select hour, gpu, instance_id from grown order by hour"
    assert lake.query(sql, tables=[new]).to_pylist() == [{"hour": H1, "gpu": 0, "instance_id": None}]
    lake.write_partition(new, H2, pa.table({"gpu": pa.array([1], pa.int32()), "instance_id": ["i-1"]}))
    assert lake.query(sql, tables=[new]).to_pylist() == [
        {"hour": H1, "gpu": 0, "instance_id": None},
        {"hour": H2, "gpu": 1, "instance_id": "i-1"},
    ]


# -- plain files: write_files / read_file ------------------------------------------------------------------
REPORT_PREFIX = "reports/week=2026-11-16"
REPORT_FILES = {
    "report.html": b"<!DOCTYPE html><p>hi</p>",
    "daily_spend.png": b"\x89PNG\r\n\x1a\n" + bytes(range(256)),
}


def test_write_files_and_read_back(lake, tmp_path):
    paths = lake.write_files(REPORT_PREFIX, REPORT_FILES)
    folder = tmp_path / "lake" / "reports" / "week=2026-11-16"
    assert paths == [str(folder / "report.html"), str(folder / "daily_spend.png")]
    for name, body in REPORT_FILES.items():
        assert open(folder / name, "rb").read() == body
        assert lake.read_file(f"{REPORT_PREFIX}/{name}") == body
    assert lake.read_file(f"{REPORT_PREFIX}/missing.png") is None
    assert lake.read_file("reports") is None  # a folder is not a file
    # a rewrite replaces the named file and leaves the others
    lake.write_files(REPORT_PREFIX, {"report.html": b"v2"})
    assert lake.read_file(f"{REPORT_PREFIX}/report.html") == b"v2"
    assert lake.read_file(f"{REPORT_PREFIX}/daily_spend.png") == REPORT_FILES["daily_spend.png"]
    assert _files(lake.root) == [f"{REPORT_PREFIX}/daily_spend.png", f"{REPORT_PREFIX}/report.html"]
    # plain files do not disturb the tables' views
    assert lake.query("select count(*) as c from things", tables=[SPEC]).column("c").to_pylist() == [0]


@pytest.mark.parametrize("prefix, name", [("", "a.html"), ("../up", "a.html"), ("/abs", "a.html"),
                                          ("a//b", "a.html"), ("ok", "../a.html"), ("ok", "sub/a.html"),
                                          ("ok", ""), ("a\\b", "a.html")])  # fmt: skip
def test_write_files_refuses_paths_outside_the_prefix(lake, tmp_path, prefix, name):
    with pytest.raises(LakeError, match="invalid"):
        lake.write_files(prefix, {name: b"x"})
    assert not (tmp_path / "lake").exists() and not (tmp_path / "a.html").exists()


@pytest.mark.parametrize("path", ["", "../x", "/etc/passwd", "a/./b"])
def test_read_file_refuses_paths_outside_the_root(lake, path):
    with pytest.raises(LakeError, match="invalid file path"):
        lake.read_file(path)


def test_failed_file_write_keeps_previous_version(lake, monkeypatch):
    lake.write_files(REPORT_PREFIX, {"report.html": b"v1"})

    def boom(*a, **k):
        raise OSError("disk on fire")

    monkeypatch.setattr(lake_mod.os, "replace", boom)
    with pytest.raises(LakeError, match=r"reports/week=2026-11-16/report.html: write failed.*disk on fire"):
        lake.write_files(REPORT_PREFIX, {"report.html": b"v2"})
    monkeypatch.undo()
    assert lake.read_file(f"{REPORT_PREFIX}/report.html") == b"v1"
    assert _files(lake.root) == [f"{REPORT_PREFIX}/report.html"]  # no temp file left behind


@pytest.mark.timeout(60)
def test_write_files_on_s3(s3_lake):
    lake, s3 = s3_lake
    assert lake.read_file(f"{REPORT_PREFIX}/report.html") is None
    paths = lake.write_files(REPORT_PREFIX, REPORT_FILES)
    assert paths == [
        f"s3://bucket/lake/{REPORT_PREFIX}/report.html",
        f"s3://bucket/lake/{REPORT_PREFIX}/daily_spend.png",
    ]
    for name, body in REPORT_FILES.items():
        key = f"lake/{REPORT_PREFIX}/{name}"
        obj = s3.get_object(Bucket="bucket", Key=key)
        assert obj["Body"].read() == body
        assert obj["ContentType"] == {"report.html": "text/html", "daily_spend.png": "image/png"}[name]
        assert lake.read_file(f"{REPORT_PREFIX}/{name}") == body
    lake.write_files(REPORT_PREFIX, {"report.html": b"v2"})
    assert lake.read_file(f"{REPORT_PREFIX}/report.html") == b"v2"
    assert lake.read_file(f"{REPORT_PREFIX}/missing.png") is None
    assert lake.read_file("reports") is None
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="bucket", Prefix="lake/reports/")["Contents"])
    assert keys == [f"lake/{REPORT_PREFIX}/daily_spend.png", f"lake/{REPORT_PREFIX}/report.html"]


def test_shrink_reason_refuses_far_fewer_entities():
    import pyarrow as pa

    from foxhunt_obs.lib.lake import shrink_reason

    def gpus(n: int) -> pa.Table:
        return pa.table(
            {"uuid": [f"GPU-{i}" for i in range(n) for _ in range(4)], "gpu_instance": [None] * (4 * n)}
        )

    keys = ["uuid", "gpu_instance"]
    assert shrink_reason(None, gpus(0), keys) == ""  # a new partition
    assert shrink_reason(gpus(0), gpus(0), keys) == ""
    assert shrink_reason(gpus(8), gpus(8), keys) == ""
    assert shrink_reason(gpus(8), gpus(7), keys) == ""  # a GPU gone: real, and allowed
    assert shrink_reason(gpus(8), gpus(0), keys) == "the source answered 0 rows where the lake has 32"
    assert (
        shrink_reason(gpus(8), gpus(3), keys)
        == "the source answered 3 of the 8 uuid/gpu_instance the lake has"
    )


def test_a_killed_writers_temp_files_go_on_the_next_write_of_the_table(lake):
    """SIGKILL mid-write leaves part-0.parquet.tmp-*; the next write of that table removes the stale ones
    (an hour old) and keeps a fresh one, which may be a concurrent writer's."""
    lake.write_partition(SPEC, H1, _table(1))
    folder = os.path.join(lake.root, "things", f"hour={H1}")
    stale, fresh = (
        os.path.join(folder, "part-0.parquet.tmp-dead"),
        os.path.join(folder, "part-0.parquet.tmp-live"),
    )
    for path in (stale, fresh):
        open(path, "wb").write(b"half a file")
    old = time.time() - lake_mod.STALE_TEMP_S - 60
    os.utime(stale, (old, old))
    lake.write_partition(SPEC, H2, _table(2))  # another partition of the same table
    assert not os.path.exists(stale) and os.path.exists(fresh)


class _S3Proxy:
    """An HTTP proxy in front of moto that records each request (method, path, query) and, while `cut`
    is set, reads half of a PUT's body and drops the connection: a network failure mid-upload."""

    def __init__(self, upstream: str):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        import requests

        proxy = self
        self.requests: list[tuple[str, str]] = []
        self.cut = False

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                proxy.requests.append((self.command, self.path))
                if self.command == "PUT" and proxy.cut:
                    self.rfile.read(length // 2)
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "expect")}
                r = requests.request(
                    self.command, upstream + self.path, data=body, headers=headers, timeout=30
                )
                self.send_response(r.status_code)
                for k, v in r.headers.items():
                    if k.lower() not in (
                        "content-length",
                        "transfer-encoding",
                        "connection",
                        "content-encoding",
                    ):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

            def log_message(self, *args):  # quiet test server
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.timeout(120)
def test_s3_writes_are_one_put_and_a_cut_upload_leaves_nothing(s3_lake, monkeypatch):
    """A partition over pyarrow's multipart threshold (~10 MiB) goes up as one PutObject, so
    an upload cut half-way leaves no multipart upload behind, and the old object stays as it was."""
    _, s3 = s3_lake
    proxy = _S3Proxy(os.environ["AWS_ENDPOINT_URL"])
    try:
        lake = Lake("s3://bucket/lake", endpoint_url=proxy.url)
        rows = 240_000
        big = _table(rows).set_column(1, "name", pa.array([os.urandom(48).hex() for _ in range(rows)]))
        res = lake.write_partition(SPEC, H1, big)
        assert res.bytes > 12 * 1024**2  # incompressible: over the multipart threshold
        assert [m for m, _ in proxy.requests] == ["PUT"] and "uploads" not in proxy.requests[0][1]
        before = s3.get_object(Bucket="bucket", Key=f"lake/things/hour={H1}/part-0.parquet")["ETag"]

        proxy.cut, proxy.requests = True, []
        with pytest.raises(LakeError, match=f"table things, partition hour={H1}: write failed"):
            lake.write_partition(SPEC, H1, big.slice(0, rows - 1))
        assert proxy.requests and {m for m, _ in proxy.requests} == {"PUT"}  # retried, never multipart
        assert s3.list_multipart_uploads(Bucket="bucket").get("Uploads", []) == []
        after = s3.get_object(Bucket="bucket", Key=f"lake/things/hour={H1}/part-0.parquet")
        assert after["ETag"] == before
        assert pq.read_table(pa.BufferReader(after["Body"].read())).num_rows == rows
    finally:
        proxy.close()
