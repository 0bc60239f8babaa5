"""The ``slack`` resource (dagster-slack's SlackResource) as the project's Definitions build it: both alert
sensors deliver through it to the local Slack stand-in, the token and API URL bound to their variables
when the code location loads and read when a tick runs; without Slack configured the code location loads
and the sensors still run.

The alert sensor evaluates for real: a Prometheus stand-in answers one stalled pod, and a rules file
(FOXHUNT_ALERT_RULES) leaves only gpu_training_stall on, firing at once."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import dagster as dg
import pytest
import yaml

from foxhunt_obs.definitions import defs
from foxhunt_obs.defs.resources import SlackBotResource
from foxhunt_obs.lib.alerts.rules import load_rules
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.sandbox.servers.local_server import free_port
from foxhunt_obs.sandbox.servers.slack_standin import SlackStandIn

TOKEN = "xoxb-0000-3333-resource-token-do-not-log"
CHANNEL = "#gpu-costs"  # a channel the stand-in knows


class PrometheusStandIn:
    """Answers every instant query with one pod: 0 (its utilization) or 8 for a ``count by`` (its GPUs)."""

    def __init__(self):
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self._answer(urllib.parse.urlsplit(self.path).query)

            def do_POST(self):  # Prometheus takes form-encoded parameters too (the client POSTs)
                self._answer(self.rfile.read(int(self.headers.get("Content-Length", 0))).decode())

            def _answer(self, params: str):
                query = urllib.parse.parse_qs(params).get("query", [""])[0]
                value = "8" if query.startswith("count by") else "0"
                sample = {"metric": {"namespace": "rl", "pod": "ppo-a-0"}, "value": [0, value]}
                data = json.dumps(
                    {"status": "success", "data": {"resultType": "vector", "result": [sample]}}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def lake(tmp_path, monkeypatch):
    """A clean environment: no Slack, no other sink, a temp lake, Prometheus stand-in, one rule on."""
    for name in list(os.environ):
        if name.startswith(("FOXHUNT_", "SLACK_", "MLFLOW_", "AWS_")):
            monkeypatch.delenv(name)
    prometheus = PrometheusStandIn()
    rules = {r.id: {"enabled": False} for r in load_rules(overrides="")}
    rules["gpu_training_stall"] = {"for": "0s"}
    overrides = tmp_path / "rules.yaml"
    overrides.write_text(yaml.safe_dump({"rules": rules}))
    monkeypatch.setenv("FOXHUNT_ALERT_RULES", str(overrides))
    monkeypatch.setenv("FOXHUNT_PROMETHEUS_URL", prometheus.url)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")  # no rule reads it
    monkeypatch.setenv("FOXHUNT_LAKE", str(tmp_path / "lake"))
    yield Lake(str(tmp_path / "lake"))
    prometheus.close()


@pytest.fixture
def slack():
    stand_in = SlackStandIn()
    yield stand_in
    stand_in.close()


def _alert_tick(definitions: dg.Definitions, resources=None):
    resources = resources or definitions.resources
    with dg.build_sensor_context(resources=resources, instance=dg.DagsterInstance.ephemeral()) as context:
        return definitions.resolve_sensor_def("alert_sensor")(context)


def _fail_a_run(definitions: dg.Definitions, resources=None):
    """run_failure_alert's tick after a real failed run in the instance it reads."""
    instance = dg.DagsterInstance.ephemeral()

    @dg.op
    def broken():
        raise RuntimeError("the node went away")

    @dg.job
    def ingest_job():
        broken()

    result = ingest_job.execute_in_process(instance=instance, raise_on_error=False)
    with dg.build_sensor_context(instance=instance, resources=resources or definitions.resources) as context:
        tick = definitions.resolve_sensor_def("run_failure_alert")(context)
    assert tick.skip_message == "1 failed runs notified", tick.skip_message
    return result.dagster_run


def test_the_definitions_register_the_slack_resource(monkeypatch):
    monkeypatch.delenv("SLACK_BOT_TOKEN", raising=False)
    resource = defs().resources["slack"]
    assert isinstance(resource, SlackBotResource) and resource.token == ""
    # set: the resource holds the variable's name (the UI shows it), never the token
    monkeypatch.setenv("SLACK_BOT_TOKEN", TOKEN)
    resource = defs().resources["slack"]
    assert isinstance(resource.token, dg.EnvVar) and resource.token == "SLACK_BOT_TOKEN"


