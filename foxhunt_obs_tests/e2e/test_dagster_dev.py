"""`dagster dev` end to end: the webserver and the daemon on a temporary DAGSTER_HOME, started in their own
process group and stopped by this test; everything is seen through the GraphQL API.

* `alert_sensor` (RUNNING by default) ticks although Prometheus and MLflow are unreachable: those sources
  are reported as not evaluated and the tick still ends SKIPPED (or SUCCESS), never FAILURE.
* A scheduled run succeeds: `daily_reports_schedule` is started through `startSchedule`, and its stored
  start is moved back 25 hours, as if it had been on since yesterday. The scheduler daemon then catches up
  the last 07:30 UTC tick itself: the product's schedule function, the tick, the run queue and a run of
  `daily_reports_job` over the trailing days, which succeeds on an empty lake (no external service).
* A run that fails, launched from the CLI (`dagster asset materialize`, Prometheus unreachable), reaches
  the webhook through `run_failure_alert` although the webhook refuses it at first: refused on one tick,
  taken on a later one, and never sent twice.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import dagster as dg
import pytest
import requests

from foxhunt_obs.sandbox.servers.local_server import free_port

REPO = Path(__file__).resolve().parents[2]
LOCATION = "foxhunt_obs"
REPOSITORY = "__repository__"  # the name Dagster gives a @definitions code location's repository
SENSOR = "alert_sensor"
SCHEDULE = "daily_reports_schedule"
JOB = "daily_reports_job"
FAILURE_SENSOR = "run_failure_alert"
DEADLINE_S = 360.0  # everything after the start: ready, the sensors' ticks, the scheduled run, the failure
REFUSE_S = 5.0  # the webhook refuses run failures this long after the first (one tick and its retries)

# Threads: sensors and schedules are evaluated beside the daemon loop, not in turn with it.
DAGSTER_YAML = """\
telemetry:
  enabled: false
sensors:
  use_threads: true
  num_workers: 2
schedules:
  use_threads: true
  num_workers: 2
