"""A real Alertmanager for the alert sinks' tests and the demo (docs/design.md#alerts).

``AlertmanagerServer`` runs Debian's ``/usr/bin/prometheus-alertmanager`` (``make alertmanager`` installs
it) on 127.0.0.1 only, in its own process group, with its own ``--storage.path`` and a minimal config: one
receiver that sends nothing (``null``), a short ``group_wait``, no clustering (``--cluster.listen-address=``
empty: no gossip port, no settle wait). ``alerts()`` is what the cluster's UI shows: ``GET /api/v2/alerts``.

Measured here (Alertmanager 0.25.0, Debian bookworm): ready in well under a second.
"""

from __future__ import annotations

import json
import socket
import urllib.parse
import urllib.request
from pathlib import Path

from foxhunt_obs.sandbox.servers.local_server import LocalServer, SandboxError, http_ok

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


class AlertmanagerServer(LocalServer):
    """``prometheus-alertmanager`` on 127.0.0.1:``port`` (0: a free one), state under ``workdir``
    (``data/``, ``alertmanager.yml``, ``alertmanager.log``; a temp dir when None)."""

    label = "Alertmanager"
    log_name = "alertmanager.log"

    def __init__(
        self,
        port: int = 0,
        workdir: Path | None = None,
        group_wait: str = "1s",
        resolve_timeout: str = "5m",
        extra_args: tuple[str, ...] = (),
    ):
        super().__init__(port, workdir)
        self.group_wait = group_wait
        self.resolve_timeout = resolve_timeout
        self.extra_args = tuple(extra_args)

    def command(self) -> list[str]:
        return [
            ALERTMANAGER,
            f"--config.file={self.workdir / 'alertmanager.yml'}",
            f"--storage.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",  # empty: no HA gossip (no port 9094, no settle wait)
            *self.extra_args,
        ]

    def prepare(self) -> None:
        if not Path(ALERTMANAGER).is_file():
            raise SandboxError(f"{ALERTMANAGER} is missing: run `make alertmanager` (Debian package)")
        (self.workdir / "data").mkdir(parents=True, exist_ok=True)
        (self.workdir / "alertmanager.yml").write_text(config_text(self.group_wait, self.resolve_timeout))
        if _port_taken(self.port):
            # checked first: the ready poll would otherwise be answered by whoever holds the port
            raise SandboxError(f"Alertmanager on {self.url}: 127.0.0.1:{self.port} is already in use")

    def ready(self, timeout: float) -> bool:
        return http_ok(f"{self.url}/-/ready", timeout)

    def alerts(self, **filters: bool | str) -> list[dict]:
        """``GET /api/v2/alerts`` (the v2 API's defaults: active, silenced, inhibited and unprocessed
        alerts; resolved ones are never listed). ``filters``: its query parameters, e.g. ``active=False``."""
        query = urllib.parse.urlencode(
            {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in filters.items()}
        )
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts?{query}", timeout=10) as r:
            return json.loads(r.read())
