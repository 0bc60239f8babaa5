"""The cost dashboard (deploy/grafana/foxhunt-cost.json): the conventions of the other two
dashboards, the series it may read, its ConfigMap, and every panel query run against a real Prometheus
whose foxhunt:* cost series are the checked-in cost rules (deploy/prometheus/foxhunt-cost-rules.yaml)
evaluated by Prometheus itself over a backfilled day and a quarter of kube- and GPU-shaped input, beside
Pushgateway-shaped series (the batch side's push_spend). $/h now, today's spend and the reconciliation
are checked against figures computed by hand from the price table."""

from __future__ import annotations

import re
import subprocess

import pytest
import requests
import yaml

import foxhunt_obs_tests.deploy.test_dashboards as base
from foxhunt_obs.lib.delivery.pushgateway import DEFAULT_JOB, LAKE_COST, LAKE_IDLE, UNTRACKED
from foxhunt_obs.sandbox.servers.prometheus import PROMTOOL, PrometheusServer, backfill_rules, rule_levels

COST = "foxhunt-cost.json"
COST_RULES = base.REPO / "deploy" / "prometheus" / "foxhunt-cost-rules.yaml"
# What the cost dashboard may read: the live cost rules' experiment sums, what push_spend pushes, and the
# Pushgateway's own push time of that group.
ALLOWED = {
    "foxhunt:experiment_cost:usd_per_hour",
    "foxhunt:experiment_idle_cost:usd_per_hour",
    UNTRACKED,
    LAKE_COST,
    LAKE_IDLE,
    "push_time_seconds",
}

# data/prices.yaml, us-east-1 on demand (test_cost_rules checks these are the table's)
P4DE, P5 = 27.44705, 55.04
UTIL = {"ppo": 0.75, "dqn": 0.5}
RATE = {"ppo": P4DE, "dqn": P5}  # ip-1 (p4de) is all ppo's, ip-2 (p5) all dqn's, the whole time
LAKE = {("2026-01-01", "ppo"): (650.0, 160.0), ("2026-01-01", "dqn"): (1320.96, 660.48),
        ("2025-12-31", "ppo"): (600.0, 150.0)}  # fmt: skip
UNTRACKED_ROWS = {"i-0a1b2c3d4e5f60718": ("g5.xlarge", 1.006), "i-0fedcba9876543210": ("g5.8xlarge", 2.448)}

DAY = 86_400
T0 = 1_767_225_600  # 2026-01-01T00:00:00Z
START = T0 - 600  # input from 23:50 the day before
NOW = T0 + DAY + 6 * 3600  # the dashboard's "now": 2026-01-02T06:00Z
LAKE_FROM = T0 + DAY + 2 * 3600  # the lake's figures for 2026-01-01 land two hours after it ends
STEP = 60


def board() -> dict:
    return base.load(COST)


# ---------------------------------------------------------------- structure


@pytest.mark.parametrize(
    "check",
    [
        base.test_dashboard_is_a_grafana_model_on_the_datasource_variable,
        base.test_queries_use_only_variables_the_dashboard_defines,
        base.test_panel_ids_are_unique,
        base.test_panels_fit_the_grid_without_overlap,
        base.test_every_panel_has_a_unit,
    ],
    ids=lambda f: f.__name__.removeprefix("test_"),
)
def test_cost_dashboard_follows_the_dashboard_conventions(check):
    check(COST)


def test_identity_time_and_variables():
    b = board()
    assert b["uid"] == "foxhunt-cost" and b["title"] == "Foxhunt / Cost"
    assert {"foxhunt", "cost"} <= set(b["tags"])
    assert b["timezone"] == "utc", "days are UTC days, as in the lake: midnight must be 00:00 UTC"
    v = base.variables(b)["experiment"]
    assert v["type"] == "query" and v["multi"] and v["includeAll"] and v["allValue"] == ".*"
    assert v["definition"] == "label_values(foxhunt:experiment_cost:usd_per_hour, experiment)"


def test_panels_read_only_the_cost_series_and_say_where_their_numbers_come_from():
    recorded = {r["record"] for g in yaml.safe_load(COST_RULES.read_text())["groups"] for r in g["rules"]}
    for p in base.panels(board()):
        if p["type"] == "row":
            continue
        used = set().union(*(base.metric_names(t["expr"]) for t in p["targets"]))
        used |= {"push_time_seconds"} & set().union(*(re.findall(r"\w+", t["expr"]) for t in p["targets"]))
        assert used, f"{p['title']}: reads no foxhunt series"
        assert used <= ALLOWED, f"{p['title']}: reads {sorted(used - ALLOWED)}"
        for m in used:
            assert not m.startswith("foxhunt:") or m in recorded, f"{p['title']}: {m} is not a cost rule"
        desc = p.get("description", "")
        assert len(desc) > 60, f"{p['title']}: the description must say where its numbers come from"
        for m in used:  # the description names its source series
            assert m in desc, f"{p['title']}: description does not name {m}"
        for t in p["targets"]:  # every range in a query is one Prometheus accepts once substituted
            assert "[$__range:1m]" in t["expr"] or "$__range" not in t["expr"], t["expr"]
            if "$__range" in t["expr"]:
                assert p.get("timeFrom") == "now/d", f"{p['title']}: $__range must be today so far"


