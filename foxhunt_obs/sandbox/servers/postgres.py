"""A real PostgreSQL (Debian's `postgresql` package, `make postgresql`) for the Dagster instance's storage in
the tests: its own data dir (initdb), 127.0.0.1 on a free port, a socket dir of its own, its own
process group, stopped by the postmaster's PID.

PostgreSQL refuses to run as root: as root, initdb, postgres and psql run as the package's `postgres` system
user (``setpriv``, which execs, so the process started is the postmaster itself), and the work dir is
chowned to it. The superuser `postgres` logs in over the socket only (trust); ``user`` with ``password``
over TCP (scram-sha-256) owns ``database``, as Dagster's instance would use it.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import time
from pathlib import Path

from foxhunt_obs.sandbox.servers.local_server import LocalServer, SandboxError, kill_group, tail

SYSTEM_USER = "postgres"


def postgres_bin_dir() -> Path:
    """The newest installed server's bin dir (/usr/lib/postgresql/<major>/bin)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/postgres"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if not found:
        raise SandboxError(
            "PostgreSQL is not installed (/usr/lib/postgresql/*/bin/postgres): run `make postgresql`"
        )
    return Path(found[-1]).parent


def available() -> bool:
    try:
        postgres_bin_dir()
    except SandboxError:
        return False
    return os.geteuid() != 0 or (shutil.which("setpriv") is not None and _system_user() is not None)


def _system_user() -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        return None


class PostgresServer(LocalServer):
    """postgres on 127.0.0.1:``port`` with a fresh cluster in ``workdir/data``; after start, ``database``
    exists, owned by ``user`` (password ``password``). ``dsn`` and ``dagster_env()`` say how to reach it."""

    label = "PostgreSQL"
    log_name = "postgres.log"
    poll_s = 0.1
    start_timeout_s = 60.0

    def __init__(
        self,
        port: int = 0,
        workdir: Path | None = None,
        database: str = "dagster",
        user: str = "dagster",
        password: str = "dagster-test-password",
    ):
        super().__init__(port, workdir)
        self.database = database
        self.user = user
        self.password = password
        self.bin = postgres_bin_dir()

    # -- where things are
    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    @property
    def socket_dir(self) -> Path:
        return self.workdir / "socket"

    @property
    def dsn(self) -> str:
        return f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/{self.database}"

    def dagster_env(self) -> dict[str, str]:
        """The DAGSTER_PG_* variables deploy/dagster/dagster.yaml reads."""
        return {
            "DAGSTER_PG_USERNAME": self.user,
            "DAGSTER_PG_PASSWORD": self.password,
            "DAGSTER_PG_HOST": "127.0.0.1",
            "DAGSTER_PG_DB": self.database,
            "DAGSTER_PG_PORT": str(self.port),
        }

    def describe(self) -> str:
        return f"{self.label} on 127.0.0.1:{self.port} (data {self.data_dir})"

    # -- as the postgres system user when we are root
    def _as_owner(self, argv: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return argv
        if _system_user() is None:
            raise SandboxError(f"running as root and there is no `{SYSTEM_USER}` user: run `make postgresql`")
        return ["setpriv", f"--reuid={SYSTEM_USER}", f"--regid={SYSTEM_USER}", "--init-groups", "--", *argv]

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(LC_ALL="C", LANG="C", HOME=str(self.workdir))
        return env

    def _run(self, argv: list[str], what: str, timeout: float = 60.0, stdin: str | None = None) -> str:
        r = subprocess.run(
            self._as_owner(argv),
            input=stdin,
            capture_output=True,
            text=True,
            cwd=self.workdir,
            env=self.env(),
            timeout=timeout,
        )
        if r.returncode:
            raise SandboxError(f"{what} failed ({r.returncode}): {(r.stderr or r.stdout)[-2000:]}")
        return r.stdout

    def prepare(self) -> None:
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            owner = _system_user()
            if owner is None:
                raise SandboxError(
                    f"running as root and there is no `{SYSTEM_USER}` user: run `make postgresql`"
                )
            for path in (self.workdir, self.socket_dir):
                os.chown(path, owner.pw_uid, owner.pw_gid)
            os.chmod(self.workdir, 0o700)
        if not (self.data_dir / "PG_VERSION").exists():
            self._run(
                [
                    str(self.bin / "initdb"),
                    "-D",
                    str(self.data_dir),
                    "-U",
                    SYSTEM_USER,
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    "--no-sync",
                ],
                "initdb",
                timeout=120,
            )

    def command(self) -> list[str]:
        return self._as_owner(
            [
                str(self.bin / "postgres"),
                "-D",
                str(self.data_dir),
                "-p",
                str(self.port),
                "-k",
                str(self.socket_dir),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",  # a throwaway test cluster
                "-c",
                "max_connections=200",  # daemon threads, a webserver and code servers, each with pools
            ]
        )

    def ready(self, timeout: float) -> bool:
        r = subprocess.run(
            [
                str(self.bin / "pg_isready"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-t",
                str(max(1, int(timeout))),
            ],
            capture_output=True,
            timeout=timeout + 5,
        )
        return r.returncode == 0

    def psql(self, sql: str, database: str = "postgres") -> str:
        """``sql`` as the superuser over the socket."""
        argv = [str(self.bin / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", str(self.socket_dir)]
        argv += ["-p", str(self.port), "-U", SYSTEM_USER, "-d", database, "-At", "-f", "-"]
        return self._run(argv, "psql", stdin=sql)

    def start(self, timeout: float | None = None) -> PostgresServer:
        super().start(timeout)
        try:
            password = self.password.replace("'", "''")
            self.psql(f"CREATE ROLE \"{self.user}\" LOGIN PASSWORD '{password}';")
            self.psql(f'CREATE DATABASE "{self.database}" OWNER "{self.user}";')
        except Exception as e:
            self.stop()
            raise SandboxError(
                f"{self.describe()}: creating the database failed: {e}\n{tail(self.log_path)}"
            ) from e
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """SIGINT to the postmaster (PostgreSQL's fast shutdown: clients disconnected, a clean checkpoint),
        then the group's SIGTERM/SIGKILL for whatever is left."""
        if not self.process:
            return
        pid = self.process.pid  # setpriv execs: the postmaster itself
        try:
            os.kill(pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + timeout
        while self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        kill_group(pid, timeout, self.process)
        self.process = None
