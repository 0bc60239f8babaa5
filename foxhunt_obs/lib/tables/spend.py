"""spend_now: what the cluster and the instances outside it cost right now, today and this month,
while the bill is still a day or two away.

* cluster: the live cost rules' $/h per experiment (lib/ingest/live_spend: foxhunt:experiment_cost), today
  as their integral since midnight UTC; the month's complete days from the lake's cost_allocation (the
  batch path, bill lines included) where that day is materialized, else the live integral of the day.
* untracked: each running EC2 instance no cluster node corresponds to (lib/ingest/untracked), its price
  table $/h, today from max(launch, midnight); its earlier days reach the month through the bill (the
  lake's tagged lines), never guessed from its launch time.
* run_rate_usd: the month so far + the $/h now x the hours left in the month (UTC): what the month comes to
  if nothing changes; budget_burn warns on it before the bill says so.

The reconciliation beside it: for each of the last RECONCILE_DAYS complete days in the lake, cost_allocation's
node-hour dollars per experiment against the live integral of the same day. With a Pushgateway configured,
the untracked instances and the lake's daily dollars are pushed for the cost dashboard.
"""

from __future__ import annotations

import calendar
import math
from datetime import datetime, timedelta, timezone

import pandas as pd
import pyarrow as pa

from foxhunt_obs.lib.ingest.live_spend import LiveCostMissing, live_rate, live_spend
from foxhunt_obs.lib.ingest.untracked import UntrackedError
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.names import CLUSTER_IDLE
from foxhunt_obs.lib.schemas import COST_ALLOCATION, COSTS_HOURLY, NODE_SAMPLES, SPEND_NOW
from foxhunt_obs.lib.sources.ec2 import Ec2Error
from foxhunt_obs.lib.tables import Built, Check, md_table
from foxhunt_obs.lib.tables.cost_model import bill_rates

RECONCILE_DAYS = 7
MIN_WINDOW_S = 60  # the live integral's step: a window shorter than that holds no sample
RECONCILE_GAP = 0.02  # live vs batch, a day's total: beyond this the live rules or the inputs disagree
# cost_allocation rows of the bill's other lines (FSx, S3, EKS, instances on no node): the live rules
# price node-hours only (kinds gpu, mig_unsliced, node_without_gpus)
BILL_LINE_KINDS = ("tagged", "shared")


def _midnight(t: datetime) -> datetime:
    return t.replace(hour=0, minute=0, second=0, microsecond=0)


def hours_left_in_month(now: datetime) -> float:
    days = calendar.monthrange(now.year, now.month)[1]
    end = _midnight(now.replace(day=1)) + timedelta(days=days)
    return (end - now).total_seconds() / 3600


def lake_days(lake: Lake, first: datetime, end: datetime, node_hours_only: bool = False) -> pd.DataFrame:
    """cost_allocation's dollars per (day, experiment) for the materialized days in [first, end): what
    a pod held to its experiment, what nobody held to (cluster idle). ``node_hours_only``: the rows the
    live rules price (node-hours), not the bill's tagged and shared lines."""
    kinds = "AND kind NOT IN (SELECT unnest($kinds))" if node_hours_only else ""
    sql = f"""
        WITH r AS (
          SELECT CAST(hour AS DATE) AS day, experiment, allocated_usd, unallocated_usd, idle_usd
          FROM cost_allocation WHERE hour >= $first AND hour < $end {kinds}
        )
        SELECT day, CASE WHEN experiment = '' THEN $idle ELSE experiment END AS experiment,
               sum(allocated_usd) AS cost_usd, sum(idle_usd) AS idle_usd FROM r GROUP BY ALL
        UNION ALL
        SELECT day, $idle, sum(unallocated_usd), sum(unallocated_usd) FROM r GROUP BY ALL
    """
    params = {"first": first, "end": end, "idle": CLUSTER_IDLE}
    if node_hours_only:
        params["kinds"] = list(BILL_LINE_KINDS)
    df = lake.query(sql, params, tables=[COST_ALLOCATION]).to_pandas()
    df = df.groupby(["day", "experiment"], as_index=False)[["cost_usd", "idle_usd"]].sum(min_count=1)
    return df[df["cost_usd"].abs() > 0].sort_values(["day", "experiment"]).reset_index(drop=True)