def test_the_panels_the_issue_asks_for():
    titles = {p["title"]: p for p in base.panels(board())}
    exprs = {title: [t["expr"] for t in p.get("targets", [])] for title, p in titles.items()}
    assert any("foxhunt:experiment_cost:usd_per_hour" in e for e in exprs["$/h by experiment"])
    assert any("foxhunt:experiment_idle_cost:usd_per_hour" in e for e in exprs["Idle $/h by experiment"])
    assert exprs["Cluster $/h now"] == ["sum(foxhunt:experiment_cost:usd_per_hour)"]
    assert len(exprs["Today's spend so far vs the day's run rate"]) == 3
    assert any(UNTRACKED in e for e in exprs["Untracked instances ($/h each)"])
    assert any(UNTRACKED in e for e in exprs["Untracked instances $/h"])
    for title in ("Daily $: lake vs live integral", "Gap: live vs lake (%)"):
        p = titles[title]
        assert p["interval"] == "1d" and all(t["interval"] == "1d" for t in p["targets"]), title
        joined = " ".join(exprs[title])
        assert LAKE_COST in joined and "[1d:1m]" in joined and "@ end()" in joined, title


def test_configmap_carries_the_cost_dashboard():
    docs = {
        d["metadata"]["name"]: d
        for d in yaml.safe_load_all((base.GRAFANA / "configmaps.yaml").read_text())
        if d
    }
    cm = docs["foxhunt-dashboard-cost"]
    assert cm["metadata"]["annotations"]["foxhunt.io/dashboard-uid"] == "foxhunt-cost"
    assert cm["data"] == {COST: (base.GRAFANA / COST).read_text()}
    assert (base.GRAFANA / "configmaps.yaml").read_text() == base._build_configmaps().render(base.GRAFANA)


def test_readme_documents_the_dashboard_and_the_pushgateway_scrape():
    text = (base.GRAFANA / "README.md").read_text()
    assert "`foxhunt-cost.json`" in text and "honor_labels: true" in text
    for series in sorted(ALLOWED - {"push_time_seconds"}):
        assert f"`{series}" in text, f"README does not document {series}"


# ---------------------------------------------------------------- on a real Prometheus


def _om(name: str, labels: dict, points) -> list[str]:
    label_text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return [f"{name}{{{label_text}}} {float(v)} {t}" for t, v in points]


def synthetic_input() -> str:
    """OpenMetrics for promtool: the kube and canonical GPU series the cost rules read, and the series a
    Pushgateway holding push_spend's figures shows to a Prometheus scraping it with honor_labels: true."""
    every = range(START, NOW + 1, STEP)
    families: dict[str, list[str]] = {}

    def add(name, labels, value, times=every):
        families.setdefault(name, []).extend(_om(name, labels, ((t, value(t)) for t in times)))

    ksm = {"job": "kube-state-metrics"}
    label = "label_node_kubernetes_io_instance_type"
    add("kube_node_labels", {**ksm, "node": "ip-1", label: "p4de.24xlarge"}, lambda t: 1)
    add("kube_node_labels", {**ksm, "node": "ip-2", label: "p5.48xlarge"}, lambda t: 1)
    add("kube_pod_labels", {**ksm, "namespace": "rl", "pod": "ppo-0", "label_experiment": "ppo"}, lambda t: 1)
    add("kube_namespace_labels", {**ksm, "namespace": "lab", "label_experiment": "dqn"}, lambda t: 1)
    for node, (namespace, pod, experiment) in {
        "ip-1": ("rl", "ppo-0", "ppo"),
        "ip-2": ("lab", "dqn-0", "dqn"),
    }.items():
        for gpu in range(8):
            gpu_labels = dict(node=node, gpu=str(gpu), uuid=f"GPU-{node}-{gpu}", model="NVIDIA H100 80GB HBM3",
                              namespace=namespace, pod=pod, container="trainer")  # fmt: skip
            add("foxhunt:gpu_util:ratio", gpu_labels, lambda t, u=UTIL[experiment]: u)
            add("foxhunt:gpu_power:watts", gpu_labels, lambda t: 400)
    pushed = {"job": DEFAULT_JOB}
    for iid, (itype, usd) in UNTRACKED_ROWS.items():
        labels = dict(region="us-east-1", instance_id=iid, instance_type=itype, name="notebook",
                      experiment="ppo", **pushed)  # fmt: skip
        add(UNTRACKED, labels, lambda t, usd=usd: usd)
    for (day, experiment), (cost, idle) in LAKE.items():
        lake_times = range(LAKE_FROM, NOW + 1, STEP)
        add(LAKE_COST, {"day": day, "experiment": experiment, **pushed}, lambda t, c=cost: c, lake_times)
        add(LAKE_IDLE, {"day": day, "experiment": experiment, **pushed}, lambda t, i=idle: i, lake_times)
    add("push_time_seconds", pushed, lambda t: t - 30)  # pushed half a minute before each scrape
    lines = []
    for name, samples in families.items():
        lines += [f"# TYPE {name} gauge", *samples]
    return "\n".join(lines) + "\n# EOF\n"


