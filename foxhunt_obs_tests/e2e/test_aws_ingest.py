"""FSx metrics and costs end to end: the `small` scenario in a real Prometheus and a real moto server,
real Dagster runs, the lake compared with the scenario's ground truth (sandbox/writers/bills.py)."""

import json
import os
import urllib.request
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import boto3
import dagster as dg
import pandas as pd
import pytest

from foxhunt_obs.definitions import defs
from foxhunt_obs.lib.analysis.prices import load_price_table
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.schemas import BUDGETS, COSTS_DAILY, COSTS_HOURLY, FSX_METRICS
from foxhunt_obs.sandbox.servers.moto_server import CUR_URI, MotoServer, cur_keys, sandbox_env, seed
from foxhunt_obs.sandbox.writers import bills

DAY = "2026-11-16"  # the small scenario: 2026-11-16T00:00..06:00Z
HOURS = ("2026-11-16-00:00", "2026-11-16-05:00")
CENT = 0.005

pytestmark = pytest.mark.timeout(300)


def run(job: str, first: str, last: str) -> dg.ExecuteInProcessResult:
    tags = {"dagster/asset_partition_range_start": first, "dagster/asset_partition_range_end": last}
    return (
        defs()
        .resolve_job_def(job)
        .execute_in_process(instance=dg.DagsterInstance.ephemeral(), tags=tags, raise_on_error=False)
    )


def failure(result) -> str:
    return "\n".join(e.step_failure_data.error.message for e in result.all_events if e.is_step_failure)


def metadata(result, key: str) -> dict:
    (m,) = [e for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == key]
    return {k: v.value for k, v in m.materialization.metadata.items()}


def checks(result) -> dict[str, bool]:
    return {
        e.asset_check_evaluation_data.check_name: e.asset_check_evaluation_data.passed
        for e in result.all_events
        if e.event_type_value == "ASSET_CHECK_EVALUATION"
    }


@pytest.fixture(scope="module")
def aws(small, tmp_path_factory):
    with MotoServer(workdir=tmp_path_factory.mktemp("moto"), account_id=small.aws.account_id) as server:
        yield server, seed(small, server.url)


@pytest.fixture(scope="module")
def env(prometheus, aws, tmp_path_factory):
    server, state = aws
    values = {
        "FOXHUNT_LAKE": str(tmp_path_factory.mktemp("lake")),
        "FOXHUNT_PROMETHEUS_URL": prometheus.url,
        **sandbox_env(state),
    }
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    yield values
    for k, v in saved.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture(scope="module")
def ingested(env):
    """node_samples (the estimate's node-hours), fsx_metrics and the costs of the scenario's day."""
    for job, first, last in [
        ("gpu_ingest_job", *HOURS),
        ("fsx_ingest_job", *HOURS),
        ("costs_job", DAY, DAY),
    ]:
        result = run(job, first, last)
        assert result.success, failure(result)
    return Lake(env["FOXHUNT_LAKE"]), result


def test_fsx_metrics_equal_the_ground_truth(small, aws, ingested):
    lake, _ = ingested
    _, state = aws
    ((name, fs_id),) = state["fsx_ids"].items()
    got = lake.query(
        "SELECT * FROM fsx_metrics ORDER BY metric, statistic, ts", tables=[FSX_METRICS]
    ).to_pandas()
    assert set(got.file_system_id) == {fs_id} and set(got.file_system_name) == {name}
    start, end = small.start, small.end
    for (metric, stat), rows in got.groupby(["metric", "statistic"]):
        truth = bills.fsx_statistic(small, name, metric, stat, start, end)
        assert [pd.Timestamp(t) for t, _ in truth] == list(rows.ts), (metric, stat)
        assert list(rows.value) == [v for _, v in truth], (metric, stat)
        if metric.endswith(("Bytes", "Operations")):
            assert list(rows.per_second) == pytest.approx([v / 60 for _, v in truth])
        else:
            assert rows.per_second.isna().all()
    assert len(got.groupby(["metric", "statistic"])) == 7 and len(got) == 7 * 6 * 60
    # the fullest disk is what fills first: the minimum of Minimum is below fsx_low_space's 500 GB threshold
    low = got[(got.metric == "FreeDataStorageCapacity") & (got.statistic == "Minimum")].value.min()
    assert low == min(v for _, v in bills.fsx_free_min(small, name, start, end)) and low < 500e9