def spend_now(
    lake: Lake,
    prometheus,
    untracked,
    now: datetime,
    pushgateway_url: str = "",
    push=None,
) -> Built:
    """``untracked``: a lib.ingest.untracked.UntrackedSpend (None: no EC2 access, no untracked rows);
    ``push``: lib.delivery.pushgateway.push_spend (passed in: tables do not send)."""
    now = now.astimezone(timezone.utc).replace(microsecond=0)
    today, month = _midnight(now), _midnight(now.replace(day=1))
    left_h = hours_left_in_month(now)

    rates = live_rate(prometheus, now)
    today_usd = live_spend(prometheus, today, now) if (now - today).total_seconds() >= MIN_WINDOW_S else {}
    closed = lake_days(lake, month, today)
    month_usd = closed.groupby("experiment")["cost_usd"].sum().to_dict()
    in_lake = {pd.Timestamp(d).date() for d in closed["day"]}
    live_days, missing = [], []
    for d in pd.date_range(month, today, freq="D", inclusive="left"):
        if d.date() in in_lake:
            continue
        try:
            day = live_spend(prometheus, d.to_pydatetime(), d.to_pydatetime() + timedelta(days=1))
        except LiveCostMissing:  # neither the lake nor the live rules have it: said, not taken as $0
            missing.append(d.date().isoformat())
            continue
        live_days.append(d.date())
        for e, usd in day.items():
            month_usd[e] = month_usd.get(e, 0.0) + usd
    rows = []
    for e in sorted(set(rates) | set(today_usd) | set(month_usd)):
        so_far = month_usd.get(e, 0.0) + today_usd.get(e, 0.0)
        rate = rates.get(e, 0.0)
        rows.append((now, e, "cluster", rate, today_usd.get(e, 0.0), so_far, so_far + rate * left_h))

    instances, untracked_error = pd.DataFrame(), ""
    if untracked is not None:
        try:
            instances = untracked.frame(now)
        except (Ec2Error, UntrackedError) as e:  # the cluster's figures stand; the check says what is missing
            untracked_error = str(e)
    for i in instances.itertuples():
        usd = float(i.usd_per_hour)
        if not math.isfinite(usd):
            continue  # unpriced: untracked_spend names it; no dollar figure is made up
        launched = pd.Timestamp(i.launch_time).to_pydatetime() if pd.notna(i.launch_time) else today
        hours = max(0.0, (now - max(launched, today)).total_seconds() / 3600)
        rows.append(
            (now, i.experiment or "", "untracked", usd, usd * hours, usd * hours, usd * (hours + left_h))
        )
    table = pa.Table.from_pylist(
        [dict(zip(SPEND_NOW.schema.names, r)) for r in rows], schema=SPEND_NOW.schema
    )
    key = SPEND_NOW.key(today)
    lake.write_partition(SPEND_NOW, key, table)

    reconciliation = reconcile(lake, prometheus, today)
    unpriced = int(instances["usd_per_hour"].isna().sum()) if len(instances) else 0
    pushed = 0
    if pushgateway_url:
        pushed = push(
            pushgateway_url,
            untracked=[
                {
                    k: getattr(i, k)
                    for k in ("region", "instance_id", "instance_type", "name", "experiment", "usd_per_hour")
                }
                for i in instances.itertuples()
                if math.isfinite(float(i.usd_per_hour))
            ],
            rates=bill_rate_rows(lake, today),
            lake_daily=[
                {
                    "day": r.day,
                    "experiment": r.experiment,
                    "cost_usd": r.batch_usd,
                    "idle_usd": r.batch_idle_usd,
                }
                for r in reconciliation.itertuples()
            ],
        )
    frame = table.to_pandas()
    totals = frame[["usd_per_hour", "today_usd", "month_usd", "run_rate_usd"]].sum()
    # per day: the live total against the batch's (NaN where the live rules did not record the day)
    days = reconciliation.groupby("day")[["live_usd", "batch_usd"]].sum(min_count=1)
    gaps = ((days["live_usd"] - days["batch_usd"]) / days["batch_usd"]).abs()
    unrecorded = sorted(days.index[days["live_usd"].isna()])
    checks = [
        Check(
            "month_complete",
            not missing,
            {"days_missing": len(missing), "missing": ", ".join(missing) or "none"},
            severity="WARN",
        ),
        Check(
            "live_matches_lake",
            bool((gaps.dropna() <= RECONCILE_GAP).all()) and not unrecorded,
            {
                "days": len(gaps),
                "largest_gap_pct": round(float(gaps.max()) * 100, 3) if gaps.notna().any() else 0.0,
                "limit_pct": RECONCILE_GAP * 100,
                "days_without_live": ", ".join(unrecorded) or "none",
            },
            severity="WARN",
        ),
        Check(
            "untracked_listed",
            not untracked_error,
            {"error": untracked_error or "none", "instances": int(len(instances))},
            severity="WARN",
        ),
    ]
    view = frame.drop(columns=["as_of"]).round(2)
    summary = {
        "dagster/row_count": len(frame),
        "as_of": now.isoformat(),
        "usd_per_hour_now": round(float(totals["usd_per_hour"]), 2),
        "today_usd": round(float(totals["today_usd"]), 2),
        "month_usd": round(float(totals["month_usd"]), 2),
        "month_run_rate_usd": round(float(totals["run_rate_usd"]), 2),
        "untracked_instances": int(len(instances)),
        "untracked_unpriced": unpriced,
        "month_days_from_lake": len(in_lake),
        "month_days_live": len(live_days),
        "month_days_missing": len(missing),
        "spend": md_table(view),
        "reconciliation": md_table(reconciliation.round(2), empty="no complete day in the lake yet"),
        "pushed_samples": pushed,
    }
    return Built({key: table}, summary, checks)


