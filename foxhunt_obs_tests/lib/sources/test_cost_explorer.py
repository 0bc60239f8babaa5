"""CostExplorerSource against a real moto server (answers queued in the protocol's order), a scripted HTTP
stand-in for throttling and errors, and botocore's Stubber for get_cost_forecast (moto lacks it)."""

from __future__ import annotations

import copy
from collections import defaultdict
from datetime import date, timedelta
from decimal import Decimal

import boto3
import pytest
from botocore.config import Config
from botocore.stub import Stubber

from foxhunt_obs.lib.schemas import COSTS_DAILY
from foxhunt_obs.lib.sources.aws import AwsConfig
from foxhunt_obs.lib.sources.cost_explorer import (
    CostExplorerError,
    CostExplorerSource,
    detail_request,
    discovery_request,
    forecast_window,
)
from foxhunt_obs_tests.lib.sources.aws_fixtures import CREDENTIALS, REGION, MotoServer, ScriptedServer

KEYS = ("Project", "Environment", "Experiment")
START, END = date(2026, 11, 1), date(2026, 11, 4)
EC2, EC2_OTHER = "Amazon Elastic Compute Cloud - Compute", "EC2 - Other"
# day, project, environment, experiment, CE service, unblended, amortized, usage ('' = untagged)
TRUTH = [
    ("2026-11-01", "foxhunt-rl", "prod", "ppo-a", EC2, "120.1234567891", "110.50", "24"),
    ("2026-11-01", "foxhunt-rl", "prod", "ppo-a", EC2_OTHER, "3.3333333333", "3.3333333333", "100"),
    ("2026-11-01", "foxhunt-rl", "prod", "", "Amazon FSx", "10.0100000001", "10.01", "1.5"),
    ("2026-11-01", "foxhunt-rl", "dev", "grpo-b", EC2, "7.77", "7.77", "3"),
    ("2026-11-01", "", "", "", "Amazon Simple Storage Service", "0.5549999999", "0.555", "5"),
    ("2026-11-02", "foxhunt-rl", "prod", "ppo-a", EC2, "98.7654321", "90", "24"),
    ("2026-11-02", "foxhunt-rl", "prod", "ppo-b", EC2, "11.11", "11.11", "2"),
    ("2026-11-02", "", "", "", "Tax", "1.23", "1.23", "0"),
    ("2026-11-02", "", "", "", "Some New Service", "0.01", "0.01", "1"),
]  # 2026-11-03: no cost at all
ESTIMATED = {"2026-11-02"}


def _metrics(u: Decimal, a: Decimal, q: Decimal) -> dict:
    return {
        "UnblendedCost": {"Amount": str(u), "Unit": "USD"},
        "AmortizedCost": {"Amount": str(a), "Unit": "USD"},
        "UsageQuantity": {"Amount": str(q), "Unit": "N/A"},
    }