"""

SENSOR_QUERY = """
query Sensor($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    __typename
    ... on Sensor {
      sensorState {
        status
        ticks(limit: 5) { status timestamp skipReason error { message } }
      }
    }
    ... on PythonError { message }
  }
}
"""

DAEMONS_QUERY = """
query Daemons {
  instance { daemonHealth { allDaemonStatuses { daemonType healthy lastHeartbeatTime } } }
}
"""

START_SCHEDULE = """
mutation Start($selector: ScheduleSelector!) {
  startSchedule(scheduleSelector: $selector) {
    __typename
    ... on ScheduleStateResult { scheduleState { status } }
    ... on PythonError { message }
  }
}
"""

SCHEDULE_QUERY = """
query Schedule($selector: ScheduleSelector!) {
  scheduleOrError(scheduleSelector: $selector) {
    __typename
    ... on Schedule {
      scheduleState {
        status
        ticks(limit: 5) { status timestamp runIds skipReason error { message } }
      }
    }
    ... on PythonError { message }
  }
}
"""

RUN_QUERY = """
query Run($runId: ID!) {
  runOrError(runId: $runId) {
    __typename
    ... on Run { status jobName startTime endTime tags { key value } }
    ... on PythonError { message }
  }
}
"""


class Dagster:
    """A `dagster dev` in its own process group, talked to over GraphQL."""

    def __init__(self, home: Path, lake: Path, log: Path, webhook_url: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("AWS_", "FOXHUNT_", "MLFLOW_", "DAGSTER_", "SLACK_"))
        }
        today = datetime.now(timezone.utc).date()
        env.update(
            DAGSTER_HOME=str(home),
            FOXHUNT_LAKE=str(lake),
            # nothing listens there: the sensor's Prometheus and MLflow sources fail fast
            FOXHUNT_PROMETHEUS_URL=f"http://127.0.0.1:{free_port()}",
            MLFLOW_TRACKING_URI=f"http://127.0.0.1:{free_port()}",
            # the scheduled run's trailing days lie inside the partitions, whatever the date
            FOXHUNT_PARTITIONS_START=(today - timedelta(days=14)).isoformat(),
            FOXHUNT_DAGSTER_URL=self.url,
            FOXHUNT_ALERT_WEBHOOK_URL=webhook_url,
            FOXHUNT_ALERT_WEBHOOK_SECRET="dev-test-secret",
        )
        self.env = env
        self.process: subprocess.Popen | None = None
        self.session = requests.Session()

    def start(self) -> None:
        dagster = Path(sys.executable).with_name("dagster")
        cmd = [str(dagster), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(self.port)]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                cmd,
                cwd=REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # stop the group, not just `dagster dev`
            )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ready(self) -> bool:
        try:
            return self.session.get(f"{self.url}/server_info", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def gql(self, query: str, **variables) -> dict:
        r = self.session.post(
            f"{self.url}/graphql", json={"query": query, "variables": variables}, timeout=30
        )
        r.raise_for_status()
        body = r.json()
        assert not body.get("errors"), body["errors"]
        return body["data"]

    def tail(self, chars: int = 6000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 10.0) -> tuple[str, list[str]]:
        """SIGTERM the group, SIGKILL it after ``timeout``: the last signal sent, and the processes left
        afterwards (of the group, or of the tree that left it), if any."""
        self.session.close()
        if self.process is None:
            return "none", []
        pgid = self.process.pid
        tree = _descendants(pgid) | {pgid}
        sent = "none"
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            sent = sig.name
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and (_group(pgid) or self.alive()):
                time.sleep(0.1)
            if not _group(pgid) and not self.alive():
                break
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        # the group, and any child that left it (a setsid), must be gone
        left = sorted(_group(pgid) | {p for p in tree if _alive(p)})
        return sent, [f"{p}: {_cmdline(p)}" for p in left]


class Webhook(ThreadingHTTPServer):
    """Records every notification it is sent, with the time; refuses (503) run failures for REFUSE_S
    after the first one it sees, so run_failure_alert must send it again on a later tick."""

    def __init__(self):
        self.taken: list[tuple[float, dict]] = []
        self.refused: list[float] = []
        self.lock = threading.Lock()
        server = self

        class Hook(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                notes = body["notifications"]
                now = time.monotonic()
                with server.lock:
                    failures = [n for n in notes if n["rule"] == "dagster_run_failed"]
                    first = server.refused[0] if server.refused else None
                    refuse = failures and (first is None or now - first < REFUSE_S)
                    if refuse:
                        server.refused.append(now)
                    else:
                        server.taken += [(now, n) for n in notes]
                self.send_response(503 if refuse else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):  # quiet test server
                pass

        super().__init__(("127.0.0.1", 0), Hook)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}/hook"

    def failures(self) -> list[tuple[float, dict]]:
        with self.lock:
            return [(t, n) for t, n in self.taken if n["rule"] == "dagster_run_failed"]


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()  # state, ppid, pgrp, ...


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _group(pgid: int) -> set[int]:
    """Live (not zombie) processes of the process group."""
    out = set()
    for pid in _pids():
        fields = _stat(pid)
        if fields and fields[0] != "Z" and int(fields[2]) == pgid:
            out.add(pid)
    return out


def _descendants(root: int) -> set[int]:
    parent = {}
    for pid in _pids():
        fields = _stat(pid)
        if fields:
            parent[pid] = int(fields[1])
    out, frontier = set(), {root}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - out
        out |= frontier
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"


def _wait(what: str, check, deadline: float, dagster: Dagster, every: float = 1.0):
    """Poll ``check()`` until it returns something truthy; fail with the log tail otherwise."""
    while True:
        if not dagster.alive():
            pytest.fail(f"dagster dev exited ({dagster.process.returncode}) while waiting for {what}")
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(every)


def _move_schedule_start_back(home: Path, name: str, hours: float) -> None:
    """As if the schedule had been RUNNING for ``hours``: the scheduler catches up its last missed tick."""
    with dg.DagsterInstance.from_config(str(home)) as instance:
        (state,) = [s for s in instance.all_instigator_state() if s.name == name]
        data = state.instigator_data
        start = time.time() - hours * 3600
        instance.update_instigator_state(
            state.with_data(data._replace(start_timestamp=start, last_iteration_timestamp=None))
        )


def _fail_a_run_from_the_cli(env: dict[str, str]) -> subprocess.CompletedProcess:
    """gpu_samples for yesterday noon, Prometheus unreachable: a failed run in the daemon's instance."""
    hour = (datetime.now(timezone.utc) - timedelta(days=1)).strftime("%Y-%m-%d-12:00")
    cmd = [sys.executable, "-m", "dagster", "asset", "materialize", "-m", "foxhunt_obs.definitions"]
    cmd += ["--select", "gpu_samples", "--partition", hour]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)


