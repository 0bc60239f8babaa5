"""No secret reaches the event log, the run database, compute logs or the lake.

Distinctive secrets are planted in every credential setting, including passwords inside URLs; then a
succeeding and failing materializations (by the CLI, with a persistent DAGSTER_HOME: run storage, event
log, compute logs) and alert ticks whose sinks fail, then every file under DAGSTER_HOME and the lake is
searched for each secret.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import dagster as dg
import pytest

from foxhunt_obs.definitions import defs
from foxhunt_obs.sandbox.servers.local_server import free_port

PROM_PW = "PromPw-7731-secret"
SECRETS = {
    "FOXHUNT_PROMETHEUS_BEARER_TOKEN": "PromTok-4410-secret",
    "MLFLOW_TRACKING_PASSWORD": "MlflowPw-9925-secret",
    "SLACK_BOT_TOKEN": "xoxb-5566-SlackTok-secret",
    "FOXHUNT_ALERT_WEBHOOK_SECRET": "HookKey-3141-secret",
    "FOXHUNT_REPORT_SMTP_PASSWORD": "SmtpPw-2718-secret",
    "AWS_SECRET_ACCESS_KEY": "AwsKey-1618-secret",
}
URL_PASSWORDS = ("PromPw-7731-secret", "MlflowUrlPw-8080-secret", "AmPw-6060-secret")

pytestmark = pytest.mark.timeout(400)


def _env(tmp_path: Path, prometheus_url: str) -> dict[str, str]:
    dead = free_port()
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("")
    host = prometheus_url.split("://", 1)[1]
    return {
        **SECRETS,
        "DAGSTER_HOME": str(home),
        "FOXHUNT_LAKE": str(tmp_path / "lake"),
        "FOXHUNT_PROMETHEUS_URL": f"http://fhuser:{PROM_PW}@{host}",
        "MLFLOW_TRACKING_URI": f"http://mluser:MlflowUrlPw-8080-secret@127.0.0.1:{dead}",
        "MLFLOW_TRACKING_USERNAME": "mluser",
        "FOXHUNT_ALERTMANAGER_URL": f"http://amuser:AmPw-6060-secret@127.0.0.1:{dead}",
        "FOXHUNT_ALERT_WEBHOOK_URL": f"http://127.0.0.1:{dead}/hook",
        "FOXHUNT_ALERT_SLACK_CHANNEL": "#gpu",
        "FOXHUNT_REPORT_SLACK_API_URL": f"http://127.0.0.1:{dead}/api/",
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{dead}",
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    }


def _materialize(env: dict[str, str], select: str, partition: str | None) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "dagster",
        "asset",
        "materialize",
        "-m",
        "foxhunt_obs.definitions",
        "--select",
        select,
    ]
    cmd += ["--partition", partition] if partition else []
    return subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)


def _leaks(root: Path, text: str = "") -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for secret in (*SECRETS.values(), *URL_PASSWORDS):
        hits = [
            str(p.relative_to(root))
            for p in root.rglob("*")
            if p.is_file() and secret.encode() in p.read_bytes()
        ]
        if secret in text:
            hits.append("<process output or a sink's request>")
        if hits:
            found[secret] = hits
    return found


class _Receiver(http.server.ThreadingHTTPServer):
    """A webhook that records every body it is sent."""

    def __init__(self):
        self.bodies: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.server.bodies.append(
                    self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
                )
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


def test_planted_secrets_never_reach_dagster_home_or_the_lake(prometheus, small, tmp_path, monkeypatch):
    env = _env(tmp_path, prometheus.url)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    hour = small.start.strftime("%Y-%m-%d-%H:00")

    ok = _materialize(env, "gpu_samples", hour)  # Prometheus ignores the basic auth: it succeeds
    assert ok.returncode == 0, ok.stderr[-3000:]
    dead = {**env, "FOXHUNT_PROMETHEUS_URL": f"http://fhuser:{PROM_PW}@127.0.0.1:{free_port()}"}
    failed = _materialize(dead, "gpu_samples", hour)
    assert failed.returncode != 0 and "cannot connect" in failed.stdout + failed.stderr
    mlflow = _materialize(env, "training_runs", None)
    assert mlflow.returncode != 0 and "MLflow at http://***@127.0.0.1" in mlflow.stdout + mlflow.stderr
    output = "".join(r.stdout + r.stderr for r in (ok, failed, mlflow))

    # an alert tick whose sinks all fail (Alertmanager with a password in its URL, Slack, the webhook)
    instance = dg.DagsterInstance.get()
    definitions = defs()
    with dg.build_sensor_context(resources=definitions.resources, instance=instance) as context:
        tick = definitions.resolve_sensor_def("alert_sensor")(context)
    output += str(getattr(tick, "skip_message", "") or tick)

    # run_failure_alert on the failed run, to a webhook that answers: what it forwards is scrubbed
    receiver = _Receiver()
    monkeypatch.setenv("FOXHUNT_ALERT_WEBHOOK_URL", f"http://127.0.0.1:{receiver.server_address[1]}/hook")
    for var in ("FOXHUNT_ALERTMANAGER_URL", "FOXHUNT_ALERT_SLACK_CHANNEL"):
        monkeypatch.delenv(var)
    definitions = defs()  # the code location as it loads in this environment: only the webhook
    with dg.build_sensor_context(resources=definitions.resources, instance=instance) as sensor_context:
        notified = definitions.resolve_sensor_def("run_failure_alert")(sensor_context)
    assert notified.skip_message.endswith("failed runs notified"), notified.skip_message
    receiver.shutdown()
    assert receiver.bodies
    output += "".join(receiver.bodies)

    leaks = {
        **_leaks(Path(env["DAGSTER_HOME"]), output),
        **{f"lake: {k}": v for k, v in _leaks(Path(env["FOXHUNT_LAKE"])).items()},
    }
    assert not leaks, leaks
