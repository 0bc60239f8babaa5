"""A real moto server holding a scenario's AWS story (docs/design.md#the-sandbox).

``MotoServer`` runs the venv's ``moto_server`` console script on 127.0.0.1 in its own process group (like
``MlflowServer``); ``seed`` writes ``bills.py``'s truth into it: the FSx file systems (moto makes their
ids), their CloudWatch datapoints, CUR 2.0 Parquet plus a manifest per billing period in S3, the budget,
and Cost Explorer's answers for the demo's window (moto answers ``get_cost_and_usage`` only from a queue).
``up_moto``/``down_moto``/``moto_status`` keep one detached server per state directory for the demo and
the CLI; ``sandbox_env`` is the environment a pipeline needs to run against it.

What moto 5.2.1 does with it (measured here, 2 cores):

* CloudWatch matches a query's dimensions against the put ones as a whole, ignores the namespace when
  dimensions are given, and has no pagination. ``get_metric_data`` scans every datapoint of the window
  once per period and query, so ask for an hour at a time (default scenario: an hour, 7 queries at a 60 s
  period ~50 ms; a whole day, ONE query at 60 s ~1 s).
* ``put_metric_data`` costs ~60 µs a datapoint on the server, so seeding is about the datapoint count
  (default: 70,560 datapoints in 60,480 items, the OSTs' free space sharing one item a minute → 4-6 s of
  the 5-6 s seed; small: 2,520 → 1.5 s). boto3 gzips big PutMetricData bodies, which moto fails to read:
  the seeding client turns request compression off.
* Start: ~0.6 s to ready, ~54 MB RSS; ~95 MB seeded with small, ~140 MB with default.
* Cost Explorer answers each new request body with the next queued result and a repeated body with the
  same one, so the queue's order is the contract with the source (``bills.ce_results``).
* Budgets stores the Budget as sent, CalculatedSpend included, and returns it as it is.
* The account is ``MOTO_ACCOUNT_ID`` in the server's environment (``MotoServer(account_id=...)``), else
  moto's default 123456789012; the CE queue names its account in the request.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from foxhunt_obs.lib.sources.aws import cur_tag_key
from foxhunt_obs.sandbox.servers.local_server import (
    LocalServer,
    SandboxError,
    alive,
    http_ok,
    kill_group,
    read_state,
)
from foxhunt_obs.sandbox.story.scenario import Scenario, load_scenario
from foxhunt_obs.sandbox.writers import bills

STATE_FILE = "moto.json"
DUMMY_KEY = "testing"  # moto accepts any credentials; boto3 needs some
CUR_BUCKET = "foxhunt-billing"
CUR_PREFIX = "cur"
EXPORT_NAME = "foxhunt-cur2"
CUR_URI = f"s3://{CUR_BUCKET}/{CUR_PREFIX}/{EXPORT_NAME}"
SUBNET = "subnet-0f0c5a1d0e0b00001"  # FSx wants one; moto does not check it exists
BUDGET_OPEN_END = datetime(2087, 6, 15, tzinfo=timezone.utc)  # what AWS sets on a budget without an end
PUT_BATCH = 1000  # MetricData items per put_metric_data (the API's limit)


def moto_script() -> Path:
    """The ``moto_server`` console script of the running interpreter's environment."""
    script = Path(sys.executable).parent / "moto_server"
    if not script.exists():
        raise SandboxError(
            f"no {script}: the sandbox's AWS stand-in needs moto[server] (pip install -e '.[dev]', "
            "which `make demo` does)"
        )
    return script


