"""docs/cost-model.md's worked examples, recomputed through the real table functions.

The page holds its examples as ```yaml blocks: `# example: <name>` gives an example's inputs (node-hours,
the pods holding each GPU, bill lines, MLflow runs), `# expect: <name> / <what>` the figures a table must
then hold. Each test here builds a lake in a temporary folder from an example's inputs (gpu_samples,
node_samples, costs_hourly, costs_daily, training_runs and training_metrics rows, written as the ingest
writes them), runs the functions the Dagster assets run (gpu_hourly, cost_allocation,
utilization_per_dollar, outcome_per_dollar, the estimate) and compares every figure the page quotes. The
maths is never repeated here: a change to the code or to the page that makes them disagree fails.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
import re
import subprocess
from datetime import datetime, timedelta, timezone
from functools import cache

import pyarrow as pa
import pytest
import yaml

import foxhunt_obs.lib.tables
from foxhunt_obs.lib.analysis.cost_estimate import StorageCapacity, estimate_day, node_hours
from foxhunt_obs.lib.analysis.effective_rates import hourly_rate
from foxhunt_obs.lib.analysis.prices import load_price_table
from foxhunt_obs.lib.analysis.training_health import mlflow_key
from foxhunt_obs.lib.ingest.mig import slice_share
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.names import CLUSTER_IDLE, UNATTRIBUTED
from foxhunt_obs.lib.schemas import (
    COSTS_DAILY,
    COSTS_HOURLY,
    FSX_METRICS,
    GPU_SAMPLES,
    NODE_SAMPLES,
    TRAINING_METRICS,
    TRAINING_RUNS,
)
from foxhunt_obs.lib.tables.cost_model import bill_rates
from foxhunt_obs_tests.lib.lake_rows import node_hour
from foxhunt_obs_tests.paths import REPO

PAGE = REPO / "docs" / "cost-model.md"
STEP = 60.0  # the examples' scrape step, seconds
NAMESPACE = "rl"
PRICES = load_price_table("us-east-1")  # the page quotes us-east-1's prices
TOLERANCE = 5e-5 + 1e-9  # the page rounds figures to 4 decimal places

# every block the page holds, and the test that checks it: a block added to the page without a check
# here, or a check whose block is gone, fails test_every_block_on_the_page_is_checked
CHECKED = {
    "example": {"node-hour", "node-cost-sources", "fsx-estimate", "shared-lines", "runs"},
    "expect": {
        "node-hour / holders",
        "node-hour / unheld GPUs",
        "node-hour / idle and unknown",
        "node-hour / SM activity",
        "node-hour / time-sliced GPU",
        "node-hour / MIG slices",
        "node-hour / by experiment",
        "node-hour / utilization per dollar",
        "node-hour / live rules at 00:10",
        "node-cost-sources / 16 November, no bill yet",
        "node-cost-sources / 16 November, from its bill",
        "node-cost-sources / 17 November, the bill's effective rate",
        "fsx-estimate / one day",
        "shared-lines / the lines",
        "shared-lines / the day",
        "runs / outcome per dollar",
    },
}


# -- the page ---------------------------------------------------------------------------------------------
@cache
def blocks() -> dict[tuple[str, str], dict]:
    """(kind, name) -> the parsed block, for every ```yaml block opening with `# example:`/`# expect:`."""
    out = {}
    for body in re.findall(r"^```yaml\n(.*?)^```", PAGE.read_text(), flags=re.S | re.M):
        head = re.match(r"# (example|expect): (.+)\n", body)
        if head:
            key = (head.group(1), head.group(2).strip())
            assert key not in out, f"{PAGE.name}: two blocks named {key}"
            out[key] = yaml.safe_load(body)
    return out


def example(name: str) -> dict:
    return blocks()[("example", name)]


def expect(name: str) -> dict:
    return blocks()[("expect", name)]


def test_every_block_on_the_page_is_checked():
    on_page = {kind: {name for k, name in blocks() if k == kind} for kind in CHECKED}
    assert on_page == CHECKED
    assert len(blocks()) == sum(map(len, CHECKED.values())) >= 20


