"""The weekly cost report: figures from the frames, charts as real PNGs, escaping, determinism."""

from __future__ import annotations

import base64
import hashlib
import io
import math
import os
import re
import struct
import subprocess
import sys
from datetime import date, datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest

from foxhunt_obs.lib.names import CLUSTER_IDLE
from foxhunt_obs.lib.names import OTHER_EXPERIMENTS as OTHER
from foxhunt_obs.lib.report import render_weekly_report
from foxhunt_obs.lib.report.charts import IDLE_GREY, chart_series, experiment_colours
from foxhunt_obs.lib.report.model import COST_POLICY, ReportDataError, ReportLinks, WeeklyReportData
from foxhunt_obs.lib.tracing import LinkTemplates

WEEK = date(2026, 11, 16)  # a Monday
EXPERIMENTS = ("ppo-ant", "sac-humanoid", "dreamer-v3")
PRICE = 4.1  # $ per GPU-hour
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _daily(names=EXPERIMENTS, scale: float = 1.0) -> pd.DataFrame:
    rows = []
    for i in range(7):
        day = WEEK + timedelta(days=i)
        for j, name in enumerate(names):
            gpu_hours = 8 * (j + 1) * (12 + i) * scale
            utilization = 0.35 + 0.15 * j + 0.02 * i
            usd = gpu_hours * PRICE
            rows.append((day, name, usd, usd * (1 - utilization), gpu_hours, gpu_hours * utilization))
        idle_hours = 10.0 + i
        rows.append((day, CLUSTER_IDLE, idle_hours * PRICE, idle_hours * PRICE, idle_hours, 0.0))
    return pd.DataFrame(
        rows, columns=["day", "experiment", "allocated_usd", "idle_usd", "gpu_hours", "active_gpu_hours"]
    )


def _experiments(daily: pd.DataFrame) -> pd.DataFrame:
    e = daily.groupby("experiment", as_index=False)[
        ["gpu_hours", "active_gpu_hours", "allocated_usd", "idle_usd"]
    ].sum()
    e["mean_util"] = e["active_gpu_hours"] / e["gpu_hours"]
    e["active_gpu_hours_per_usd"] = e["active_gpu_hours"] / e["allocated_usd"]
    e["usd_per_active_gpu_hour"] = (e["allocated_usd"] / e["active_gpu_hours"]).replace(np.inf, np.nan)
    e["energy_kwh"] = e["gpu_hours"] * 0.4
    e["cost_source"] = ["cur", "cur+estimate", "estimate", "cur"][: len(e)] + ["cur"] * max(0, len(e) - 4)
    return e


def make_data(names=EXPERIMENTS, previous: bool = True, alerts=None, bill: bool = True) -> WeeklyReportData:
    daily = _daily(names)
    experiments = _experiments(daily)
    prev = None
    if previous:
        # the week before: the first experiment ran at 80 %, the last one did not run, "old-run" did
        prev_names = [names[0], names[1], "old-run"]
        prev = _experiments(_daily(prev_names, scale=0.8))
    total = float(experiments["allocated_usd"].sum())
    wastes = pd.DataFrame(
        {
            "pod": [f"{names[k % len(names)]}-worker-{k}" for k in range(5)],
            "experiment": [names[k % len(names)] for k in range(5)],
            "node": [f"ip-10-0-0-{k}" for k in range(5)],
            "gpus": [8, 8, 4, 2, 1],
            "held_gpu_hours": [96.0, 80.0, 40.0, 20.0, 6.0],
            "mean_util": [0.01, 0.02, 0.0, 0.05, 0.03],
            "idle_usd": [390.0, 320.5, 164.0, 78.0, 23.9],
        }
    )
    outcomes = pd.DataFrame(
        {
            "run_name": ["run-a", "run-b", "run-c"],
            "experiment": [names[0], names[1], names[2 % len(names)]],
            "success_start": [20.0, 50.0, 70.0],
            "success_end": [45.0, 55.0, 70.0],
            "success_gained": [25.0, 5.0, 0.0],
            "usd": [1000.0, 900.0, 400.0],
            "usd_per_point": [40.0, 180.0, math.nan],
        }
    )
    totals = {
        "bill_usd": total * 1.02 if bill else math.nan,
        "estimate_usd": total,
        "allocated_usd": float(
            experiments.loc[experiments.experiment != CLUSTER_IDLE, "allocated_usd"].sum()
        ),
        "idle_usd": float(experiments["idle_usd"].sum()),
        "unallocated_usd": float(
            experiments.loc[experiments.experiment == CLUSTER_IDLE, "allocated_usd"].sum()
        ),
        "gap_pct": (1 / 1.02 - 1) * 100 if bill else math.nan,
    }
    return WeeklyReportData(
        week_start=WEEK,
        daily=daily,
        experiments=experiments,
        previous=prev,
        wastes=wastes,
        outcomes=outcomes,
        totals=totals,
        alerts=alerts,
    )