def _pages(items: list[tuple[str, dict]], n_pages: int, chain: str) -> list[dict]:
    """Groups (day, group) cut into n pages the way Cost Explorer pages: a day may span two pages."""
    days = [(START + timedelta(d)).isoformat() for d in range((END - START).days)]
    size = -(-len(items) // n_pages) if items else 1
    chunks = [items[i : i + size] for i in range(0, len(items), size)] or [[]]
    pages = []
    for k, chunk in enumerate(chunks):
        by_day: dict[str, list] = defaultdict(list)
        for day, g in chunk:
            by_day[day].append(g)
        page_days = days if k == 0 else sorted(by_day)
        results = [
            {
                "TimePeriod": {"Start": d, "End": (date.fromisoformat(d) + timedelta(1)).isoformat()},
                "Total": {},
                "Groups": by_day.get(d, []),
                "Estimated": d in ESTIMATED,
            }
            for d in page_days
        ]
        page = {"ResultsByTime": results, "DimensionValueAttributes": []}
        if k < len(chunks) - 1:
            page["NextPageToken"] = f"{chain}-page-{k + 2}"
        pages.append(page)
    return pages


def ce_answers(truth=TRUTH, discovery_pages: int = 1, detail_pages: dict | None = None) -> list[dict]:
    """What Cost Explorer answers, in the order the protocol asks: discovery pages, then each pair's."""
    detail_pages = detail_pages or {}
    pair_sum: dict[tuple, list[Decimal]] = defaultdict(lambda: [Decimal(0)] * 3)
    detail: dict[tuple, dict[tuple, list[Decimal]]] = defaultdict(
        lambda: defaultdict(lambda: [Decimal(0)] * 3)
    )
    for day, p, e, x, svc, u, a, q in truth:
        for acc in (pair_sum[(day, p, e)], detail[(p, e)][(day, x, svc)]):
            for i, v in enumerate((u, a, q)):
                acc[i] += Decimal(v)
    disc = [
        (day, {"Keys": [f"Project${p}", f"Environment${e}"], "Metrics": _metrics(*v)})
        for (day, p, e), v in sorted(pair_sum.items())
    ]
    out = _pages(disc, discovery_pages, "disc")
    for pair in sorted(detail):
        items = [
            (day, {"Keys": [f"Experiment${x}", svc], "Metrics": _metrics(*v)})
            for (day, x, svc), v in sorted(detail[pair].items())
        ]
        out += _pages(items, detail_pages.get(pair, 1), "-".join(pair) or "untagged")
    return out


@pytest.fixture(scope="module")
def moto():
    server = MotoServer().start()
    yield server
    server.stop()


@pytest.fixture
def ce(moto):
    moto.reset()
    return moto.client("ce")


def _by_tag(table) -> dict[tuple, float]:
    out: dict[tuple, float] = defaultdict(float)
    for r in table.to_pylist():
        out[(r["day"].isoformat(), r["project"], r["environment"], r["experiment"])] += r["cost_usd"]
    return out


@pytest.mark.servers
def test_daily_costs_match_the_truth_per_tag_to_the_cent(moto, ce):
    moto.queue_ce(ce_answers())
    src = CostExplorerSource(ce)
    table = src.daily_costs(START, END, partition="2026-11-01")

    assert table.schema == COSTS_DAILY.schema
    want: dict[tuple, Decimal] = defaultdict(Decimal)
    for day, p, e, x, _, u, *_ in TRUTH:
        want[(day, p, e, x)] += Decimal(u)
    got = _by_tag(table)
    assert set(got) == set(want)
    for k, v in want.items():
        assert abs(got[k] - float(v)) < 0.005, k
    # every day's total is Cost Explorer's total for the day: no row counted twice
    for day in {t[0] for t in TRUTH}:
        total = sum(Decimal(t[5]) for t in TRUTH if t[0] == day)
        assert abs(sum(v for k, v in got.items() if k[0] == day) - float(total)) < 1e-9

    rows = table.to_pylist()
    assert {r["source"] for r in rows} == {"ce"} and {r["resource_id"] for r in rows} == {""}
    assert date(2026, 11, 3) not in {r["day"] for r in rows}  # a day without groups gives no rows
    keys = [(r["day"], r["project"], r["environment"], r["experiment"], r["service"]) for r in rows]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    # untagged kept as ''; CE service names mapped to product codes; both EC2 names add up to AmazonEC2
    assert ("", "", "", "AmazonS3") in {
        (r["project"], r["environment"], r["experiment"], r["service"]) for r in rows
    }
    ec2 = [r for r in rows if r["day"] == START and r["experiment"] == "ppo-a"]
    assert [r["service"] for r in ec2] == ["AmazonEC2"]
    assert ec2[0]["cost_usd"] == pytest.approx(123.4568, abs=1e-4)
    assert ec2[0]["amortized_usd"] == pytest.approx(113.8333333333)
    assert ec2[0]["usage_quantity"] == 124
    assert {r["service"] for r in rows} == {"AmazonEC2", "AmazonFSx", "AmazonS3", "Tax", "Some New Service"}
    assert {r["day"].isoformat() for r in rows if r["estimated"]} == ESTIMATED
    # one discovery call + one per (project, environment) pair
    assert src.calls == 4 and src.cost_usd == pytest.approx(0.04)


@pytest.mark.servers
def test_every_page_is_read_and_counted(moto, ce):
    moto.queue_ce(ce_answers(discovery_pages=3, detail_pages={("foxhunt-rl", "prod"): 2}))
    src = CostExplorerSource(ce)
    table = src.daily_costs(START, END)
    assert src.pages == {
        "discovery": 3,
        "Project='' Environment=''": 1,
        "Project='foxhunt-rl' Environment='dev'": 1,
        "Project='foxhunt-rl' Environment='prod'": 2,
    }
    assert src.calls == 7
    assert sum(table.column("cost_usd").to_pylist()) == pytest.approx(
        float(sum(Decimal(t[5]) for t in TRUTH))
    )


@pytest.mark.servers
def test_a_rerun_gives_an_identical_table(moto, ce):
    moto.queue_ce(ce_answers(discovery_pages=2))
    src = CostExplorerSource(ce)
    first = src.daily_costs(START, END)
    calls = src.calls
    second = src.daily_costs(START, END)  # moto answers the same bodies with the same results
    assert second.equals(first) and src.calls == calls


@pytest.mark.servers
def test_detail_that_does_not_add_up_to_discovery_fails(moto, ce):
    answers = ce_answers()
    prod = answers[-1]  # the last pair in sorted order: ('foxhunt-rl', 'prod')
    day1 = prod["ResultsByTime"][0]
    day1["Groups"] = [g for g in day1["Groups"] if g["Keys"][1] != "Amazon FSx"]
    moto.queue_ce(answers)
    with pytest.raises(CostExplorerError) as err:
        CostExplorerSource(ce).daily_costs(START, END, partition="2026-11-01")
    msg = str(err.value)
    for part in ("Cost Explorer", "2026-11-01", "Project='foxhunt-rl'", "Environment='prod'"):
        assert part in msg
    assert "123.4567901224 USD" in msg and "133.4667901225 USD" in msg  # detail sum, discovery amount
    assert "partition 2026-11-01" in msg


@pytest.mark.servers
def test_a_malformed_amount_names_the_day_group_and_value(moto, ce):
    answers = ce_answers()
    bad = copy.deepcopy(answers)
    bad[2]["ResultsByTime"][0]["Groups"][0]["Metrics"]["UnblendedCost"]["Amount"] = "12.3x"
    moto.queue_ce(bad)
    with pytest.raises(CostExplorerError) as err:
        CostExplorerSource(ce).daily_costs(START, END, partition="p1")
    msg = str(err.value)
    assert "Cost Explorer get_cost_and_usage" in msg and "'12.3x'" in msg and "UnblendedCost" in msg
    assert (
        "2026-11-01" in msg and "Experiment$grpo-b" in msg and "Project='foxhunt-rl' Environment='dev'" in msg
    )


@pytest.mark.servers
def test_a_page_token_that_comes_back_fails_instead_of_looping(moto, ce):
    page = ce_answers()[0]
    moto.queue_ce([dict(page, NextPageToken="again"), {"ResultsByTime": [], "NextPageToken": "again"}])
    src = CostExplorerSource(ce)
    with pytest.raises(CostExplorerError, match="NextPageToken 'again' came back twice"):
        src.daily_costs(START, END)
    assert src.calls == 2  # the first page and 'again': the token seen twice stops the chain


def test_request_bodies_follow_the_protocol():
    assert discovery_request(START, END, KEYS) == {
        "TimePeriod": {"Start": "2026-11-01", "End": "2026-11-04"},
        "Granularity": "DAILY",
        "Metrics": ["UnblendedCost", "AmortizedCost", "UsageQuantity"],
        "GroupBy": [{"Type": "TAG", "Key": "Project"}, {"Type": "TAG", "Key": "Environment"}],
    }
    assert discovery_request(START, END, KEYS, "t2")["NextPageToken"] == "t2"
    req = detail_request(START, END, KEYS, ("", "prod"), "t3")
    assert req["Filter"] == {
        "And": [
            {"Tags": {"Key": "Project", "MatchOptions": ["ABSENT"]}},
            {"Tags": {"Key": "Environment", "Values": ["prod"], "MatchOptions": ["EQUALS"]}},
        ]
    }
    assert req["GroupBy"] == [{"Type": "TAG", "Key": "Experiment"}, {"Type": "DIMENSION", "Key": "SERVICE"}]
    assert req["NextPageToken"] == "t3" and req["Metrics"] == discovery_request(START, END, KEYS)["Metrics"]


# -- throttling and errors, through a scripted stand-in --------------------------------------------------
THROTTLED = (400, {"__type": "LimitExceededException", "message": "Rate exceeded"})
ANSWER = (200, ce_answers(truth=[TRUTH[4]])[0])  # discovery of one day: only the untagged S3 line


@pytest.mark.servers
def test_throttling_is_retried_in_standard_mode():
    untagged_detail = ce_answers(truth=[TRUTH[4]])[1]
    with ScriptedServer([THROTTLED, THROTTLED, ANSWER, (200, untagged_detail)]) as stand_in:
        client = AwsConfig(
            region_name=REGION, endpoint_url=stand_in.url, retry_mode="standard", **CREDENTIALS
        ).client("ce")
        table = CostExplorerSource(client).daily_costs(START, END)
    assert len(stand_in.requests) == 4  # 2 throttled + the discovery answer + the one detail chain
    assert stand_in.requests[0] == stand_in.requests[2] == discovery_request(START, END, KEYS)
    assert table.to_pylist()[0]["cost_usd"] == pytest.approx(0.5549999999)


@pytest.mark.servers
def test_legacy_retry_mode_does_not_retry_limit_exceeded():
    """Why AwsConfig sets the retry mode explicitly: botocore's legacy mode (the default without config)
    does not count Cost Explorer's LimitExceededException as throttling, so the first one fails the run."""
    with ScriptedServer([THROTTLED, THROTTLED, ANSWER]) as stand_in:
        client = boto3.client(
            "ce",
            endpoint_url=stand_in.url,
            region_name=REGION,
            config=Config(retries={"mode": "legacy", "max_attempts": 4}),
            **CREDENTIALS,
        )
        with pytest.raises(CostExplorerError, match="LimitExceededException"):
            CostExplorerSource(client).daily_costs(START, END)
    assert len(stand_in.requests) == 1


@pytest.mark.servers
def test_an_aws_error_names_the_call_window_and_partition():
    denied = (
        400,
        {"__type": "AccessDeniedException", "message": "User is not authorized to ce:GetCostAndUsage"},
    )
    with ScriptedServer([denied]) as stand_in:
        client = AwsConfig(region_name=REGION, endpoint_url=stand_in.url, **CREDENTIALS).client("ce")
        with pytest.raises(CostExplorerError) as err:
            CostExplorerSource(client).daily_costs(START, END, partition="2026-11-03")
    msg = str(err.value)
    for part in ("get_cost_and_usage (discovery)", "2026-11-01..2026-11-04", "partition 2026-11-03"):
        assert part in msg
    assert "AccessDeniedException" in msg and "not authorized" in msg


# -- forecast (moto has no get_cost_forecast: botocore's Stubber) ------------------------------------------
@pytest.mark.parametrize(
    "today, end",
    [
        (date(2026, 11, 29), "2026-12-01"),
        (date(2026, 11, 30), "2026-12-01"),  # last day of a month: a one-day window, End still after Start
        (date(2026, 12, 31), "2027-01-01"),
    ],
)
def test_forecast_asks_for_the_rest_of_the_month(today, end):
    client = boto3.client("ce", region_name=REGION, **CREDENTIALS)
    with Stubber(client) as stub:
        stub.add_response(
            "get_cost_forecast",
            {"Total": {"Amount": "1234.5678901", "Unit": "USD"}, "ForecastResultsByTime": []},
            {
                "TimePeriod": {"Start": today.isoformat(), "End": end},
                "Metric": "UNBLENDED_COST",
                "Granularity": "MONTHLY",
            },
        )
        out = CostExplorerSource(client).forecast(today)
        stub.assert_no_pending_responses()
    assert out == {
        "period_start": today,
        "period_end": date.fromisoformat(end),
        "forecast_usd": Decimal("1234.5678901"),
    }
    assert forecast_window(today) == (today, date.fromisoformat(end))


def test_forecast_errors_name_the_call():
    client = boto3.client("ce", region_name=REGION, **CREDENTIALS)
    with Stubber(client) as stub:
        stub.add_client_error("get_cost_forecast", "DataUnavailableException", "Insufficient amount of data")
        with pytest.raises(
            CostExplorerError, match=r"get_cost_forecast 2026-11-29\.\.2026-12-01.*Insufficient"
        ):
            CostExplorerSource(client).forecast(date(2026, 11, 29), partition="2026-11-29")