# -- the table functions, wherever the tables package keeps them -----------------------------------------
@cache
def table_function(name: str):
    """The lake-writing function of a table (lib/tables/<module>.py), found by name in the package."""
    found = []
    for info in pkgutil.iter_modules(foxhunt_obs.lib.tables.__path__):
        module = importlib.import_module(f"foxhunt_obs.lib.tables.{info.name}")
        fn = getattr(module, name, None)
        if callable(fn) and getattr(fn, "__module__", "") == module.__name__:
            found.append(fn)
    assert len(found) == 1, f"lib/tables defines {name} {len(found)} times"
    return found[0]


# -- inputs -> lake rows ---------------------------------------------------------------------------------
def _hour(key: str) -> datetime:
    return datetime.strptime(key, "%Y-%m-%dT%H").replace(tzinfo=timezone.utc)


def _minute(key: str) -> datetime:
    return datetime.strptime(key, "%Y-%m-%dT%H:%M").replace(tzinfo=timezone.utc)


def _day(t: datetime) -> datetime:
    return t.replace(hour=0)


def _covers(span: list | None, minute: int) -> bool:
    return span is None or span[0] <= minute < span[1]


def gpu_samples(node: dict, start: datetime, gpus: dict) -> pa.Table:
    """One hour of gpu_samples, a row per GPU (MIG slice, time-sliced pod's copy) and minute, as the
    ingest writes them. An unheld whole GPU: one row with no pod, util 0."""
    rows = []
    for i in range(node["gpus"]):
        holders = gpus.get(i, [])
        for m in range(60):
            base = dict(
                ts=start + timedelta(minutes=m), node=node["name"], gpu=i, uuid=f"GPU-{i}", model=node["model"],
                container="main", step_seconds=STEP, power_watts=300.0,
            )  # fmt: skip
            present = [h for h in holders if _covers(h.get("minutes"), m)]
            if any("mig" in h for h in holders):  # a slice per holder; what no slice covers has no row
                for h in present:
                    util = h["util"] if _covers(h.get("util_minutes"), m) else None
                    share = slice_share(h["mig"]["profile"], node["model"])
                    rows.append(
                        base | dict(gpu_instance=h["mig"]["instance"], gpu_profile=h["mig"]["profile"],
                                    gpu_share=share, namespace=NAMESPACE, pod=h["pod"], experiment=h["experiment"],
                                    util=util, gr_engine_active=util, step_share=1.0,
                                    util_basis="DCGM_FI_PROF_GR_ENGINE_ACTIVE" if util is not None else "")
                    )  # fmt: skip
                continue
            whole = base | dict(gpu_profile="", gpu_share=1.0)
            if not present:
                rows.append(whole | dict(pod="", namespace="", experiment=UNATTRIBUTED, util=0.0,
                                         util_basis="DCGM_FI_DEV_GPU_UTIL", step_share=1.0))  # fmt: skip
            sliced = _time_sliced(holders)
            for h in present:
                util = h["util"] if _covers(h.get("util_minutes"), m) else None
                rows.append(
                    whole | dict(pod=h["pod"], namespace=NAMESPACE, experiment=h["experiment"], util=util,
                                 sm_active=h.get("sm"), step_share=1.0 / len(present),
                                 util_basis="DCGM_FI_DEV_GPU_UTIL" if util is not None else "",
                                 vgpu=str(holders.index(h)) if sliced else "")
                )  # fmt: skip
    return pa.Table.from_pylist(rows, schema=GPU_SAMPLES.schema)


def _time_sliced(holders: list[dict]) -> bool:
    """Several pods on one GPU at the same minute (not one after the other)."""
    return any(sum(_covers(h.get("minutes"), m) for h in holders) > 1 for m in range(60))


def bill_rows(lines: list[dict]) -> dict[str, pa.Table]:
    """CUR 2.0 lines -> costs_hourly partitions by day."""
    by_day: dict[str, list] = {}
    for line in lines:
        hour = _hour(line["hour"])
        usage = line["usage_type"]
        by_day.setdefault(COSTS_HOURLY.key(hour), []).append(
            dict(
                hour=hour, billing_period=hour.strftime("%Y-%m"), account_id="111122223333",
                line_item_type=line["line_item_type"], service=line["service"], usage_type=usage,
                operation="RunInstances" if line["service"] == "AmazonEC2" else "",
                instance_type=usage.split(":", 1)[1] if line["service"] == "AmazonEC2" else "",
                resource_id=line["resource_id"], usage_amount=float(line["usage_amount"]),
                cost_usd=float(line["cost_usd"]), amortized_usd=float(line["cost_usd"]), project="rl",
                environment="prod", experiment=line.get("experiment", ""), tags="{}", manifest="example",
            )
        )  # fmt: skip
    return {k: pa.Table.from_pylist(v, schema=COSTS_HOURLY.schema) for k, v in by_day.items()}


