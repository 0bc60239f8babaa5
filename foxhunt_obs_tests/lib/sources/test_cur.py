"""CurSource against CUR 2.0-shaped Parquet files and Data Exports manifests in a real moto S3."""

from __future__ import annotations

import io
import json
import time
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from foxhunt_obs.lib.schemas import COSTS_HOURLY
from foxhunt_obs.lib.sources.cur import OPTIONAL, REQUIRED, CurError, CurSource, billing_periods
from foxhunt_obs_tests.lib.sources.aws_fixtures import MotoServer
from foxhunt_obs_tests.paths import REAL

BUCKET, PREFIX, NAME = "foxhunt-cur", "cur", "foxhunt-export"
ROOT = f"s3://{BUCKET}/{PREFIX}/{NAME}"
UTC = timezone.utc
REAL = REAL / "cur"


def h(day: int, hour: int, month: int = 11) -> datetime:
    return datetime(2026, month, day, hour, tzinfo=UTC)


def line(hour: datetime, cost: float = 1.0, **kw) -> dict:
    out = {
        "bill_billing_period_start_date": hour.replace(day=1, hour=0),
        "line_item_usage_account_id": "111122223333",
        "line_item_line_item_type": "Usage",
        "line_item_usage_start_date": hour,
        "line_item_product_code": "AmazonEC2",
        "line_item_usage_type": "USE1-BoxUsage:p5.48xlarge",
        "line_item_operation": "RunInstances",
        "line_item_resource_id": "i-0abc",
        "line_item_usage_amount": 1.0,
        "line_item_unblended_cost": cost,
        "reservation_effective_cost": 0.0,
        "savings_plan_savings_plan_effective_cost": 0.0,
        "product_instance_type": "p5.48xlarge",
        "resource_tags": {
            "user_project": "foxhunt-rl",
            "user_environment": "prod",
            "user_experiment": "ppo-a",
        },
    }
    out.update(kw)
    return out


MONEY = (
    "line_item_usage_amount",
    "line_item_unblended_cost",
    "reservation_effective_cost",
    "savings_plan_savings_plan_effective_cost",
    "savings_plan_total_commitment_to_date",
    "savings_plan_used_commitment",
)


DOUBLE = pa.float64()


def parquet(
    lines: list[dict], money: pa.DataType = DOUBLE, naive_ts: bool = True, drop=(), json_tags: bool = False
) -> bytes:
    """One CUR 2.0 data file: timestamps as Athena-style naive UTC, resource_tags as map<string,string>."""
    ts = pa.timestamp("ms") if naive_ts else pa.timestamp("ms", tz="UTC")
    names = [k for k in lines[0] if k not in drop]
    cols = {}
    for k in names:
        vals = [ln.get(k) for ln in lines]
        if k == "resource_tags" and json_tags:  # a CSV-style export: the map as a JSON object
            cols[k] = pa.array([None if v is None else json.dumps(v) for v in vals], pa.string())
        elif k == "resource_tags":
            cols[k] = pa.array(
                [None if v is None else list(v.items()) for v in vals], pa.map_(pa.string(), pa.string())
            )
        elif k in ("bill_billing_period_start_date", "line_item_usage_start_date"):
            cols[k] = pa.array([v if naive_ts is False else v.replace(tzinfo=None) for v in vals], ts)
        elif k in MONEY:
            if pa.types.is_string(money):
                cols[k] = pa.array(
                    [v if isinstance(v, str) or v is None else repr(v) for v in vals], pa.string()
                )
            else:
                cols[k] = pa.array(vals, pa.float64()).cast(money)
        else:
            cols[k] = pa.array(vals, pa.string())
    buf = io.BytesIO()
    pq.write_table(pa.table(cols), buf, compression="snappy")
    return buf.getvalue()


def put_file(s3, period: str, name: str, body: bytes, execution: str | None = None) -> str:
    key = f"{PREFIX}/{NAME}/data/BILLING_PERIOD={period}/" + (f"{execution}/" if execution else "") + name
    s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    return f"s3://{BUCKET}/{key}"


