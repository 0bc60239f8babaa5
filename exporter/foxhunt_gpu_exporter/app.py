"""Wiring: one backend, the poller + watchdog + XID threads, optional pod labels, the registry, the server.

The CLI builds one Exporter; the tests and the benchmark build them directly (with a FakeBackend).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from prometheus_client.registry import CollectorRegistry

from .backend import Backend
from .collector import SnapshotCollector
from .events import XidCounters, XidWatcher
from .exposition import Exposition
from .podresources import PodSource
from .poller import ErrorCounts, Poller, Watchdog, exit_for_restart
from .server import MetricsServer

log = logging.getLogger(__name__)


class Exporter:
    def __init__(
        self,
        backend: Backend,
        *,
        interval: float = 5.0,
        hostname: str = "",
        pods: PodSource | None = None,
        stuck_after: float | None = None,
        on_stuck: Callable[[], None] = exit_for_restart,
        backoff_initial: float = 1.0,
        backoff_max: float = 60.0,
        xid_timeout_s: float = 1.0,
        errors: ErrorCounts | None = None,
    ):
        self.backend = backend
        self.errors = errors or ErrorCounts()  # shared with a PodResourcesWatcher built beforehand
        self.xids = XidCounters()
        self.pods = pods
        self.poller = Poller(
            backend,
            interval=interval,
            hostname=hostname,
            errors=self.errors,
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
        )
        # A poll running for 3 intervals is not slow, it is stuck in the driver.
        self.watchdog = Watchdog(self.poller, stuck_after or 3 * interval, on_stuck)
        self.xid_watcher = XidWatcher(backend, self.poller, self.xids, self.errors, timeout_s=xid_timeout_s)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(lambda: self.poller.snapshot, self.xids, self.errors, pods))
        self.exposition = Exposition(self.registry, self.version)
        self.poller.after_poll.append(self.exposition.warm)
        self.server: MetricsServer | None = None

    def version(self) -> tuple[int, ...]:
        """Changes whenever anything /metrics shows changes."""
        return self.poller.version, self.xids.version, self.errors.version, getattr(self.pods, "version", 0)

    def health(self) -> tuple[bool, str]:
        if self.poller.stuck:
            return False, "poll stuck in the driver"
        if not self.poller.alive:
            return False, "poller thread not running"
        return True, "ok"

    def start(self) -> Exporter:
        self.poller.start()
        self.watchdog.start()
        self.xid_watcher.start()
        if hasattr(self.pods, "start"):
            self.pods.start()
        return self

    def serve(self, address: str = ":9094", **server_options) -> MetricsServer:
        self.server = MetricsServer(self.exposition.render, self.health, address, **server_options)
        self.server.start()
        log.info("listening on %s/metrics", self.server.url)
        return self.server

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.watchdog.stop()
        self.xid_watcher.stop()
        if hasattr(self.pods, "stop"):
            self.pods.stop()
        self.poller.stop()