def _cur_daily(hourly: pa.Table) -> pa.Table:
    """costs_daily's cur rows of a day: its lines summed by tag, service and resource."""
    rows: dict[tuple, dict] = {}
    for r in hourly.to_pylist():
        key = (r["project"], r["environment"], r["experiment"], r["service"], r["resource_id"])
        row = rows.setdefault(
            key,
            dict(day=r["hour"].date(), source="cur", project=key[0], environment=key[1], experiment=key[2],
                 service=key[3], resource_id=key[4], cost_usd=0.0, amortized_usd=0.0, usage_quantity=0.0,
                 estimated=False),
        )  # fmt: skip
        row["cost_usd"] += r["cost_usd"]
        row["amortized_usd"] += r["amortized_usd"]
        row["usage_quantity"] += r["usage_amount"]
    return pa.Table.from_pylist(list(rows.values()), schema=COSTS_DAILY.schema)


class ExampleLake:
    """An example's inputs written to a lake as the ingest writes them."""

    def __init__(self, root, spec: dict):
        self.lake = Lake(str(root))
        self.spec = spec
        node = spec["node"]
        silent = set(spec.get("gpus_silent", []))
        self.days = sorted({_day(_hour(h)) for h in spec["hours"]})
        for key in spec["hours"]:
            start = _hour(key)
            gpus_reporting = 0 if key in silent else node["gpus"]
            ns = node_hour(start, node["name"], gpus_reporting, STEP, node["instance_type"])
            assert set(ns.column("instance_id").to_pylist()) == {node["instance"]}
            self.lake.write_partition(NODE_SAMPLES, NODE_SAMPLES.key(start), ns)
            if key not in silent:
                self.lake.write_partition(
                    GPU_SAMPLES, GPU_SAMPLES.key(start), gpu_samples(node, start, spec["gpus"])
                )
        self.lake.write_partition(FSX_METRICS, "2026-11-01T00", FSX_METRICS.schema.empty_table())
        for day in self.days:
            for table in (COSTS_HOURLY, COSTS_DAILY):
                self.lake.write_partition(table, table.key(day), table.schema.empty_table())

    def land_bill(self) -> None:
        """The example's CUR lines arrive: costs_hourly, and costs_daily's cur rows beside the estimate."""
        for key, hourly in bill_rows(self.spec["bill"]).items():
            self.lake.write_partition(COSTS_HOURLY, key, hourly)
            self.lake.write_partition(COSTS_DAILY, key, _cur_daily(hourly))

    def estimate(self, day: datetime) -> None:
        """costs_daily's estimate rows of a day without a bill: the node-hours reported × the rate the
        estimate uses (the bill's effective rate, else the price table), from the functions costs_daily
        calls."""
        con = self.lake.connect([NODE_SAMPLES, COSTS_HOURLY])
        try:
            table = estimate_day(
                day.date(), node_hours(con, day.date()), [], PRICES, bill_rates(con, day)
            ).table
        finally:
            con.close()
        self.lake.write_partition(COSTS_DAILY, COSTS_DAILY.key(day), table)

    def allocate(self, days: list[datetime]):
        table_function("gpu_hourly")(self.lake, days)
        return table_function("cost_allocation")(self.lake, days, PRICES)


# -- expectations ----------------------------------------------------------------------------------------
def _key(row, by) -> str:
    """A row's key as the page writes it: columns joined by '/', whole numbers without a '.0'."""
    values = [row[c] for c in ([by] if isinstance(by, str) else by)]
    return "/".join(str(int(v)) if isinstance(v, float) and v.is_integer() else str(v) for v in values)


