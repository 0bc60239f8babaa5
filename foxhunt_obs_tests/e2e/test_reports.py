"""Utilization per dollar end to end: the `small` scenario in a real Prometheus, a real mlflow server and
a real moto server; every asset materialized by real Dagster runs; the cost allocation checked against
the scenario (the bill, the stall, the lost node, unheld GPUs, the MIG slices of ip-10-0-1-13) and the
weekly report against the tables."""

import os
from datetime import date

import dagster as dg
import numpy as np
import pytest

from foxhunt_obs.definitions import defs
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.schemas import COST_ALLOCATION, COSTS_DAILY, OUTCOME_PER_DOLLAR, UTILIZATION_PER_DOLLAR
from foxhunt_obs.sandbox.servers.mlflow_server import MlflowServer, copy_store
from foxhunt_obs.sandbox.servers.moto_server import MotoServer, sandbox_env, seed
from foxhunt_obs.sandbox.story import truth
from foxhunt_obs.sandbox.writers import bills

DAY = "2026-11-16"  # the small scenario: Monday 2026-11-16T00:00..06:00Z
WEEK = "2026-11-16"
HOURS = ("2026-11-16-00:00", "2026-11-16-05:00")

pytestmark = pytest.mark.timeout(600)


def run(job: str, first: str, last: str | None = None) -> dg.ExecuteInProcessResult:
    job_def = defs().resolve_job_def(job)
    kwargs = {"instance": dg.DagsterInstance.ephemeral(), "raise_on_error": False}
    if last is None:
        return job_def.execute_in_process(partition_key=first, **kwargs)
    tags = {"dagster/asset_partition_range_start": first, "dagster/asset_partition_range_end": last}
    return job_def.execute_in_process(tags=tags, **kwargs)


def failure(result) -> str:
    return "\n".join(e.step_failure_data.error.message for e in result.all_events if e.is_step_failure)


def metadata(result, key: str) -> dict:
    (m,) = [e for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == key]
    return {k: v.value for k, v in m.materialization.metadata.items()}


@pytest.fixture(scope="module")
def stack(small, prometheus, small_mlflow_store, tmp_path_factory):
    work = tmp_path_factory.mktemp("reports")
    copy_store(small_mlflow_store, work / "mlflow")
    with (
        MlflowServer(work / "mlflow", workdir=work) as mlflow,
        MotoServer(workdir=work, account_id=small.aws.account_id) as moto,
    ):
        values = {
            "FOXHUNT_LAKE": str(work / "lake"),
            "FOXHUNT_PROMETHEUS_URL": prometheus.url,
            "MLFLOW_TRACKING_URI": mlflow.url,
            **sandbox_env(seed(small, moto.url)),
        }
        saved = {k: os.environ.get(k) for k in values}
        os.environ.update(values)
        try:
            yield Lake(values["FOXHUNT_LAKE"])
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture(scope="module")
def reported(stack):
    results = {}
    for job, first, last in [
        ("gpu_ingest_job", *HOURS),
        ("gpu_hourly_job", DAY, DAY),
        ("training_job", DAY, None),
        ("fsx_ingest_job", *HOURS),
        ("costs_job", DAY, DAY),
        ("daily_reports_job", DAY, DAY),
        ("weekly_report_job", WEEK, None),
    ]:
        results[job] = run(job, first, last)
        assert results[job].success, f"{job}: {failure(results[job])}"
    return stack, results


def _frame(lake, spec, key=DAY):
    return lake.read_partition(spec, key).to_pandas()


