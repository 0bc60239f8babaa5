"""The sandbox's real Alertmanager: starts on 127.0.0.1 with its own storage and no gossip, answers the v2
API, and stops with its whole process group. `make install` installs it (Debian package
prometheus-alertmanager); without it these tests skip and say why."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import pytest

from foxhunt_obs.sandbox.servers.alertmanager import ALERTMANAGER, AlertmanagerServer
from foxhunt_obs.sandbox.servers.local_server import SandboxError, alive, free_port, group_pids

pytestmark = [
    pytest.mark.servers,
    pytest.mark.skipif(
        not Path(ALERTMANAGER).is_file(), reason=f"{ALERTMANAGER} is missing (`make install` installs it)"
    ),
]


def _listening_ports(pid: int) -> set[tuple[str, int]]:
    """(address, port) of the TCP sockets ``pid`` listens on (Linux /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                addr, port = fields[1].rsplit(":", 1)
                out.add((addr, int(port, 16)))
    return out


def test_runs_on_loopback_with_its_own_storage_and_no_gossip(tmp_path):
    with AlertmanagerServer(workdir=tmp_path) as am:
        assert am.started_in < 10
        assert am.alerts() == []
        with urllib.request.urlopen(f"{am.url}/api/v2/status", timeout=5) as r:
            status = json.loads(r.read())
        assert status["cluster"]["status"] == "disabled"  # --cluster.listen-address= (empty)
        assert 'receiver: "null"' in status["config"]["original"]
        # only the web port, only on loopback (127.0.0.1 = 0100007F in /proc/net/tcp)
        assert _listening_ports(am.pid) == {("0100007F", am.port)}
        assert (tmp_path / "data").is_dir() and (tmp_path / "alertmanager.log").is_file()
        assert f"--storage.path={tmp_path / 'data'}" in am.command()
        pgid = am.pid
        assert os.getpgid(am.pid) == am.pid  # its own process group
        assert group_pids(pgid) == [am.pid]
        with pytest.raises(SandboxError, match="already started"):
            am.start()
    assert am.process is None and not alive(pgid) and group_pids(pgid) == []
    am.stop()  # stopping twice is fine


def test_a_port_in_use_is_refused_not_mistaken_for_ready(tmp_path):
    # the ready poll would get its answer from the server already there
    with AlertmanagerServer(workdir=tmp_path / "a") as first:
        second = AlertmanagerServer(port=first.port, workdir=tmp_path / "b")
        with pytest.raises(SandboxError, match=f"127.0.0.1:{first.port} is already in use"):
            second.start(timeout=10)
        assert second.process is None


def test_a_bad_config_fails_with_the_log_tail(tmp_path):
    am = AlertmanagerServer(workdir=tmp_path, extra_args=("--no-such-flag",))
    with pytest.raises(SandboxError) as info:
        am.start(timeout=10)
    message = str(info.value)
    assert f"Alertmanager on {am.url} exited with" in message and "no-such-flag" in message
    assert am.process is None


def test_alerts_passes_the_api_filters(tmp_path):
    port = free_port()
    with AlertmanagerServer(port=port, workdir=tmp_path) as am:
        assert am.url == f"http://127.0.0.1:{port}"
        assert am.alerts(active=True, silenced=False) == [] and am.alerts(filter="alertname=x") == []