@pytest.mark.servers
def test_the_alert_sensors_deliver_through_the_slack_resource(lake, slack, monkeypatch, caplog):
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-replaced-before-the-tick")
    monkeypatch.setenv("FOXHUNT_REPORT_SLACK_API_URL", slack.url + "/api/")
    monkeypatch.setenv("FOXHUNT_ALERT_SLACK_CHANNEL", CHANNEL)
    definitions = defs()
    monkeypatch.setenv("SLACK_BOT_TOKEN", TOKEN)  # the variables' values are read when the tick runs

    result = _alert_tick(definitions)

    assert "1 notified" in result.skip_message
    [post] = slack.requests
    assert post["path"] == "/api/chat.postMessage" and post["params"]["channel"] == CHANNEL
    assert post["params"]["text"].startswith("🔥 *CRITICAL* `gpu_training_stall` — Training stalled: ppo-a-0")
    assert post["headers"]["Authorization"] == f"Bearer {TOKEN}"
    [row] = lake.query("SELECT rule, status, sent_to FROM alerts").to_pylist()
    assert row == {"rule": "gpu_training_stall", "status": "firing", "sent_to": "slack"}

    run = _fail_a_run(definitions)

    failed = slack.requests[-1]["params"]
    assert len(slack.requests) == 2 and failed["channel"] == CHANNEL
    assert failed["text"].startswith("🔥 *WARNING* `dagster_run_failed` — Dagster run of ingest_job failed")
    assert f"`run_id={run.run_id}`" in failed["text"] and "Steps failed: ['broken']" in failed["text"]
    assert TOKEN not in caplog.text


@pytest.mark.servers
def test_the_sensors_use_the_resource_they_are_given(lake, slack, monkeypatch):
    # no SLACK_BOT_TOKEN: only the resource's own token and base_url can reach the stand-in
    monkeypatch.setenv("FOXHUNT_ALERT_SLACK_CHANNEL", CHANNEL)
    definitions = defs()
    own = SlackBotResource(token="xoxb-4444-configured", base_url=slack.url + "/api/")
    resources = {**definitions.resources, "slack": own}

    assert "1 notified" in _alert_tick(definitions, resources).skip_message
    _fail_a_run(definitions, resources)

    assert [r["path"] for r in slack.requests] == ["/api/chat.postMessage"] * 2
    assert {r["headers"]["Authorization"] for r in slack.requests} == {"Bearer xoxb-4444-configured"}


@pytest.mark.servers
def test_without_slack_the_definitions_load_and_the_sensors_still_run(lake):
    definitions = defs()
    assert definitions.resources["slack"].get_client().token == ""

    result = _alert_tick(definitions)

    assert "1 notified" in result.skip_message  # to the lake alone
    _fail_a_run(definitions)  # every sink took it
    rows = lake.query("SELECT rule, sent_to FROM alerts ORDER BY rule").to_pylist()
    assert rows == [
        {"rule": "dagster_run_failed", "sent_to": ""},
        {"rule": "gpu_training_stall", "sent_to": ""},
    ]


@pytest.mark.servers
def test_a_broken_overrides_file_does_not_stop_alerting(lake, tmp_path, monkeypatch):
    """A typo in FOXHUNT_ALERT_RULES keeps the last good rules, and says which line."""
    definitions = defs()
    overrides = Path(os.environ["FOXHUNT_ALERT_RULES"])
    good = overrides.read_text()
    assert "1 notified" in _alert_tick(definitions).skip_message  # the good file, once
    overrides.write_text(good + "  gpu_overheat: {for: 5m\n")  # an unclosed flow mapping
    with dg.build_sensor_context(resources=definitions.resources, instance=dg.DagsterInstance.ephemeral(),
                                 cursor=None) as context:  # fmt: skip
        result = definitions.resolve_sensor_def("alert_sensor")(context)
    # the same single rule is still evaluated (the last good set), and the tick says what is wrong
    assert result.skip_message.startswith("1 rules evaluated")
    assert (
        "FOXHUNT_ALERT_RULES is broken, alerting goes on with the rules it gave last" in result.skip_message
    )
    assert "line" in result.skip_message and str(overrides) in result.skip_message
    # never good in this process: the catalog's own rules
    other = tmp_path / "other.yaml"
    other.write_text("rules: [\n")
    monkeypatch.setenv("FOXHUNT_ALERT_RULES", str(other))
    result = _alert_tick(definitions)
    assert "goes on with the catalog's own rules" in result.skip_message
    assert not result.skip_message.startswith("1 rules evaluated")  # every enabled rule of the catalog