def put_manifest(s3, period: str, files: list[str], execution: str | None, folder: bool = True) -> str:
    """A Data Exports manifest: under <executionId>/ ("create new") or in place ("overwrite")."""
    doc = {
        "exportArn": f"arn:aws:bcm-data-exports:us-east-1:111122223333:export/{NAME}-1a2b",
        "columns": [{"name": "line_item_unblended_cost", "type": "double"}],
        "dataFiles": files,
        "billingPeriod": {"start": f"{period}-01T00:00:00.000Z", "end": "2026-12-01T00:00:00.000Z"},
    }
    if execution:
        doc["executionId"] = execution
    sub = f"{execution}/" if execution and folder else ""
    key = f"{PREFIX}/{NAME}/metadata/BILLING_PERIOD={period}/{sub}{NAME}-Manifest.json"
    s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(doc).encode())
    return key


@pytest.fixture(scope="module")
def moto():
    server = MotoServer().start()
    yield server
    server.stop()


@pytest.fixture
def s3(moto):
    moto.reset()
    client = moto.client("s3")
    client.create_bucket(Bucket=BUCKET)
    return client


@pytest.fixture
def two_deliveries(s3):
    """November delivered twice ('create new'): an old execution, then a newer one whose key sorts first."""
    old = put_file(s3, "2026-11", f"{NAME}-00001.snappy.parquet", parquet([line(h(2, 5), 999.0)]), "zzz-old")
    put_manifest(s3, "2026-11", [old], "zzz-old")
    put_file(s3, "2026-11", f"{NAME}-00009.snappy.parquet", parquet([line(h(2, 6), 555.0)]))  # in no manifest
    f1 = put_file(
        s3,
        "2026-11",
        f"{NAME}-00001.snappy.parquet",
        parquet([line(h(1, 23), 1.0), line(h(2, 0), 2.0), line(h(2, 13), 3.0)]),
        "aaa-new",
    )
    f2 = put_file(
        s3,
        "2026-11",
        f"{NAME}-00002.snappy.parquet",
        parquet([line(h(2, 23), 4.0), line(h(3, 0), 5.0)], money=pa.decimal128(24, 10), naive_ts=False),
        "aaa-new",
    )
    time.sleep(1.05)  # S3 LastModified has whole seconds
    put_manifest(s3, "2026-11", [f1, f2], "aaa-new")
    return s3, [f1, f2]


@pytest.mark.servers
def test_lines_of_the_window_from_the_newest_manifest_only(two_deliveries):
    s3, files = two_deliveries
    src = CurSource(s3, ROOT + "/")
    m = src.newest_manifest("2026-11")
    assert m.execution_id == "aaa-new" and m.data_files == tuple(files) and m.billing_period == "2026-11"
    assert m.uri.endswith("/metadata/BILLING_PERIOD=2026-11/aaa-new/foxhunt-export-Manifest.json")
    assert m.period_start == "2026-11-01T00:00:00.000Z"

    table, skipped = src.line_items(h(2, 0), h(3, 0), partition="2026-11-02")
    assert skipped == [] and table.schema == COSTS_HOURLY.schema
    rows = table.to_pylist()
    assert [r["cost_usd"] for r in rows] == [2.0, 3.0, 4.0]  # not 999 (old execution), not 555 (stray file)
    assert [r["hour"] for r in rows] == [h(2, 0), h(2, 13), h(2, 23)]
    assert {r["manifest"] for r in rows} == {"aaa-new"} and {r["billing_period"] for r in rows} == {"2026-11"}
    r = rows[0]
    assert (r["service"], r["resource_id"], r["instance_type"], r["account_id"]) == (
        "AmazonEC2",
        "i-0abc",
        "p5.48xlarge",
        "111122223333",
    )
    assert (r["project"], r["environment"], r["experiment"]) == ("foxhunt-rl", "prod", "ppo-a")

    # several days in one call: each listed file read once
    table, _ = src.line_items(h(1, 0), h(4, 0))
    assert table.column("cost_usd").to_pylist() == [1.0, 2.0, 3.0, 4.0, 5.0] and src.files_read == 2
    table, _ = src.line_items(h(10, 0), h(11, 0))  # files read, no line in the window
    assert table.num_rows == 0 and table.schema == COSTS_HOURLY.schema and src.files_read == 2


