"""A private PostgreSQL primary and its streaming replica, for the failover drill (issue 35).

Real servers of the machine's PostgreSQL (``pg_config --bindir``), never the shared cluster:
``initdb`` into a temporary folder (as the ``postgres`` OS user when this process is root:
``initdb`` refuses root), ``wal_level=replica`` on a free loopback port, then
``pg_basebackup -R`` into a second folder, started as a hot standby streaming from it on another
free port. Everything lives under one folder that ``destroy`` stops and deletes.

How the replica is made to lag: its link to the primary is cut (``primary_conninfo`` emptied and
the configuration reloaded: the WAL receiver stops, as on a network partition), so the commits
that follow never reach it. Pausing replay (``pg_wal_replay_pause()``) would not do: a promotion
ends the pause and replays every WAL record already received (PostgreSQL 15 documentation, 27.2.2
"Standby Server Operation": "Before failover, any WAL immediately available in the archive or
in pg_wal will be restored").
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from console.lab.cluster import HarnessError, wait_until

#: The server tools the pair needs in ``pg_config --bindir``.
SERVER_TOOLS = ("initdb", "pg_ctl", "pg_basebackup", "postgres")
#: The OS user the servers run as when this process is root.
SERVER_USER = "postgres"
#: The database superuser ``initdb`` creates (trust authentication on loopback only).
SUPERUSER = "postgres"


def server_bindir() -> Path | None:
    """The folder of the PostgreSQL server binaries (``pg_config --bindir``), or None when
    ``pg_config`` is not on PATH or a tool of ``SERVER_TOOLS`` is missing there."""
    pg_config = shutil.which("pg_config")
    if pg_config is None:
        return None
    try:
        completed = subprocess.run(  # noqa: S603 - the PostgreSQL tool, fixed arguments
            [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    bindir = Path(completed.stdout.strip())
    return bindir if all((bindir / tool).is_file() for tool in SERVER_TOOLS) else None


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the kernel's choice; taken by the server soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def lsn_bytes(lsn: str) -> int:
    """A WAL position in ``pg_lsn`` text form (``16/B374D848``) as a byte offset.

    Raises:
        ValueError: ``lsn`` is not two hexadecimal numbers separated by ``/``.
    """
    high, slash, low = str(lsn).partition("/")
    if not slash:
        raise ValueError(f"not a WAL position (pg_lsn): {lsn!r}")
    return (int(high, 16) << 32) | int(low, 16)


@dataclass(frozen=True)
class Server:
    """One server of the pair: its name (``primary``, ``replica``), data folder and port."""

    name: str
    data: Path
    port: int

    def dsn(self, dbname: str = "postgres") -> str:
        """A libpq DSN for ``dbname`` on this server (loopback TCP, the superuser)."""
        return f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname={dbname} connect_timeout=5"


class StreamingPair:
    """A primary and a streaming replica in a temporary folder of their own (``root``, owned by
    the servers' OS user: nothing else of the caller's goes there).

    Raises (every method that runs a server tool):
        HarnessError: the binaries are missing, this process is root and there is no
            ``postgres`` OS user, or a tool failed (its output in the message).
    """

    def __init__(self) -> None:
        bindir = server_bindir()
        if bindir is None:
            raise HarnessError(
                "the failover drill needs the PostgreSQL server binaries (initdb, pg_ctl, pg_basebackup, "
                "postgres) in the folder `pg_config --bindir` names"
            )
        self.bindir = bindir
        self.root = root = Path(tempfile.mkdtemp(prefix="effect-ledger-failover-pg-"))
        self.primary = Server("primary", root / "primary", free_port())
        self.replica = Server("replica", root / "replica", free_port())
        self._as_server_user: list[str] = []
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam(SERVER_USER)
            except KeyError as exc:
                shutil.rmtree(root, ignore_errors=True)
                raise HarnessError(
                    f"initdb refuses root and there is no {SERVER_USER!r} OS user to run the servers as"
                ) from exc
            os.chown(root, user.pw_uid, user.pw_gid)
            self._as_server_user = ["runuser", "-u", SERVER_USER, "--"]

    # --- life cycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        """``initdb`` and start the primary, ``pg_basebackup -R`` the replica from it, start the
        replica, and wait until it streams."""
        self._tool("initdb", "-D", str(self.primary.data), "-U", SUPERUSER, "--auth=trust", "-N")
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.primary.port),
            "unix_socket_directories": f"'{self.root}'",
            "wal_level": "replica",
            "max_wal_senders": "4",
            "hot_standby": "on",
            # The machine does not crash during the drill; what it tests is the WAL the replica
            # never received, not the primary's disk.
            "fsync": "off",
        }
        with (self.primary.data / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{name} = {value}\n" for name, value in settings.items())
        self._pg_ctl(self.primary, "start", "-w", "-t", "60", "-l", str(self.root / "primary.log"))
        self._tool(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", SUPERUSER,
            "-D", str(self.replica.data), "-R", "-X", "stream", "-c", "fast",
        )  # fmt: skip
        with (self.replica.data / "postgresql.auto.conf").open("a") as conf:
            conf.write(f"port = {self.replica.port}\n")
        self._pg_ctl(self.replica, "start", "-w", "-t", "60", "-l", str(self.root / "replica.log"))
        wait_until(self._streaming, 30, "the replica to stream from the primary", interval=0.1)

    def destroy(self) -> None:
        """Stop both servers (``-m immediate``; whatever state they are in) and delete the folder.
        Never raises."""
        for server in (self.primary, self.replica):
            if (server.data / "postmaster.pid").exists():
                with contextlib.suppress(HarnessError, OSError, subprocess.SubprocessError):
                    self._pg_ctl(server, "stop", "-m", "immediate", "-w", "-t", "30")
        shutil.rmtree(self.root, ignore_errors=True)

    # --- the failover ----------------------------------------------------------------------------------

    def wait_replayed(self, timeout: float = 30) -> None:
        """Wait until the replica has replayed the primary's WAL up to its position now."""
        target = lsn_bytes(self.query(self.primary, "SELECT pg_current_wal_lsn()::text")[0])

        def replayed() -> bool:
            position = self.query(self.replica, "SELECT pg_last_wal_replay_lsn()::text")[0]
            return position is not None and lsn_bytes(position) >= target

        wait_until(replayed, timeout, "the replica to replay the primary's WAL", interval=0.02)

    def cut(self) -> dict[str, Any]:
        """Cut the replica off its primary (``primary_conninfo`` emptied, configuration
        reloaded) and wait until its WAL receiver stopped and it replayed all it received.

        Returns:
            ``replica_lsn``: the last WAL position it received (text), ``last_replayed_commit``:
            the time of the last transaction it replayed (ISO 8601, UTC offset), the restore point.
        """
        with psycopg.connect(self.replica.dsn(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET primary_conninfo = ''")
            conn.execute("SELECT pg_reload_conf()")
        wait_until(
            lambda: not self.query(self.replica, "SELECT count(*) FROM pg_stat_wal_receiver")[0],
            30,
            "the replica's WAL receiver to stop",
            interval=0.02,
        )

        def caught_up() -> bool:
            received, replayed = self.query(
                self.replica, "SELECT pg_last_wal_receive_lsn()::text, pg_last_wal_replay_lsn()::text"
            )
            return lsn_bytes(replayed) >= lsn_bytes(received)

        wait_until(caught_up, 30, "the replica to replay what it received", interval=0.02)
        lsn, last = self.query(
            self.replica, "SELECT pg_last_wal_replay_lsn()::text, pg_last_xact_replay_timestamp()"
        )
        return {"replica_lsn": lsn, "last_replayed_commit": last.isoformat()}

    def crash_primary(self) -> str:
        """Read the primary's WAL position, then stop it hard (``pg_ctl stop -m immediate``: no
        shutdown checkpoint, as on a crash). Returns that position (text)."""
        lsn = str(self.query(self.primary, "SELECT pg_current_wal_lsn()::text")[0])
        self._pg_ctl(self.primary, "stop", "-m", "immediate", "-w", "-t", "30")
        return lsn

    def promote(self) -> None:
        """Promote the replica (``pg_ctl promote -w``) and check it left recovery."""
        self._pg_ctl(self.replica, "promote", "-w", "-t", "60")
        if self.query(self.replica, "SELECT pg_is_in_recovery()")[0]:
            raise HarnessError("the promoted replica is still in recovery")

    # --- helpers -----------------------------------------------------------------------------------

    def query(self, server: Server, sql: str) -> tuple[Any, ...]:
        """The first row of ``sql`` run on ``server``'s ``postgres`` database (autocommit).

        Raises:
            HarnessError: no row.
        """
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            row = conn.execute(sql.encode()).fetchone()
        if row is None:
            raise HarnessError(f"no row from {server.name}: {sql}")
        return tuple(row)

    def _streaming(self) -> bool:
        try:
            sql = "SELECT count(*) FROM pg_stat_wal_receiver WHERE status = 'streaming'"
            return bool(self.query(self.replica, sql)[0])
        except psycopg.OperationalError:
            return False

    def _pg_ctl(self, server: Server, *args: str) -> None:
        self._tool("pg_ctl", "-D", str(server.data), *args)

    def _tool(self, name: str, *args: str) -> None:
        """Run server tool ``name`` (as the server's OS user when this process is root)."""
        command = [*self._as_server_user, str(self.bindir / name), *args]
        completed = subprocess.run(  # noqa: S603 - the PostgreSQL tools, our own arguments
            command, capture_output=True, text=True, timeout=120, check=False, cwd=self.root
        )
        if completed.returncode:
            logs = "".join(
                f"\n--- {log.name}:\n{log.read_text(errors='replace')[-1500:]}"
                for log in sorted(self.root.glob("*.log"))
            )
            raise HarnessError(
                f"{name} {' '.join(args[:3])} failed ({completed.returncode}): "
                f"{(completed.stdout + completed.stderr)[-1500:]}{logs}"
            )
