"""XID errors: a thread blocked in the NVML event wait, feeding monotonic per-(GPU, xid) counters.

Counters, not a "last XID" gauge: a gauge that sticks at 79 cannot tell one event from ten, and one that
resets misses events between scrapes. The wait is the only backend call made off the poller thread.
"""

from __future__ import annotations

import logging
import threading

from .backend import Backend, ErrorCode, NvmlError
from .poller import ErrorCounts, Poller

log = logging.getLogger(__name__)


class XidCounters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[int, int], int] = {}
        self.version = 0

    def add(self, gpu: int, xid: int) -> None:
        with self._lock:
            self._counts[(gpu, xid)] = self._counts.get((gpu, xid), 0) + 1
            self.version += 1

    def items(self) -> list[tuple[tuple[int, int], int]]:
        with self._lock:
            return sorted(self._counts.items())


class XidWatcher:
    def __init__(
        self,
        backend: Backend,
        poller: Poller,
        counters: XidCounters,
        errors: ErrorCounts,
        timeout_s: float = 1.0,
    ):
        self.backend, self.poller, self.counters, self.errors = backend, poller, counters, errors
        self.timeout_s = timeout_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="foxhunt-xid", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            # Nothing to wait on until the poller has (re)initialised NVML and registered the event set.
            if not self.poller.xid_registered.wait(self.timeout_s):
                continue
            try:
                event = self.backend.wait_xid_event(self.timeout_s)
            except Exception as e:  # never let this thread die: XIDs are the errors that matter most
                if not (isinstance(e, NvmlError) and e.code == ErrorCode.UNINITIALIZED):  # mid re-init: wait
                    self.errors.inc("xid_wait")
                    if not failing:
                        log.warning("waiting for XID events failed: %s; retrying", e)
                failing = True
                self._stop.wait(self.timeout_s)
                continue
            failing = False
            if event is not None:
                self.counters.add(event.gpu, event.xid)
                log.warning("XID %d on GPU %d", event.xid, event.gpu)