@pytest.mark.servers
def test_a_period_without_manifest_is_skipped_not_read(s3):
    put_file(
        s3, "2026-10", f"{NAME}-00001.snappy.parquet", parquet([line(h(31, 22, month=10), 7.0)]), "e-oct"
    )
    f = put_file(s3, "2026-11", f"{NAME}-00001.snappy.parquet", parquet([line(h(1, 1), 8.0)]), "e-nov")
    put_manifest(s3, "2026-11", [f], "e-nov")
    src = CurSource(s3, ROOT)
    assert src.newest_manifest("2026-10") is None
    table, skipped = src.line_items(h(31, 0, month=10), h(2, 0))
    assert skipped == ["2026-10"] and table.column("cost_usd").to_pylist() == [8.0]

    table, skipped = src.line_items(h(31, 0, month=10), h(1, 0))
    assert skipped == ["2026-10"] and table.num_rows == 0 and table.schema == COSTS_HOURLY.schema


@pytest.mark.servers
def test_overwrite_delivery_and_a_manifest_without_execution_id(s3):
    f = put_file(s3, "2026-11", f"{NAME}-00001.snappy.parquet", parquet([line(h(5, 1), 1.5)]))
    key = put_manifest(s3, "2026-11", [f], execution=None)
    assert key == f"{PREFIX}/{NAME}/metadata/BILLING_PERIOD=2026-11/{NAME}-Manifest.json"
    table, _ = CurSource(s3, ROOT).line_items(h(5, 0), h(6, 0))
    assert table.column("manifest").to_pylist() == [f"s3://{BUCKET}/{key}"]


@pytest.mark.servers
@pytest.mark.parametrize("raw", ["12.3x", "nan", "inf"])
def test_a_malformed_amount_names_file_row_and_column(s3, raw):
    lines = [line(h(2, i), f"{i}.5") for i in range(4)]
    lines[2]["line_item_unblended_cost"] = raw
    f = put_file(s3, "2026-11", f"{NAME}-00001.snappy.parquet", parquet(lines, money=pa.string()), "e1")
    put_manifest(s3, "2026-11", [f], "e1")
    with pytest.raises(CurError) as err:
        CurSource(s3, ROOT).line_items(h(2, 1), h(3, 0), partition="2026-11-02")
    msg = str(err.value)
    assert f"CUR file {f}" in msg and "row 2" in msg and "line_item_unblended_cost" in msg
    assert repr(raw) in msg and "partition 2026-11-02" in msg


@pytest.mark.servers
def test_string_amounts_are_read_as_numbers(s3):
    lines = [line(h(2, 0), "0.1234567891"), line(h(2, 1), " 2 ", line_item_usage_amount="")]
    f = put_file(s3, "2026-11", f"{NAME}-00001.snappy.parquet", parquet(lines, money=pa.string()), "e1")
    put_manifest(s3, "2026-11", [f], "e1")
    table, _ = CurSource(s3, ROOT).line_items(h(2, 0), h(3, 0))
    assert table.column("cost_usd").to_pylist() == [0.1234567891, 2.0]
    assert table.column("usage_amount").to_pylist() == [1.0, None]


