"""Rendering /metrics once per change of what it shows, in whichever formats scrapers ask for.

prometheus_client's encoders cost ~0.5 ms per GPU (text or OpenMetrics), and what they render changes only
when the poller publishes, an XID arrives, an error is counted or the pod mapping changes. So the bytes are
kept per content type under a version key, and the poller thread re-renders the formats seen recently right
after each poll (`warm`): a scrape then only copies bytes, even the first one after a new snapshot. A format
nobody asked for in KEEP_WARM_S (a one-off curl) stops being rendered until it is asked for again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

log = logging.getLogger(__name__)
KEEP_WARM_S = 300.0


class Exposition:
    def __init__(self, registry: CollectorRegistry, version: Callable[[], Hashable]):
        self.registry, self.version = registry, version
        self._cache: dict[str, tuple[Hashable, bytes]] = {}  # content type -> (version, body)
        # content type -> (encoder, monotonic time it was last asked for)
        self._encoders: dict[str, tuple[Callable[[CollectorRegistry], bytes], float]] = {}
        self._lock = threading.Lock()  # one render at a time: concurrent scrapes wait instead of all rendering
        self.renders = 0

    def render(self, accept: str) -> tuple[bytes, str]:
        """The body and content type for an Accept header (prometheus_client's negotiation)."""
        encoder, content_type = choose_encoder(accept)
        self._encoders[content_type] = (encoder, time.monotonic())
        version = self.version()
        hit = self._cache.get(content_type)
        if hit is not None and hit[0] == version:
            return hit[1], content_type
        with self._lock:
            return self._render(content_type, encoder), content_type

    def _render(self, content_type: str, encoder: Callable[[CollectorRegistry], bytes]) -> bytes:
        version = self.version()  # read before rendering: a change during it only causes one more render
        hit = self._cache.get(content_type)
        if hit is not None and hit[0] == version:
            return hit[1]
        body = encoder(self.registry)
        self.renders += 1
        self._cache[content_type] = (version, body)
        return body

    def warm(self) -> None:
        """Re-render the formats scraped lately (the poller thread calls this after each poll)."""
        recent = time.monotonic() - KEEP_WARM_S
        with self._lock:
            for content_type, (encoder, asked) in self._encoders.copy().items():  # copy(): atomic vs scrapes
                if asked >= recent:
                    self._render(content_type, encoder)
