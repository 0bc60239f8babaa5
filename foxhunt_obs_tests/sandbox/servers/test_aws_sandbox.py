"""The sandbox's AWS part: the scenario's `aws:` block, its exact truth (bills.py) and a real moto server
seeded from it (moto_server.py). One seeded server for the module (small scenario, ~2 s), one more for
up/down/status."""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import re
from collections import defaultdict
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import boto3
import pyarrow.parquet as pq
import pytest
import yaml

from foxhunt_obs.lib.sources.aws import ce_service_name
from foxhunt_obs.sandbox.servers.local_server import alive
from foxhunt_obs.sandbox.servers.moto_server import (
    CUR_BUCKET,
    CUR_SCHEMA,
    MotoServer,
    cur_keys,
    down_moto,
    moto_status,
    queue_cost_explorer,
    sandbox_env,
    seed,
    up_moto,
)
from foxhunt_obs.sandbox.story import truth
from foxhunt_obs.sandbox.story.scenario import SCENARIO_DIR, ScenarioError, load_scenario, parse_scenario
from foxhunt_obs.sandbox.writers import bills

UTC = timezone.utc
CENT = Decimal("0.005")
EXACT = Decimal("1e-20")  # Decimal's 28 digits: GB-month prices / 720 h do not terminate


def close(a: Decimal, b: Decimal, tol: Decimal = EXACT) -> bool:
    return abs(a - b) < tol


@pytest.fixture(scope="module")
def small():
    return load_scenario("small")


@pytest.fixture(scope="module")
def default():
    return load_scenario("default")


def _raw(name: str = "small") -> dict:
    return yaml.safe_load((SCENARIO_DIR / f"{name}.yaml").read_text())


def _parse(raw: dict):
    return parse_scenario(yaml.safe_dump(raw), origin="test.yaml")


# ---- the aws: block ----


def test_small_aws_block(small):
    aws = small.aws
    assert (aws.account_id, aws.region) == ("123456789012", "us-east-1")
    assert aws.default_tags == {"Project": "foxhunt-rl", "Environment": "training"}
    (fs,) = aws.fsx
    assert (fs.name, fs.storage_gib, fs.osts, fs.price_key) == (
        "foxhunt-scratch",
        1200,
        2,
        "PERSISTENT_2/125",
    )
    assert [(b.name, b.experiment) for b in aws.s3_buckets] == [
        ("foxhunt-ckpt-ppo-humanoid", "ppo-humanoid"),
        ("foxhunt-ckpt-dqn-atari", "dqn-atari"),
    ]
    assert aws.eks_cluster == "foxhunt-eks" and aws.budget.limit_usd == Decimal(10000)
    (fill,) = aws.incidents
    assert (fill.fsx, fill.start.hour, fill.end.hour, fill.recover.hour) == ("foxhunt-scratch", 2, 3, 4)


def test_aws_block_changes_nothing_else(default):
    """The block is optional and touches no Prometheus or MLflow sample (GENERATOR_VERSION stays)."""
    raw = _raw("default")
    del raw["aws"]
    assert _parse(raw) == dataclasses.replace(default, aws=None)
    assert load_scenario("small").aws is not None and _parse(_raw("small")).aws is not None


def _aws(raw):
    return raw["aws"]


def _fs(raw):
    return raw["aws"]["fsx"][0]


def _fill(raw):
    return raw["aws"]["incidents"][0]


STRAY = {"kind": "stray_instance", "name": "bench", "instance_type": "p5.48xlarge", "start_h": 1, "hours": 2}