def test_allocations_sum_to_the_bill(small, reported):
    lake, results = reported
    alloc = _frame(lake, COST_ALLOCATION)
    bill = float(bills.daily_totals(small, date.fromisoformat(DAY))["cur"])
    total = alloc.allocated_usd.sum() + alloc.unallocated_usd.sum()
    assert abs(total / bill - 1) < 0.001, (total, bill)
    checks = [
        e.asset_check_evaluation_data
        for e in results["daily_reports_job"].all_events
        if e.event_type_value == "ASSET_CHECK_EVALUATION"
    ]
    assert [(c.check_name, c.passed) for c in checks] == [("sums_to_the_bill", True)]
    # every GPU-hour was priced from the instance's own CUR lines (kube_node_info's providerID)
    gpu = alloc[alloc.kind == "gpu"]
    assert set(gpu.cost_source) == {"cur"} and (gpu.allocated_usd + gpu.unallocated_usd > 0).all()
    # a p4de GPU-hour with a full hour of data costs 1/2 of the 2-GPU node's hour in the small scenario
    full = gpu[gpu.gpu_seconds == 3600]
    assert ((full.allocated_usd + full.unallocated_usd) - 27.44705 / 2).abs().max() < 1e-6


def _unit(df):
    """gpu_instance -1 on whole GPUs and no slice, hours in ns: the lake's rows and the truth's merge."""
    return df.assign(
        gpu_instance=df["gpu_instance"].astype("Float64").fillna(-1).astype(int),
        hour=df["hour"].astype("datetime64[ns, UTC]"),
    )


def test_every_gpu_hour_and_slice_hour_is_charged_as_the_truth_says(small, reported):
    """Every kind gpu row (a whole GPU or a MIG slice, per holder) and mig_unsliced row equals
    truth.gpu_allocations: the node's CUR cost for the hour ÷ its GPUs × the slice's share, to each pod for
    the seconds it held it (a time-sliced scrape: 1/k each), the rest to nobody; idle $ on its activity."""
    lake, _ = reported
    alloc = _unit(_frame(lake, COST_ALLOCATION))
    got = alloc[alloc.kind.isin(["gpu", "mig_unsliced"])]
    want = _unit(truth.gpu_allocations(small))
    key = ["hour", "node", "gpu", "gpu_instance", "kind", "namespace", "pod"]
    m = want.merge(got, on=key, suffixes=("_t", ""), how="outer", indicator=True)
    assert (m["_merge"] == "both").all() and len(m) == len(got) == len(want)
    for col in ("experiment", "gpu_profile"):
        assert (m[col] == m[f"{col}_t"]).all(), col
    for col in ("allocated_usd", "unallocated_usd", "gpu_share", "idle_usd"):
        assert m[col].to_numpy() == pytest.approx(m[f"{col}_t"].to_numpy(), rel=1e-9, abs=1e-9), col
    # both activity bases: SM activity where the GPU Operator nodes report it, NULL where nothing does
    held = m[(m.kind == "gpu") & (m.pod != "")]
    for col in ("active_gpu_seconds", "sm_active_gpu_seconds"):
        np.testing.assert_allclose(
            held[col].astype(float), held[f"{col}_t"].astype(float), rtol=1e-9, err_msg=col
        )
    assert held.sm_active_gpu_seconds.notna().any() and held.sm_active_gpu_seconds.isna().any()
    # the fair-share cases, each a unit-hour with several holders
    holders = got[got.pod != ""].groupby(["hour", "node", "gpu", "gpu_instance"]).pod.nunique()
    assert (holders >= 2).sum() >= 3  # the hand-off at 05:20, the time-sliced GPU, the reused trainer-0