@pytest.mark.servers
def test_amortized_cost_follows_the_aws_convention(s3):
    sp = "savings_plan_savings_plan_effective_cost"
    lines = [
        line(h(2, 0), 10.0),  # Usage: unblended
        line(h(2, 1), 10.0, line_item_line_item_type="SavingsPlanCoveredUsage", **{sp: 6.0}),
        line(h(2, 1), -10.0, line_item_line_item_type="SavingsPlanNegation"),
        line(
            h(2, 1),
            8.0,
            line_item_line_item_type="SavingsPlanRecurringFee",
            savings_plan_total_commitment_to_date=8.0,
            savings_plan_used_commitment=6.0,
        ),  # 2.0 of the commitment went unused
        line(h(2, 2), 0.0, line_item_line_item_type="DiscountedUsage", reservation_effective_cost=4.0),
        line(h(2, 2), 4.0, line_item_line_item_type="RIFee"),  # no unused-reservation columns: 0
        line(h(2, 3), 1.25, line_item_line_item_type="Tax", line_item_product_code="AmazonEC2"),
    ]
    for ln in lines:
        ln.setdefault("savings_plan_total_commitment_to_date", 0.0)
        ln.setdefault("savings_plan_used_commitment", 0.0)
    f = put_file(s3, "2026-11", f"{NAME}-00001.snappy.parquet", parquet(lines), "e1")
    put_manifest(s3, "2026-11", [f], "e1")
    table, _ = CurSource(s3, ROOT).line_items(h(2, 0), h(3, 0))
    got = list(zip(table.column("line_item_type").to_pylist(), table.column("amortized_usd").to_pylist()))
    assert got == [
        ("Usage", 10.0),
        ("SavingsPlanCoveredUsage", 6.0),
        ("SavingsPlanNegation", 0.0),
        ("SavingsPlanRecurringFee", 2.0),
        ("DiscountedUsage", 4.0),
        ("RIFee", 0.0),
        ("Tax", 1.25),
    ]
    assert sum(table.column("cost_usd").to_pylist()) == 23.25


@pytest.mark.servers
def test_a_covered_line_without_its_effective_cost_fails(s3):
    lines = [line(h(2, 0), 10.0, line_item_line_item_type="SavingsPlanCoveredUsage")]
    lines[0]["savings_plan_savings_plan_effective_cost"] = None
    f = put_file(s3, "2026-11", f"{NAME}-00001.snappy.parquet", parquet(lines), "e1")
    put_manifest(s3, "2026-11", [f], "e1")
    with pytest.raises(CurError, match=r"row 0: column savings_plan_savings_plan_effective_cost is null"):
        CurSource(s3, ROOT).line_items(h(2, 0), h(3, 0))


@pytest.mark.servers
def test_tags_are_normalised(s3):
    lines = [
        # aws:createdBy is written aws_created_by (fixtures/real/cur/tag_keys.tsv)
        line(
            h(2, 0), resource_tags={"user_project": "foxhunt-rl", "user_team": "rl", "aws_created_by": "me"}
        ),
        line(h(2, 1), resource_tags={"user:Project": "other", "user:Experiment": "grpo-b"}),
        line(h(2, 2), resource_tags={}),
        line(h(2, 3), resource_tags=None),
    ]
    f = put_file(s3, "2026-11", f"{NAME}-00001.snappy.parquet", parquet(lines), "e1")
    put_manifest(s3, "2026-11", [f], "e1")
    table, _ = CurSource(s3, ROOT).line_items(h(2, 0), h(3, 0))
    rows = table.to_pylist()
    assert [(r["project"], r["environment"], r["experiment"]) for r in rows] == [
        ("foxhunt-rl", "", ""),
        ("other", "", "grpo-b"),
        ("", "", ""),
        ("", "", ""),
    ]
    assert rows[0]["tags"] == '{"aws_created_by":"me","project":"foxhunt-rl","team":"rl"}'
    assert rows[1]["tags"] == '{"experiment":"grpo-b","project":"other"}'
    assert rows[2]["tags"] == rows[3]["tags"] == "{}"