def _png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == PNG_SIGNATURE and png[12:16] == b"IHDR"
    return struct.unpack(">II", png[16:24])


@pytest.fixture(scope="module")
def data() -> WeeklyReportData:
    return make_data()


@pytest.fixture(scope="module")
def report(data):
    return render_weekly_report(data)


def test_figures_are_the_frames_sums(data, report):
    f, e, d = report.figures, data.experiments, data.daily
    total, idle, active = e["allocated_usd"].sum(), e["idle_usd"].sum(), e["active_gpu_hours"].sum()
    assert total == pytest.approx(d["allocated_usd"].sum())  # the fixture's frames agree with each other
    assert f["total_usd"] == pytest.approx(total)
    assert f["idle_usd"] == pytest.approx(idle)
    assert f["idle_pct"] == pytest.approx(idle / total * 100)
    assert f["unallocated_usd"] == pytest.approx(e.loc[e.experiment == CLUSTER_IDLE, "allocated_usd"].sum())
    assert f["gpu_hours"] == pytest.approx(e["gpu_hours"].sum())
    assert f["active_gpu_hours"] == pytest.approx(active)
    assert f["active_gpu_hours_per_usd"] == pytest.approx(active / total)
    assert f["usd_per_active_gpu_hour"] == pytest.approx(total / active)
    assert f["energy_kwh"] == pytest.approx(e["energy_kwh"].sum())
    assert f["experiments"] == 3
    assert f["bill_usd"] == pytest.approx(total * 1.02)
    assert f["estimate_usd"] == pytest.approx(total)
    assert f["estimate_gap_pct"] == pytest.approx((1 / 1.02 - 1) * 100)
    assert f["top_wastes_idle_usd"] == pytest.approx(data.wastes["idle_usd"].sum())
    assert f["best_usd_per_point"] == 40.0
    assert all(isinstance(v, float) for v in f.values())
    # the headline shows them as money
    for needle in (
        f"${total:,.2f}",
        f"${idle:,.2f}",
        f"{active / total:.3f}",
        f"${total / active:,.2f}",
        "-2.0%",
    ):
        assert needle in report.markdown and needle in report.html


def test_charts_are_real_pngs(report):
    from PIL import Image  # installed with matplotlib

    assert list(report.charts) == ["daily_spend.png", "utilization_per_dollar.png", "idle_by_day.png"]
    for name, png in report.charts.items():
        assert _png_size(png) == (900, 400), name
        with Image.open(io.BytesIO(png)) as img:
            img.load()
            assert img.size == (900, 400)
            colours = img.convert("RGB").getcolors(maxcolors=1 << 16)
        assert colours is None or len(colours) > 20, f"{name} looks blank"
        assert b"Software" not in png and b"matplotlib" not in png.lower()


def test_markdown_has_tables_and_data_uri_images(data, report):
    md = report.markdown
    assert md.startswith("# Weekly GPU cost report — week of 2026-11-16\n")
    for header in ("| Experiment ", "| Pod ", "| Run ", "| **Total** "):
        assert header in md
    for name in (*EXPERIMENTS, CLUSTER_IDLE, "old-run", "run-a", "ip-10-0-0-4"):
        assert name in md
    images = re.findall(r"!\[([^\]]+)\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", md)
    assert [base64.b64decode(b) for _, b in images] == list(report.charts.values())
    assert "the measure no other tool gives" in md
    assert "No alerts table yet." in md
    # the cost policy, in words, in both renderings
    assert "divided by the GPUs on the node" in md and "divided by the GPUs on the node" in report.html