@pytest.mark.servers
def test_an_alias_bomb_or_a_huge_overrides_file_does_not_stop_alerting(lake, monkeypatch):
    """A rules file whose aliases would expand to ~387 million strings, then one of 20 MB: each tick
    evaluates the last good rules at once and says why in a short line."""
    definitions = defs()
    overrides = Path(os.environ["FOXHUNT_ALERT_RULES"])
    assert "1 notified" in _alert_tick(definitions).skip_message  # the good file, once
    levels = ['&a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    levels += [f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    overrides.write_text(
        f"rules:\n  gpu_overheat: {{thresholds: {{temp_max_celsius: [{', '.join(levels)}]}}}}\n"
    )
    start = time.monotonic()
    result = _alert_tick(definitions)
    assert time.monotonic() - start < 10
    assert result.skip_message.startswith("1 rules evaluated")  # the last good set
    assert f"the rules it gave last: {overrides}, line 2: alias *a0 refused" in result.skip_message
    overrides.write_text("rules:\n  gpu_overheat: {for: '" + "9" * 20_000_000 + "'}\n")
    result = _alert_tick(definitions)
    assert result.skip_message.startswith("1 rules evaluated") and len(result.skip_message) < 500
    assert f"{overrides}: {overrides.stat().st_size} bytes, over the 1048576 bytes" in result.skip_message


@pytest.mark.servers
def test_an_alert_links_to_the_sensor_under_the_location_the_tick_runs_in(lake, slack, monkeypatch):
    """The daemon names the code location as the deployment's workspace does (the Helm chart's, or
    workspace.yaml's): the alert's link into the Dagster UI follows it, not a literal."""
    from dagster._core.execution.build_resources import wrap_resources_for_execution
    from dagster._core.remote_origin import RegisteredCodeLocationOrigin

    monkeypatch.setenv("FOXHUNT_REPORT_SLACK_API_URL", slack.url + "/api/")
    monkeypatch.setenv("FOXHUNT_ALERT_SLACK_CHANNEL", CHANNEL)
    monkeypatch.setenv("SLACK_BOT_TOKEN", TOKEN)
    monkeypatch.setenv("FOXHUNT_DAGSTER_URL", "https://dagster.example.com/")
    definitions = defs()
    with dg.SensorEvaluationContext(
        instance_ref=None,
        instance=dg.DagsterInstance.ephemeral(),
        resources=wrap_resources_for_execution(definitions.resources),
        sensor_name="alert_sensor",
        code_location_origin=RegisteredCodeLocationOrigin("foxhunt prod/eu"),  # as the daemon passes it
    ) as context:
        assert "1 notified" in definitions.resolve_sensor_def("alert_sensor")(context).skip_message
    [post] = slack.requests
    link = "https://dagster.example.com/locations/foxhunt%20prod%2Feu/sensors/alert_sensor?rule=gpu_training_stall"
    assert f"<{link}|" in post["params"]["text"], post["params"]["text"]


@pytest.mark.servers
def test_a_refreshes_training_rule_requests_todays_training_job(lake, tmp_path, monkeypatch):
    """The sensor requests training_job for today when a notified rule has `refreshes_training`: the same
    firing gpu_training_stall only notifies with the packaged catalog, and asks for the refresh once the
    catalog (a copy, flag added) says so."""
    from datetime import datetime, timezone

    from foxhunt_obs.lib.alerts import rules as catalog

    definitions = defs()
    result = _alert_tick(definitions)
    assert isinstance(result, dg.SkipReason) and "1 notified" in result.skip_message

    text, rule = catalog.DEFAULT_PATH.read_text(), "  - id: gpu_training_stall\n"
    assert text.count(rule) == 1
    flagged = tmp_path / "alert_rules.yaml"
    flagged.write_text(text.replace(rule, rule + "    refreshes_training: true\n"))
    monkeypatch.setattr(catalog, "DEFAULT_PATH", flagged)
    monkeypatch.setenv("FOXHUNT_LAKE", str(tmp_path / "another_lake"))  # no alert state: it fires anew
    result = _alert_tick(definitions)
    assert isinstance(result, dg.SensorResult), result
    [request] = result.run_requests
    today = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    assert (request.job_name, request.partition_key) == ("training_job", today)
    [row] = Lake(str(tmp_path / "another_lake")).query("SELECT rule, status FROM alerts").to_pylist()
    assert row == {"rule": "gpu_training_stall", "status": "firing"}
