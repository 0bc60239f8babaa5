"""The test tiers, for every test of the repository (foxhunt_obs_tests/ and exporter/tests/).

``servers``: the test starts a server or another process: Prometheus or promtool, MLflow, moto, Alertmanager,
the Pushgateway, PostgreSQL, Chromium, Dagster (a daemon, the webserver, `dagster dev`), the CLI or Python in
a subprocess, the exporter's HTTP server, an HTTP or SMTP stand-in on a socket of its own. A test is marked
here by where it lives (``SERVER_DIRS``) and by the fixtures it uses (``SERVER_FIXTURES``, followed through
the fixtures they use), and in its file (``@pytest.mark.servers``, ``pytestmark``) where it starts something
by itself.

The rest is the quick tier (`make check` runs ``pytest -m "not servers"``) and it starts nothing: a test
without the mark that starts a process or listens on a socket fails at its teardown, naming what it started,
so the split stays true as tests are added.
"""

from __future__ import annotations

import fcntl
import multiprocessing.util
import os
import socket
import subprocess
import threading

import pytest

SERVER_DIRS = ("foxhunt_obs_tests/e2e/",)  # real servers and real Dagster runs, every test
SERVER_FIXTURES = frozenset(
    {
        "small_tsdb",  # e2e/conftest.py: promtool, and a Prometheus the recording rules are backfilled from
        "small_mlflow_store",  # e2e/conftest.py: runs logged into a real MLflow server
        "prometheus",  # e2e/conftest.py
        "own_prometheus",  # e2e/conftest.py
        "moto_s3",  # lib/conftest.py: a moto server in this process
    }
)


@pytest.fixture(scope="session")
def built_once(tmp_path_factory):
    """``built_once(name, build)``: ``build(folder)``'s answer, ``folder`` being one every pytest-xdist worker of
    this run shares (the run's base temp dir), the call made under a file lock: the first worker builds (the
    sandbox's TSDB, its MLflow store, each cached by scenario fingerprint under ``folder``) while the others
    wait, then find the build there, rather than every worker building its own at the same time."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # xdist gives each worker <the run's base temp>/<worker id>

    def built(name: str, build):
        folder = base / name
        folder.mkdir(exist_ok=True)
        with open(base / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return build(folder)

    return built


# What the running test without the mark has started; None while a marked test runs and between tests.
_started: list[str] | None = None


def _note(what: str) -> None:
    started = _started
    if started is not None:
        started.append(f"{what} (thread {threading.current_thread().name})")


def _watch_starts() -> None:
    """Every process started (subprocess, multiprocessing, os.fork) and every socket that listens passes here."""
    execute_child = subprocess.Popen._execute_child

    def _execute_child(self, args, *rest, **kw):
        argv = [args] if isinstance(args, str | bytes | os.PathLike) else args
        _note(f"a process: {' '.join(map(os.fsdecode, argv))}")
        return execute_child(self, args, *rest, **kw)

    fork = os.fork

    def _fork():
        _note("a forked process")
        return fork()

    spawnv_passfds = multiprocessing.util.spawnv_passfds  # multiprocessing's spawn and forkserver

    def _spawnv_passfds(path, args, passfds):
        _note(f"a process: {' '.join(map(os.fsdecode, args))}")
        return spawnv_passfds(path, args, passfds)

    listen = socket.socket.listen

    def _listen(self, *backlog):
        try:
            where = self.getsockname()
        except OSError:
            where = "?"
        _note(f"a server listening on {where}")
        return listen(self, *backlog)

    subprocess.Popen._execute_child = _execute_child
    os.fork = _fork
    multiprocessing.util.spawnv_passfds = _spawnv_passfds
    socket.socket.listen = _listen


def pytest_configure(config: pytest.Config) -> None:
    _watch_starts()


# The files that take longest (make test --durations: `dagster dev` 160 s, Dagster on PostgreSQL 90 s, the
# Prometheus backfills 70 s), run first
LONGEST_FIRST = (
    "foxhunt_obs_tests/e2e/test_dagster_dev.py",
    "foxhunt_obs_tests/e2e/test_dagster_postgres.py",
    "foxhunt_obs_tests/sandbox/servers/test_prometheus_backfill.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    where = {item: item.path.relative_to(root).as_posix() for item in items}
    place: dict[str, int] = {}  # a file's: 0 one of the longest, 1 one with a servers test, 2 the rest
    for item in items:
        if not item.get_closest_marker("servers") and (
            where[item].startswith(SERVER_DIRS) or SERVER_FIXTURES.intersection(item.fixturenames)
        ):
            item.add_marker(pytest.mark.servers)
        here = 0 if where[item] in LONGEST_FIRST else 1 if item.get_closest_marker("servers") else 2
        place[where[item]] = min(place.get(where[item], 2), here)
    # Whole files in that order, each file's tests in theirs: make test's workers (pytest-xdist, a file at a
    # time, in this order) start the long ones at once, and the quick tier's files fill the end of the run
    items.sort(key=lambda item: place[where[item]])


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item):
    global _started
    _started = None if item.get_closest_marker("servers") else []
    return (yield)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    global _started
    try:
        return (yield)
    finally:
        started, _started = _started, None
        if started:
            pytest.fail(
                f"{item.nodeid} is in the quick tier but started {len(started)} thing(s): "
                + "; ".join(dict.fromkeys(started))
                + ". Mark it @pytest.mark.servers (see conftest.py at the repository root).",
                pytrace=False,
            )