@pytest.mark.servers
def test_tags_written_as_json_text(s3):
    lines = [
        line(h(2, 0), resource_tags={"user_project": "foxhunt-rl"}),
        line(h(2, 1), resource_tags=None),
        line(h(2, 2), resource_tags={"user_project": "foxhunt-rl"}),
    ]
    f = put_file(s3, "2026-11", f"{NAME}-00001.snappy.parquet", parquet(lines, json_tags=True), "e1")
    put_manifest(s3, "2026-11", [f], "e1")
    table, _ = CurSource(s3, ROOT).line_items(h(2, 0), h(3, 0))
    assert table.column("project").to_pylist() == ["foxhunt-rl", "", "foxhunt-rl"]
    assert table.column("tags").to_pylist() == ['{"project":"foxhunt-rl"}', "{}", '{"project":"foxhunt-rl"}']


@pytest.mark.servers
def test_custom_tag_keys_and_a_missing_instance_type(s3):
    lines = [line(h(2, 0), resource_tags={"user_team": "rl", "user_stage": "dev", "user_run": "r1"})]
    f = put_file(s3, "2026-11", "x.snappy.parquet", parquet(lines, drop=("product_instance_type",)), "e1")
    put_manifest(s3, "2026-11", [f], "e1")
    table, _ = CurSource(s3, ROOT, tag_keys=("Team", "Stage", "Run")).line_items(h(2, 0), h(3, 0))
    r = table.to_pylist()[0]
    assert (r["project"], r["environment"], r["experiment"], r["instance_type"]) == ("rl", "dev", "r1", "")


@pytest.mark.servers
def test_a_file_without_a_required_column_fails(s3):
    f = put_file(s3, "2026-11", "x.snappy.parquet", parquet([line(h(2, 0))], drop=("resource_tags",)), "e1")
    put_manifest(s3, "2026-11", [f], "e1")
    with pytest.raises(CurError, match=rf"CUR file {f} .*lacks the CUR 2.0 column\(s\) resource_tags"):
        CurSource(s3, ROOT).line_items(h(2, 0), h(3, 0))


@pytest.mark.servers
@pytest.mark.parametrize(
    "tags",
    [
        pa.array([7], pa.int64()),
        pa.array([["user_project", "rl"]], pa.list_(pa.string())),
        pa.array([{"user_project": "rl"}], pa.struct([("user_project", pa.string())])),
        pa.array([b'{"user_project": "rl"}'], pa.binary()),
    ],
    ids=["int64", "list", "struct", "binary"],
)
def test_resource_tags_of_a_wrong_type_names_file_column_and_types(s3, tags):
    """A resource_tags column pyarrow wrote with another type than AWS's map<string,string>."""
    table = pq.read_table(io.BytesIO(parquet([line(h(2, 0))])))
    table = table.set_column(table.schema.get_field_index("resource_tags"), "resource_tags", tags)
    buf = io.BytesIO()
    pq.write_table(table, buf)
    f = put_file(s3, "2026-11", "x.snappy.parquet", buf.getvalue(), "e1")
    put_manifest(s3, "2026-11", [f], "e1")
    with pytest.raises(CurError) as e:
        CurSource(s3, ROOT).line_items(h(2, 0), h(3, 0))
    assert str(e.value).startswith(f"CUR file {f} ")
    # the type as the file holds it (Parquet names a list's item `element`)
    found = str(tags.type).replace("list<item:", "list<element:")
    assert f"column resource_tags has type {found}, expected map<string,string>" in str(e.value)


@pytest.mark.servers
def test_a_listed_file_that_is_missing_fails(s3):
    put_manifest(
        s3, "2026-11", [f"s3://{BUCKET}/{PREFIX}/{NAME}/data/BILLING_PERIOD=2026-11/e1/gone.parquet"], "e1"
    )
    with pytest.raises(CurError, match=r"gone.parquet: get_object failed: .*NoSuchKey"):
        CurSource(s3, ROOT).line_items(h(2, 0), h(3, 0))