def test_cur_and_cost_explorer_equal_the_scenario_to_the_cent(small, ingested):
    lake, result = ingested
    day = date.fromisoformat(DAY)
    truth = bills.daily_costs(small, day)
    rows = lake.read_partition(COSTS_DAILY, DAY).to_pandas()
    for source in ("cur", "ce"):
        got = (
            rows[rows.source == source]
            .groupby(["project", "environment", "experiment", "service"])
            .cost_usd.sum()
        )
        assert set(got.index) == set(truth), source
        for key, usd in truth.items():
            assert abs(got[key] - float(usd)) < CENT, (source, key, got[key], usd)
    totals = bills.daily_totals(small, day)
    for source in ("cur", "ce"):
        assert abs(rows[rows.source == source].cost_usd.sum() - float(totals[source])) < CENT
    # the untagged EKS control plane stays untagged; S3 checkpoint buckets carry their experiment
    cur = rows[rows.source == "cur"]
    assert (cur[cur.service == "AmazonEKS"][["project", "environment", "experiment"]] == "").all().all()
    assert set(cur[cur.service == "AmazonS3"].experiment) == {"ppo-humanoid", "dqn-atari"}
    table = load_price_table("us-east-1")
    current = table.age_days(datetime.now(timezone.utc).date()) <= table.max_age_days
    assert checks(result) == {"no_double_counting": True, "price_table_current": current}
    assert metadata(result, "costs_daily")["cost_explorer_calls"] == 1 + len({(p, e) for p, e, _, _ in truth})


def test_costs_hourly_holds_every_line_item_with_normalised_tags(small, ingested):
    lake, _ = ingested
    got = lake.read_partition(COSTS_HOURLY, DAY).to_pandas()
    items = [i for i in bills.line_items(small, fsx_ids=None) if i.day == date.fromisoformat(DAY)]
    assert len(got) == len(items)
    assert abs(got.cost_usd.sum() - float(sum(i.cost for i in items))) < 1e-6
    tagged = got[got.project != ""]
    assert set(tagged.project) == {"foxhunt-rl"} and set(tagged.environment) == {"training"}
    assert all(json.loads(t).get("project") == "foxhunt-rl" for t in tagged.tags)
    assert set(got.billing_period) == {"2026-11"} and (got.amortized_usd == got.cost_usd).all()


def test_estimate_equals_the_bill_within_a_tenth_of_a_percent(small, ingested):
    """Price table × node-hours from node_samples (and FSx storage) against the CUR lines it covers;
    the small scenario loses a node for 2 hours, billed by neither."""
    lake, _ = ingested
    rows = lake.read_partition(COSTS_DAILY, DAY).to_pandas()
    covered = rows[rows.service.isin(["AmazonEC2", "AmazonFSx"])]
    estimate = covered[covered.source == "estimate"].cost_usd.sum()
    bill = covered[covered.source == "cur"].cost_usd.sum()
    assert bill == pytest.approx(float(bills.daily_totals(small, date.fromisoformat(DAY))["estimate"]))
    assert abs(estimate / bill - 1) < 0.001, (estimate, bill)
    ec2 = rows[(rows.source == "estimate") & (rows.service == "AmazonEC2")]
    assert sorted(ec2.resource_id) == sorted(n.name for n in small.nodes)
    assert ec2.usage_quantity.sum() < 6 * len(small.nodes)  # the lost node's hours are not estimated


def test_budget_as_aws_reports_it(small, ingested):
    lake, _ = ingested
    (row,) = lake.read_partition(BUDGETS, DAY).to_pylist()
    truth = bills.budget_truth(small)
    assert row["source"] == "budgets" and row["budget_name"] == truth.name
    assert row["limit_usd"] == float(truth.limit_usd)
    assert row["actual_usd"] == pytest.approx(float(truth.actual_usd), abs=CENT)
    assert row["forecast_usd"] == pytest.approx(float(truth.forecast_usd), abs=CENT)


