"""The one thread that talks to the device, and the watchdog that notices when it stops coming back.

Each cycle reads every GPU and publishes a new immutable Snapshot; scrapes only ever read the latest one.
All backend calls except the XID wait happen here (nvmlDeviceGetFieldValues is not thread-safe).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
import time
from collections.abc import Callable

from .backend import (
    DEVICE_CODES,
    GPM,
    LIBRARY_CODES,
    MEMORY_V2,
    METRICS,
    UNSUPPORTED_CODES,
    Backend,
    ErrorCode,
    GpmActivity,
    GpmSample,
    GpuIdentity,
    Memory,
    NvmlError,
)
from .snapshot import GpuReading, Snapshot

log = logging.getLogger(__name__)

# Kinds of foxhunt_exporter_poll_errors_total, all exported from the start so rate() works at once.
ERROR_KINDS = ("init", "library", "device", "metric", "stuck", "internal", "xid_wait", "podresources")
# The v2 memory call is absent or refused on old drivers: fall back to v1 for good.
MEMORY_V2_UNSUPPORTED = UNSUPPORTED_CODES | {ErrorCode.ARGUMENT_VERSION_MISMATCH}


class ErrorCounts:
    """Errors by kind, shared by the poller, XID and PodResources threads; the collector reads a copy."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(ERROR_KINDS, 0)
        self.version = 0  # bumped on every change: part of the exposition cache key

    def inc(self, kind: str) -> None:
        with self._lock:
            self._counts[kind] = self._counts.get(kind, 0) + 1
            self.version += 1

    def items(self) -> tuple[tuple[str, int], ...]:
        with self._lock:
            return tuple(self._counts.items())

    def __getitem__(self, kind: str) -> int:
        return self._counts.get(kind, 0)


class _LibraryDown(Exception):
    def __init__(self, error: NvmlError):
        self.error = error


