"""The Dagster instance on a real PostgreSQL: DAGSTER_HOME holds a copy of the shipped
deploy/dagster/dagster.yaml (so that file is what is tested) and DAGSTER_PG_* point it at a PostgreSQL of
the test's own (foxhunt_obs/sandbox/servers/postgres.py: Debian's `postgresql`, `make postgresql`).

* (a) A run launched from the CLI (`dagster asset materialize` of gpu_samples against an empty real
  Prometheus) is stored in Postgres: the instance's run storage is dagster-postgres', and the `runs` table,
  read with psycopg2, holds it.
* (b) A scheduled run: `gpu_ingest_schedule` is started from the CLI and its stored start moved back an
  hour before the daemon starts; the daemon's scheduler catches up the last :10 tick itself and launches
  gpu_ingest_job for the previous hour, which succeeds and is stored in Postgres.
* (c) The alert sensor's cursor survives a daemon restart: `dagster-daemon run` with one rule enabled
  (gpu_node_missing, `for: 0s`, its absent() branch firing against the empty Prometheus) notifies the
  webhook stand-in once; the daemon is stopped and started again; after a tick of alert_sensor by the new
  daemon, the webhook got nothing new, and the stored cursor still holds the firing alert.
* (d) A second, separate `dagster-webserver` process on the same DAGSTER_HOME reads the run history: its
  GraphQL `runsOrError` lists the runs of (a) and (b).

Every process runs in its own process group and is stopped by it (docs/design.md#running-it), with the helpers of the
`dagster dev` end-to-end test.
"""

import shutil
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.scheduler.instigation import TickStatus  # not in the public API

from foxhunt_obs.sandbox.servers import postgres as pg
from foxhunt_obs.sandbox.servers.prometheus import PrometheusServer
from foxhunt_obs_tests.e2e.test_dagster_dev import REPO, Dagster, Webhook, _move_schedule_start_back, _wait

pytestmark = pytest.mark.skipif(not pg.available(), reason="PostgreSQL is not installed (make postgresql)")

SHIPPED_YAML = REPO / "deploy" / "dagster" / "dagster.yaml"
CATALOG = REPO / "foxhunt_obs" / "data" / "alert_rules.yaml"
SENSOR = "alert_sensor"
SCHEDULE, SCHEDULED_JOB = "gpu_ingest_schedule", "gpu_ingest_job"
RULE = "gpu_node_missing"
DEADLINE_S = 300.0  # each part's bounded waits, from the test's start

RUNS_QUERY = """
query Runs {
  runsOrError(limit: 50) {
    __typename
    ... on Runs { results { runId status jobName } }
    ... on PythonError { message }
  }
}
"""


class Process(Dagster):
    """One Dagster process (``dagster-daemon run``, ``dagster-webserver``) in its own process group, with
    the `dagster dev` test's environment, ready probe, GraphQL client and group stop."""

    def __init__(self, argv: list[str], home: Path, lake: Path, log: Path, webhook_url: str, env: dict):
        super().__init__(home, lake, log, webhook_url)
        self.argv = [a.format(port=self.port) for a in argv]  # "{port}": the free port chosen
        self.env.update(env)

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                cwd=REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )


def _bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def _overrides(path: Path) -> Path:
    """Every catalog rule off but gpu_node_missing, which fires at once (`for: 0s`)."""
    ids = [r["id"] for r in yaml.safe_load(CATALOG.read_text())["rules"]]
    assert RULE in ids, ids
    rules = {i: {"enabled": False} for i in ids if i != RULE}
    rules[RULE] = {"for": "0s", "enabled": True}
    path.write_text(yaml.safe_dump({"rules": rules}))
    return path


def _sensor_state(instance: dg.DagsterInstance, name: str):
    states = [s for s in instance.all_instigator_state() if s.name == name]
    return states[0] if states else None


def _ticks(instance: dg.DagsterInstance, name: str) -> list:
    """The sensor's finished ticks, newest first."""
    state = _sensor_state(instance, name)
    if state is None:
        return []
    ticks = instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=20)
    return [t for t in ticks if t.status != TickStatus.STARTED]