def _promtool(*args: str) -> None:
    r = subprocess.run([PROMTOOL, *args], capture_output=True, text=True)
    assert r.returncode == 0, f"promtool {args[:3]} failed: {r.stderr[-2000:]}"


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    work = tmp_path_factory.mktemp("cost-dashboard-prometheus")
    tsdb = work / "tsdb"
    (work / "input.om").write_text(synthetic_input())
    _promtool("tsdb", "create-blocks-from", "openmetrics", "--quiet", str(work / "input.om"), str(tsdb))
    # the checked-in cost rules, evaluated every minute over the whole input, level by level, as the
    # sandbox backfills them
    backfill_rules(tsdb, work, rule_levels(yaml.safe_load(COST_RULES.read_text())), START, NOW, STEP)
    server = PrometheusServer(tsdb, workdir=work)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def substitute(panel: dict, expr: str) -> str:
    """The query Grafana sends for ``panel`` at NOW: all experiments; $__range of a today-so-far panel is
    the time since 00:00 UTC. Digits after $ are label_replace's groups, not variables."""
    values = {"experiment": ".*", "__range": f"{NOW % DAY}s"}

    def value(m: re.Match) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name.isdigit():
            return m.group(0)
        assert name in values, f"{panel['title']}: unknown variable ${name}"
        return values[name]

    return base.VARIABLE_RE.sub(value, expr)


def _get(server: PrometheusServer, path: str, **params) -> list:
    body = requests.get(f"{server.url}/api/v1/{path}", params=params, timeout=30).json()
    assert body["status"] == "success", f"{params.get('query')}: {body.get('error')}"
    return body["data"]["result"]


def instant(server: PrometheusServer, expr: str, at: int = NOW) -> list:
    return _get(server, "query", query=expr, time=at)


def daily(server: PrometheusServer, expr: str) -> list:
    """As Grafana asks a 1d-interval panel in UTC: a point at each 00:00 UTC up to NOW."""
    return _get(server, "query_range", query=expr, start=T0 + DAY, end=NOW, step=DAY)


def by_panel(server) -> dict[str, list[list]]:
    """title -> each target's instant result at NOW (variables substituted)."""
    return {
        p["title"]: [instant(server, substitute(p, t["expr"])) for t in p["targets"]]
        for p in base.panels(board())
        if p["type"] != "row"
    }


def test_every_panel_query_runs_and_finds_data(prometheus):
    empty, legends = [], []
    for p in base.panels(board()):
        for t in p.get("targets", []):
            expr = substitute(p, t["expr"])
            results = [instant(prometheus, expr)]
            if t.get("interval") == "1d":
                results.append(daily(prometheus, expr))
            for result in results:
                if not result:
                    empty.append(f"{p['title']!r}: {expr}")
                wanted = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", t.get("legendFormat", "")))
                if t.get("format") != "table" and any(
                    label not in s["metric"] for s in result for label in wanted
                ):
                    legends.append(f"{p['title']!r}: legend {t['legendFormat']!r}: {expr}")
    assert not empty, "panel queries that find nothing:\n" + "\n".join(empty)
    assert not legends, "legends naming labels the series lack:\n" + "\n".join(legends)


def _values(result: list, label: str = "experiment") -> dict[str, float]:
    return {s["metric"].get(label, ""): float(s["value"][1]) for s in result}


