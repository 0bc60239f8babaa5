"""A real Alertmanager for the alert sinks' tests and the demo (DESIGN §6, §7).

``AlertmanagerServer`` runs Debian's ``/usr/bin/prometheus-alertmanager`` (``make alertmanager`` installs
it) on 127.0.0.1 only, in its own process group, with its own ``--storage.path`` and a minimal config: one
receiver that sends nothing (``null``), a short ``group_wait``, no clustering (``--cluster.listen-address=``
empty: no gossip port, no settle wait). ``alerts()`` is what the cluster's UI shows: ``GET /api/v2/alerts``.

Measured here (Alertmanager 0.25.0, Debian bookworm): ready in well under a second.
"""

from __future__ import annotations

import json
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from foxhunt_obs.sandbox.prometheus import SandboxError, _kill_group, _ready, _tail, free_port

ALERTMANAGER = "/usr/bin/prometheus-alertmanager"


def _port_taken(port: int) -> bool:
    """Whether something listens on 127.0.0.1:port (SO_REUSEADDR, as Go's listener: TIME_WAIT is free)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def config_text(group_wait: str = "1s", resolve_timeout: str = "5m") -> str:
    """The sandbox's alertmanager.yml (JSON is YAML): every alert to the ``null`` receiver."""
    config = {
        "global": {"resolve_timeout": resolve_timeout},
        "route": {
            "receiver": "null",
            "group_by": ["alertname"],
            "group_wait": group_wait,
            "group_interval": "5s",
            "repeat_interval": "1h",
        },
        "receivers": [{"name": "null"}],
    }
    return json.dumps(config, indent=2) + "\n"


class AlertmanagerServer:
    """``prometheus-alertmanager`` on 127.0.0.1:``port`` (0: a free one), state under ``workdir``
    (``data/``, ``alertmanager.yml``, ``alertmanager.log``; a temp dir when None)."""

    def __init__(
        self,
        port: int = 0,
        workdir: Path | None = None,
        group_wait: str = "1s",
        resolve_timeout: str = "5m",
        extra_args: tuple[str, ...] = (),
    ):
        self.port = port
        self.workdir = Path(workdir).resolve() if workdir else None  # the process runs elsewhere
        self.group_wait = group_wait
        self.resolve_timeout = resolve_timeout
        self.extra_args = tuple(extra_args)
        self.process: subprocess.Popen | None = None
        self.started_in: float | None = None  # seconds from Popen to a ready /-/ready

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def log_path(self) -> Path:
        return self.workdir / "alertmanager.log"

    def command(self) -> list[str]:
        return [
            ALERTMANAGER,
            f"--config.file={self.workdir / 'alertmanager.yml'}",
            f"--storage.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",  # empty: no HA gossip (no port 9094, no settle wait)
            *self.extra_args,
        ]

    def start(self, timeout: float = 30.0) -> AlertmanagerServer:
        if self.process:
            raise SandboxError("Alertmanager already started")
        if not Path(ALERTMANAGER).is_file():
            raise SandboxError(f"{ALERTMANAGER} is missing: run `make alertmanager` (Debian package)")
        self.workdir = self.workdir or Path(tempfile.mkdtemp(prefix="foxhunt-alertmanager-"))
        (self.workdir / "data").mkdir(parents=True, exist_ok=True)
        (self.workdir / "alertmanager.yml").write_text(config_text(self.group_wait, self.resolve_timeout))
        self.port = self.port or free_port()
        if _port_taken(self.port):
            # checked first: the ready poll would otherwise be answered by whoever holds the port
            raise SandboxError(f"Alertmanager on {self.url}: 127.0.0.1:{self.port} is already in use")
        t0 = time.monotonic()
        with self.log_path.open("ab") as log:
            # own process group, so stop() takes down whatever it starts (DESIGN §8)
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
                start_new_session=True,
            )
        deadline = t0 + timeout
        while self.process.poll() is not None or not _ready(self.url, timeout=1.0):
            if self.process.poll() is not None or time.monotonic() > deadline:
                why = (
                    f"exited with {self.process.returncode}"
                    if self.process.poll() is not None
                    else f"not ready after {timeout:g} s"
                )
                self.stop()
                raise SandboxError(f"Alertmanager on {self.url} {why}; log tail:\n{_tail(self.log_path)}")
            time.sleep(0.05)
        self.started_in = time.monotonic() - t0
        return self

    def alerts(self, **filters: bool | str) -> list[dict]:
        """``GET /api/v2/alerts`` (the v2 API's defaults: active, silenced, inhibited and unprocessed
        alerts; resolved ones are never listed). ``filters``: its query parameters, e.g. ``active=False``."""
        query = urllib.parse.urlencode(
            {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in filters.items()}
        )
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts?{query}", timeout=10) as r:
            return json.loads(r.read())

    def stop(self, timeout: float = 10.0) -> None:
        if not self.process:
            return
        _kill_group(self.process.pid, timeout, self.process)
        self.process = None

    def __enter__(self) -> AlertmanagerServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