@pytest.mark.timeout(540)
def test_dagster_on_postgres_runs_cursor_and_history(tmp_path, monkeypatch):
    t0 = time.monotonic()
    deadline = t0 + DEADLINE_S
    timings: dict[str, float] = {}
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(SHIPPED_YAML, home / "dagster.yaml")
    lake = tmp_path / "lake"
    rules = _overrides(tmp_path / "rules.yaml")

    server = pg.PostgresServer()
    prometheus = PrometheusServer(tmp_path / "tsdb", workdir=tmp_path / "prometheus")
    webhook = Webhook()
    processes: list[Process] = []
    left: list[str] = []
    passed = False

    def process(argv: list[str], log: str) -> Process:
        p = Process(argv, home, lake, tmp_path / log, webhook.url, extra_env)
        processes.append(p)
        p.start()
        return p

    def stop(p: Process) -> None:
        sent, rest = p.stop()
        timings[f"{p.log.stem} stopped ({sent})"] = time.monotonic() - t0
        left.extend(rest)
        assert not rest, f"processes of {p.argv[0]} survived SIGKILL: {rest}"

    try:
        server.start()
        (tmp_path / "tsdb").mkdir()
        prometheus.start()
        timings["postgres and prometheus ready"] = time.monotonic() - t0
        for k, v in server.dagster_env().items():
            monkeypatch.setenv(k, v)
        extra_env = {
            **server.dagster_env(),
            "FOXHUNT_PROMETHEUS_URL": prometheus.url,
            "FOXHUNT_ALERT_RULES": str(rules),
        }

        # (a) a CLI run, stored in Postgres
        hour = (datetime.now(timezone.utc) - timedelta(days=1)).strftime("%Y-%m-%d-12:00")
        env = Process(["true"], home, lake, tmp_path / "cli.log", webhook.url, extra_env).env
        cmd = [sys.executable, "-m", "dagster", "asset", "materialize", "-m", "foxhunt_obs.definitions"]
        cmd += ["--select", "gpu_samples", "--partition", hour]
        cli = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
        timings["CLI run"] = time.monotonic() - t0
        out = (cli.stdout + cli.stderr)[-3000:]
        if "No module named 'psycopg'" in out:
            pytest.fail(
                "the shipped dagster.yaml's postgres_db has no `scheme`: SQLAlchemy 2.1 reads `postgresql://` as "
                "psycopg 3, not installed (dagster-postgres brings psycopg2-binary); "
                f"`scheme: postgresql+psycopg2` fixes it\n{out}"
            )
        assert cli.returncode == 0, out
        with dg.DagsterInstance.from_config(str(home)) as instance:
            assert type(instance.run_storage).__name__ == "PostgresRunStorage", instance.run_storage
            assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
            assert type(instance.schedule_storage).__name__ == "PostgresScheduleStorage"
            [run] = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.SUCCESS, run.status
        import psycopg2

        with psycopg2.connect(server.dsn) as conn, conn.cursor() as cur:
            cur.execute("SELECT run_id, status FROM runs")
            assert cur.fetchall() == [(run.run_id, "SUCCESS")]
        conn.close()

        # (b) a scheduled run: the schedule on since an hour ago, before the daemon starts, so that the
        # daemon's scheduler catches up the one :10 tick in that hour
        started = subprocess.run(
            [_bin("dagster"), "schedule", "start", SCHEDULE, "-w", "workspace.yaml"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert started.returncode == 0, (started.stdout + started.stderr)[-3000:]
        _move_schedule_start_back(home, SCHEDULE, hours=1)
        now = datetime.now(timezone.utc)
        tick_due = now.replace(minute=10, second=0, microsecond=0)
        tick_due -= timedelta(hours=1) if tick_due > now else timedelta(0)

        # (c) the alert sensor notifies once, and not again after a daemon restart
        daemon_argv = [_bin("dagster-daemon"), "run", "-w", "workspace.yaml"]
        daemon = process(daemon_argv, "daemon-1.log")

        def fired():
            return [n for _, n in webhook.taken if n["rule"] == RULE]

        [note] = _wait(f"the webhook to get {RULE}", fired, deadline, daemon)
        timings["notice taken"] = time.monotonic() - t0
        taken_at = time.time()  # the tick that sent it began before this
        assert note["status"] == "firing", note

        with dg.DagsterInstance.from_config(str(home)) as instance:
            # the tick that sent it is finished: its cursor is stored
            def sent_tick():  # the newest tick begun before the notice came is no longer STARTED
                state = _sensor_state(instance, SENSOR)
                if state is None:
                    return None
                ticks = instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=20)
                ticks = sorted((t for t in ticks if t.timestamp <= taken_at), key=lambda t: t.timestamp)
                return ticks if ticks and ticks[-1].status != TickStatus.STARTED else None

            ticks = _wait(f"the {SENSOR} tick that sent it to finish", sent_tick, deadline, daemon, every=0.5)
            assert ticks[-1].status != TickStatus.FAILURE, ticks[-1].error
            cursor = _sensor_state(instance, SENSOR).instigator_data.cursor
        assert cursor and note["fingerprint"] in cursor, cursor[:2000]
        assert len(fired()) == 1, fired()

        # (b) the scheduled run, launched by this daemon, finished before it stops
        with dg.DagsterInstance.from_config(str(home)) as instance:

            def scheduled_run():
                runs = instance.get_runs(dg.RunsFilter(tags={"dagster/schedule_name": SCHEDULE}))
                return runs if runs and all(r.is_finished for r in runs) else None

            [scheduled] = _wait(f"the {SCHEDULE} run to finish", scheduled_run, deadline, daemon)
        timings["scheduled run done"] = time.monotonic() - t0
        assert scheduled.job_name == SCHEDULED_JOB, scheduled.job_name
        assert scheduled.status == dg.DagsterRunStatus.SUCCESS, scheduled.status
        # the :10 tick in the hour before the daemon started, for the hour that ended ten minutes before it
        assert scheduled.tags.get(".dagster/scheduled_execution_time") == tick_due.isoformat(), scheduled.tags
        previous_hour = (tick_due - timedelta(hours=1)).replace(minute=0)
        assert scheduled.tags.get("dagster/partition") == previous_hour.strftime("%Y-%m-%d-%H:%M"), (
            scheduled.tags
        )
        with psycopg2.connect(server.dsn) as conn, conn.cursor() as cur:
            cur.execute("SELECT status FROM runs WHERE run_id = %s", (scheduled.run_id,))
            assert cur.fetchall() == [("SUCCESS",)]
        conn.close()
        stop(daemon)
        restarted = time.time()
        before = list(webhook.taken)

        daemon = process(daemon_argv, "daemon-2.log")
        # (d) meanwhile, a separate webserver on the same DAGSTER_HOME
        webserver = process(
            [_bin("dagster-webserver"), "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", "{port}"],
            "webserver.log",
        )

        with dg.DagsterInstance.from_config(str(home)) as instance:

            def new_tick():
                return [t for t in _ticks(instance, SENSOR) if t.timestamp > restarted]

            [tick, *_] = _wait(f"a {SENSOR} tick of the restarted daemon", new_tick, deadline, daemon)
            timings["tick after restart"] = time.monotonic() - t0
            assert tick.status != TickStatus.FAILURE, tick.error
            cursor_after = _sensor_state(instance, SENSOR).instigator_data.cursor
        assert webhook.taken == before, f"sent again after the restart: {webhook.taken[len(before) :]}"
        assert cursor_after and note["fingerprint"] in cursor_after, cursor_after[:2000]
        print(f"\n{SENSOR} tick after restart: {tick.status} {tick.skip_reason}")

        _wait("the second webserver", webserver.ready, deadline, webserver, every=0.25)
        runs = webserver.gql(RUNS_QUERY)["runsOrError"]
        assert runs["__typename"] == "Runs", runs
        listed = {r["runId"]: r for r in runs["results"]}
        assert run.run_id in listed and listed[run.run_id]["status"] == "SUCCESS", runs
        assert listed.get(scheduled.run_id, {}).get("jobName") == SCHEDULED_JOB, runs
        timings["webserver lists the run"] = time.monotonic() - t0
        passed = True
    finally:
        webhook.shutdown()
        for p in processes:
            try:
                sent, rest = p.stop()
            except Exception as e:  # noqa: BLE001 - keep stopping the others
                rest = [f"{p.argv[0]}: {e}"]
            left.extend(rest)
            if not passed or rest:
                print(f"--- {p.log.name} tail ---\n{p.tail()}")
        prometheus.stop()
        server.stop()
        if server.workdir:
            shutil.rmtree(server.workdir, ignore_errors=True)
        print("timings (s from start): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    assert not left, f"processes survived SIGKILL: {left}"