class MotoServer(LocalServer):
    """``moto_server -H 127.0.0.1 -p PORT`` in its own process group, logging to ``workdir/moto.log``.
    ``account_id`` (MOTO_ACCOUNT_ID) is the account every request acts in; None: moto's default."""

    label = "moto server"
    log_name = "moto.log"

    def __init__(self, port: int = 0, workdir: Path | None = None, account_id: str | None = None):
        super().__init__(port, workdir)
        self.account_id = account_id

    def command(self) -> list[str]:
        # moto's server, with the sandbox's EC2 instance ids (moto_main.py)
        return [sys.executable, "-m", "foxhunt_obs.sandbox.servers.moto_main", "-H", "127.0.0.1", "-p", str(self.port)]

    def prepare(self) -> None:
        moto_script()  # a clear error when moto[server] is not installed

    def env(self) -> dict[str, str]:
        return {**os.environ, "MOTO_ACCOUNT_ID": self.account_id} if self.account_id else dict(os.environ)

    def ready(self, timeout: float) -> bool:
        return http_ok(f"{self.url}/moto-api/", timeout)


# ---- seeding ----


def _client(service: str, endpoint_url: str, region: str, **config):
    import boto3
    from botocore.config import Config

    session = boto3.session.Session(
        aws_access_key_id=DUMMY_KEY, aws_secret_access_key=DUMMY_KEY, region_name=region
    )
    cfg = Config(retries={"mode": "standard", "total_max_attempts": 3}, **config)
    return session.client(service, endpoint_url=endpoint_url, config=cfg)


CUR_COLUMNS = (
    ("bill_billing_period_start_date", pa.timestamp("ms", tz="UTC"), "timestamp"),
    ("line_item_usage_account_id", pa.string(), "string"),
    ("line_item_line_item_type", pa.string(), "string"),
    ("line_item_usage_start_date", pa.timestamp("ms", tz="UTC"), "timestamp"),
    ("line_item_usage_end_date", pa.timestamp("ms", tz="UTC"), "timestamp"),
    ("line_item_product_code", pa.string(), "string"),
    ("line_item_usage_type", pa.string(), "string"),
    ("line_item_operation", pa.string(), "string"),
    ("line_item_resource_id", pa.string(), "string"),
    ("line_item_usage_amount", pa.float64(), "double"),
    ("line_item_unblended_cost", pa.float64(), "double"),
    ("reservation_effective_cost", pa.float64(), "double"),
    ("savings_plan_savings_plan_effective_cost", pa.float64(), "double"),
    ("product_instance_type", pa.string(), "string"),
    ("resource_tags", pa.map_(pa.string(), pa.string()), "map<string,string>"),
)
CUR_SCHEMA = pa.schema([(name, typ) for name, typ, _ in CUR_COLUMNS])


def _month_start(t: datetime) -> datetime:
    return datetime(t.year, t.month, 1, tzinfo=timezone.utc)