class Poller:
    def __init__(
        self,
        backend: Backend,
        *,
        interval: float = 5.0,
        hostname: str = "",
        errors: ErrorCounts | None = None,
        backoff_initial: float = 1.0,
        backoff_max: float = 60.0,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ):
        self.backend, self.interval, self.hostname = backend, interval, hostname
        self.errors = errors or ErrorCounts()
        self._backoff_initial, self._backoff_max = backoff_initial, backoff_max
        self.monotonic, self._wall = monotonic, wall
        self._snapshot = Snapshot(hostname=hostname)
        self._publish_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # NVML state, touched by the poller thread only
        self._nvml_up = False
        self._backoff = backoff_initial
        self._next_init = 0.0
        self._init_error = 0
        self._driver = ""
        self._count = 0
        self._identities: dict[int, GpuIdentity] = {}
        self._unsupported: dict[int, set[str]] = {}
        self._gpm_samples: dict[int, GpmSample] = {}  # GPU -> its GPM sample of the last poll
        self._down: set[int] = set()
        self._warned: set[tuple] = set()
        self._said_no_gpus = False
        self.busy_since: float | None = None  # monotonic start of the poll in progress; read by the watchdog
        self.stuck = False
        self.xid_registered = threading.Event()
        self.version = 0  # bumped on every publish: part of the exposition cache key
        self.after_poll: list[Callable[[], None]] = []  # run on the poller thread after each cycle

    # -- reading ------------------------------------------------------------------------------------------

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def poll_once(self) -> Snapshot:
        """One cycle on the calling thread: read every GPU, publish and return the new Snapshot."""
        start = self.monotonic()
        try:
            fields = self._poll()
        except Exception:  # a bug must not kill the only thread that polls
            log.exception("poll failed unexpectedly")
            self.errors.inc("internal")
            fields = {"nvml_up": self._nvml_up}
        duration = self.monotonic() - start
        with self._publish_lock:
            prev = self._snapshot
            snap = dataclasses.replace(
                prev,
                taken_at=self._wall(),
                polls=prev.polls.observe(duration),
                init_error_code=self._init_error,
                **fields,
            )
            if not self.stuck:  # once the watchdog reported every GPU down, a late poll must not undo it
                self._snapshot = snap
                self.version += 1
        return snap

    def _poll(self) -> dict:
        if not self._nvml_up and not self._try_init():
            return {"nvml_up": False, "gpus": self._known_down()}
        gpus = []
        try:
            for i in range(self._count):
                gpus.append(self._read_gpu(i))
        except _LibraryDown as e:
            self._library_down(e.error)
            return {"nvml_up": False, "gpus": self._known_down()}
        return {"nvml_up": True, "gpus": tuple(gpus), "driver": self._driver, "last_success": self._wall()}

    def _known_down(self) -> tuple[GpuReading, ...]:
        """While NVML is down, GPUs seen before are reported with up 0 rather than vanishing."""
        return tuple(GpuReading(index=i, up=False, identity=self._identities.get(i)) for i in range(self._count))

    def _try_init(self) -> bool:
        now = self.monotonic()
        if now < self._next_init:
            return False
        try:
            self.backend.init()
            driver, count = self.backend.driver_version(), self.backend.device_count()
        except NvmlError as e:
            self._init_error = int(e.code)
            self.errors.inc("init")
            log.warning("NVML init failed: %s; serving self-metrics, retrying in %.0fs", e, self._backoff)
            self._next_init = now + self._backoff
            self._backoff = min(self._backoff * 2, self._backoff_max)
            return False
        self._nvml_up, self._init_error, self._backoff = True, 0, self._backoff_initial
        self._driver, self._count = driver, count
        self._unsupported.clear()  # a new driver may support more
        self._identities.clear()  # and after a driver reload, index i need not be the same board
        log.info("NVML initialised: driver %s, %d GPU(s)", driver, count)
        if count == 0 and not self._said_no_gpus:
            self._said_no_gpus = True
            log.warning("NVML reports no GPUs on this node; serving self-metrics only")
        try:
            self.backend.register_xid_events()
            self.xid_registered.set()
        except NvmlError as e:
            log.warning("XID events unavailable: %s; foxhunt_gpu_xid_errors_total stays empty", e)
        return True

    def _library_down(self, e: NvmlError) -> None:
        self._nvml_up = False
        self.errors.inc("library")
        log.error("NVML stopped answering (%s); re-initialising with backoff", e)
        self.xid_registered.clear()
        self._drop_gpm_samples()  # taken under this NVML session: free them before it ends
        try:
            self.backend.shutdown()
        except NvmlError:
            pass  # it is already broken; init will tell us more
        self._next_init = self.monotonic() + self._backoff

    def _read_gpu(self, i: int) -> GpuReading:
        identity = self._identities.get(i)
        unsupported = self._unsupported.setdefault(i, set())
        values: dict = {}
        try:
            if identity is None:
                identity = self._identities[i] = self.backend.identity(i)
            for key in METRICS:
                if key in unsupported:
                    continue
                try:
                    values[key] = self._read(i, key, unsupported)
                except NvmlError as e:
                    self._metric_error(i, key, e, unsupported)
        except NvmlError as e:
            if e.code in LIBRARY_CODES:
                raise _LibraryDown(e) from None
            self.errors.inc("device")
            self._drop_gpm_samples(i)  # a sample from before a reset must not be paired with one after
            if i not in self._down:
                self._down.add(i)
                log.warning("GPU %d (%s) is down: %s; retrying every poll", i, identity and identity.uuid, e)
            return GpuReading(index=i, up=False, identity=identity)
        if i in self._down:
            self._down.discard(i)
            log.info("GPU %d (%s) answers again", i, identity.uuid)
        return GpuReading(index=i, up=True, identity=identity, **values)

    def _read(self, i: int, key: str, unsupported: set[str]):
        if key == "memory":
            return self._memory(i, unsupported)
        if key == GPM:
            return self._gpm(i)
        return getattr(self.backend, key)(i)

    def _gpm(self, i: int) -> GpmActivity | None:
        """GPM metrics are computed between two samples: this poll's and the last one's (none at first).

        Any error breaks the pair: both samples are freed and the next poll starts a new one.
        """
        previous = self._gpm_samples.pop(i, None)
        try:
            current = self.backend.gpm_sample(i)
            try:
                activity = None if previous is None else self.backend.gpm_activity(i, previous, current)
            except NvmlError:
                self._free_gpm(current)
                raise
        finally:
            if previous is not None:
                self._free_gpm(previous)
        self._gpm_samples[i] = current
        return activity

    def _free_gpm(self, sample: GpmSample) -> None:
        try:
            self.backend.gpm_free(sample)
        except NvmlError as e:  # nothing to do about it; a library-wide failure shows on the next call
            log.debug("freeing a GPM sample failed: %s", e)

    def _drop_gpm_samples(self, gpu: int | None = None) -> None:
        """Free the kept GPM samples of one GPU (or all)."""
        for i in [gpu] if gpu is not None else list(self._gpm_samples):
            sample = self._gpm_samples.pop(i, None)
            if sample is not None:
                self._free_gpm(sample)

    def _memory(self, i: int, unsupported: set[str]) -> Memory:
        if MEMORY_V2 not in unsupported:
            try:
                return self.backend.memory(i, v2=True)
            except NvmlError as e:
                if e.code not in MEMORY_V2_UNSUPPORTED:
                    raise
                unsupported.add(MEMORY_V2)
                log.info("GPU %d: memory info v2 unavailable (%s); using v1 (reserved counted as used)", i, e.code.name)
        return self.backend.memory(i, v2=False)

    def _metric_error(self, i: int, key: str, e: NvmlError, unsupported: set[str]) -> None:
        if e.code in UNSUPPORTED_CODES:
            unsupported.add(key)  # asked once: NOT_SUPPORTED will not change until the driver does
            log.info("GPU %d: %s not supported (%s); not asking again", i, key, e.code.name)
            return
        if e.code in DEVICE_CODES or e.code in LIBRARY_CODES:
            raise e
        self.errors.inc("metric")
        if (i, key, e.code) not in self._warned:  # one line per new kind of failure, not one per poll
            self._warned.add((i, key, e.code))
            log.warning("GPU %d: reading %s failed: %s; skipped this poll", i, key, e)

    # -- thread -------------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="foxhunt-poller", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self.stuck

    def _run(self) -> None:
        next_at = self.monotonic()
        while not self._stop.is_set():
            self.busy_since = self.monotonic()
            self.poll_once()
            self.busy_since = None
            for hook in self.after_poll:
                try:
                    hook()
                except Exception:
                    log.exception("after-poll hook %s failed", hook)
            now = self.monotonic()
            next_at = max(next_at + self.interval, now)  # fixed rate; skip cycles a slow poll missed
            self._stop.wait(next_at - now)

    def mark_stuck(self) -> None:
        """Report every GPU down (and NVML with them) in the served snapshot, for good."""
        with self._publish_lock:
            self.stuck = True
            self._snapshot = self._snapshot.all_down()
            self.version += 1


def exit_for_restart() -> None:
    """The watchdog's default: a thread blocked in C cannot be killed, so end the process for a restart."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(3)


class Watchdog:
    """Calls `on_stuck` once when a poll has been running for longer than `stuck_after` seconds."""

    def __init__(
        self,
        poller: Poller,
        stuck_after: float,
        on_stuck: Callable[[], None] = exit_for_restart,
        check_every: float | None = None,
    ):
        self.poller, self.stuck_after, self.on_stuck = poller, stuck_after, on_stuck
        self.check_every = check_every or min(1.0, stuck_after / 4)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> bool:
        busy = self.poller.busy_since
        if busy is None or self.poller.stuck or self.poller.monotonic() - busy <= self.stuck_after:
            return False
        self.poller.mark_stuck()
        self.poller.errors.inc("stuck")
        log.error(
            "poll stuck in the driver for more than %.1fs: reporting every GPU down and exiting so the pod restarts",
            self.stuck_after,
        )
        self.on_stuck()
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="foxhunt-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.check_every):
            if self.check():
                return