def test_a_rerun_gives_identical_rows(ingested):
    lake, _ = ingested
    before = {t: lake.read_partition(t, DAY) for t in (COSTS_DAILY, COSTS_HOURLY)}
    result = run("costs_job", DAY, DAY)
    assert result.success, failure(result)
    for spec, table in before.items():
        assert lake.read_partition(spec, DAY).equals(table), spec.name


def test_restated_days_replace_and_a_missing_manifest_is_not_ingested(small, aws, env, ingested, monkeypatch):
    """Cost Explorer restates the day (amounts +10 %, Estimated) and the CUR manifest is gone: a re-run
    replaces the day's ce rows (never adds to them) and ingests no CUR."""
    lake, _ = ingested
    server, _ = aws
    urllib.request.urlopen(urllib.request.Request(f"{server.url}/moto-api/reset", method="POST"), timeout=30)
    original = bills.ce_results

    def restated(*args, **kwargs):
        out = original(*args, **kwargs)
        for answer in out:
            for day in answer["ResultsByTime"]:
                day["Estimated"] = True
                for group in day["Groups"]:
                    for m in group["Metrics"].values():
                        m["Amount"] = str((Decimal(m["Amount"]) * Decimal("1.1")).quantize(Decimal("1e-10")))
        return out

    monkeypatch.setattr(bills, "ce_results", restated)
    state = seed(small, server.url)
    monkeypatch.setenv("FOXHUNT_FSX_IDS", ",".join(state["fsx_ids"].values()))
    s3 = boto3.client("s3", endpoint_url=server.url, region_name="us-east-1")
    bucket = CUR_URI.removeprefix("s3://").split("/")[0]
    s3.delete_object(Bucket=bucket, Key=cur_keys("2026-11")[1])  # the export is "still being delivered"
    before = lake.read_partition(COSTS_DAILY, DAY).to_pandas()

    result = run("costs_job", DAY, DAY)
    assert result.success, failure(result)
    after = lake.read_partition(COSTS_DAILY, DAY).to_pandas()
    ce_before, ce_after = before[before.source == "ce"], after[after.source == "ce"]
    assert len(ce_after) == len(ce_before) and ce_after.estimated.all()
    assert ce_after.cost_usd.sum() == pytest.approx(1.1 * ce_before.cost_usd.sum(), abs=CENT)
    assert "cur" not in set(after.source) and lake.read_partition(COSTS_HOURLY, DAY).num_rows == 0
    assert metadata(result, "costs_hourly")["billing_periods_without_manifest"] == "2026-11"

    # node-hours are unchanged (the reset gave the file system a new id, so compare the nodes only)
    def nodes(rows):
        return rows[(rows.source == "estimate") & (rows.service == "AmazonEC2")].reset_index(drop=True)

    pd.testing.assert_frame_equal(nodes(after), nodes(before))


def test_a_dead_endpoint_names_the_source_and_partition(env, ingested, monkeypatch):
    lake, _ = ingested
    before = lake.read_partition(FSX_METRICS, "2026-11-16T03")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # discard port: connection refused
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    started = datetime.now(timezone.utc)
    result = run("fsx_ingest_job", "2026-11-16-03:00", "2026-11-16-03:00")
    assert not result.success
    message = failure(result)
    assert "127.0.0.1:9" in message and ("FSx" in message or "fsx" in message), message
    assert "testing" not in message  # no credentials in messages
    assert lake.read_partition(FSX_METRICS, "2026-11-16T03").equals(before)
    assert datetime.now(timezone.utc) - started < timedelta(seconds=90)


