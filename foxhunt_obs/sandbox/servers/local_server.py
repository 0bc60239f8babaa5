"""The sandbox's local servers (Prometheus, mlflow server, moto, Alertmanager) share one life cycle:
127.0.0.1 on a given or free port, a work directory with the log, their own process group
(``mlflow server`` forks uvicorn workers that outlive a plain kill of the parent), a ready probe with a
deadline, and stop() that takes the whole group down. ``LocalServer`` is that life cycle; each server
says its command, its ready probe and what to prepare before it starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from abc import ABC, abstractmethod
from pathlib import Path


class SandboxError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """Whether GET ``url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


def tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def kill_group(pgid: int, timeout: float, process: subprocess.Popen | None = None) -> None:
    """SIGTERM the process group, SIGKILL it after ``timeout``; reap our child if it is one."""

    def gone() -> bool:
        if process is not None and process.poll() is None:
            return False
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        return zombie(pgid)  # a leader that exited but was not reaped by its (other) parent

    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + timeout
        while not gone() and time.monotonic() < deadline:
            time.sleep(0.05)
        if gone():
            return
    raise SandboxError(f"process group {pgid} survived SIGKILL")


def wait_serving(
    process: subprocess.Popen, port: int, timeout_s: float, what: str, log: Path
) -> subprocess.Popen:
    """`process` once it answers 200 on 127.0.0.1:`port`/healthz; stopped (its group) and a SandboxError
    naming `what` with `log`'s tail if it exits or does not answer within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SandboxError(f"{what} exited with {process.returncode}: {tail(log)}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                if r.status == 200:
                    return process
        except OSError:
            time.sleep(0.1)
    kill_group(process.pid, 5.0, process)
    raise SandboxError(f"{what} not serving after {timeout_s:g} s: {tail(log)}")


def zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not zombie(pid)


def _group_stats(pgid: int) -> dict[int, list[str]]:
    """pid -> /proc/<pid>/stat fields after the name (state ppid pgrp ...) of every live process in
    the group."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out[int(stat.parent.name)] = fields
    return out


def group_pids(pgid: int) -> list[int]:
    """Live (not zombie) processes of the group, e.g. the server and its uvicorn worker."""
    return sorted(_group_stats(pgid))


def group_rss_bytes(pgid: int) -> int:
    """Resident memory of every process in the group, summed (Linux /proc)."""
    page = os.sysconf("SC_PAGE_SIZE")
    return sum(int(f[21]) * page for f in _group_stats(pgid).values())  # rss: field 24 of stat


def read_state(path: Path) -> dict | None:
    """A detached server's recorded state (JSON), or None when there is none or it is unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


class LocalServer(ABC):
    """A server on 127.0.0.1:``port`` (0: a free one) in its own process group, run in ``workdir`` (a
    temp dir when None) and logging to ``workdir/<log_name>``. Subclasses give ``command()`` and
    ``ready()``, and may override ``prepare()`` (config files, checks; called with the port known) and
    ``env()``."""

    label = "server"  # in messages
    log_name = "server.log"
    poll_s = 0.05  # between ready probes
    start_timeout_s = 30.0

    def __init__(self, port: int = 0, workdir: Path | None = None):
        self.port = port
        self.workdir = Path(workdir).resolve() if workdir else None  # the process runs there
        self.process: subprocess.Popen | None = None
        self.started_in: float | None = None  # seconds from Popen to ready

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def log_path(self) -> Path:
        return self.workdir / self.log_name

    @abstractmethod
    def command(self) -> list[str]:
        """The server's argv (the port and workdir are set)."""

    @abstractmethod
    def ready(self, timeout: float) -> bool:
        """Whether the server answers its readiness probe."""

    def prepare(self) -> None:  # noqa: B027 - optional: most servers need nothing prepared
        """Before the process starts (workdir and port are set)."""

    def env(self) -> dict[str, str] | None:
        return None  # inherit ours

    def describe(self) -> str:
        """The server in error messages."""
        return f"{self.label} on {self.url}"

    def start(self, timeout: float | None = None) -> LocalServer:
        if self.process:
            raise SandboxError(f"{self.label} already started")
        timeout = self.start_timeout_s if timeout is None else timeout
        self.workdir = self.workdir or Path(
            tempfile.mkdtemp(prefix=f"foxhunt-{self.log_name.split('.')[0]}-")
        )
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        self.prepare()
        t0 = time.monotonic()
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
                env=self.env(),
                start_new_session=True,  # own process group: stop() takes down whatever it forks
            )
        while not self.ready(1.0):
            exited = self.process.poll() is not None
            if exited or time.monotonic() > t0 + timeout:
                why = f"exited with {self.process.returncode}" if exited else f"not ready after {timeout:g} s"
                self.stop()
                raise SandboxError(f"{self.describe()} {why}; log tail:\n{tail(self.log_path)}")
            time.sleep(self.poll_s)
        self.started_in = time.monotonic() - t0
        return self

    def rss_bytes(self) -> int:
        return group_rss_bytes(self.pid) if self.process else 0

    def pids(self) -> list[int]:
        return group_pids(self.pid) if self.process else []

    def stop(self, timeout: float = 10.0) -> None:
        if not self.process:
            return
        kill_group(self.process.pid, timeout, self.process)
        self.process = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