def test_billing_periods_overlapping_a_window():
    assert billing_periods(h(30, 0), h(1, 0, month=12)) == ["2026-11"]
    assert billing_periods(h(30, 0), h(1, 1, month=12)) == ["2026-11", "2026-12"]
    start = datetime(2026, 12, 31, 23, tzinfo=UTC)
    assert billing_periods(start, start + timedelta(hours=2)) == ["2026-12", "2027-01"]
    assert billing_periods(start, start) == []


def cur2_columns() -> dict[str, str]:
    """fixtures/real/cur/cur2_columns.txt: CUR 2.0 column -> documented type."""
    out = {}
    for ln in (REAL / "cur2_columns.txt").read_text().splitlines():
        if ln.strip() and not ln.startswith("#"):
            name, typ = ln.split("\t")
            out[name] = typ
    return out


ARROW = {
    "string": pa.string(),
    "double": pa.float64(),
    "timestamp": pa.timestamp("ms"),  # Glue/Athena timestamp: no zone, UTC
    "map<string,string>": pa.map_(pa.string(), pa.string()),
}


def cur2_parquet(lines: list[dict]) -> bytes:
    """A CUR 2.0 data file with every column the reader uses, each of its documented type."""
    cols = {}
    for name, typ in cur2_columns().items():
        vals = [ln.get(name) for ln in lines]
        if typ == "map<string,string>":
            vals = [None if v is None else list(v.items()) for v in vals]
        elif typ == "timestamp":
            vals = [None if v is None else v.replace(tzinfo=None) for v in vals]
        cols[name] = pa.array(vals, ARROW[typ])
    buf = io.BytesIO()
    pq.write_table(pa.table(cols), buf, compression="snappy")
    return buf.getvalue()


def cur2_line(hour: datetime, cost: float, tags: dict | None) -> dict:
    return {
        **line(hour, cost, resource_tags=tags),
        "identity_time_interval": f"{hour:%Y-%m-%dT%H:%M:%SZ}/{hour + timedelta(hours=1):%Y-%m-%dT%H:%M:%SZ}",
        "reservation_reservation_a_r_n": "",
        "reservation_unused_amortized_upfront_fee_for_billing_period": 0.0,
        "reservation_unused_recurring_fee": 0.0,
        "savings_plan_total_commitment_to_date": 0.0,
        "savings_plan_used_commitment": 0.0,
    }


def test_the_reader_uses_documented_cur2_columns():
    """Every column the reader requires or reads exists in CUR 2.0 with a type it reads."""
    cols = cur2_columns()
    assert set(REQUIRED) | set(OPTIONAL) <= set(cols)
    assert cols["resource_tags"] == "map<string,string>"
    assert cols["line_item_usage_start_date"] == "timestamp"
    assert {cols[c] for c in ("line_item_unblended_cost", "line_item_usage_amount")} == {"double"}


CAMEL_TAGS = ("CostCenter", "team:owner", "Experiment")


@pytest.mark.servers
def test_camel_case_tag_keys_as_aws_writes_them(s3):
    """FOXHUNT_COST_TAGS=CostCenter,team:owner,Experiment against resource_tags keys in AWS's spelling
    (user_cost_center, user_team_owner; aws:createdBy as aws_created_by)."""
    tags = {
        "user_cost_center": "cc-42",
        "user_team_owner": "rl-infra",
        "user_experiment": "ppo-a",
        "aws_created_by": "AssumedRole:AROAEXAMPLE:karpenter",
    }
    lines = [
        cur2_line(h(2, 0), 3.0, tags),
        cur2_line(h(2, 1), 4.0, {"user_cost_center": "cc-7"}),
        cur2_line(h(2, 2), 5.0, None),
    ]
    f = put_file(s3, "2026-11", f"{NAME}-00001.snappy.parquet", cur2_parquet(lines), "e1")
    put_manifest(s3, "2026-11", [f], "e1")
    src = CurSource(s3, ROOT, tag_keys=CAMEL_TAGS)
    table, skipped = src.line_items(h(2, 0), h(3, 0))
    rows = table.to_pylist()
    assert skipped == [] and src.unmatched_tag_keys == {}
    assert [(r["project"], r["environment"], r["experiment"], r["cost_usd"]) for r in rows] == [
        ("cc-42", "rl-infra", "ppo-a", 3.0),
        ("cc-7", "", "", 4.0),
        ("", "", "", 5.0),
    ]
    assert json.loads(rows[0]["tags"]) == {
        "aws_created_by": "AssumedRole:AROAEXAMPLE:karpenter",
        "cost_center": "cc-42",
        "experiment": "ppo-a",
        "team_owner": "rl-infra",
    }
    # the same keys as Cost Explorer and legacy CUR spell them
    table, _ = CurSource(s3, ROOT, tag_keys=("user:CostCenter", "user_team_owner", "Experiment")).line_items(
        h(2, 0), h(2, 1)
    )
    assert (table["project"][0].as_py(), table["environment"][0].as_py()) == ("cc-42", "rl-infra")


