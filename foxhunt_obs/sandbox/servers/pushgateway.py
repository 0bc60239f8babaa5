"""A real Prometheus Pushgateway for the spend push's tests (lib/delivery/pushgateway.py).

``PushgatewayServer`` runs Debian's ``/usr/bin/prometheus-pushgateway`` (``make pushgateway`` installs it) on
127.0.0.1 only, in its own process group, with ``--persistence.file`` set empty (Debian's default is a
shared /var/lib/prometheus/pushgateway.data): the pushed groups live in its memory and go with it. ``metrics_text()`` is what Prometheus scrapes: ``GET /metrics``.

Measured here (Pushgateway 1.5.1, Debian bookworm): ready in well under a second.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

from foxhunt_obs.sandbox.servers.alertmanager import _port_taken
from foxhunt_obs.sandbox.servers.local_server import LocalServer, SandboxError, http_ok

PUSHGATEWAY = "/usr/bin/prometheus-pushgateway"


class PushgatewayServer(LocalServer):
    """``prometheus-pushgateway`` on 127.0.0.1:``port`` (0: a free one), its log in ``workdir``
    (``pushgateway.log``; a temp dir when None)."""

    label = "Pushgateway"
    log_name = "pushgateway.log"

    def __init__(self, port: int = 0, workdir: Path | None = None, extra_args: tuple[str, ...] = ()):
        super().__init__(port, workdir)
        self.extra_args = tuple(extra_args)

    def command(self) -> list[str]:
        return [
            PUSHGATEWAY,
            f"--web.listen-address=127.0.0.1:{self.port}",
            # empty: pushed groups in memory only. Debian's build defaults to persisting them in
            # /var/lib/prometheus/pushgateway.data, shared by every run (and restored by the next)
            "--persistence.file=",
            *self.extra_args,
        ]

    def prepare(self) -> None:
        if not Path(PUSHGATEWAY).is_file():
            raise SandboxError(f"{PUSHGATEWAY} is missing: run `make pushgateway` (Debian package)")
        if _port_taken(self.port):
            # checked first: the ready poll would otherwise be answered by whoever holds the port
            raise SandboxError(f"Pushgateway on {self.url}: 127.0.0.1:{self.port} is already in use")

    def ready(self, timeout: float) -> bool:
        return http_ok(f"{self.url}/-/ready", timeout)

    def metrics_text(self) -> str:
        """The exposition Prometheus scrapes (every pushed group, plus the gateway's own metrics)."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as r:
            return r.read().decode()