def test_html_is_self_contained(report):
    page = report.html
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert not re.search(r"https?://", page)
    assert "<script" not in page.lower() and "<link" not in page.lower() and "@import" not in page
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    srcs = re.findall(r'<img src="([^"]+)"', page)
    assert len(srcs) == 3 and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert "max-width: 100%" in page and "overflow-x: auto" in page


def test_rendering_is_deterministic(data, report):
    again = render_weekly_report(make_data())
    assert again.html == report.html and again.markdown == report.markdown
    assert again.charts == report.charts
    assert again.figures.keys() == report.figures.keys()


@pytest.mark.servers
def test_rendering_is_deterministic_across_processes(report):
    """Another interpreter with another hash seed (set order) gives the same bytes."""
    code = (
        "import hashlib, sys\n"
        "from foxhunt_obs_tests.lib.report.test_weekly_report import make_data\n"
        "from foxhunt_obs.lib.report import render_weekly_report\n"
        "r = render_weekly_report(make_data())\n"
        "print(hashlib.sha256(r.html.encode()).hexdigest())\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345", "MPLBACKEND": "svg"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == hashlib.sha256(report.html.encode()).hexdigest()


def test_user_text_is_escaped():
    evil = "<script>alert(1)</script>"
    piped = "ppo|ant *bold* [x](http://evil.example) ![i](http://evil.example/i.png)"
    r = render_weekly_report(make_data(names=(evil, piped, "sac")))
    for page in (r.html, r.markdown):
        assert evil not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script" not in r.html.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", r.html, re.I)
    md = r.markdown
    assert "ppo\\|ant \\*bold\\* \\[x\\](http://evil.example)" in md
    assert not re.search(r"(?<!\\)\]\(http", md)  # no link or image came through
    # a pipe in a name cannot add a column: every row of a table has as many cells as its header
    for block in md.split("\n\n"):
        lines = block.splitlines()
        if lines and lines[0].startswith("|"):
            cells = {len(re.split(r"(?<!\\)\|", line)) for line in lines}
            assert len(cells) == 1, block


def test_without_previous_week_there_are_no_deltas():
    r = render_weekly_report(make_data(previous=False))
    assert "no week-over-week deltas" in r.markdown and "no week-over-week deltas" in r.html
    assert math.isnan(r.figures["week_over_week_usd_pct"]) and math.isnan(r.figures["previous_total_usd"])
    assert "| Week before " not in r.markdown
    empty = make_data()
    empty.previous = empty.previous.iloc[0:0]
    assert "no week-over-week deltas" in render_weekly_report(empty).markdown


def test_week_over_week_deltas(data, report):
    now = data.experiments.set_index("experiment")["allocated_usd"]
    before = data.previous.set_index("experiment")["allocated_usd"]
    expected = (now.sum() - before.sum()) / before.sum() * 100
    assert report.figures["week_over_week_usd_pct"] == pytest.approx(expected)
    assert report.figures["previous_total_usd"] == pytest.approx(before.sum())
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in
            report.markdown.split("## Week over week")[1].split("## Experiments")[0].splitlines()
            if line.startswith("| ")}  # fmt: skip
    # ppo-ant ran at 80 % of this week the week before: +25 %
    delta = now["ppo-ant"] - before["ppo-ant"]
    assert rows["ppo-ant"][:4] == [
        f"${now['ppo-ant']:,.2f}",
        f"${before['ppo-ant']:,.2f}",
        f"+${delta:,.2f}",
        "+25.0%",
    ]
    assert rows["dreamer-v3"][1:4] == ["—", f"+${now['dreamer-v3']:,.2f}", "new"]
    assert rows["old-run"][0] == "—" and rows["old-run"][2:4] == [f"-${before['old-run']:,.2f}", "gone"]
    assert rows["**Total**"][3] == f"**{expected:+.1f}%**"
    assert f"{expected:+.1f}%" in report.html