def test_mig_slices_are_charged_their_share_of_the_gpu(small, reported):
    """ip-10-0-1-13's GPU 0: two 3g.40gb slices, each 3 of the A100's 7 compute slices. A GPU-hour costs
    $27.44705 / 2 (the 2-GPU node's p4de hour), so a slice-hour 13.723525 × 3/7 = $5.8815107; the 1/7 no
    slice covers ($1.9605036 an hour) is cluster idle."""
    lake, _ = reported
    alloc = _frame(lake, COST_ALLOCATION)
    gpu_hour = 27.44705 / 2
    slice_hour = gpu_hour * 3 / 7
    mig = alloc[(alloc.node == "ip-10-0-1-13") & (alloc.gpu == 0)]
    slices = mig[mig.kind == "gpu"]
    assert sorted(slices.gpu_instance.unique()) == [1, 2] and set(slices.gpu_profile) == {"3g.40gb"}
    per_slice_hour = slices.groupby(["gpu_instance", "hour"])[["allocated_usd", "unallocated_usd"]].sum()
    assert per_slice_hour.sum(axis=1).to_numpy() == pytest.approx([slice_hour] * 12)
    # each slice's holder pays 3/7 of the GPU-hour for each hour it held the slice (half of it for the
    # half hours at 00:30 and 05:30), the rest of the slice-hour is cluster idle
    held = slices[slices.pod != ""]
    assert {(r.gpu_instance, r.pod, r.experiment) for r in held.itertuples()} == {
        (1, "ppo-humanoid-mig-0", "ppo-humanoid"),
        (2, "dqn-atari-mig-0", "dqn-atari"),
    }
    by_hour = {(int(gi), hour.hour): usd for (gi, hour), usd in per_slice_hour["allocated_usd"].items()}
    want = {(1, h): slice_hour * (0.5 if h in (0, 5) else 1) for h in range(6)}
    want |= {(2, h): slice_hour * (1 if 1 <= h < 4 else 0) for h in range(6)}
    assert by_hour == pytest.approx(want, rel=1e-9)
    per_pod = held.groupby("pod").allocated_usd.sum()
    assert per_pod["ppo-humanoid-mig-0"] == pytest.approx(5 * slice_hour)  # 4 hours + 2 halves
    assert per_pod["dqn-atari-mig-0"] == pytest.approx(3 * slice_hour)
    assert slice_hour == pytest.approx(5.88151071428571)
    # what no slice covers: 1/7 of the GPU every hour, unallocated
    unsliced = mig[mig.kind == "mig_unsliced"]
    assert len(unsliced) == 6 and set(unsliced.gpu_profile) == {"unsliced"}
    assert unsliced.gpu_share.to_numpy() == pytest.approx([1 / 7] * 6)
    assert (unsliced.allocated_usd == 0).all() and (unsliced.pod == "").all()
    assert unsliced.unallocated_usd.to_numpy() == pytest.approx([gpu_hour / 7] * 6)
    assert gpu_hour / 7 == pytest.approx(1.96050357142857)
    # the node's whole GPU 1: dqn-atari-learner-2 02:00-05:00, a full GPU-hour each
    whole = alloc[(alloc.kind == "gpu") & (alloc.node == "ip-10-0-1-13") & (alloc.gpu == 1)]
    assert whole.gpu_instance.isna().all() and (whole.gpu_share == 1).all()
    assert set(whole[whole.pod != ""].pod) == {"dqn-atari-learner-2"}
    assert whole.allocated_usd.sum() == pytest.approx(3 * gpu_hour)
    # no exporter pod is charged anything
    assert not set(alloc.pod) & {"dcgm-exporter", "exporter"} and not alloc.pod.str.contains("exporter").any()


def test_the_stall_is_charged_to_its_experiment_as_idle(reported):
    lake, _ = reported
    alloc = _frame(lake, COST_ALLOCATION)
    stall = alloc[(alloc.kind == "gpu") & (alloc.node == "ip-10-0-1-11") & (alloc.hour.dt.hour == 2)]
    assert sorted(stall.gpu) == [0, 1] and set(stall.experiment) == {"ppo-humanoid"}
    # util 0 for 40 of the 60 minutes: at least ~2/3 of the GPU-hour's cost is idle, and it is the
    # experiment's (allocated), not the cluster's
    assert (stall.idle_usd >= 0.6 * stall.allocated_usd).all() and (stall.unallocated_usd == 0).all()
    normal = alloc[(alloc.kind == "gpu") & (alloc.node == "ip-10-0-1-11") & (alloc.hour.dt.hour == 1)]
    assert (normal.idle_usd < 0.3 * normal.allocated_usd).all()