ASSET_COLUMNS_QUERY = """
query {
  assetNodes {
    assetKey { path }
    description
    metadataEntries {
      label
      ... on JsonMetadataEntry { jsonString }
      ... on TableSchemaMetadataEntry { schema { columns { name type description } } }
    }
  }
}
"""


def _assert_the_ui_shows_every_lake_tables_columns(dagster) -> None:
    """What the webserver serves the asset pages (their Columns tab and description): for each asset that
    writes a lake table, its table's columns with type and note, and the table's text."""
    from foxhunt_obs.lib import schemas

    specs = {s.name: s for s in vars(schemas).values() if isinstance(s, schemas.TableSpec)}
    shown = {}
    for node in dagster.gql(ASSET_COLUMNS_QUERY)["assetNodes"]:
        entries = {e["label"]: e for e in node["metadataEntries"]}
        if "foxhunt/lake_tables" in entries:
            table = json.loads(entries["foxhunt/lake_tables"]["jsonString"])[0]
            shown[table] = (node, entries["dagster/column_schema"]["schema"]["columns"])
    assert len(shown) == 15, sorted(shown)  # every asset that writes a lake table
    for table, (node, columns) in shown.items():
        spec = specs[table]
        assert spec.doc in node["description"], node["assetKey"]
        assert columns == [
            {"name": f.name, "type": str(f.type), "description": spec.columns[f.name]} for f in spec.schema
        ], table