def test_outcomes_best_dollar_per_point_first(report):
    section = report.markdown.split("## Outcome per dollar")[1].split("## Alerts")[0]
    rows = [
        [c.strip() for c in line.split("|")[1:-1]]
        for line in section.splitlines()
        if line.startswith("| run-")
    ]
    assert [r[0] for r in rows] == ["run-a", "run-b", "run-c"]
    assert rows[0][-2:] == ["$1,000.00", "$40.00"] and rows[2][-1] == "—"  # no gain: no $ per point


def test_alerts_when_the_table_exists():
    fired = datetime(2026, 11, 18, 9, 30, tzinfo=timezone.utc)
    alerts = pd.DataFrame(
        {
            "rule": ["gpu_idle_held", "nan_loss"],
            "severity": ["warning", "critical"],
            "fired_at": [fired + timedelta(hours=5), fired],
            "resolved_at": [None, fired + timedelta(minutes=45)],
            "summary": ["4 GPUs idle on <node>", "NaN loss in run-a"],
        }
    )
    r = render_weekly_report(make_data(alerts=alerts))
    section = r.markdown.split("## Alerts")[1].split("## Cost policy")[0]
    assert section.index("nan\\_loss") < section.index("gpu\\_idle\\_held")  # by time fired, escaped
    assert (
        "2026-11-18 09:30 UTC" in section and "2026-11-18 10:15 UTC" in section and "still firing" in section
    )
    assert "&lt;node&gt;" in section and "4 GPUs idle on &lt;node&gt;" in r.html
    assert "No alerts table yet" not in r.markdown
    none = render_weekly_report(make_data(alerts=alerts.iloc[0:0]))
    assert "No alert fired this week." in none.markdown


def test_no_bill_yet_and_custom_policy():
    d = make_data(bill=False)
    d.cost_policy = "Our policy: <b>node</b> cost / GPUs.\n\n- one\n- two"
    r = render_weekly_report(d)
    assert math.isnan(r.figures["bill_usd"]) and math.isnan(r.figures["estimate_gap_pct"])
    assert "no bill yet" in r.markdown and "No bill for this week yet" in r.html
    assert (
        "Our policy: &lt;b&gt;node&lt;/b&gt; cost / GPUs." in r.html and "<li>one</li><li>two</li>" in r.html
    )
    assert "divided by the GPUs on the node" not in r.markdown
    assert "divided by the GPUs on the node" in COST_POLICY


def test_gap_is_computed_when_totals_lack_it():
    d = make_data()
    d.totals = {**d.totals, "gap_pct": math.nan, "bill_usd": 100.0, "estimate_usd": 110.0}
    assert render_weekly_report(d).figures["estimate_gap_pct"] == pytest.approx(10.0)


def test_totals_that_disagree_with_the_table_are_flagged():
    d = make_data()
    assert "Check:" not in render_weekly_report(d).markdown
    d.totals = {**d.totals, "allocated_usd": 1.0, "unallocated_usd": 2.0}
    assert "Check:" in render_weekly_report(d).markdown


def test_unknown_activity_is_said_not_counted_as_idle():
    d = make_data()
    assert "Unknown activity" not in render_weekly_report(d).markdown
    d.totals = {**d.totals, "unknown_activity_usd": 123.45}
    r = render_weekly_report(d)
    assert "Unknown activity" in r.markdown and "$123.45" in r.markdown
    assert "core_columns_reported" in r.html
    assert "counted neither as active nor as idle" in COST_POLICY


def test_bad_input_names_the_frame():
    d = make_data()
    d.week_start = WEEK + timedelta(days=1)
    with pytest.raises(ReportDataError, match="not a Monday"):
        render_weekly_report(d)
    d = make_data()
    d.wastes = d.wastes.drop(columns=["idle_usd"])
    with pytest.raises(ReportDataError, match=r"'wastes' misses columns \['idle_usd'\]"):
        render_weekly_report(d)
    d = make_data()
    d.experiments = pd.concat([d.experiments, d.experiments.iloc[:1]])
    with pytest.raises(ReportDataError, match="several rows"):
        render_weekly_report(d)