BAD = {
    "unknown field": (lambda r: _aws(r).update(vpc="x"), "aws: unknown field(s) vpc"),
    "account id": (lambda r: _aws(r).update(account_id=123), "aws.account_id: expected 12 digits"),
    "tag key": (lambda r: _aws(r)["tags"].update(Owner="me"), "tag 'Owner' is not a default cost tag"),
    "experiment tag": (lambda r: _aws(r)["tags"].update(Experiment="x"), "Experiment is set per S3 bucket"),
    "fsx unknown field": (
        lambda r: _fs(r).update(iops=3),
        "aws.fsx[0] ('foxhunt-scratch'): unknown field(s) iops",
    ),
    "deployment type": (lambda r: _fs(r).update(deployment_type="GP3"), "deployment_type must be one of"),
    "free per ost": (lambda r: _fs(r).update(free_gb=[600]), "free_gb must list one value per OST (2)"),
    "ost too small": (
        lambda r: _fs(r).update(free_gb=[700, 500]),
        "OST 0 has 700 GB free but holds only 644",
    ),
    "io field": (lambda r: _fs(r)["io"].update(iops=1), "aws.fsx[0] ('foxhunt-scratch'): io: unknown field"),
    "runs out": (
        lambda r: _fill(r).update(gb=1200),
        "OST 0 would run out of space (600 GB free at the start, up to 606 GB",
    ),
    "bucket experiment": (
        lambda r: _aws(r)["billed"]["s3_buckets"][0].update(experiment="sac"),
        "aws.billed.s3_buckets[0] ('foxhunt-ckpt-ppo-humanoid'): unknown experiment 'sac'",
    ),
    "bucket name": (
        lambda r: _aws(r)["billed"]["s3_buckets"][0].update(name="Bad_Bucket"),
        "is not an S3 bucket name",
    ),
    "duplicate bucket": (
        lambda r: _aws(r)["billed"]["s3_buckets"].append(dict(_aws(r)["billed"]["s3_buckets"][0])),
        "aws.billed.s3_buckets bucket 'foxhunt-ckpt-ppo-humanoid': defined twice",
    ),
    "budget field": (lambda r: _aws(r)["budget"].update(currency="EUR"), "aws.budget: unknown field(s)"),
    "incident kind": (
        lambda r: _fill(r).update(kind="fsx_melt"),
        "aws.incidents[0] (fsx_melt): kind must be",
    ),
    "unknown fsx": (
        lambda r: _fill(r).update(fsx="ghost"),
        "aws.incidents[0] (fsx_fill): unknown FSx file system 'ghost'",
    ),
    "outside": (
        lambda r: _fill(r).update(start_h=5.5, recover_h=None),
        "window 5.5h..6.5h is empty or outside",
    ),
    "recover early": (lambda r: _fill(r).update(recover_h=2.5), "recover_h=2.5 must be at or after"),
    "recover at end": (lambda r: _fill(r).update(recover_h=6), "before the scenario's end (6h)"),
    "off minute grid": (
        lambda r: _fill(r).update(start_h="2:00:30"),
        "not on the 60 s CloudWatch minute grid",
    ),
    "stray kind field": (
        lambda r: _aws(r)["incidents"].append(dict(STRAY, gb=1)),
        "aws.incidents[1] (stray_instance): unknown field(s) gb",
    ),
    "stray experiment": (
        lambda r: _aws(r)["incidents"].append(dict(STRAY, experiment="sac")),
        "aws.incidents[1] (stray_instance): unknown experiment 'sac'",
    ),
    "stray type": (
        lambda r: _aws(r)["incidents"].append(dict(STRAY, instance_type="P5")),
        "instance_type must look like p5.48xlarge, got 'P5'",
    ),
    "stray outside": (
        lambda r: _aws(r)["incidents"].append(dict(STRAY, start_h=5, hours=2)),
        "aws.incidents[1] (stray_instance): window 5h..7h is empty or outside 0..6h",
    ),
    "stray twice": (
        lambda r: _aws(r)["incidents"].extend([dict(STRAY), dict(STRAY)]),
        "aws.incidents stray_instance 'bench': defined twice",
    ),
    "overlapping fills": (
        lambda r: _aws(r)["incidents"].append({**_fill(r), "start_h": 3.5, "recover_h": 5}),
        "fsx_fill at 3.5h starts before the one at 2h recovered",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_validation_errors(case):
    mutate, message = BAD[case]
    raw = copy.deepcopy(_raw())
    mutate(raw)
    with pytest.raises(ScenarioError, match=re.escape(message)) as e:
        _parse(raw)
    assert str(e.value).startswith("scenario test.yaml: ")


# ---- truth ----


def _day_totals(items, d):
    return sum((i.cost for i in items if i.day == d), Decimal(0))


def _amounts(results, days: set[str]) -> Decimal:
    return sum(
        (
            Decimal(g["Metrics"]["UnblendedCost"]["Amount"])
            for r in results
            for t in r["ResultsByTime"]
            if t["TimePeriod"]["Start"] in days
            for g in t["Groups"]
        ),
        Decimal(0),
    )


@pytest.mark.parametrize("name", ["small", "default"])
def test_cur_ce_and_daily_costs_agree(name):
    sc = load_scenario(name)
    items = bills.line_items(sc)
    days = sorted({i.day for i in items})
    results = bills.ce_results(sc, days[0], days[-1] + timedelta(days=1), items=items)
    discovery = results[: len(days)]
    detail = results[len(days) :]
    assert len(detail) == 2 * len(days)  # pairs ('', '') and ('foxhunt-rl', 'training')
    for d in days:
        cur = _day_totals(items, d)
        assert abs(_amounts(discovery, {d.isoformat()}) - cur) < CENT
        assert abs(_amounts(detail, {d.isoformat()}) - cur) < CENT
        assert close(sum(bills.daily_costs(sc, d, items).values()), cur)
        totals = bills.daily_totals(sc, d, items)
        assert totals["cur"] == cur and abs(totals["ce"] - cur) < Decimal("1e-8")
    assert all(i.amortized == i.cost for i in items)


def test_default_last_day(default):
    items = bills.line_items(default)
    last = date(2026, 11, 22)
    costs = bills.daily_costs(default, last, items)
    p4de = Decimal("27.44705")
    # ip-10-0-1-11 and ip-10-0-1-13 all day, ip-10-0-1-12 minus its 2 lost hours: 24 + 24 + 22 hours
    assert costs[("foxhunt-rl", "training", "", "AmazonEC2")] == p4de * 70
    assert close(costs[("foxhunt-rl", "training", "", "AmazonFSx")], Decimal("0.145") * 4800 / 720 * 24)
    assert costs[("", "", "", "AmazonEKS")] == Decimal("0.10") * 24
    assert close(
        costs[("foxhunt-rl", "training", "ppo-humanoid", "AmazonS3")], Decimal("0.023") * 1800 / 720 * 24
    )
    # 70 x $27.44705 = $1,921.2935, FSx $23.20, S3 $2.76, EKS $2.40
    assert round(sum(costs.values()), 2) == Decimal("1949.65")
    b = bills.budget_truth(default, items)
    assert (b.period_start, b.period_end) == (
        datetime(2026, 11, 1, tzinfo=UTC),
        datetime(2026, 12, 1, tzinfo=UTC),
    )
    assert b.actual_usd == sum(i.cost for i in items)  # the scenario lies inside November
    assert close(b.forecast_usd, b.actual_usd + sum(costs.values()) * 8)
    # past the 80 % alert, under the limit; the forecast past it
    assert b.limit_usd * Decimal("0.8") < b.actual_usd < b.limit_usd < b.forecast_usd


def test_stray_instance_is_the_cost_spike(default):
    """The default scenario's stray p5: 8 hours billed on 2026-11-21 to ppo-humanoid, on no node."""
    (stray,) = bills.stray_instances(default)
    assert stray.node == "" and stray.instance_id not in {i.instance_id for i in bills.instances(default)}
    every = bills.line_items(default)
    items = [i for i in every if i.resource_id == stray.instance_id]
    assert [i.hour.hour for i in items] == list(range(10, 18))
    assert {i.day for i in items} == {date(2026, 11, 21)}
    assert all(i.usage_type == "BoxUsage:p5.48xlarge" and i.cost == Decimal("55.04") for i in items)
    assert items[0].tags == {"Project": "foxhunt-rl", "Environment": "training", "Experiment": "ppo-humanoid"}
    spike = _day_totals(every, date(2026, 11, 21)) - _day_totals(every, date(2026, 11, 20))
    assert close(spike, Decimal("440.32"))
    # nothing of it reaches Prometheus: no kube_node_info, no node_samples
    assert stray.instance_id not in set(truth.node_samples(default)["instance_id"])


def test_untagged_eks_line(small):
    items = bills.line_items(small)
    eks = [i for i in items if i.service == "AmazonEKS"]
    assert len(eks) == small.hours and all(i.tags == {} and i.cost == Decimal("0.10") for i in eks)
    assert eks[0].resource_id == "arn:aws:eks:us-east-1:123456789012:cluster/foxhunt-eks"
    assert all(i.tags for i in items if i.service != "AmazonEKS")
    discovery, untagged, tagged = bills.ce_results(small, date(2026, 11, 16), date(2026, 11, 17), items=items)
    assert [g["Keys"] for g in discovery["ResultsByTime"][0]["Groups"]] == [
        ["Project$", "Environment$"],
        ["Project$foxhunt-rl", "Environment$training"],
    ]
    assert [g["Keys"] for g in untagged["ResultsByTime"][0]["Groups"]] == [
        ["Experiment$", ce_service_name("AmazonEKS")]
    ]
    assert ["Experiment$", "Amazon FSx"] in [g["Keys"] for g in tagged["ResultsByTime"][0]["Groups"]]


def test_node_lost_replaces_the_instance(small):
    items = bills.line_items(small)
    old, new = [i for i in bills.instances(small) if i.node == "ip-10-0-1-12"]
    assert old.instance_id != new.instance_id and re.fullmatch(r"i-0[0-9a-f]{16}", old.instance_id)
    assert (old.end.hour, new.start.hour) == (3, 5)
    hours = {
        i.instance_id: sorted(x.hour.hour for x in items if x.resource_id == i.instance_id)
        for i in (old, new)
    }
    assert hours == {old.instance_id: [0, 1, 2], new.instance_id: [5]}
    # node_samples has no rows while the node is lost: the estimate's node-hours equal the billed hours
    rows = truth.node_samples(small).groupby("node").size()
    billed = defaultdict(Decimal)
    node_of = {i.instance_id: i.node for i in bills.instances(small)}
    for i in items:
        if i.service == "AmazonEC2":
            billed[node_of[i.resource_id]] += i.usage_amount
            assert i.usage_type == "BoxUsage:p4de.24xlarge" and i.instance_type == "p4de.24xlarge"
            assert i.tags == {"Project": "foxhunt-rl", "Environment": "training"}  # shared: no Experiment
    assert {n: Decimal(int(c)) * small.step_s / 3600 for n, c in rows.items()} == dict(billed)


def test_partial_hours_are_fractions():
    raw = _raw()
    lost = next(i for i in raw["incidents"] if i["kind"] == "node_lost")
    lost.update(start_h="3:15", minutes=100)  # 03:15-04:55
    sc = _parse(raw)
    items = bills.line_items(sc)
    old, new = [i for i in bills.instances(sc) if i.node == "ip-10-0-1-12"]
    usage = {(i.resource_id, i.hour.hour): i.usage_amount for i in items if i.service == "AmazonEC2"}
    assert usage[(old.instance_id, 3)] == Decimal("0.25")
    assert usage[(new.instance_id, 4)] == Decimal(5) / 60
    assert (old.instance_id, 4) not in usage and usage[(new.instance_id, 5)] == 1


def test_s3_buckets_carry_experiment(default):
    s3 = [i for i in bills.line_items(default) if i.service == "AmazonS3"]
    assert {i.resource_id: i.tags["Experiment"] for i in s3} == {
        "foxhunt-ckpt-ppo-humanoid": "ppo-humanoid",
        "foxhunt-ckpt-ppo-ant": "ppo-ant",
        "foxhunt-ckpt-dqn-atari": "dqn-atari",
    }
    assert all(i.tags["Project"] == "foxhunt-rl" and i.usage_type == "TimedStorage-ByteHrs" for i in s3)


def test_ce_pages_one_day_per_answer(default):
    results = bills.ce_results(default, date(2026, 11, 20), date(2026, 11, 23))
    assert len(results) == 3 + 2 * 3  # discovery, then ('', '') and ('foxhunt-rl', 'training') chains
    chains = [results[k : k + 3] for k in range(0, 9, 3)]
    for chain in chains:
        assert [r["ResultsByTime"][0]["TimePeriod"]["Start"] for r in chain] == [
            "2026-11-20",
            "2026-11-21",
            "2026-11-22",
        ]
        assert "NextPageToken" in chain[0] and "NextPageToken" in chain[1] and "NextPageToken" not in chain[2]
        assert all(r["ResultsByTime"][0]["Estimated"] is False for r in chain)
    tokens = [r["NextPageToken"] for r in results if "NextPageToken" in r]
    assert len(set(tokens)) == len(tokens) == 6
    assert chains[0][0]["GroupDefinitions"] == [
        {"Type": "TAG", "Key": "Project"},
        {"Type": "TAG", "Key": "Environment"},
    ]
    assert chains[1][0]["GroupDefinitions"][1] == {"Type": "DIMENSION", "Key": "SERVICE"}
    amount = chains[0][0]["ResultsByTime"][0]["Groups"][1]["Metrics"]["UnblendedCost"]["Amount"]
    assert re.fullmatch(r"\d+\.\d{10}", amount)
    with pytest.raises(ValueError, match="empty Cost Explorer window"):
        bills.ce_results(default, date(2026, 11, 22), date(2026, 11, 22))


def test_fsx_fill_on_the_last_day(default):
    (s,) = bills.fsx_datapoints(default).values()
    assert s.datapoints == 168 * 60 * 7 and s.free.shape == (168 * 60, 2)
    for stat in ("Minimum", "Sum"):
        ((start, end),) = bills.fsx_low_windows(default, "foxhunt-lustre", stat=stat)
        assert datetime(2026, 11, 22, 14, tzinfo=UTC) < start < datetime(2026, 11, 22, 16, tzinfo=UTC)
        assert end == datetime(2026, 11, 22, 20, tzinfo=UTC)  # files deleted: the alert can resolve
    # the fill is written: DataWriteBytes carries the 2,200 GB on top of the usual traffic
    fill = slice(158 * 60, 160 * 60)
    assert s.io["DataWriteBytes"][fill].sum() > 2200 * 10**9
    assert (s.io["DataReadOperations"] == (s.io["DataReadBytes"] + 2**19) // 2**20).all()


# ---- the seeded server ----


@pytest.fixture(scope="module")
def server(small, tmp_path_factory):
    with MotoServer(workdir=tmp_path_factory.mktemp("moto"), account_id=small.aws.account_id) as srv:
        assert srv.started_in < 30 and srv.rss_bytes() > 0
        yield srv


@pytest.fixture(scope="module")
def seeded(small, server):
    return seed(small, server.url)


def _client(service, url):
    return boto3.client(
        service,
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.mark.servers
def test_seed_result_and_env(seeded, server):
    assert seeded["endpoint_url"] == server.url and seeded["ce_window"] == ["2026-11-16", "2026-11-17"]
    assert seeded["datapoints"] == 6 * 60 * 7 and seeded["ce_answers"] == 3
    env = sandbox_env(seeded)
    assert env["AWS_ENDPOINT_URL"] == server.url and env["AWS_REGION"] == "us-east-1"
    assert env["FOXHUNT_CUR_S3_URI"] == "s3://foxhunt-billing/cur/foxhunt-cur2"
    assert env["FOXHUNT_FSX_IDS"] == seeded["fsx_ids"]["foxhunt-scratch"]
    assert env["AWS_ACCESS_KEY_ID"] == env["AWS_SECRET_ACCESS_KEY"] == "testing"


@pytest.mark.servers
def test_file_systems_with_tags(seeded, server):
    (fs,) = _client("fsx", server.url).describe_file_systems()["FileSystems"]
    assert fs["FileSystemId"] == seeded["fsx_ids"]["foxhunt-scratch"] and fs["FileSystemType"] == "LUSTRE"
    assert fs["StorageCapacity"] == 1200
    assert fs["LustreConfiguration"] == {"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 125}
    assert {t["Key"]: t["Value"] for t in fs["Tags"]} == {
        "Name": "foxhunt-scratch",
        "Project": "foxhunt-rl",
        "Environment": "training",
    }


@pytest.mark.servers
def test_cloudwatch_equals_truth(small, seeded, server):
    fs_id = seeded["fsx_ids"]["foxhunt-scratch"]
    start, end = datetime(2026, 11, 16, 2, tzinfo=UTC), datetime(2026, 11, 16, 3, tzinfo=UTC)
    asks = [
        ("FreeDataStorageCapacity", "Minimum"),
        ("FreeDataStorageCapacity", "Sum"),
        ("DataWriteBytes", "Sum"),
    ]
    queries = [
        {
            "Id": f"q{k}",
            "MetricStat": {
                "Metric": {
                    "Namespace": "AWS/FSx",
                    "MetricName": metric,
                    "Dimensions": [{"Name": "FileSystemId", "Value": fs_id}],
                },
                "Period": 60,
                "Stat": stat,
            },
        }
        for k, (metric, stat) in enumerate(asks)
    ]
    got = _client("cloudwatch", server.url).get_metric_data(
        MetricDataQueries=queries, StartTime=start, EndTime=end
    )
    for k, (metric, stat) in enumerate(asks):
        r = next(x for x in got["MetricDataResults"] if x["Id"] == f"q{k}")
        answer = sorted((int(t.timestamp()), v) for t, v in zip(r["Timestamps"], r["Values"]))
        want = [
            (int(t.timestamp()), v)
            for t, v in bills.fsx_statistic(small, "foxhunt-scratch", metric, stat, start, end)
        ]
        assert len(want) == 60 and answer == want, (metric, stat)
    free_min = bills.fsx_free_min(small, "foxhunt-scratch", start, end)
    assert free_min[0][1] > 500e9 > free_min[-1][1]  # the fill crosses fsx_low_space's threshold


@pytest.mark.servers
def test_cur_objects_and_manifest(small, seeded, server):
    s3 = _client("s3", server.url)
    data_key, manifest_key = cur_keys("2026-11")
    assert seeded["cur_keys"] == [data_key, manifest_key]  # the manifest is written last
    heads = {k: s3.head_object(Bucket=CUR_BUCKET, Key=k)["LastModified"] for k in (data_key, manifest_key)}
    assert heads[manifest_key] >= heads[data_key]
    manifest = json.loads(s3.get_object(Bucket=CUR_BUCKET, Key=manifest_key)["Body"].read())
    assert manifest["dataFiles"] == [f"s3://{CUR_BUCKET}/{data_key}"]
    assert manifest["billingPeriod"] == {
        "start": "2026-11-01T00:00:00.000Z",
        "end": "2026-12-01T00:00:00.000Z",
    }
    assert [c["name"] for c in manifest["columns"]] == CUR_SCHEMA.names
    assert manifest["executionId"] and manifest["exportArn"].startswith("arn:aws:bcm-data-exports:")
    body = s3.get_object(Bucket=CUR_BUCKET, Key=data_key)["Body"].read()
    assert pq.ParquetFile(io.BytesIO(body)).metadata.row_group(0).column(0).compression == "SNAPPY"
    table = pq.read_table(io.BytesIO(body))
    assert table.schema.equals(CUR_SCHEMA)
    rows = table.to_pylist()
    items = bills.line_items(small, fsx_ids=seeded["fsx_ids"])
    assert len(rows) == len(items)
    assert abs(Decimal(sum(r["line_item_unblended_cost"] for r in rows)) - sum(i.cost for i in items)) < CENT
    tags = {r["line_item_resource_id"]: dict(r["resource_tags"]) for r in rows}
    assert tags["arn:aws:eks:us-east-1:123456789012:cluster/foxhunt-eks"] == {}
    assert tags["foxhunt-ckpt-dqn-atari"] == {
        "user_project": "foxhunt-rl",
        "user_environment": "training",
        "user_experiment": "dqn-atari",
    }
    fsx_arn = f"arn:aws:fsx:us-east-1:123456789012:file-system/{seeded['fsx_ids']['foxhunt-scratch']}"
    assert fsx_arn in tags
    ec2 = [r for r in rows if r["line_item_product_code"] == "AmazonEC2"]
    assert all(
        r["product_instance_type"] == "p4de.24xlarge" and r["line_item_operation"] == "RunInstances"
        for r in ec2
    )
    assert sum(r["line_item_usage_amount"] for r in ec2) == 6 + 4 + 6  # node 2 lost 2 of its 6 hours
    tagging = s3.get_bucket_tagging(Bucket="foxhunt-ckpt-dqn-atari")["TagSet"]
    assert {"Key": "Experiment", "Value": "dqn-atari"} in tagging


@pytest.mark.servers
def test_budget(small, seeded, server):
    want = bills.budget_truth(small)
    got = _client("budgets", server.url).describe_budget(
        AccountId="123456789012", BudgetName=seeded["budget_name"]
    )
    b = got["Budget"]
    assert (b["BudgetType"], b["TimeUnit"]) == ("COST", "MONTHLY")
    assert Decimal(b["BudgetLimit"]["Amount"]) == Decimal(10000)
    assert abs(Decimal(b["CalculatedSpend"]["ActualSpend"]["Amount"]) - want.actual_usd) < Decimal("1e-9")
    assert abs(Decimal(b["CalculatedSpend"]["ForecastedSpend"]["Amount"]) - want.forecast_usd) < Decimal(
        "1e-9"
    )
    assert b["TimePeriod"]["Start"] == datetime(2026, 11, 1, tzinfo=UTC)
    (n,) = _client("budgets", server.url).describe_notifications_for_budget(
        AccountId="123456789012", BudgetName=seeded["budget_name"]
    )["Notifications"]
    assert (n["NotificationType"], n["Threshold"]) == ("ACTUAL", 80.0)


def _ask(ce, start, end, group_by, pair=None, token=None):
    kwargs = {
        "TimePeriod": {"Start": start, "End": end},
        "Granularity": "DAILY",
        "Metrics": ["UnblendedCost", "AmortizedCost", "UsageQuantity"],
        "GroupBy": [{"Type": t, "Key": k} for t, k in group_by],
    }
    if pair is not None:
        kwargs["Filter"] = {
            "And": [
                {"Tags": {"Key": k, "Values": [v]} if v else {"Key": k, "MatchOptions": ["ABSENT"]}}
                for k, v in zip(("Project", "Environment"), pair)
            ]
        }
    if token:
        kwargs["NextPageToken"] = token
    r = ce.get_cost_and_usage(**kwargs)
    r.pop("ResponseMetadata")
    return r


def _chain(ce, start, end, group_by, pair=None) -> list[dict]:
    pages, token = [], None
    while True:
        pages.append(_ask(ce, start, end, group_by, pair, token))
        token = pages[-1].get("NextPageToken")
        if not token:
            return pages


DISCOVERY = [("TAG", "Project"), ("TAG", "Environment")]
DETAIL = [("TAG", "Experiment"), ("DIMENSION", "SERVICE")]


@pytest.mark.servers
def test_cost_explorer_answers_in_protocol_order(small, seeded, server):
    ce = _client("ce", server.url)
    items = bills.line_items(small, fsx_ids=seeded["fsx_ids"])
    want = bills.ce_results(small, date(2026, 11, 16), date(2026, 11, 17), items=items)
    got = _chain(ce, "2026-11-16", "2026-11-17", DISCOVERY)
    pairs = sorted(
        {
            tuple(k.split("$", 1)[1] for k in g["Keys"])
            for p in got
            for t in p["ResultsByTime"]
            for g in t["Groups"]
        }
    )
    assert pairs == [("", ""), ("foxhunt-rl", "training")]
    for pair in pairs:
        got += _chain(ce, "2026-11-16", "2026-11-17", DETAIL, pair)
    assert got == want
    assert _ask(ce, "2026-11-16", "2026-11-17", DISCOVERY) == want[0]  # a repeated body: the same answer
    # a two-day window (the second day is empty): paged one day per answer
    start, end = date(2026, 11, 16), date(2026, 11, 18)
    assert queue_cost_explorer(server.url, small, start, end, items=items) == 2 + 2 * 2
    got = _chain(ce, "2026-11-16", "2026-11-18", DISCOVERY)
    assert len(got) == 2 and got[1]["ResultsByTime"][0]["Groups"] == []
    for pair in pairs:
        got += _chain(ce, "2026-11-16", "2026-11-18", DETAIL, pair)
    assert got == bills.ce_results(small, start, end, items=items)
    total = _amounts(got[2:], {"2026-11-16"})
    assert abs(total - sum(i.cost for i in items)) < CENT


# ---- up / down / status ----


@pytest.mark.servers
def test_up_status_down_leave_nothing(tmp_path):
    other = tmp_path / "run" / "prometheus.log"  # another server's file in the shared run dir
    other.parent.mkdir(parents=True)
    other.write_text("keep me")
    state = up_moto("small", tmp_path)
    pid = state["pid"]
    try:
        assert alive(pid) and moto_status(tmp_path) == state
        assert json.loads((tmp_path / "moto.json").read_text())["pid"] == pid
        assert Path(state["log"]) == tmp_path / "run" / "moto.log" and Path(state["log"]).exists()
        assert state["fsx_ids"] and state["started_in"] < 30 and state["rss_bytes"] > 0
        fs = _client("fsx", state["url"]).describe_file_systems()["FileSystems"]
        assert [f["FileSystemId"] for f in fs] == list(state["fsx_ids"].values())
    finally:
        down_moto(tmp_path)
    assert not alive(pid) and not Path(f"/proc/{pid}").exists()
    assert moto_status(tmp_path) is None and not (tmp_path / "moto.json").exists()
    assert not (tmp_path / "run" / "moto.log").exists() and other.read_text() == "keep me"
    down_moto(tmp_path)  # fine when nothing runs