def check(frame, block: dict, name: str) -> None:
    """Every figure of an expect block against the rows of a table the functions wrote: a row's figure is
    the sum over the rows with that key (`by`), after the `where` filter."""
    df = frame
    if "day" in block:
        df = df[df["hour" if "hour" in df else "day"].map(lambda t: t.date()) == block["day"]]
    for col, value in (block.get("where") or {}).items():
        df = df[df[col] == value]
    keys = df.apply(lambda r: _key(r, block["by"]), axis=1) if len(df) else df.index
    for key, figures in block["rows"].items():
        rows = df[keys == str(key)]
        assert len(rows), f"{name}: no {block['table']} row for {block['by']} = {key!r}"
        for col, want in figures.items():
            values = rows[col]
            where = f"{name}: {key} {col}"
            if want is None:
                assert values.isna().all(), f"{where}: {values.tolist()}, the page says null"
            elif isinstance(want, str):
                assert set(values) == {want}, f"{where}: {sorted(set(values))}, the page says {want!r}"
            else:
                got = values.sum(min_count=1)
                assert got == pytest.approx(want, abs=TOLERANCE), f"{where}: {got}, the page says {want}"


# -- the examples ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def node_hour_lake(tmp_path_factory):
    spec = example("node-hour")
    lake = ExampleLake(tmp_path_factory.mktemp("node-hour"), spec)
    lake.estimate(lake.days[0])
    allocation = lake.allocate(lake.days)
    return lake, allocation


@pytest.mark.parametrize(
    "name",
    sorted(n for n in CHECKED["expect"] if n.startswith("node-hour /") and "live rules" not in n
           and "utilization" not in n),
)  # fmt: skip
def test_the_example_node_hour(node_hour_lake, name):
    _, allocation = node_hour_lake
    block = expect(name)
    assert block["table"] == "cost_allocation"
    check(allocation.frame(), block, name)


def test_the_example_node_hour_sums_to_its_estimate(node_hour_lake):
    """The node-hour's $55.04, every dollar charged once; the estimate (no bill) is the day's bill."""
    _, allocation = node_hour_lake
    df = allocation.frame()
    assert df["allocated_usd"].sum() + df["unallocated_usd"].sum() == pytest.approx(55.04)
    (check_,) = allocation.checks
    assert check_.name == "sums_to_the_bill" and check_.passed, check_.metadata


def test_utilization_per_dollar_of_the_example(node_hour_lake):
    lake, _ = node_hour_lake
    built = table_function("utilization_per_dollar")(lake.lake, lake.days)
    check(built.frame(), expect("node-hour / utilization per dollar"), "utilization per dollar")
    assert CLUSTER_IDLE in set(built.frame()["experiment"])


def test_a_runs_dollars_and_outcome_per_dollar(node_hour_lake):
    lake, _ = node_hour_lake
    runs = example("runs")["runs"]
    rows, metrics = [], []
    for r in runs:
        start = _minute(r["start"])
        end = _minute(r["end"]) if r["end"] else None
        rows.append(
            dict(run_id=r["run_id"], run_name=r["run_id"], experiment=r["experiment"],
                 status="FINISHED" if end else "RUNNING", deleted=False, start_time=start, end_time=end,
                 pod=r["pod"], namespace=r["namespace"])
        )  # fmt: skip
        first, last = r["success_rate"]
        stop = end or start.replace(minute=55)
        metrics += [
            dict(run_id=r["run_id"], key=mlflow_key("success_rate"), step=0, ts=start, value=float(first)),
            dict(run_id=r["run_id"], key=mlflow_key("success_rate"), step=1, ts=stop, value=float(last)),
        ]
    lake.lake.write_partition(
        TRAINING_RUNS, "current", pa.Table.from_pylist(rows, schema=TRAINING_RUNS.schema)
    )
    lake.lake.write_partition(
        TRAINING_METRICS, "current", pa.Table.from_pylist(metrics, schema=TRAINING_METRICS.schema)
    )
    built = table_function("outcome_per_dollar")(lake.lake, lake.days)
    check(built.frame(), expect("runs / outcome per dollar"), "outcome per dollar")


