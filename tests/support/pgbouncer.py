"""A real PgBouncer (Debian's ``/usr/sbin/pgbouncer``) in transaction pooling mode, for tests
that run the product behind a pooler the way production does (DESIGN.md, "Topology").

Import the fixture in a test module::

    from tests.support.pgbouncer import pgbouncer  # noqa: F401

``pgbouncer`` (session scope) starts one PgBouncer on a free loopback port in front of the
test run's PostgreSQL server, for every database (``* = host=... port=...``), with a small pool
(``POOL_SIZE`` server connections per database and user) so that session state left on a
pooled connection bites at once, and yields a ``PgBouncer``. Without the binary the tests that
use it are skipped, saying so (CI installs it: ``.ci/pgbouncer``).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

from tests.support.processes import stop_process

PGBOUNCER_BIN = os.environ.get("PGBOUNCER_BIN", "/usr/sbin/pgbouncer")
#: Server connections per (database, user): small, so a leaked session lock or LISTEN shows.
POOL_SIZE = 4
START_TIMEOUT_SECONDS = 15.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PgBouncer:
    """A running PgBouncer process.

    Attributes:
        port: its loopback port.
        user, password: the role it lets in (trust authentication) and connects as.
        server_host, server_port: the PostgreSQL server behind it.
        directory: its config, auth file and log.
    """

    def __init__(
        self, *, process: subprocess.Popen[bytes], port: int, user: str, password: str,
        server_host: str, server_port: int, directory: Path,
    ) -> None:  # fmt: skip
        self.process = process
        self.port = port
        self.user = user
        self.password = password
        self.server_host = server_host
        self.server_port = server_port
        self.directory = directory

    def url(self, database: str) -> str:
        """A libpq URL of ``database`` through the pooler (``postgres://user:pw@127.0.0.1:port/db``)."""
        return f"postgres://{quote(self.user)}:{quote(self.password)}@127.0.0.1:{self.port}/{quote(database)}"

    def direct_url(self, database: str) -> str:
        """A libpq URL of ``database`` on the PostgreSQL server itself, bypassing the pooler."""
        auth = f"{quote(self.user)}:{quote(self.password)}"
        return f"postgres://{auth}@{self.server_host}:{self.server_port}/{quote(database)}"

    def show(self, what: str) -> list[dict[str, Any]]:
        """Rows of PgBouncer's admin console ``SHOW <what>`` (``POOLS``, ``SERVERS``, ``CLIENTS``).

        Raises:
            ValueError: ``what`` is not one word.
        """
        if not what.isalpha():
            raise ValueError(f"SHOW takes one word, e.g. POOLS; got {what!r}")
        with psycopg.connect(self.url("pgbouncer"), autocommit=True, prepare_threshold=None) as conn:
            cursor = conn.execute(f"SHOW {what}")
            names = [column.name for column in cursor.description or []]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def log(self) -> str:
        """PgBouncer's log so far."""
        path = self.directory / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        """SIGTERM PgBouncer and wait (SIGKILL after 10 seconds); remove its directory."""
        stop_process(self.process)
        shutil.rmtree(self.directory, ignore_errors=True)


def _answers(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=2, prepare_threshold=None) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def start_pgbouncer(
    *, server_host: str, server_port: int, user: str, password: str = "", pool_size: int = POOL_SIZE,
    probe_database: str = "postgres",
) -> PgBouncer:  # fmt: skip
    """Start PgBouncer in transaction mode on a free loopback port in front of
    ``server_host:server_port`` (every database), letting ``user`` in without a password
    (``auth_type = trust``; it connects to PostgreSQL with ``password`` when one is given).

    Args:
        pool_size: ``default_pool_size``: server connections per (database, user).
        probe_database: a database to connect to through it until it answers.

    Raises:
        FileNotFoundError: no PgBouncer binary at ``PGBOUNCER_BIN``.
        RuntimeError: it exited or did not answer within 15 seconds; the message carries its log.
    """
    if not os.access(PGBOUNCER_BIN, os.X_OK):
        raise FileNotFoundError(f"no pgbouncer binary at {PGBOUNCER_BIN} (Debian: apt-get install pgbouncer)")
    directory = Path(tempfile.mkdtemp(prefix="el-pgbouncer-"))
    port = free_port()
    server = f"host={server_host} port={server_port}" + (f" password={password}" if password else "")
    (directory / "userlist.txt").write_text(f'"{user}" ""\n')
    (directory / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = {server}\n\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {directory / 'userlist.txt'}\nadmin_users = {user}\n"
        f"pool_mode = transaction\ndefault_pool_size = {pool_size}\nmax_client_conn = 1000\n"
        "ignore_startup_parameters = extra_float_digits\n"
        f"logfile = {directory / 'pgbouncer.log'}\n"
    )
    command = [PGBOUNCER_BIN, str(directory / "pgbouncer.ini")]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root; -u drops to an ordinary user
        owner = pwd.getpwnam("postgres")
        os.chown(directory, owner.pw_uid, owner.pw_gid)
        for path in directory.iterdir():
            os.chown(path, owner.pw_uid, owner.pw_gid)
        command[1:1] = ["-u", "postgres"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    bouncer = PgBouncer(
        process=process, port=port, user=user, password=password,
        server_host=server_host, server_port=server_port, directory=directory,
    )  # fmt: skip
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline and process.poll() is None:
        if _answers(bouncer.url(probe_database)):
            return bouncer
        time.sleep(0.1)
    stderr = b""
    with contextlib.suppress(Exception):
        process.kill()
        stderr = process.communicate(timeout=5)[1] or b""
    log = bouncer.log()
    shutil.rmtree(directory, ignore_errors=True)
    raise RuntimeError(f"pgbouncer did not answer on port {port}:\n{stderr.decode(errors='replace')}\n{log}")


@pytest.fixture(scope="session")
def pgbouncer(django_db_setup: None) -> Iterator[PgBouncer]:
    """One PgBouncer (transaction mode, ``POOL_SIZE`` server connections per database) for the
    session, in front of the test database's PostgreSQL server; skipped, with the reason, when
    the binary is missing."""
    from django.db import connection

    if not os.access(PGBOUNCER_BIN, os.X_OK):
        pytest.skip(f"PgBouncer is not installed ({PGBOUNCER_BIN}); CI installs it (.ci/pgbouncer)")
    conf = connection.settings_dict
    host = str(conf.get("HOST") or "")
    if not host or host.startswith("/"):
        pytest.skip("PgBouncer tests need DATABASE_URL on TCP (host and port), not a Unix socket")
    bouncer = start_pgbouncer(
        server_host=host,
        server_port=int(conf.get("PORT") or 5432),
        user=str(conf.get("USER") or "postgres"),
        password=str(conf.get("PASSWORD") or ""),
        probe_database=str(conf["NAME"]),
    )
    try:
        yield bouncer
    finally:
        bouncer.stop()