def _next_month(t: datetime) -> datetime:
    return datetime(t.year + t.month // 12, t.month % 12 + 1, 1, tzinfo=timezone.utc)


def cur_table(items: list[bills.LineItem], account_id: str) -> pa.Table:
    """CUR 2.0 rows for line items (one billing period's, usually)."""
    cols = {
        "bill_billing_period_start_date": [_month_start(i.hour) for i in items],
        "line_item_usage_account_id": [account_id] * len(items),
        "line_item_line_item_type": ["Usage"] * len(items),
        "line_item_usage_start_date": [i.hour for i in items],
        "line_item_usage_end_date": [i.end for i in items],
        "line_item_product_code": [i.service for i in items],
        "line_item_usage_type": [i.usage_type for i in items],
        "line_item_operation": [i.operation for i in items],
        "line_item_resource_id": [i.resource_id for i in items],
        "line_item_usage_amount": [float(i.usage_amount) for i in items],
        "line_item_unblended_cost": [float(i.cost) for i in items],
        "reservation_effective_cost": [0.0] * len(items),
        "savings_plan_savings_plan_effective_cost": [0.0] * len(items),
        "product_instance_type": [i.instance_type or None for i in items],
        "resource_tags": [[(cur_tag_key(k), v) for k, v in sorted(i.tags.items())] for i in items],
    }
    return pa.table(cols, schema=CUR_SCHEMA)


def cur_keys(period: str) -> tuple[str, str]:
    """(data file key, manifest key) of one billing period (YYYY-MM) under the CUR bucket."""
    root = f"{CUR_PREFIX}/{EXPORT_NAME}"
    return (
        f"{root}/data/BILLING_PERIOD={period}/{EXPORT_NAME}-00001.snappy.parquet",
        f"{root}/metadata/BILLING_PERIOD={period}/{EXPORT_NAME}-Manifest.json",
    )


def _manifest(scenario: Scenario, period_start: datetime, data_uris: list[str]) -> dict:
    aws = scenario.aws
    ident = uuid.uuid5(uuid.NAMESPACE_URL, f"{scenario.fingerprint()}/{period_start:%Y-%m}")
    export_id = uuid.uuid5(uuid.NAMESPACE_URL, f"{aws.account_id}/{EXPORT_NAME}")
    return {
        "executionId": str(ident),
        "exportArn": f"arn:aws:bcm-data-exports:us-east-1:{aws.account_id}:export/{EXPORT_NAME}-{export_id}",
        "exportName": EXPORT_NAME,
        "billingPeriod": {
            "start": period_start.strftime("%Y-%m-%dT%H:%M:%S.000Z"),
            "end": _next_month(period_start).strftime("%Y-%m-%dT%H:%M:%S.000Z"),
        },
        "bucket": CUR_BUCKET,
        "dataFiles": data_uris,
        "columns": [{"name": name, "type": t} for name, _, t in CUR_COLUMNS],
    }


def _put_fsx(scenario: Scenario, endpoint_url: str) -> tuple[dict[str, str], int]:
    """Create the file systems and put their datapoints; (name → FileSystemId, datapoints put)."""
    aws = scenario.aws
    fsx = _client("fsx", endpoint_url, aws.region)
    ids: dict[str, str] = {}
    for fs in aws.fsx:
        lustre: dict = {"DeploymentType": fs.deployment_type}
        if fs.deployment_type.startswith("PERSISTENT"):
            lustre["PerUnitStorageThroughput"] = fs.throughput_mb_per_tib
        tags = [{"Key": "Name", "Value": fs.name}] + [{"Key": k, "Value": v} for k, v in aws.tags]
        made = fsx.create_file_system(
            FileSystemType="LUSTRE",
            StorageCapacity=fs.storage_gib,
            StorageType="SSD",
            SubnetIds=[SUBNET],
            Tags=tags,
            LustreConfiguration=lustre,
        )
        ids[fs.name] = made["FileSystem"]["FileSystemId"]
    # compression off: moto cannot read boto3's gzipped PutMetricData; validation off: ~30 % faster
    cw = _client(
        "cloudwatch", endpoint_url, aws.region, disable_request_compression=True, parameter_validation=False
    )
    batches, count = [], 0
    for name, s in bills.fsx_datapoints(scenario).items():
        dims = [{"Name": "FileSystemId", "Value": ids[name]}]
        stamps = [scenario.start + timedelta(minutes=m) for m in range(s.minutes)]
        io_values = {metric: v.astype(float).tolist() for metric, v in s.io.items()}
        free_values = s.free.astype(float).tolist()
        data = []
        for m, ts in enumerate(stamps):
            for metric, values in io_values.items():
                data.append(
                    {
                        "MetricName": metric,
                        "Dimensions": dims,
                        "Timestamp": ts,
                        "Value": values[m],
                        "Unit": bills.UNITS[metric],
                    }
                )
            # one value per OST at the same minute: CloudWatch's Minimum is the fullest OST, Sum the total
            free = free_values[m]
            data.append(
                {
                    "MetricName": bills.FREE,
                    "Dimensions": dims,
                    "Timestamp": ts,
                    "Values": free,
                    "Counts": [1.0] * len(free),
                    "Unit": bills.UNITS[bills.FREE],
                }
            )
        count += s.datapoints
        batches += [data[i : i + PUT_BATCH] for i in range(0, len(data), PUT_BATCH)]

    def put(batch: list[dict]) -> None:
        cw.put_metric_data(Namespace="AWS/FSx", MetricData=batch)

    # two in flight: one serialised here while moto parses the other
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(put, batches))
    return ids, count