def test_the_demo_summary_shows_costs_gap_and_free_space(small, ingested):
    """The printed figures are the lake's (whichever test ran before: one restates the day)."""
    from foxhunt_obs.cli.summaries import costs_summary

    lake, _ = ingested
    text = costs_summary(DAY)
    rows = lake.read_partition(COSTS_DAILY, DAY).to_pandas()
    untagged = rows[rows.project == ""]

    def usd(source: str) -> str:
        part = untagged[untagged.source == source]
        return f"{part.cost_usd.sum():.2f}" if len(part) else "NaN"

    (line,) = [x.split() for x in text.splitlines() if x.strip().startswith("(untagged)")]
    assert line == ["(untagged)", usd("cur"), usd("ce")]
    for name in ("ppo-humanoid", "dqn-atari", "AmazonEC2", "AmazonFSx", "foxhunt-scratch"):
        assert name in text
    low = min(v for _, v in bills.fsx_free_sum(small, "foxhunt-scratch", small.start, small.end))
    assert f"{low / 1e9:.1f}" in text


def test_cur_tag_keys_as_aws_writes_them_and_an_unmatched_key_is_named(
    small, aws, env, ingested, monkeypatch
):
    """End to end: the scenario's CUR 2.0 export rewritten with a camelCase cost-allocation tag
    (CostCenter: CUR 2.0 writes user_cost_center) in a real moto S3, ingested by a real Dagster run with
    FOXHUNT_COST_TAGS=CostCenter,...; then a key that matches nothing is named in the run's metadata."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    server, state = aws
    s3 = boto3.client("s3", endpoint_url=state["endpoint_url"], region_name=state["region"])
    bucket, root = CUR_URI[5:].split("/", 1)
    camel = root + "-camel"
    period = DAY[:7]
    data_key, manifest_key = cur_keys(period)
    table = pq.read_table(io.BytesIO(s3.get_object(Bucket=bucket, Key=data_key)["Body"].read()))
    tags = [
        [("user_cost_center" if k == "user_project" else k, v) for k, v in row or []]
        for row in table.column("resource_tags").to_pylist()
    ]
    table = table.set_column(
        table.schema.get_field_index("resource_tags"),
        "resource_tags",
        pa.array(tags, table.schema.field("resource_tags").type),
    )
    out = io.BytesIO()
    pq.write_table(table, out)
    new_data = data_key.replace(root, camel, 1)
    s3.put_object(Bucket=bucket, Key=new_data, Body=out.getvalue())
    # a manifest of its own (an earlier test deletes the scenario's): dataFiles is the field it needs
    manifest = {"executionId": "camel-1", "billingPeriod": {"start": f"{period}-01T00:00:00.000Z"}}
    manifest["dataFiles"] = [f"s3://{bucket}/{new_data}"]
    s3.put_object(Bucket=bucket, Key=manifest_key.replace(root, camel, 1), Body=json.dumps(manifest).encode())

    def costs_hourly(tag_keys: str) -> dg.ExecuteInProcessResult:
        monkeypatch.setenv("FOXHUNT_CUR_S3_URI", f"s3://{bucket}/{camel}")
        monkeypatch.setenv("FOXHUNT_COST_TAGS", tag_keys)
        monkeypatch.setenv("FOXHUNT_LAKE", str(Path(env["FOXHUNT_LAKE"]) / f"camel-{tag_keys[:10]}"))
        job = defs().get_implicit_global_asset_job_def()
        result = job.execute_in_process(
            instance=dg.DagsterInstance.ephemeral(), partition_key=DAY,
            asset_selection=[dg.AssetKey("costs_hourly")], raise_on_error=False,
        )  # fmt: skip
        assert result.success, failure(result)
        return result

    result = costs_hourly("CostCenter,Environment,Experiment")
    lake = Lake(os.environ["FOXHUNT_LAKE"])
    rows = lake.read_partition(COSTS_HOURLY, DAY).to_pandas()
    tagged = rows[rows["environment"] == "training"]
    assert len(tagged) and set(tagged["project"]) == {
        "foxhunt-rl"
    }  # the cost center's value, from user_cost_center
    assert metadata(result, "costs_hourly")["unmatched_tag_keys"] == {}

    result = costs_hourly("CostCentre,Environment,Experiment")  # spelled as in no tag
    assert metadata(result, "costs_hourly")["unmatched_tag_keys"] == {"CostCentre": [period]}