def test_the_lost_node_is_not_charged(reported):
    lake, _ = reported
    alloc = _frame(lake, COST_ALLOCATION)
    lost = alloc[(alloc.node == "ip-10-0-1-12") & alloc.hour.dt.hour.isin([3, 4])]
    assert lost.empty


def test_unheld_gpus_are_cluster_idle(reported):
    lake, _ = reported
    alloc = _frame(lake, COST_ALLOCATION)
    # node 2 GPU 0: no pod 00:00-00:15 -> a quarter of hour 0 is the cluster's, a row of its own
    h0 = alloc[
        (alloc.kind == "gpu") & (alloc.node == "ip-10-0-1-12") & (alloc.gpu == 0) & (alloc.hour.dt.hour == 0)
    ].set_index("pod")
    assert list(h0.index) == ["dqn-atari-learner-0", ""]
    assert h0.loc["", "unallocated_usd"] == pytest.approx(h0.loc["dqn-atari-learner-0", "allocated_usd"] / 3)
    assert h0.loc["", "experiment"] == "" and h0.loc["dqn-atari-learner-0", "experiment"] == "dqn-atari"
    upd = _frame(lake, UTILIZATION_PER_DOLLAR)
    cluster = upd[upd.experiment == "(cluster idle)"].iloc[0]
    assert cluster.allocated_usd == pytest.approx(alloc.unallocated_usd.sum())
    assert cluster.allocated_usd == pytest.approx(cluster.idle_usd) and cluster.gpu_hours > 0
    per_exp = upd[upd.experiment != "(cluster idle)"].set_index("experiment")
    assert set(per_exp.index) == {"ppo-humanoid", "dqn-atari"}
    for _, r in per_exp.iterrows():
        assert r.active_gpu_hours_per_usd == pytest.approx(r.active_gpu_hours / r.allocated_usd)
        assert r.usd_per_active_gpu_hour == pytest.approx(r.allocated_usd / r.active_gpu_hours)
        assert 0 < r.mean_util < 1


def test_outcome_per_dollar(small, reported):
    """Each run's dollars are its own pods' in its own window, to the cent of the truth: the reused
    trainer-0 (ppo-humanoid-f2, -f3), the other namespace's trainer-0 (dqn-atari-f2), the Ray head and
    workers (ppo-humanoid-ray). A run on no pod is listed with no dollars, never $0; a deleted one not."""
    lake, _ = reported
    out = _frame(lake, OUTCOME_PER_DOLLAR).set_index("run_name")
    want = truth.run_dollars(small, date.fromisoformat(DAY)).set_index("run_name")
    want = want[~want.deleted]
    assert set(out.index) == set(want.index)
    priced = want[want.pod.notna()]
    assert out.loc[priced.index, "usd"].to_numpy() == pytest.approx(priced.allocated_usd.to_numpy(), rel=1e-9)
    assert out.loc[priced.index, "idle_usd"].to_numpy() == pytest.approx(priced.idle_usd.to_numpy(), rel=1e-6)
    assert out.loc["ppo-humanoid-f2", "usd"] != pytest.approx(out.loc["ppo-humanoid-f3", "usd"])
    assert out.loc["ppo-humanoid-ray", "pod"].count(",") == 2
    (podless,) = want[want.pod.isna()].index
    assert out.loc[podless, "usd"] != out.loc[podless, "usd"]  # NaN, not $0
    assert out.loc[podless, "charged_by"] == "no pod tag: ran outside the cluster?"
    assert out.loc[podless, "usd_per_point"] != out.loc[podless, "usd_per_point"]  # no $, no $ per point
    for name, r in out.loc[priced.index].iterrows():
        if r.success_end > r.success_start:
            assert r.usd_per_point == pytest.approx(r.usd / (100 * (r.success_end - r.success_start))), name