def _put_cur(scenario: Scenario, endpoint_url: str, items: list[bills.LineItem]) -> list[str]:
    """CUR 2.0 data files, then each period's manifest (a reader that sees a manifest finds its data)."""
    aws = scenario.aws
    s3 = _client("s3", endpoint_url, aws.region)
    s3.create_bucket(Bucket=CUR_BUCKET)
    written = []
    periods = sorted({i.billing_period for i in items})
    for period in periods:
        rows = [i for i in items if i.billing_period == period]
        buf = io.BytesIO()
        pq.write_table(cur_table(rows, aws.account_id), buf, compression="snappy")
        data_key, manifest_key = cur_keys(period)
        s3.put_object(Bucket=CUR_BUCKET, Key=data_key, Body=buf.getvalue())
        written.append(data_key)
        manifest = _manifest(scenario, _month_start(rows[0].hour), [f"s3://{CUR_BUCKET}/{data_key}"])
        s3.put_object(
            Bucket=CUR_BUCKET,
            Key=manifest_key,
            Body=json.dumps(manifest, indent=2).encode(),
            ContentType="application/json",
        )
        written.append(manifest_key)
    for b in aws.s3_buckets:  # the checkpoint buckets themselves, tagged as billed
        s3.create_bucket(Bucket=b.name)
        tags = {**aws.default_tags, "Experiment": b.experiment}
        s3.put_bucket_tagging(
            Bucket=b.name, Tagging={"TagSet": [{"Key": k, "Value": v} for k, v in sorted(tags.items())]}
        )
    return written


def _amount(x: Decimal) -> str:
    return str(x.quantize(bills.CE_PLACES))


def _put_budget(scenario: Scenario, endpoint_url: str, items: list[bills.LineItem]) -> str | None:
    aws = scenario.aws
    if aws.budget is None:
        return None
    truth = bills.budget_truth(scenario, items)
    budgets = _client("budgets", endpoint_url, aws.region)
    notifications = []
    if truth.alert_pct is not None:
        notifications.append(
            {
                "Notification": {
                    "NotificationType": "ACTUAL",
                    "ComparisonOperator": "GREATER_THAN",
                    "Threshold": truth.alert_pct,
                    "ThresholdType": "PERCENTAGE",
                },
                "Subscribers": [{"SubscriptionType": "EMAIL", "Address": "finops@example.com"}],
            }
        )
    budgets.create_budget(
        AccountId=aws.account_id,
        Budget={
            "BudgetName": truth.name,
            "BudgetLimit": {"Amount": str(truth.limit_usd), "Unit": "USD"},
            "TimeUnit": "MONTHLY",
            "BudgetType": "COST",
            "TimePeriod": {"Start": truth.period_start, "End": BUDGET_OPEN_END},
            "CalculatedSpend": {
                "ActualSpend": {"Amount": _amount(truth.actual_usd), "Unit": "USD"},
                "ForecastedSpend": {"Amount": _amount(truth.forecast_usd), "Unit": "USD"},
            },
        },
        NotificationsWithSubscribers=notifications,
    )
    return truth.name


