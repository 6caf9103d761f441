"""The scratch databases, ``pg_stat_database`` deltas and the single-row commit ceiling."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import dj_database_url
import psycopg
from django.conf import settings
from django.db import connection, connections

from console.lab.sandbox_provider.database import dsn_from_settings_dict


def direct_settings_dict(dbname: str) -> dict[str, Any]:
    """Django's default ``DATABASES`` entry for database ``dbname``, reaching the server
    directly: ``DATABASE_LISTEN_URL``'s host, port and credentials when it is set (the ledger's
    direct URL beside a ``DATABASE_URL`` through a pooler), else ``DATABASE_URL``'s own.

    The lab's CREATE/DROP DATABASE, ``pg_dump`` and ``pg_restore`` use it: through PgBouncer in
    transaction mode, ``pg_restore``'s session ``set_config('search_path', '', false)`` stayed on
    a pooled connection and the next queries there found no table (issue 35), and a database
    cannot be dropped while the pooler keeps server connections to it.
    """
    settings_dict: dict[str, Any] = {**connection.settings_dict, "NAME": dbname}
    listen_url = str(getattr(settings, "DATABASE_LISTEN_URL", "") or "")
    if listen_url:
        direct = dj_database_url.parse(listen_url)
        settings_dict.update({key: direct.get(key) for key in ("HOST", "PORT", "USER", "PASSWORD")})
    return settings_dict


def server_dsn(dbname: str) -> str:
    """A libpq DSN for database ``dbname`` on the server Django's default database lives on,
    reached directly (``direct_settings_dict``)."""
    return dsn_from_settings_dict(direct_settings_dict(dbname))


def recreate_database(name: str, *, admin_db: str) -> None:
    """Drop ``name`` if it exists (ending its sessions) and create it empty."""
    with psycopg.connect(server_dsn(admin_db), autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            [name],
        )
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(name: str, *, admin_db: str) -> None:
    """Drop ``name``, ending any session still connected to it."""
    with psycopg.connect(server_dsn(admin_db), autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            [name],
        )
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


def use_database(name: str) -> str:
    """Point Django's default connection (and every child started afterwards) at ``name``.

    Returns the previous database name.
    """
    previous = str(connection.settings_dict["NAME"])
    connections.close_all()
    connection.settings_dict["NAME"] = name
    return previous


@dataclass
class DbCounters:
    """``pg_stat_database`` figures of one database at one moment."""

    commits: int
    rollbacks: int
    sessions: int
    tuples_inserted: int
    tuples_updated: int

    def minus(self, other: DbCounters) -> DbCounters:
        """The delta ``self - other``."""
        return DbCounters(
            *(getattr(self, f) - getattr(other, f) for f in self.__dataclass_fields__)  # noqa: B009
        )


def db_counters(dbname: str) -> DbCounters:
    """Read ``pg_stat_database`` for ``dbname`` from a fresh session (after the stats of ended
    sessions are flushed; call ``settle_stats`` first for exact deltas)."""
    with psycopg.connect(server_dsn("postgres"), autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit, xact_rollback, sessions, tup_inserted, tup_updated"
            " FROM pg_stat_database WHERE datname = %s",
            [dbname],
        ).fetchone()
    assert row is not None
    return DbCounters(*(int(value) for value in row))


#: Seconds until every idle session has flushed its statistics: PostgreSQL 15 flushes a session's
#: counters when it goes idle, but at most once a second; a session that flushed less than a
#: second ago waits PGSTAT_IDLE_INTERVAL (10 s, src/backend/utils/activity/pgstat.c) before the
#: next flush. Waiting less (1.2 s, before issue 37) left a run's last commits uncounted.
STATS_SETTLE_SECONDS = 11.0


def settle_stats(seconds: float = STATS_SETTLE_SECONDS) -> None:
    """Close this process's connections and wait for the other sessions to flush their pending
    statistics (``STATS_SETTLE_SECONDS``), so ``pg_stat_database`` counts every commit made."""
    connections.close_all()
    time.sleep(seconds)


def pg_stat_statements_available(dbname: str) -> bool:
    """True when ``pg_stat_statements`` is preloaded (it needs ``shared_preload_libraries``)."""
    with psycopg.connect(server_dsn(dbname), autocommit=True) as conn:
        row = conn.execute("SELECT current_setting('shared_preload_libraries')").fetchone()
        if not row or "pg_stat_statements" not in str(row[0]):
            return False
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        except psycopg.Error:
            return False
    return True


def statements_total(dbname: str) -> int:
    """Sum of ``pg_stat_statements.calls`` for ``dbname`` (only when available)."""
    with psycopg.connect(server_dsn(dbname), autocommit=True) as conn:
        row = conn.execute(
            "SELECT COALESCE(sum(calls), 0) FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
            " WHERE d.datname = %s",
            [dbname],
        ).fetchone()
    return int(row[0]) if row else 0


def commit_ceiling(dbname: str, *, clients: int, seconds: float) -> dict[str, Any]:
    """The database's single-row commit rate: ``clients`` sessions each committing one-row
    ``INSERT`` s in autocommit for ``seconds`` seconds (durable commits, the server's own
    ``synchronous_commit``). Returns commits per second and the per-commit latency in ms."""
    dsn = server_dsn(dbname)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_commit_probe (id bigserial PRIMARY KEY, v int)")
        setting = conn.execute("SHOW synchronous_commit").fetchone()
    counts = [0] * clients
    start = threading.Event()
    deadline = [0.0]

    def run(slot: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            start.wait()
            while time.monotonic() < deadline[0]:
                conn.execute("INSERT INTO bench_commit_probe (v) VALUES (%s)", [slot])
                counts[slot] += 1

    threads = [threading.Thread(target=run, args=(slot,)) for slot in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)  # let every session connect
    began = time.monotonic()
    deadline[0] = began + seconds
    start.set()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - began
    total = sum(counts)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE bench_commit_probe")
    return {
        "clients": clients,
        "commits_per_second": total / elapsed,
        "ms_per_commit_per_client": 1000 * elapsed * clients / total if total else None,
        "synchronous_commit": setting[0] if setting else "?",
    }