def test_the_report_equals_the_tables(reported):
    lake, results = reported
    meta = metadata(results["weekly_report_job"], "weekly_cost_report")
    upd = _frame(lake, UTILIZATION_PER_DOLLAR)
    assert meta["total_usd"] == pytest.approx(upd.allocated_usd.sum(), abs=0.01)
    assert meta["idle_usd"] == pytest.approx(upd.idle_usd.sum(), abs=0.01)
    costs = _frame(lake, COSTS_DAILY)
    assert meta["bill_usd"] == pytest.approx(costs[costs.source == "cur"].cost_usd.sum(), abs=0.01)
    html = lake.read_file(f"reports/week={WEEK}/report.html")
    markdown = lake.read_file(f"reports/week={WEEK}/report.md").decode()
    assert html and b"ppo-humanoid" in html and "ppo-humanoid" in markdown
    for experiment in upd.experiment:
        total = upd[upd.experiment == experiment].allocated_usd.sum()
        assert f"{total:,.2f}" in markdown, experiment
    # both activity bases, over the dollars each is known for (the GPU Operator nodes report SM activity)
    util_known = upd.allocated_usd.sum() - upd.unknown_activity_usd.sum()
    sm_known = upd.allocated_usd.sum() - upd.sm_unknown_activity_usd.sum()
    assert meta["active_gpu_hours_per_usd"] == pytest.approx(
        upd.active_gpu_hours.sum() / util_known, abs=1e-4
    )
    assert meta["sm_active_gpu_hours_per_usd"] == pytest.approx(
        upd.sm_active_gpu_hours.sum() / sm_known, abs=1e-4
    )
    assert 0 < meta["sm_active_gpu_hours_per_usd"] < meta["active_gpu_hours_per_usd"]  # SM ≤ util here
    assert f"{meta['sm_active_gpu_hours_per_usd']:,.3f} by SM activity" in markdown
    assert "a hand-off at 14:20 charges the first pod 20 minutes" in markdown  # the split, in words


def test_the_report_is_mailed_when_smtp_is_configured(reported, monkeypatch):
    """The asset itself delivers: a real local SMTP server receives the week's report."""
    import email

    from aiosmtpd.controller import Controller

    from foxhunt_obs.sandbox.servers.local_server import free_port

    lake, results = reported
    assert (
        metadata(results["weekly_report_job"], "weekly_cost_report")["delivered_to"] == "no sink configured"
    )
    received = []

    class Inbox:
        async def handle_DATA(self, server, session, envelope):
            received.append((envelope.rcpt_tos, envelope.original_content))
            return "250 OK"

    port = free_port()
    controller = Controller(Inbox(), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        for k, v in {
            "FOXHUNT_REPORT_SMTP_HOST": "127.0.0.1",
            "FOXHUNT_REPORT_SMTP_PORT": str(port),
            "FOXHUNT_REPORT_SMTP_STARTTLS": "0",
            "FOXHUNT_REPORT_EMAIL_FROM": "reports@foxhunt.test",
            "FOXHUNT_REPORT_EMAIL_TO": "ml-team@foxhunt.test",
        }.items():
            monkeypatch.setenv(k, v)
        result = run("weekly_report_job", WEEK)
    finally:
        controller.stop()
    assert result.success, failure(result)
    assert metadata(result, "weekly_cost_report")["delivered_to"] == "email to ml-team@foxhunt.test"
    ((rcpt, raw),) = received
    message = email.message_from_bytes(raw)
    assert rcpt == ["ml-team@foxhunt.test"] and "week of 2026-11-16" in message["Subject"]
    html = lake.read_file(f"reports/week={WEEK}/report.html").decode()
    parts = {p.get_content_type(): p for p in message.walk()}
    assert parts["text/html"].get_payload(decode=True).decode().replace("\r\n", "\n") == html