def test_an_empty_week_still_renders():
    d = make_data(previous=False)
    d.daily, d.experiments = d.daily.iloc[0:0], d.experiments.iloc[0:0]
    d.wastes, d.outcomes = d.wastes.iloc[0:0], d.outcomes.iloc[0:0]
    r = render_weekly_report(d)
    assert r.figures["total_usd"] == 0 and math.isnan(r.figures["active_gpu_hours_per_usd"])
    assert all(_png_size(png) == (900, 400) for png in r.charts.values())
    assert "No GPU was held idle this week." in r.markdown


def test_colours_are_per_experiment_and_many_experiments_are_lumped():
    names = tuple(f"exp-{i:02d}" for i in range(14))
    d = make_data(names=names)
    series = chart_series(d.experiments)
    assert len(series) == 11 and series[-2:] == [OTHER, CLUSTER_IDLE]
    assert series[0] == "exp-13"  # the biggest spender first (bottom of the stacks)
    colours = experiment_colours(series)
    assert colours[CLUSTER_IDLE] == IDLE_GREY
    assert len({colours[s] for s in series}) == len(series)  # no two series share a colour
    assert experiment_colours(reversed(series)) == colours  # independent of order
    r = render_weekly_report(d)
    assert all(_png_size(png) == (900, 400) for png in r.charts.values())
    assert all(n in r.markdown for n in names)  # tables keep every experiment


if __name__ == "__main__":  # python -m foxhunt_obs_tests.lib.report.test_weekly_report OUT_DIR
    out = sys.argv[1]
    report = render_weekly_report(make_data())
    os.makedirs(out, exist_ok=True)
    open(os.path.join(out, "report.html"), "w").write(report.html)
    open(os.path.join(out, "report.md"), "w").write(report.markdown)
    for name, png in report.charts.items():
        open(os.path.join(out, name), "wb").write(png)


def test_both_activity_bases_and_the_split_policy_are_in_the_report():
    """Utilization per dollar by utilization and by SM activity, the headline on the configured
    basis, and the split over holders in the cost policy."""
    d = make_data()
    r = render_weekly_report(d)
    assert "SM activity not reported" in r.markdown  # frames without the SM columns: unknown, never 0
    assert r.figures["sm_active_gpu_hours_per_usd"] != r.figures["sm_active_gpu_hours_per_usd"]  # NaN

    e = d.experiments
    # the columns there but nothing reported (NULL on every experiment; the cluster row's unheld dollars
    # count as known, idle): still unknown, not 0.000
    e["sm_active_gpu_hours"], e["sm_unknown_activity_usd"] = np.nan, e["allocated_usd"]
    e.loc[e["experiment"] == "(cluster idle)", "sm_unknown_activity_usd"] = 0.0
    r = render_weekly_report(d)
    assert "SM activity not reported" in r.markdown and "0.000 by SM activity" not in r.markdown
    assert r.figures["sm_active_gpu_hours_per_usd"] != r.figures["sm_active_gpu_hours_per_usd"]

    e["sm_active_gpu_hours"] = e["active_gpu_hours"] * 0.5
    e["sm_unknown_activity_usd"] = 0.0
    r = render_weekly_report(d)
    total, active = e["allocated_usd"].sum(), e["active_gpu_hours"].sum()
    assert r.figures["sm_active_gpu_hours_per_usd"] == pytest.approx(active * 0.5 / total)
    util_text = f"{active / total:,.3f}"
    sm_text = f"{active * 0.5 / total:,.3f}"
    assert "Active GPU-hours per $ (utilization)" in r.markdown and f"{sm_text} by SM activity" in r.markdown
    assert "SM-active GPU-h per $" in r.markdown

    d.activity_basis = "sm"
    r = render_weekly_report(d)
    assert (
        "Active GPU-hours per $ (SM activity)" in r.markdown and f"{util_text} by utilization" in r.markdown
    )
    assert "a hand-off at 14:20 charges the first pod 20 minutes and the second 40" in COST_POLICY
    assert "time-sliced GPU" in COST_POLICY and "its `namespace`" in COST_POLICY


