"""Calls that wait on a server, run beside each other on daemon threads.

Daemon threads, not a pool: concurrent.futures joins its workers when the interpreter exits, so a hung
server would hold a finished (or failed) Dagster step until its request's deadline. Each call runs in a
copy of the caller's context, so the spans it opens hang under the caller's (lib/tracing.py).
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def _start(target: Callable[[], None], name: str) -> None:
    context = contextvars.copy_context()
    threading.Thread(target=context.run, args=(target,), daemon=True, name=name).start()


def in_order(calls: list[Callable[[], R]], at_once: int, name: str = "side-by-side") -> Iterator[R]:
    """The calls' results in order, each as soon as it and those before it are done; at most `at_once`
    running, none started more than `at_once` past the result the caller is on (what waits for its turn
    is held in memory). A call's error is raised when the caller reaches it, as one after another would
    (so which error a run reports does not depend on timing); once one has failed, no further call
    starts, and those running end within their own request's deadline."""
    if at_once <= 1:
        for call in calls:
            yield call()
        return
    # `at_once` worker threads take the calls as they are let start: a thread per call cost ~0.1 ms of CPU
    # a call, a day of hourly ingest ~1,000 calls
    todo: queue.SimpleQueue = queue.SimpleQueue()  # (index, the caller's context then), or None: stop
    finished: queue.SimpleQueue = queue.SimpleQueue()

    def work() -> None:
        while (job := todo.get()) is not None:
            i, context = job
            try:
                finished.put((i, context.run(calls[i]), None))
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread, raised there
                finished.put((i, None, e))

    done: dict[int, tuple] = {}
    started, workers, failed = 0, 0, False

    def start_until(stop: int) -> None:
        # never more than `at_once` calls let start and not yet taken by the caller, so none waits for a worker
        nonlocal started, workers
        while not failed and started < min(len(calls), stop):
            todo.put((started, contextvars.copy_context()))
            started += 1
            if workers < at_once:
                threading.Thread(target=work, daemon=True, name=name).start()
                workers += 1

    try:
        start_until(at_once)
        for i in range(len(calls)):
            # every call before the first failure was started: none is waited for in vain
            while i not in done:
                j, value, error = finished.get()
                done[j] = (value, error)
                failed = failed or error is not None
            value, error = done.pop(i)
            if error is not None:
                raise error
            start_until(i + 1 + at_once)  # while the caller is on result i, the next at_once run
            yield value
    finally:  # the workers end once their calls have (or at once, those waiting for one)
        for _ in range(workers):
            todo.put(None)


def side_by_side(calls: list[Callable[[], R]], at_once: int, name: str = "side-by-side") -> list[R]:
    """in_order's results as a list."""
    return list(in_order(calls, at_once, name))


def one_ahead(items: Iterable[T], fetch: Callable[[T], R], name: str = "one-ahead") -> Iterator[tuple[T, R]]:
    """(item, fetch(item)) in order, the next item's fetch running while the caller works on this one:
    downloading hour h + 1 overlaps writing hour h. An item's error is raised when the caller reaches
    it, after every item before it, as one after another. When the caller stops, the fetch already
    running ends within its own requests' deadlines and no other starts."""
    items = list(items)
    if not items:
        return

    def begin(item: T) -> queue.SimpleQueue:
        box = queue.SimpleQueue()

        def run() -> None:
            try:
                box.put((fetch(item), None))
            except BaseException as e:  # noqa: BLE001 - raised in the caller's thread
                box.put((None, e))

        _start(run, name)
        return box

    box = begin(items[0])
    for i, item in enumerate(items):
        value, error = box.get()
        if error is not None:
            raise error
        if i + 1 < len(items):
            box = begin(items[i + 1])
        yield item, value