def test_dollars_per_hour_now_are_the_price_table_s(prometheus):
    got = by_panel(prometheus)
    assert _values(got["Cluster $/h now"][0]) == {"": pytest.approx(P4DE + P5, abs=1e-9)}
    assert _values(got["$/h by experiment"][0]) == pytest.approx(RATE, abs=1e-9)
    idle = {e: RATE[e] * (1 - UTIL[e]) for e in RATE}
    assert _values(got["Idle $/h by experiment"][0]) == pytest.approx(idle, abs=1e-9)
    assert _values(got["Idle $/h now"][0]) == {"": pytest.approx(sum(idle.values()), abs=1e-9)}
    share = sum(idle.values()) / (P4DE + P5)
    assert _values(got["Idle share of $/h"][0]) == {"": pytest.approx(share, abs=1e-9)}


def test_today_so_far_and_the_run_rate(prometheus):
    got = by_panel(prometheus)
    hours = (NOW % DAY) / 3600  # 6 h since 00:00 UTC
    spent, run_rate, by_midnight = (_values(r)[""] for r in got["Today's spend so far vs the day's run rate"])
    assert spent == pytest.approx((P4DE + P5) * hours, rel=0.01)
    assert run_rate == pytest.approx((P4DE + P5) * 24, abs=1e-6)
    assert by_midnight == pytest.approx(spent + (P4DE + P5) * (24 - hours), abs=1e-6)
    per_experiment = _values(got["Today's spend by experiment"][0])
    assert per_experiment == pytest.approx({e: r * hours for e, r in RATE.items()}, rel=0.01)


def test_untracked_instances(prometheus):
    got = by_panel(prometheus)
    (rows,) = got["Untracked instances ($/h each)"]
    assert {s["metric"]["instance_id"]: float(s["value"][1]) for s in rows} == {
        iid: usd for iid, (_, usd) in UNTRACKED_ROWS.items()
    }
    assert all(
        set(s["metric"]) == {"region", "instance_id", "instance_type", "name", "experiment"} for s in rows
    )
    total = sum(usd for _, usd in UNTRACKED_ROWS.values())
    assert _values(got["Untracked instances $/h"][0]) == {"": pytest.approx(total, abs=1e-9)}
    assert _values(got["Untracked instances"][0]) == {"": 2}
    assert _values(got["Batch figures age"][0]) == {"": pytest.approx(30)}


def test_reconciliation_sets_the_lake_beside_the_live_integral_of_the_same_day(prometheus):
    """At 00:00 UTC on 2026-01-02 the live integral of 2026-01-01 (one p4de held by ppo all day: 24 x
    27.44705 = 658.73 $; one p5 held by dqn: 1320.96 $) is set beside the lake's figures for that day,
    which landed two hours later; the gap is 100 x (live - lake) / lake."""
    panel = {p["title"]: p for p in base.panels(board())}
    live_q, lake_q = (substitute(panel["Daily $: lake vs live integral"], t["expr"])
                      for t in panel["Daily $: lake vs live integral"]["targets"])  # fmt: skip
    gap_q = substitute(panel["Gap: live vs lake (%)"], panel["Gap: live vs lake (%)"]["targets"][0]["expr"])

    def at_midnight(expr: str) -> dict[str, float]:
        out = {}
        for s in daily(prometheus, expr):
            ((t, v),) = s["values"]  # one complete day in the range: one point, at its end
            assert int(float(t)) == T0 + DAY
            out[s["metric"]["experiment"]] = float(v)
        return out

    live, lake, gap = at_midnight(live_q), at_midnight(lake_q), at_midnight(gap_q)
    assert live == pytest.approx({"ppo": 24 * P4DE, "dqn": 24 * P5}, rel=0.01)
    assert live["ppo"] == pytest.approx(658.73, rel=0.01)
    assert lake == {"ppo": 650.0, "dqn": 1320.96}  # 2026-01-01's, not 2025-12-31's
    assert gap == pytest.approx({e: 100 * (live[e] - lake[e]) / lake[e] for e in lake}, rel=1e-9)
    assert gap["ppo"] == pytest.approx(100 * (658.7292 - 650) / 650, abs=0.2)
    assert abs(gap["dqn"]) < 0.2
    # at that midnight itself the lake had nothing for the day yet: @ end() (the panel's end) is what
    # brings the figures that landed later beside it
    assert instant(prometheus, lake_q, at=T0 + DAY) == []
    lake_table = {(s["metric"]["day"], s["metric"]["experiment"]): float(s["value"][1])
                  for s in by_panel(prometheus)["Lake daily $ and idle $"][0]}  # fmt: skip
    assert lake_table == {k: cost for k, (cost, _) in LAKE.items()}


def test_variable_query_selects_existing_series(prometheus):
    v = base.variables(board())["experiment"]
    selector, label = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", v["definition"]).groups()
    assert {s["metric"][label] for s in instant(prometheus, selector)} == {"ppo", "dqn"}
