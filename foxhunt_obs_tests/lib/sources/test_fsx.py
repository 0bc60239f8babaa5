"""FsxSource against a real moto server (FSx + CloudWatch on 127.0.0.1), and against a tiny HTTP server that
answers what a failing CloudWatch or FSx would (query status errors, Messages, API errors, pages)."""

from __future__ import annotations

import http.server
import io
import json
import threading
from datetime import datetime, timedelta, timezone

import boto3
import pyarrow as pa
import pytest
from botocore.config import Config

from foxhunt_obs.lib.schemas import FSX_METRICS, LABEL
from foxhunt_obs.lib.sources.fsx import (
    MAX_QUERIES,
    FileSystem,
    FsxMetric,
    FsxMetricList,
    FsxSource,
    FsxSourceError,
    load_metric_list,
)
from foxhunt_obs.sandbox.servers.local_server import free_port

# A region of its own: moto's backends are process-global and other modules run moto servers too.
REGION = "ap-southeast-2"
SECRET = "fsx-test-secret-never-printed"
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
MINUTES = 60  # the window read: [T0, T0 + 60 min)
SEEDED = range(-5, MINUTES + 5)  # minutes with data: 5 before and 5 after the window, to be left out
RATES = ("DataReadBytes", "DataWriteBytes", "DataReadOperations", "DataWriteOperations", "MetadataOperations")
FAST = Config(retries={"mode": "standard", "total_max_attempts": 1}, connect_timeout=1, read_timeout=2)


def _rate_value(metric: str, fsi: int, k: int) -> float:
    base = {
        "DataReadBytes": (k + 6) * 1_048_576.0,
        "DataWriteBytes": (k % 7) * 262_144.0,  # zero every 7th minute: zeros are data too
        "DataReadOperations": 3.0 * (k + 6) + 1,
        "DataWriteOperations": float((5 * k) % 11),
        "MetadataOperations": 100.0 + k,
    }[metric]
    return base + fsi * 17


def _ost_free(fsi: int, k: int) -> tuple[float, float]:
    """Free bytes of two OSTs; which one is fuller changes from minute to minute."""
    return 1.0e12 - k * 1.0e9 - fsi * 1.0e8, 0.9e12 + (k % 10) * 2.5e10 + fsi * 1.0e8


def _client(service: str, url: str, **kw):
    return boto3.client(
        service,
        endpoint_url=url,
        region_name=REGION,
        aws_access_key_id="AKIAFSXTEST",
        aws_secret_access_key=SECRET,
        **kw,
    )