def test_where_a_node_hours_cost_comes_from(tmp_path):
    spec = example("node-cost-sources")
    lake = ExampleLake(tmp_path, spec)
    first, second = lake.days
    # the 16th before its bill: the price table
    lake.estimate(first)
    name = "node-cost-sources / 16 November, no bill yet"
    check(lake.allocate([first]).frame(), expect(name), name)
    # the bill of the 16th lands: the 16th again, from its lines; the day sums to the bill
    lake.land_bill()
    name = "node-cost-sources / 16 November, from its bill"
    built = lake.allocate([first])
    check(built.frame(), expect(name), name)
    (sums,) = built.checks
    assert sums.passed is expect(name)["sums_to_the_bill"], sums.metadata
    # the 17th, no bill of its own: the effective rate of the 16th's bill
    name = "node-cost-sources / 17 November, the bill's effective rate"
    block = expect(name)
    lake.estimate(second)
    check(lake.allocate([second]).frame(), block, name)
    con = lake.lake.connect([NODE_SAMPLES, COSTS_HOURLY])
    try:
        rate = hourly_rate(block["rate"]["instance_type"], PRICES, bill_rates(con, second))
    finally:
        con.close()
    assert (float(rate.usd_per_hour), rate.basis) == (block["rate"]["usd_per_hour"], block["rate"]["basis"])


def test_the_fsx_estimate():
    spec = example("fsx-estimate")
    fs = spec["file_system"]
    capacity = StorageCapacity(
        fs["id"],
        fs["deployment_type"],
        fs["per_unit_storage_throughput"],
        fs["storage_capacity_gib"],
        fs["hours"],
    )
    estimate = estimate_day(spec["day"], [], [capacity], PRICES)
    assert not estimate.unpriced
    check(estimate.table.to_pandas(), expect("fsx-estimate / one day"), "fsx estimate")


def test_bill_lines_on_no_node_are_tagged_or_shared(tmp_path):
    lake = ExampleLake(tmp_path, example("shared-lines"))
    lake.land_bill()
    built = lake.allocate(lake.days)
    for name in ("shared-lines / the lines", "shared-lines / the day"):
        check(built.frame(), expect(name), name)
    (sums,) = built.checks
    assert sums.passed is expect("shared-lines / the day")["sums_to_the_bill"], sums.metadata


# -- the live rules --------------------------------------------------------------------------------------
COST_RULES = REPO / "deploy" / "prometheus" / "foxhunt-cost-rules.yaml"


def _series(metric: str, labels: dict, value: float = 1.0) -> dict:
    return {"series": metric + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}",
            "values": f"{value}x10"}  # fmt: skip


@pytest.mark.servers  # promtool, a process
def test_the_live_rules_at_ten_past(tmp_path):
    """The example node-hour at 00:10 as the canonical series the live rules read; promtool evaluates
    the checked-in cost rules and compares the page's $/h per experiment."""
    spec, block = example("node-hour"), expect("node-hour / live rules at 00:10")
    node, minute = spec["node"], 10
    series = [
        _series("kube_node_labels", {"node": node["name"],
                                     "label_node_kubernetes_io_instance_type": node["instance_type"]}),
    ]  # fmt: skip
    for i in range(node["gpus"]):
        holders = spec["gpus"].get(i, [])
        base = {"node": node["name"], "gpu": str(i), "uuid": f"GPU-{i}", "model": node["model"]}
        present = [h for h in holders if _covers(h.get("minutes"), minute)]
        if not present:
            series.append(_series("foxhunt:gpu_util:ratio", base, 0.0))
        for h in present:
            labels = base | {"namespace": NAMESPACE, "pod": h["pod"]}
            if "mig" in h:
                labels |= {"gpu_instance": str(h["mig"]["instance"]), "gpu_profile": h["mig"]["profile"]}
            series.append(_series("foxhunt:gpu_util:ratio", labels, h["util"]))
            series.append(
                _series(
                    "kube_pod_labels",
                    {"namespace": NAMESPACE, "pod": h["pod"], "label_experiment": h["experiment"]},
                )
            )
    tests = {
        "rule_files": [str(COST_RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": f"round({block['rule']} * 1e4) / 1e4",
                        "eval_time": "5m",
                        "exp_samples": [
                            {"labels": f'{{experiment="{e}"}}', "value": float(v)}
                            for e, v in sorted(block["rows"].items())
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "live.yaml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    out = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert math.isclose(sum(block["rows"].values()), 55.04, abs_tol=1e-3)  # the node, counted once


def test_the_page_quotes_the_price_table():
    """The examples' node is priced from data/prices.yaml: the page's $55.04/h is that row's."""
    price = PRICES.get("AmazonEC2", example("node-hour")["node"]["instance_type"])
    assert f"**${price.usd}/h**" in PAGE.read_text()
