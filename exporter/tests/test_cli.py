"""The console script end to end: a real process serving fake metrics, flags, clean shutdown."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from exporter_helpers import families, get


def start(*args: str, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "foxhunt_gpu_exporter.cli", *args],
        stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
    )  # fmt: skip
    deadline, lines = time.monotonic() + 15, []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        lines.append(line)
        found = re.search(r"listening on (\S+)/metrics", line)
        if found:
            return proc, found.group(1)
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError("exporter did not start:\n" + "".join(lines))


@pytest.mark.servers
def test_console_script_serves_plausible_fake_metrics_and_stops_on_sigterm(tmp_path):
    scenario = tmp_path / "two_h100.json"
    scenario.write_text(json.dumps({"gpus": 2, "model": "NVIDIA H100 80GB HBM3", "hostname": "ip-10-0-0-1"}))
    proc, url = start("--fake", str(scenario), "--listen-address", "127.0.0.1:0", "--interval", "0.2")
    try:
        status, _, body = get(url, "/metrics")
        fams = families(body.decode())
        up = fams["foxhunt_gpu_up"].samples
        assert status == 200 and len(up) == 2 and up[0].labels["hostname"] == "ip-10-0-0-1"
        assert fams["foxhunt_gpu_power_draw_watts"].samples[0].value <= 700
        assert get(url, "/healthz")[0] == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0 and "stopping" in err


@pytest.mark.servers
def test_bad_scenario_exits_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"gpus": 2, "gpu_count": 3}))
    proc = subprocess.run([sys.executable, "-m", "foxhunt_gpu_exporter.cli", "--fake", str(bad)],
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert proc.returncode == 2 and "unknown keys ['gpu_count']" in proc.stderr


@pytest.mark.parametrize(
    "args, message",
    [(["--basic-auth-user", "prom"], "FOXHUNT_EXPORTER_BASIC_AUTH_PASSWORD"),
     (["--tls-cert", "c.pem"], "--tls-cert and --tls-key go together"),
     (["--interval", "0"], "--interval must be positive")],
)  # fmt: skip
def test_flag_errors(args, message, monkeypatch, capsys):
    from foxhunt_gpu_exporter import cli

    monkeypatch.delenv("FOXHUNT_EXPORTER_BASIC_AUTH_PASSWORD", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_args(args)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.servers
def test_port_in_use_exits_1():
    proc, url = start("--fake", "--listen-address", "127.0.0.1:0")
    try:
        port = url.rsplit(":", 1)[1]
        second = subprocess.run([sys.executable, "-m", "foxhunt_gpu_exporter.cli", "--fake", "--listen-address",
                                 f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=30)  # fmt: skip
        assert second.returncode == 1 and "cannot serve on" in second.stderr
    finally:
        proc.kill()
        proc.communicate(timeout=10)


@pytest.mark.servers
def test_stuck_poll_exits_the_process_with_status_3(tmp_path):
    scenario = tmp_path / "hang.json"
    scenario.write_text(json.dumps({"gpus": 1, "faults": [{"kind": "hang", "at": 0.5}]}))
    proc, url = start("--fake", str(scenario), "--listen-address", "127.0.0.1:0", "--interval", "0.1")
    try:
        _, err = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == 3 and "poll stuck in the driver" in err