@pytest.mark.servers
def test_a_configured_key_that_matches_no_tag_is_reported(s3):
    """November carries tags, none under 'Experiment' (and 'CostCenter' only outside the window, which still
    counts: the month has it); December has no tags at all, so nothing can be said about it."""
    nov = [
        cur2_line(h(2, 0), 1.0, {"user_cost_center": "cc-1", "user_team_owner": "rl", "user_exp": "x"}),
        cur2_line(h(20, 0), 1.0, {"user_cost_center": "cc-2"}),
    ]
    nov[0]["resource_tags"] = {"user_team_owner": "rl", "user_exp": "x"}
    f = put_file(s3, "2026-11", f"{NAME}-00001.snappy.parquet", cur2_parquet(nov), "e1")
    put_manifest(s3, "2026-11", [f], "e1")
    dec = [cur2_line(h(1, 0, month=12), 1.0, None), cur2_line(h(1, 1, month=12), 1.0, {})]
    g = put_file(s3, "2026-12", f"{NAME}-00001.snappy.parquet", cur2_parquet(dec), "e2")
    put_manifest(s3, "2026-12", [g], "e2")

    src = CurSource(s3, ROOT, tag_keys=CAMEL_TAGS)
    table, _ = src.line_items(h(2, 0), h(3, 0))
    assert table.num_rows == 1 and table["environment"][0].as_py() == "rl"
    assert src.unmatched_tag_keys == {"Experiment": ["2026-11"]}
    src.line_items(h(30, 0), h(1, 2, month=12))
    assert src.unmatched_tag_keys == {"Experiment": ["2026-11"]}  # December: no tags, no verdict
    src.line_items(h(1, 0, month=12), h(2, 0, month=12))
    assert src.unmatched_tag_keys == {}

    # a key AWS spells otherwise is named; TeamOwner and team:owner are one key in CUR 2.0 (user_team_owner)
    src = CurSource(s3, ROOT, tag_keys=("costcenter", "TeamOwner", "Experiment"))
    table, _ = src.line_items(h(2, 0), h(3, 0))
    assert table["environment"].to_pylist() == ["rl"]
    assert src.unmatched_tag_keys == {"costcenter": ["2026-11"], "Experiment": ["2026-11"]}


@pytest.mark.servers
def test_unmatched_keys_from_tags_written_as_json_text(s3):
    lines = [line(h(2, 0), resource_tags={"user_cost_center": "cc-1"}), line(h(2, 1), resource_tags=None)]
    f = put_file(s3, "2026-11", f"{NAME}-00001.snappy.parquet", parquet(lines, json_tags=True), "e1")
    put_manifest(s3, "2026-11", [f], "e1")
    src = CurSource(s3, ROOT, tag_keys=CAMEL_TAGS)
    table, _ = src.line_items(h(2, 0), h(3, 0))
    assert table["project"].to_pylist() == ["cc-1", ""]
    assert src.unmatched_tag_keys == {"team:owner": ["2026-11"], "Experiment": ["2026-11"]}