def queue_cost_explorer(
    endpoint_url: str,
    scenario: Scenario,
    start_day: date,
    end_day: date,
    items: list[bills.LineItem] | None = None,
) -> int:
    """Queue Cost Explorer's answers to one ``CostExplorerSource.daily_costs(start_day, end_day)`` call
    (end exclusive) at moto's static-result endpoint; returns how many. Queue a window again for each
    call that asks for it with new request bodies."""
    results = bills.ce_results(scenario, start_day, end_day, items=items)
    body = json.dumps({"results": results, "account_id": scenario.aws.account_id}).encode()
    req = urllib.request.Request(
        f"{endpoint_url}/moto-api/static/ce/cost-and-usage-results",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        if r.status != 201:
            raise SandboxError(f"moto at {endpoint_url}: queueing Cost Explorer results answered {r.status}")
    return len(results)


def default_ce_window(scenario: Scenario) -> tuple[date, date]:
    """The Cost Explorer window queued by default: every day the scenario touches (end exclusive), what
    the demo asks for in one costs run. moto ignores the dates it is asked for, so a run over other days
    gets these answers and fails its window check: queue_cost_explorer() again for those."""
    last = (scenario.end - timedelta(seconds=1)).date()
    return scenario.start.date(), last + timedelta(days=1)


def seed(scenario: Scenario, endpoint_url: str, ce_window: tuple[date, date] | None = None) -> dict:
    """Write the scenario's AWS truth into a fresh moto server at ``endpoint_url``. Returns what a
    pipeline needs to find it, plus the counts and the seconds it took."""
    aws = scenario.aws
    if aws is None:
        raise SandboxError(f"scenario {scenario.name} has no aws: block to seed moto with")
    t0 = time.monotonic()
    account = _client("sts", endpoint_url, aws.region).get_caller_identity()["Account"]
    if account != aws.account_id:
        raise SandboxError(
            f"moto at {endpoint_url} acts as account {account}, scenario {scenario.name} bills "
            f"{aws.account_id}: start it with MotoServer(account_id={aws.account_id!r})"
        )
    fsx_ids, datapoints = _put_fsx(scenario, endpoint_url)
    items = bills.line_items(scenario, fsx_ids=fsx_ids)
    keys = _put_cur(scenario, endpoint_url, items)
    budget = _put_budget(scenario, endpoint_url, items)
    window = ce_window or default_ce_window(scenario)
    answers = queue_cost_explorer(endpoint_url, scenario, window[0], window[1], items=items)
    return {
        "endpoint_url": endpoint_url,
        "account_id": aws.account_id,
        "region": aws.region,
        "fsx_ids": fsx_ids,
        "cur_uri": CUR_URI,
        "cur_keys": keys,  # in write order: each period's data file, then its manifest
        "budget_name": budget,
        "ce_window": [window[0].isoformat(), window[1].isoformat()],
        "ce_answers": answers,
        "datapoints": datapoints,
        "line_items": len(items),
        "seeded_in": round(time.monotonic() - t0, 3),
    }


# ---- EC2: the instances running at a moment of the scenario ----


def _ec2_tags(scenario: Scenario, inst: bills.Instance) -> list[dict[str, str]]:
    """What the instance carries: a node the tags an EKS managed node group puts on its instances (the
    cluster's name, its Kubernetes cluster tag), a stray its Name and Experiment; both the default tags."""
    aws = scenario.aws
    tags = {**aws.default_tags, "Name": inst.node or inst.name}
    if inst.node:
        cluster = aws.eks_cluster or "foxhunt-eks"
        tags |= {"eks:cluster-name": cluster, f"kubernetes.io/cluster/{cluster}": "owned"}
    if inst.experiment:
        tags["Experiment"] = inst.experiment
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def set_ec2_as_of(scenario: Scenario, endpoint_url: str, now: datetime) -> dict[str, list[str]]:
    """Make moto's running EC2 instances those of the scenario at ``now``: every node's instance (the ids
    its kube_node_info history names, through moto_main's ClientToken) and every stray instance running
    then; the others are terminated. For a replay walking forward through the scenario (a terminated
    instance does not come back). Returns the ids started and terminated."""
    from foxhunt_obs.sandbox.servers.moto_main import ID_TOKEN
    from foxhunt_obs.sandbox.story.truth import availability_zone

    ec2 = _client("ec2", endpoint_url, scenario.aws.region)
    want = {
        i.instance_id: i
        for i in bills.instances(scenario) + bills.stray_instances(scenario)
        if i.start <= now < i.end
    }
    running = {
        inst["InstanceId"]
        for page in ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}]
        )
        for r in page["Reservations"]
        for inst in r["Instances"]
    }
    start = sorted(set(want) - running)
    if start:
        image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]  # one of moto's defaults
    for instance_id in start:
        inst = want[instance_id]
        ec2.run_instances(
            ImageId=image,
            InstanceType=inst.instance_type,
            MinCount=1,
            MaxCount=1,
            ClientToken=f"{ID_TOKEN}{instance_id}",
            Placement={"AvailabilityZone": availability_zone(scenario)},
            TagSpecifications=[{"ResourceType": "instance", "Tags": _ec2_tags(scenario, inst)}],
        )
    stop = sorted(running - set(want))
    if stop:
        ec2.terminate_instances(InstanceIds=stop)
    return {"started": start, "terminated": stop}


