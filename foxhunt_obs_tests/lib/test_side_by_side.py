"""lib/side_by_side.py: results in order, the bound on calls running and on calls started ahead of the
caller, the first error raised with no call started after it, and daemon threads."""

import subprocess
import sys
import threading
import time

import pytest

from foxhunt_obs.lib.side_by_side import in_order, one_ahead, side_by_side


class _Calls:
    """Calls that sleep (shortest last, so they finish out of order) and record what ran when."""

    def __init__(self, n: int, fail: int | None = None, first_together: int = 0):
        self.lock, self.running, self.most, self.started = threading.Lock(), 0, 0, []
        self.n, self.fail = n, fail
        # the first `first_together` calls wait for each other: reaching the bound does not depend on how
        # fast a loaded machine starts threads
        self.together, self.all_in = first_together, threading.Event()

    def call(self, i: int):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.started.append(i)
            if len(self.started) >= self.together:
                self.all_in.set()
        if i < self.together:
            assert self.all_in.wait(10)
        time.sleep(0.02 * (self.n - i) / self.n + 0.01)
        with self.lock:
            self.running -= 1
        if i == self.fail:
            raise ValueError(f"call {i} failed")
        return i * 10

    def calls(self):
        return [lambda i=i: self.call(i) for i in range(self.n)]


@pytest.mark.parametrize("at_once", [1, 2, 4, 30])
def test_results_in_order_and_never_more_running_than_the_bound(at_once):
    c = _Calls(12, first_together=min(at_once, 12))
    assert side_by_side(c.calls(), at_once) == [i * 10 for i in range(12)]
    assert c.most == min(at_once, 12)
    assert sorted(c.started) == list(range(12))


def test_no_call_starts_more_than_the_bound_ahead_of_the_caller():
    c = _Calls(10)
    answers = in_order(c.calls(), 3)
    assert next(answers) == 0
    time.sleep(0.2)  # the caller dwells on the first result: only calls 1..3 may have started
    assert sorted(c.started) == [0, 1, 2, 3]
    assert list(answers) == [i * 10 for i in range(1, 10)]


def test_the_first_error_is_raised_and_no_call_starts_after_it():
    c = _Calls(12, fail=1)
    with pytest.raises(ValueError, match="call 1 failed"):
        side_by_side(c.calls(), 3)
    time.sleep(0.1)
    assert max(c.started) <= 3  # started before the failure was seen; nothing after


def test_errors_are_raised_in_the_calls_order_not_as_they_happen():
    """Call 2 fails at once, call 1 later: the caller gets result 0, then call 1's error, as one after
    another would have it (a run's error never depends on which query was quicker)."""

    def call(i: int):
        if i == 1:
            time.sleep(0.2)
            raise ValueError("call 1")
        if i == 2:
            raise ValueError("call 2")
        return i

    answers = in_order([lambda i=i: call(i) for i in range(6)], 4)
    assert next(answers) == 0
    with pytest.raises(ValueError, match="call 1"):
        next(answers)


def _workers(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


def _gone(name: str) -> bool:
    deadline = time.monotonic() + 5
    while _workers(name) and time.monotonic() < deadline:
        time.sleep(0.01)
    return not _workers(name)


def test_at_most_at_once_threads_serve_the_calls_and_end_with_the_caller():
    ran_on: set[int] = set()

    def call(i: int) -> int:
        ran_on.add(threading.get_ident())
        time.sleep(0.002)
        return i

    assert side_by_side([lambda i=i: call(i) for i in range(40)], 3, "sbs-test-all") == list(range(40))
    assert 1 <= len(ran_on) <= 3  # not a thread per call
    assert _gone("sbs-test-all")

    answers = in_order([lambda i=i: call(i) for i in range(40)], 3, "sbs-test-stop")
    assert next(answers) == 0 and _workers("sbs-test-stop")
    answers.close()  # the caller stops early: the workers end after the calls they hold
    assert _gone("sbs-test-stop")


def test_one_ahead_fetches_the_next_item_while_the_caller_works():
    fetched: list[tuple[int, float]] = []

    def fetch(i: int) -> int:
        fetched.append((i, time.monotonic()))
        return -i

    seen = []
    for item, value in one_ahead(range(4), fetch):
        seen.append((item, value))
        time.sleep(0.1)  # the caller's work on this item
        assert [i for i, _ in fetched] == list(range(min(item + 2, 4)))  # the next one is already fetched
    assert seen == [(i, -i) for i in range(4)]


def test_one_ahead_raises_an_items_error_at_that_item_and_fetches_nothing_after():
    fetched = []

    def fetch(i: int) -> int:
        fetched.append(i)
        if i == 2:
            raise ValueError("item 2")
        return i

    done = []
    with pytest.raises(ValueError, match="item 2"):
        for item, _ in one_ahead(range(5), fetch):
            done.append(item)
    time.sleep(0.1)
    assert done == [0, 1] and fetched == [0, 1, 2]
    assert list(one_ahead([], fetch)) == []


@pytest.mark.servers
def test_a_hung_call_does_not_hold_the_process_at_exit():
    script = (
        "import time\n"
        "from foxhunt_obs.lib.side_by_side import in_order\n"
        "answers = in_order([lambda: 1, lambda: time.sleep(60)], 2)\n"
        "print(next(answers), flush=True)\n"
    )
    t = time.monotonic()
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=50)
    assert out.returncode == 0 and out.stdout.strip() == "1", out.stderr
    assert time.monotonic() - t < 30  # not the hung call's 60 s
