"""The test tiers (conftest.py at the repository root): a test outside the `servers` mark that starts a process
or listens on a socket fails, and `-m "not servers"` leaves out the marked ones. Checked on a throwaway suite
run by pytest in a subprocess, with the repository's conftest.py and markers."""

import shutil
import subprocess
import sys

import pytest

from foxhunt_obs_tests.paths import REPO

SUITE = '''
import socket, subprocess, sys
import pytest

def test_quiet():
    assert sum([1, 1]) == 2

def test_starts_a_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_listens():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()

@pytest.mark.servers
def test_marked_starts_a_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

@pytest.fixture
def small_tsdb():  # a name conftest.py knows for a server fixture: its users are marked
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_uses_a_server_fixture(small_tsdb):
    pass
'''


def _pytest(folder, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", *args],
        cwd=folder, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.servers
def test_the_quick_tier_fails_a_test_that_starts_something_and_leaves_out_the_marked(tmp_path):
    shutil.copy(REPO / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\naddopts = --strict-markers\nmarkers =\n    servers: starts a server or a process\n"
    )
    (tmp_path / "test_suite.py").write_text(SUITE)

    everything = _pytest(tmp_path)
    out = everything.stdout
    assert everything.returncode == 1, out
    assert "PASSED test_suite.py::test_quiet" in out
    assert "PASSED test_suite.py::test_marked_starts_a_process" in out
    assert "PASSED test_suite.py::test_uses_a_server_fixture" in out
    assert "ERROR test_suite.py::test_starts_a_process" in out and "started 1 thing(s): a process" in out
    assert "ERROR test_suite.py::test_listens" in out and "a server listening on ('127.0.0.1'" in out

    quick = _pytest(tmp_path, "-m", "not servers")
    assert "2 deselected" in quick.stdout, quick.stdout
    assert "test_marked_starts_a_process" not in quick.stdout
    assert "test_uses_a_server_fixture" not in quick.stdout