# -- links to the report run's trace and the named pods' logs (FOXHUNT_*_URL_TEMPLATE) ------------------
RUN_ID = "7c3a2f10-5b4e-4d6a-9e8f-0a1b2c3d4e5f"
RUN_STARTED = datetime(2026, 11, 23, 8, 0, 3, tzinfo=timezone.utc)
LOGS_TEMPLATE = "https://grafana.test/explore?logs={namespace}/{pod}&from={from_ms}&to={to_ms}"
TRACE_TEMPLATE = "https://grafana.test/explore?trace={trace_id}&from={from_ms}&to={to_ms}"


def _ms(day: date) -> str:
    return str(int(datetime.combine(day, datetime.min.time(), tzinfo=timezone.utc).timestamp() * 1000))


def _linked(logs: str = LOGS_TEMPLATE, trace: str = TRACE_TEMPLATE) -> WeeklyReportData:
    data = make_data()
    # two pods in a namespace, one in none (no logs link: the template needs both)
    data.wastes = data.wastes.assign(namespace=["ml", "ml", None, "rl team", "rl team"])
    data.links = ReportLinks(LinkTemplates(logs=logs, trace=trace), RUN_ID, RUN_STARTED)
    return data


def test_report_links_to_its_run_trace_and_each_pods_week_of_logs():
    r = render_weekly_report(_linked())
    run_started_ms = str(int(RUN_STARTED.timestamp() * 1000))
    trace = f"https://grafana.test/explore?trace={RUN_ID.replace('-', '')}&from={run_started_ms}&to=now"
    assert f'<a href="{trace.replace("&", "&amp;")}">its trace</a>' in r.html
    assert f"[its trace]({trace})" in r.markdown
    week = f"&from={_ms(WEEK)}&to={_ms(WEEK + timedelta(days=7))}"  # Monday 00:00 to the next Monday
    pods = make_data().wastes["pod"]
    for pod, namespace in zip(pods, ["ml", "ml", None, "rl%20team", "rl%20team"]):
        url = f"https://grafana.test/explore?logs={namespace}/{pod}{week}"
        if namespace is None:
            assert f"logs=None/{pod}" not in r.html and f"/{pod}&" not in r.markdown
            continue
        assert f'<a href="{url.replace("&", "&amp;")}">week&#x27;s logs</a>' in r.html
        assert f"[week's logs]({url})" in r.markdown
    assert r.html.count("<a href=") == 1 + 4 and r.markdown.count("](https://") == 1 + 4
    assert "| Logs" in r.markdown and "<th>Logs</th>" in r.html


def test_without_templates_the_report_has_no_links():
    for data in (make_data(), _linked(logs="", trace="")):
        r = render_weekly_report(data)
        assert "<a " not in r.html and "](http" not in r.markdown
        assert "Logs" not in r.markdown and "its trace" not in r.markdown
    # only the one that is set
    r = render_weekly_report(_linked(logs=""))
    assert r.html.count("<a href=") == 1 and "its trace" in r.html and "Logs</th>" not in r.html


def test_a_link_cannot_break_the_markdown_or_the_page():
    """A template with characters Markdown or HTML give meaning to still makes one link each."""
    r = render_weekly_report(_linked(trace='https://grafana.test/x?q={"a":[1]}&t=(|{trace_id}|)'))
    [md_link] = re.findall(r"\[its trace\]\(([^)\s]*)\)", r.markdown)
    assert "%7C" in md_link and "%28" in md_link and '"' not in md_link
    assert '<a href="https://grafana.test/x?q={&quot;a&quot;:[1]}&amp;t=(|' in r.html
    # a template that is no http(s) URL makes no link
    r = render_weekly_report(_linked(logs="javascript:alert({pod})", trace="file:///{trace_id}"))
    assert "<a " not in r.html and "javascript" not in r.markdown