@pytest.fixture(scope="module")
def aws():
    """moto with two Lustre file systems (+ one Windows), one datapoint a minute for every metric.

    Yields (url, {name: id}, truth) with truth[(fs_id, metric, statistic)] = {ts_ms: value}.
    """
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        url = f"http://127.0.0.1:{server.get_host_and_port()[1]}"
        fsx = _client("fsx", url)
        # botocore gzips PutMetricData bodies over 10 KiB; moto's server then gunzips them twice (a 500)
        cw = _client("cloudwatch", url, config=Config(disable_request_compression=True))
        subnet = ["subnet-0123456789abcdef0"]  # botocore wants >= 15 characters
        ids = {
            "train": fsx.create_file_system(
                FileSystemType="LUSTRE",
                StorageCapacity=2400,
                SubnetIds=subnet,
                LustreConfiguration={"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 125},
                Tags=[{"Key": "Name", "Value": "train"}, {"Key": "team", "Value": "rl"}],
            )["FileSystem"]["FileSystemId"],
            "scratch": fsx.create_file_system(
                FileSystemType="LUSTRE",
                StorageCapacity=1200,
                SubnetIds=subnet,
                LustreConfiguration={"DeploymentType": "SCRATCH_2"},
                Tags=[{"Key": "Name", "Value": "scratch"}],
            )["FileSystem"]["FileSystemId"],
            "windows": fsx.create_file_system(FileSystemType="WINDOWS", StorageCapacity=32, SubnetIds=subnet)[
                "FileSystem"
            ]["FileSystemId"],
        }
        truth: dict[tuple[str, str, str], dict[int, float]] = {}
        data = []
        for fsi, name in enumerate(("train", "scratch")):
            dims = [{"Name": "FileSystemId", "Value": ids[name]}]
            for k in SEEDED:
                at = T0 + timedelta(minutes=k)
                ms = int(at.timestamp() * 1000)
                inside = 0 <= k < MINUTES
                for metric in RATES:
                    v = _rate_value(metric, fsi, k)
                    data.append({"MetricName": metric, "Dimensions": dims, "Timestamp": at, "Value": v})
                    if inside:
                        truth.setdefault((ids[name], metric, "Sum"), {})[ms] = v
                # one datum per OST, same timestamp, FileSystemId only: CloudWatch's Minimum is then the
                # fullest OST and Sum the whole file system
                free = _ost_free(fsi, k)
                for v in free:
                    data.append(
                        {
                            "MetricName": "FreeDataStorageCapacity",
                            "Dimensions": dims,
                            "Timestamp": at,
                            "Value": v,
                        }
                    )
                if inside:
                    truth.setdefault((ids[name], "FreeDataStorageCapacity", "Minimum"), {})[ms] = min(free)
                    truth.setdefault((ids[name], "FreeDataStorageCapacity", "Sum"), {})[ms] = sum(free)
        for i in range(0, len(data), 1000):  # PutMetricData takes at most 1000 items
            cw.put_metric_data(Namespace="AWS/FSx", MetricData=data[i : i + 1000])
        yield url, ids, truth
    finally:
        server.stop()


@pytest.fixture
def source(aws):
    url = aws[0]
    return FsxSource(_client("fsx", url), _client("cloudwatch", url))


def _rows(table: pa.Table) -> dict[tuple[str, str, str], dict[int, float]]:
    out: dict[tuple[str, str, str], dict[int, float]] = {}
    for r in table.to_pylist():
        ms = int(r["ts"].timestamp() * 1000)
        out.setdefault((r["file_system_id"], r["metric"], r["statistic"]), {})[ms] = r["value"]
    return out


def _ipc(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue()


# -- the metric list ------------------------------------------------------------------------------------
def test_metric_list_is_the_data_file():
    ml = load_metric_list()
    assert (ml.namespace, ml.dimension) == ("AWS/FSx", "FileSystemId")
    assert [(m.name, m.statistic, m.per_second) for m in ml.metrics] == [
        *[(name, "Sum", True) for name in RATES],
        ("FreeDataStorageCapacity", "Minimum", False),
        ("FreeDataStorageCapacity", "Sum", False),
    ]


def test_bad_arguments():
    with pytest.raises(ValueError, match="multiple of 60"):
        FsxSource(None, None, period_s=30)
    with pytest.raises(ValueError, match="max_queries"):
        FsxSource(None, None, max_queries=MAX_QUERIES + 1)
    src = FsxSource(None, None)
    with pytest.raises(ValueError, match="timezone-aware"):
        src.window(datetime(2026, 11, 29, 12), T0)
    with pytest.raises(ValueError, match="ends before"):
        src.window(T0, T0 - timedelta(minutes=5))


# -- file systems -----------------------------------------------------------------------------------------
@pytest.mark.servers
def test_file_systems_all_lustre_sorted(aws, source):
    _, ids, _ = aws
    fss = source.file_systems()
    assert [fs.id for fs in fss] == sorted([ids["train"], ids["scratch"]])  # the Windows one left out
    by_name = {fs.name: fs for fs in fss}
    assert by_name["train"] == FileSystem(
        id=ids["train"],
        name="train",
        deployment_type="PERSISTENT_2",
        storage_capacity_gib=2400,
        per_unit_storage_throughput=125,
        tags={"Name": "train", "team": "rl"},
    )
    assert by_name["scratch"].deployment_type == "SCRATCH_2"
    assert by_name["scratch"].per_unit_storage_throughput is None
    assert source.calls == 1


@pytest.mark.servers
def test_file_systems_filter(aws, source):
    _, ids, _ = aws
    assert [fs.name for fs in source.file_systems([ids["scratch"]])] == ["scratch"]
    assert [fs.name for fs in source.file_systems([])] == sorted(["train", "scratch"], key=lambda n: ids[n])


@pytest.mark.servers
def test_unknown_and_bad_ids(aws, source):
    _, ids, _ = aws
    with pytest.raises(FsxSourceError, match=r"not found: fs-0123456789abcdef0") as e:
        source.file_systems([ids["train"], "fs-0123456789abcdef0"])
    assert ids["train"] not in str(e.value).split("not found:")[1]
    with pytest.raises(FsxSourceError, match=r"not FSx file system ids .*: nope"):
        source.file_systems(["nope"])
    with pytest.raises(FsxSourceError, match=rf"not Lustre file systems: {ids['windows']} \(WINDOWS\)"):
        source.file_systems([ids["windows"], ids["train"]])


# -- metrics ----------------------------------------------------------------------------------------------
@pytest.mark.servers
def test_metrics_match_what_was_put(aws, source):
    _, ids, truth = aws
    fss = source.file_systems()
    table = source.metrics(fss, T0, T0 + timedelta(minutes=MINUTES), partition="2026-11-29-12:00")
    assert table.schema == FSX_METRICS.schema
    for col in ("file_system_id", "file_system_name", "metric", "statistic"):
        assert table.schema.field(col).type == LABEL
    # every (file system, metric, statistic, minute) of the window, nothing else: the 5 minutes put
    # before and after it are left out
    assert _rows(table) == truth
    assert table.num_rows == 2 * 7 * MINUTES
    rows = table.to_pylist()
    keys = [(r["file_system_id"], r["metric"], r["statistic"], r["ts"]) for r in rows]
    assert keys == sorted(keys)
    for r in rows:
        assert r["period_seconds"] == 60
        assert r["file_system_name"] == ("train" if r["file_system_id"] == ids["train"] else "scratch")
        if r["metric"] in RATES:
            assert r["per_second"] == pytest.approx(r["value"] / 60, rel=1e-12)
        else:
            assert r["per_second"] is None
    # the free-space minimum is the fullest OST, the Sum the file system's total
    k, fsi = 42, 0
    ms = int((T0 + timedelta(minutes=k)).timestamp() * 1000)
    got = _rows(table)
    assert got[(ids["train"], "FreeDataStorageCapacity", "Minimum")][ms] == min(_ost_free(fsi, k))
    assert got[(ids["train"], "FreeDataStorageCapacity", "Sum")][ms] == sum(_ost_free(fsi, k))


@pytest.mark.servers
def test_unaligned_window_is_aligned(aws, source):
    _, ids, truth = aws
    fs = source.file_systems([ids["train"]])
    start, end = T0 + timedelta(minutes=10, seconds=30), T0 + timedelta(minutes=20, seconds=10)
    t0, t1 = source.window(start, end)
    assert (t0, t1) == (
        int((T0 + timedelta(minutes=10)).timestamp()),
        int((T0 + timedelta(minutes=21)).timestamp()),
    )
    table = source.metrics(fs, start, end)
    assert table.num_rows == 7 * 11  # minutes 10..20: the partial first and last periods are whole
    want = {
        key: {ms: v for ms, v in pts.items() if t0 * 1000 <= ms < t1 * 1000}
        for key, pts in truth.items()
        if key[0] == ids["train"]
    }
    assert _rows(table) == want


@pytest.mark.servers
def test_batches_of_queries(aws):
    url, ids, _ = aws
    small = FsxSource(_client("fsx", url), _client("cloudwatch", url), max_queries=3)
    whole = FsxSource(_client("fsx", url), _client("cloudwatch", url))
    fss = whole.file_systems()
    start, end = T0, T0 + timedelta(minutes=15)
    before = small.calls
    a = small.metrics(fss, start, end)
    assert small.calls - before == 5  # 2 file systems x 7 queries = 14, at most 3 a call
    before = whole.calls
    b = whole.metrics(fss, start, end)
    assert whole.calls - before == 1
    assert a.num_rows == 2 * 7 * 15
    assert _ipc(a) == _ipc(b)


@pytest.mark.servers
def test_reread_is_identical(aws, source):
    fss = source.file_systems()
    start, end = T0 + timedelta(minutes=3), T0 + timedelta(minutes=33)
    a = source.metrics(fss, start, end, partition="p")
    b = source.metrics(
        list(reversed(fss)) + fss, start, end, partition="p"
    )  # order and duplicates don't matter
    assert a.num_rows == 2 * 7 * 30
    assert _ipc(a) == _ipc(b)


@pytest.mark.servers
def test_empty_inputs(aws, source):
    fss = source.file_systems()
    calls = source.calls
    empty = source.metrics([], T0, T0 + timedelta(hours=1))
    assert empty.num_rows == 0 and empty.schema == FSX_METRICS.schema
    assert source.metrics(fss, T0, T0).num_rows == 0  # an empty window
    assert source.calls == calls
    # a window with no datapoints: an empty table, not an error
    assert source.metrics(fss, T0 + timedelta(days=1), T0 + timedelta(days=1, minutes=5)).num_rows == 0


def test_dead_endpoint_names_what_failed():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    src = FsxSource(_client("fsx", url, config=FAST), _client("cloudwatch", url, config=FAST))
    fs = FileSystem("fs-0123456789abcdef0", "train", "PERSISTENT_2", 1200, 125, {})
    with pytest.raises(FsxSourceError) as e:
        src.metrics([fs], T0, T0 + timedelta(hours=1), partition="2026-11-29-12:00")
    text = str(e.value)
    for part in (
        "fs-0123456789abcdef0 (train)",
        "DataReadBytes Sum",
        "2026-11-29T12:00:00Z..2026-11-29T13:00:00Z period 60s",
        "partition 2026-11-29-12:00",
        "Could not connect",
    ):
        assert part in text
    assert SECRET not in text
    with pytest.raises(FsxSourceError, match=r"describe_file_systems \(all\): Could not connect"):
        src.file_systems()
    assert src.calls == 2


# -- a CloudWatch / FSx that fails ------------------------------------------------------------------------
class _FakeAws:
    """Answers each X-Amz-Target with the next scripted reply: a callable(request) -> (status, body)."""

    def __init__(self):
        self.replies: dict[str, list] = {}
        self.requests: list[dict] = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                target = self.headers.get("X-Amz-Target", "").split(".")[-1]
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                fake.requests.append({"target": target, **body})
                status, reply = fake.replies[target].pop(0)(body)
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header(
                    "Content-Type", self.headers.get("Content-Type", "application/x-amz-json-1.0")
                )
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake():
    f = _FakeAws()
    yield f
    f.close()


FS = FileSystem("fs-0123456789abcdef0", "train", "PERSISTENT_2", 1200, 125, {})
TWO = FsxMetricList(
    "AWS/FSx",
    "FileSystemId",
    (FsxMetric("DataReadBytes", "Sum", True), FsxMetric("FreeDataStorageCapacity", "Minimum", False)),
)


def _fake_source(fake: _FakeAws) -> FsxSource:
    cw = _client("cloudwatch", fake.url, config=FAST)
    if cw.meta.service_model.resolved_protocol != "json":
        pytest.skip("the fake CloudWatch speaks the JSON protocol; this botocore uses another one")
    return FsxSource(_client("fsx", fake.url, config=FAST), cw, metric_list=TWO)


def _results(body, status: dict[str, str] | None = None, points: dict[str, list] | None = None):
    out = []
    for q in body["MetricDataQueries"]:
        pts = (points or {}).get(q["Id"], [])
        out.append(
            {
                "Id": q["Id"],
                "StatusCode": (status or {}).get(q["Id"], "Complete"),
                "Timestamps": [t for t, _ in pts],
                "Values": [v for _, v in pts],
            }
        )
    return out


@pytest.mark.servers
def test_request_shape_and_pages(fake):
    src = _fake_source(fake)
    t = T0.timestamp()
    fake.replies["GetMetricData"] = [
        lambda b: (
            200,
            {"MetricDataResults": _results(b, {"q0": "PartialData"}, {"q0": [(t, 60.0)]}), "NextToken": "n1"},
        ),
        # the second page: the rest of q0, and a period at the end that is not in [start, end)
        lambda b: (200, {"MetricDataResults": _results(b, points={"q0": [(t + 60, 120.0), (t + 120, 1.0)]})}),
    ]
    table = src.metrics([FS], T0 + timedelta(seconds=5), T0 + timedelta(seconds=100), partition="p")
    assert [(r["metric"], r["value"], r["per_second"]) for r in table.to_pylist()] == [
        ("DataReadBytes", 60.0, 1.0),
        ("DataReadBytes", 120.0, 2.0),
    ]
    assert src.calls == 2
    first, second = fake.requests
    assert "NextToken" not in first and second["NextToken"] == "n1"
    assert (first["StartTime"], first["EndTime"]) == (t, t + 120)  # floored and ceiled to the minute
    assert first["ScanBy"] == "TimestampAscending"
    assert first["MetricDataQueries"] == [
        {
            "Id": "q0",
            "MetricStat": {
                "Metric": {
                    "Namespace": "AWS/FSx",
                    "MetricName": "DataReadBytes",
                    "Dimensions": [{"Name": "FileSystemId", "Value": FS.id}],
                },
                "Period": 60,
                "Stat": "Sum",
            },
            "ReturnData": True,
        },
        {
            "Id": "q1",
            "MetricStat": {
                "Metric": {
                    "Namespace": "AWS/FSx",
                    "MetricName": "FreeDataStorageCapacity",
                    "Dimensions": [{"Name": "FileSystemId", "Value": FS.id}],
                },
                "Period": 60,
                "Stat": "Minimum",
            },
            "ReturnData": True,
        },
    ]


@pytest.mark.servers
@pytest.mark.parametrize("status", ["InternalError", "Forbidden"])
def test_query_status_error(fake, status):
    src = _fake_source(fake)
    fake.replies["GetMetricData"] = [lambda b: (200, {"MetricDataResults": _results(b, {"q1": status})})]
    with pytest.raises(FsxSourceError) as e:
        src.metrics([FS], T0, T0 + timedelta(hours=1), partition="2026-11-29-12:00")
    text = str(e.value)
    assert f"FreeDataStorageCapacity Minimum of {FS.id} (train)" in text
    assert "2026-11-29T12:00:00Z..2026-11-29T13:00:00Z period 60s (partition 2026-11-29-12:00)" in text
    assert f"status {status}" in text


@pytest.mark.servers
def test_response_messages_are_errors(fake):
    src = _fake_source(fake)
    msg = {"Code": "MaxMetricsExceeded", "Value": "Maximum number of allowed metrics exceeded"}
    fake.replies["GetMetricData"] = [lambda b: (200, {"MetricDataResults": _results(b), "Messages": [msg]})]
    with pytest.raises(
        FsxSourceError, match=r"of fs-0123456789abcdef0 \(train\) .*: MaxMetricsExceeded: Maximum"
    ):
        src.metrics([FS], T0, T0 + timedelta(hours=1))


@pytest.mark.servers
def test_aws_error_text_is_kept(fake):
    src = _fake_source(fake)
    err = {"__type": "InvalidParameterCombination", "message": "Period must be 60 for this window"}
    fake.replies["GetMetricData"] = [lambda b: (400, err)]
    with pytest.raises(FsxSourceError) as e:
        src.metrics([FS], T0, T0 + timedelta(hours=1), partition="p1")
    text = str(e.value)
    assert "InvalidParameterCombination: Period must be 60 for this window (HTTP 400)" in text
    assert f"DataReadBytes Sum, FreeDataStorageCapacity Minimum of {FS.id} (train)" in text
    assert "(partition p1)" in text and SECRET not in text


@pytest.mark.servers
def test_fsx_file_system_not_found(fake):
    src = _fake_source(fake)
    err = {"__type": "FileSystemNotFound", "Message": "File system 'fs-0123456789abcdef0' does not exist."}
    fake.replies["DescribeFileSystems"] = [lambda b: (400, err)]
    with pytest.raises(
        FsxSourceError, match=r"file systems not found: fs-0123456789abcdef0 \(FileSystemNotFound"
    ):
        src.file_systems(["fs-0123456789abcdef0"])
    assert fake.requests[0]["FileSystemIds"] == ["fs-0123456789abcdef0"]
