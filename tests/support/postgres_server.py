"""A real PostgreSQL server for tests: the distribution's binaries, a fresh cluster in a temp dir, listening on
127.0.0.1 only, stopped and removed by itself.

`initdb` refuses to run as root, and CI runs as root: then the cluster belongs to the `postgres` system user
the distribution's package creates, and its commands run through `runuser`. A missing PostgreSQL is an error
naming the package (`.ci/run` installs it), never a skipped test.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Self

from tests.support.proxy_server import HOST, free_port

SERVICE_USER = "postgres"
START_TIMEOUT_S = 60
DATABASE = "context_proxy_test"


def binaries() -> Path:
    """The newest installed PostgreSQL's bin directory (Debian keeps them out of PATH)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    raise RuntimeError("PostgreSQL is not installed: install the distribution's package (apt-get install postgresql)")


class PostgresServer:
    def __init__(self) -> None:
        self.bin = binaries()
        self.port = free_port()
        self._as_root = os.geteuid() == 0
        self.root = Path(tempfile.mkdtemp(prefix="context-proxy-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self._databases = 0

    @property
    def url(self) -> str:
        return f"postgresql://{self._user}@{HOST}:{self.port}/{DATABASE}"

    @property
    def _user(self) -> str:
        return SERVICE_USER if self._as_root else pwd.getpwuid(os.geteuid()).pw_name

    def _run(self, *command: str) -> subprocess.CompletedProcess[str]:
        prefix = ["runuser", "-u", SERVICE_USER, "--"] if self._as_root else []
        return subprocess.run(
            [*prefix, *command], capture_output=True, text=True, timeout=START_TIMEOUT_S, check=False, cwd=self.root
        )

    def _checked(self, *command: str) -> None:
        done = self._run(*command)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr or done.stdout}")

    def start(self) -> None:
        if self._as_root:
            service = pwd.getpwnam(SERVICE_USER)
            os.chown(self.root, service.pw_uid, service.pw_gid)
        self.root.chmod(0o700)
        self._checked(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-E", "UTF8", "--no-sync")
        self.resume()
        self._checked(str(self.bin / "createdb"), "-h", HOST, "-p", str(self.port), DATABASE)

    def pause(self) -> None:
        """Stop the server as an operator would (fast shutdown: clients are disconnected), keeping its data."""
        self._checked(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def resume(self) -> None:
        """Start the server on its data, on the same port."""
        options = (
            f"-c listen_addresses={HOST} -c port={self.port} -c unix_socket_directories={self.root} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._checked(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")

    def psql(self, sql: str) -> str:
        """Run SQL with the distribution's client: the server's own view, not the proxy's."""
        return self.psql_in(DATABASE, sql)

    def psql_in(self, database: str, sql: str) -> str:
        """`psql` in another database (a name, or a URL from `database()`)."""
        done = self._run(
            str(self.bin / "psql"),
            "-h",
            HOST,
            "-p",
            str(self.port),
            "-d",
            database.rsplit("/", 1)[-1],
            "-At",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            sql,
        )
        if done.returncode != 0:
            raise RuntimeError(f"psql failed: {done.stderr}")
        return done.stdout.strip()

    def database(self) -> str:
        """A new empty database on this server (one per test: no test sees another's rows); its URL."""
        self._databases += 1
        name = f"{DATABASE}_{self._databases}"
        self.psql(f"CREATE DATABASE {name}")
        return self.url.rsplit("/", 1)[0] + "/" + name

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