def bill_rate_rows(lake: Lake, today: datetime) -> list[dict]:
    """The bill's effective $/h per region and instance type (the newest landed bill day of the last
    week, as the estimate prices with): what the live cost rules price a node at instead of the list."""
    con = lake.connect([COSTS_HOURLY, NODE_SAMPLES])
    try:
        rates = bill_rates(con, today)
    finally:
        con.close()
    return [
        {
            "price_region": region,
            "instance_type": t,
            "bill_day": r.day.isoformat(),
            "usd_per_hour": float(r.usd_per_hour),
        }
        for (region, t), r in sorted(rates.rates.items())
    ]


def reconcile(lake: Lake, prometheus, today: datetime) -> pd.DataFrame:
    """day, experiment, batch_usd, batch_idle_usd (cost_allocation's node-hours), live_usd (the live
    integral of the same day), for the last RECONCILE_DAYS days before ``today`` in the lake."""
    batch = lake_days(lake, today - timedelta(days=RECONCILE_DAYS), today, node_hours_only=True)
    out = []
    for day, g in batch.groupby("day", sort=True):
        start = datetime.combine(pd.Timestamp(day).date(), datetime.min.time(), timezone.utc)
        try:
            live = live_spend(prometheus, start, start + timedelta(days=1))
        except LiveCostMissing:  # the live rules did not record that day: unknown, not $0
            live = None
        for e in sorted(set(g["experiment"]) | set(live or ())):
            row = g[g["experiment"] == e]
            out.append(
                {
                    "day": pd.Timestamp(day).date().isoformat(),
                    "experiment": e,
                    "batch_usd": float(row["cost_usd"].sum()) if len(row) else 0.0,
                    "batch_idle_usd": float(row["idle_usd"].sum())
                    if len(row) and row["idle_usd"].notna().any()
                    else None,
                    "live_usd": math.nan if live is None else live.get(e, 0.0),
                }
            )
    return pd.DataFrame(out, columns=["day", "experiment", "batch_usd", "batch_idle_usd", "live_usd"])