def sandbox_env(state: dict) -> dict[str, str]:
    """The environment a pipeline run needs against the seeded server (``seed``'s or ``up_moto``'s dict)."""
    return {
        "AWS_ENDPOINT_URL": state["endpoint_url"],
        "AWS_REGION": state["region"],
        "AWS_DEFAULT_REGION": state["region"],
        "AWS_ACCESS_KEY_ID": DUMMY_KEY,
        "AWS_SECRET_ACCESS_KEY": DUMMY_KEY,
        "FOXHUNT_CUR_S3_URI": state["cur_uri"],
        "FOXHUNT_FSX_IDS": ",".join(state["fsx_ids"].values()),
    }


# ---- one detached server per state directory (demo, CLI) ----

_DETACHED: dict[int, subprocess.Popen] = {}  # started here, so down_moto() here can reap them


def up_moto(
    scenario_name: str, state_dir: Path, port: int = 0, ce_window: tuple[date, date] | None = None
) -> dict:
    """Run a moto server seeded with the scenario (detached: it outlives this process; log
    ``state_dir/run/moto.log``) and record it in ``state_dir/moto.json``. A server already recorded there
    is stopped first. ``ce_window``: the Cost Explorer window queued (default: every day of the scenario)."""
    state_dir = Path(state_dir)
    scenario = load_scenario(scenario_name)
    if scenario.aws is None:
        raise SandboxError(f"scenario {scenario.name} has no aws: block to seed moto with")
    down_moto(state_dir)
    server = MotoServer(port=port, workdir=state_dir / "run", account_id=scenario.aws.account_id).start()
    try:
        seeded = seed(scenario, server.url, ce_window)
    except BaseException:
        server.stop()
        raise
    _DETACHED[server.pid] = server.process
    state = {
        "pid": server.pid,
        "url": server.url,
        "scenario": scenario.name,
        "fingerprint": scenario.fingerprint(),
        "log": str(server.log_path),
        "started_in": round(server.started_in, 3),
        "rss_bytes": server.rss_bytes(),
        **seeded,
    }
    (state_dir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    return state


def _state(state_dir: Path) -> dict | None:
    return read_state(Path(state_dir) / STATE_FILE)


def down_moto(state_dir: Path) -> None:
    """Stop the server recorded in ``state_dir/moto.json`` and remove that file and its log; fine if none
    runs. Leaves the rest of ``state_dir/run`` (the other servers') alone."""
    state_dir = Path(state_dir)
    state = _state(state_dir)
    if state:
        pid = state.get("pid")
        process = _DETACHED.pop(pid, None)
        if pid and alive(pid):
            kill_group(pid, 10.0, process)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    (state_dir / "run" / "moto.log").unlink(missing_ok=True)


def moto_status(state_dir: Path) -> dict | None:
    """The recorded state if its server is alive and answering, else None."""
    state = _state(state_dir)
    if state and alive(state["pid"]) and http_ok(f"{state['url']}/moto-api/"):
        return state
    return None