@pytest.mark.timeout(560)
def test_dagster_dev_sensor_ticks_and_a_scheduled_run_succeeds(tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(DAGSTER_YAML)
    webhook = Webhook()
    dagster = Dagster(home, tmp_path / "lake", tmp_path / "dagster-dev.log", webhook.url)
    failure_sensor = {
        "repositoryLocationName": LOCATION,
        "repositoryName": REPOSITORY,
        "sensorName": FAILURE_SENSOR,
    }
    sensor = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "sensorName": SENSOR}
    schedule = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "scheduleName": SCHEDULE}
    timings: dict[str, float] = {}
    passed = False
    t0 = time.monotonic()
    deadline = t0 + DEADLINE_S
    try:
        dagster.start()
        _wait("the webserver", dagster.ready, deadline, dagster, every=0.25)
        timings["webserver ready"] = time.monotonic() - t0

        # (1) the alert sensor is RUNNING and ticks; SKIPPED and SUCCESS count, FAILURE does not
        def sensor_tick():
            result = dagster.gql(SENSOR_QUERY, selector=sensor)["sensorOrError"]
            if result["__typename"] != "Sensor":
                return None  # the code location is still loading
            state = result["sensorState"]
            assert state["status"] == "RUNNING", state
            done = [t for t in state["ticks"] if t["status"] != "STARTED"]
            failed = [t for t in done if t["status"] == "FAILURE"]
            assert not failed, f"{SENSOR} tick failed: {failed[0]['error']}"
            return done[0] if done else None

        tick = _wait(f"a tick of {SENSOR}", sensor_tick, deadline, dagster)
        timings["first sensor tick"] = time.monotonic() - t0
        print(f"\n{SENSOR} tick: {tick['status']} {tick['skipReason']}")
        assert tick["status"] in ("SKIPPED", "SUCCESS"), tick

        # (1b) every lake asset's page in the UI lists its table's columns, as lib/schemas.py notes them
        _assert_the_ui_shows_every_lake_tables_columns(dagster)

        # (2) a scheduled run: start the schedule, then move its start back so the daemon's next
        # iteration (on the minute) catches up the last 07:30 UTC tick. Both happen mid-minute, away
        # from the scheduler's iteration, which would otherwise remember "evaluated now" in memory.
        def scheduler_up():
            statuses = dagster.gql(DAEMONS_QUERY)["instance"]["daemonHealth"]["allDaemonStatuses"]
            return any(d["daemonType"] == "SCHEDULER" and d["lastHeartbeatTime"] for d in statuses)

        _wait("the scheduler daemon's heartbeat", scheduler_up, deadline, dagster)
        second = time.time() % 60
        if not 3 <= second <= 45:
            time.sleep((63 - second) % 60)
        started = dagster.gql(START_SCHEDULE, selector=schedule)["startSchedule"]
        assert started["__typename"] == "ScheduleStateResult", started
        assert started["scheduleState"]["status"] == "RUNNING", started
        _move_schedule_start_back(home, SCHEDULE, hours=25)
        timings["schedule started"] = time.monotonic() - t0

        def schedule_tick():
            result = dagster.gql(SCHEDULE_QUERY, selector=schedule)["scheduleOrError"]
            assert result["__typename"] == "Schedule", result
            ticks = [t for t in result["scheduleState"]["ticks"] if t["status"] != "STARTED"]
            failed = [t for t in ticks if t["status"] == "FAILURE"]
            assert not failed, f"{SCHEDULE} tick failed: {failed[0]['error']}"
            return ticks[0] if ticks else None

        tick = _wait(f"a tick of {SCHEDULE}", schedule_tick, deadline, dagster)
        timings["schedule tick"] = time.monotonic() - t0
        assert tick["status"] == "SUCCESS" and len(tick["runIds"]) == 1, tick
        fired = datetime.fromtimestamp(tick["timestamp"], timezone.utc)
        assert (fired.hour, fired.minute) == (7, 30), f"not the cron's 07:30 UTC tick: {fired}"
        (run_id,) = tick["runIds"]

        def run_done():
            run = dagster.gql(RUN_QUERY, runId=run_id)["runOrError"]
            assert run["__typename"] == "Run", run
            return run if run["status"] in ("SUCCESS", "FAILURE", "CANCELED") else None

        run = _wait(f"run {run_id} to finish", run_done, deadline, dagster)
        timings["scheduled run done"] = time.monotonic() - t0
        tags = {t["key"]: t["value"] for t in run["tags"]}
        print(f"{SCHEDULE} tick {fired:%Y-%m-%d %H:%M} UTC -> run {run_id} {run['status']}, tags {tags}")
        assert run["jobName"] == JOB, run
        assert tags.get("dagster/schedule_name") == SCHEDULE, tags
        assert run["status"] == "SUCCESS", run
        # the run's range: the trailing days before the tick, each a cost_allocation partition in the lake
        first, last = tags["dagster/asset_partition_range_start"], tags["dagster/asset_partition_range_end"]
        assert last == (fired.date() - timedelta(days=1)).isoformat(), tags
        written = sorted(p.name for p in (tmp_path / "lake" / "cost_allocation").iterdir())
        assert written[0] == f"day={first}" and written[-1] == f"day={last}", written

        # (3) a failed CLI run reaches the webhook that refused it at first, once
        failed = _fail_a_run_from_the_cli(dagster.env)
        assert failed.returncode != 0, failed.stdout[-2000:]
        timings["failed CLI run"] = time.monotonic() - t0
        with dg.DagsterInstance.from_config(str(home)) as instance:
            [failed_run] = instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]))
        taken = _wait("the webhook to take the run failure", webhook.failures, deadline, dagster)
        timings["run failure taken"] = time.monotonic() - t0
        assert webhook.refused, "the webhook never refused: the retry was not exercised"
        [(taken_at, note)] = taken
        assert note["fingerprint"] == failed_run.run_id and note["labels"]["job"] == "__ASSET_JOB", note
        assert "gpu_samples" in note["description"] and "cannot connect" in note["description"], note

        def later_tick():  # a tick that began after the webhook took it: it must not send it again
            result = dagster.gql(SENSOR_QUERY, selector=failure_sensor)["sensorOrError"]
            ticks = [t for t in result["sensorState"]["ticks"] if t["status"] != "STARTED"]
            since = time.time() - (time.monotonic() - taken_at)
            return [t for t in ticks if t["timestamp"] > since + 1]

        [after, *_] = _wait(f"a later tick of {FAILURE_SENSOR}", later_tick, deadline, dagster)
        assert after["status"] == "SKIPPED" and after["skipReason"] == "0 failed runs notified", after
        assert len(webhook.failures()) == 1, webhook.failures()
        timings["later failure-sensor tick"] = time.monotonic() - t0
        passed = True
    finally:
        webhook.shutdown()
        sent, left = dagster.stop()
        timings[f"stopped ({sent})"] = time.monotonic() - t0
        print("timings (s from start): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
        if not passed or left:
            print(f"--- dagster dev log tail ({dagster.log}) ---\n{dagster.tail()}")
    assert not left, f"processes of dagster dev survived SIGKILL: {left}"
