"""Where the sandbox provider's database lives: libpq DSNs built from the ledger's Django
settings, the default database beside the ledger's (``<ledger database>_sandbox``), and creating
or dropping it.

The provider stands for the outside world, so its data lives outside the ledger's database (see
``store`` for what it holds); ``SANDBOX_DATABASE_URL`` or ``--dsn`` points it elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import errors, sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo


def dsn_from_settings_dict(settings_dict: Mapping[str, Any]) -> str:
    """Build a libpq connection string from a Django ``DATABASES`` entry.

    Args:
        settings_dict: ``django.db.connection.settings_dict`` (``NAME``, ``USER``, ``PASSWORD``,
            ``HOST``, ``PORT`` and ``OPTIONS``); under pytest-django, read it after the test
            database is set up so ``NAME`` is the test database.

    Returns:
        e.g. ``"dbname=test_effect_ledger user=postgres host=127.0.0.1 port=5432"``; a Unix socket
        directory in ``HOST`` (the embedded server) works as well.
    """
    params: dict[str, Any] = {
        "dbname": settings_dict.get("NAME") or None,
        "user": settings_dict.get("USER") or None,
        "password": settings_dict.get("PASSWORD") or None,
        # The embedded server's socket directory arrives as OPTIONS["host"] (see console/embedded.py).
        "host": settings_dict.get("HOST") or (settings_dict.get("OPTIONS") or {}).get("host") or None,
        "port": str(settings_dict["PORT"]) if settings_dict.get("PORT") else None,
    }
    for name in ("sslmode", "sslrootcert", "sslcert", "sslkey", "connect_timeout", "options"):
        value = (settings_dict.get("OPTIONS") or {}).get(name)
        if value is not None:
            params[name] = value
    return make_conninfo("", **{k: v for k, v in params.items() if v is not None})


#: Appended to the ledger database's name to name the sandbox provider's default database.
DATABASE_SUFFIX = "_sandbox"


def sandbox_database_name(ledger_database: str) -> str:
    """The default database of the sandbox provider beside ledger database ``ledger_database``.

    Example: ``"effect_ledger"`` gives ``"effect_ledger_sandbox"``; a test database
    ``"test_effect_ledger"`` gives ``"test_effect_ledger_sandbox"``, so every test run has its own.
    """
    return f"{ledger_database}{DATABASE_SUFFIX}"


def default_dsn(settings_dict: Mapping[str, Any]) -> str:
    """A libpq DSN of the sandbox provider's default database: the ledger's server and
    credentials, database ``sandbox_database_name(<ledger database>)``.

    Args:
        settings_dict: the ledger's ``DATABASES`` entry (``connection.settings_dict``).
    """
    ledger_database = str(settings_dict.get("NAME") or "")
    return dsn_from_settings_dict({**settings_dict, "NAME": sandbox_database_name(ledger_database)})


def database_name(dsn: str) -> str:
    """The database a libpq DSN or URL names (``""`` when it names none)."""
    return str(conninfo_to_dict(dsn).get("dbname") or "")


def ensure_database(dsn: str, *, admin_dsn: str) -> bool:
    """Create the database ``dsn`` names when it does not exist (safe under concurrency).

    Two processes starting together may both find it missing: ``CREATE DATABASE`` then fails in
    one of them with ``duplicate_database`` (42P04), or, when both inserted into the catalogue at
    once, with ``unique_violation`` (23505) on ``pg_database``'s name index; either means another
    process created it, which is what was wanted.

    Args:
        dsn: the sandbox database's DSN (only its ``dbname`` is used).
        admin_dsn: a DSN of an existing database on the same server whose role may create
            databases (the ledger's own).

    Returns:
        ``True`` when this call created it, ``False`` when it already existed.

    Raises:
        psycopg.Error: the server is unreachable or the role may not create databases.
    """
    name = database_name(dsn)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            return False
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except (errors.DuplicateDatabase, errors.UniqueViolation):
            return False
    return True


def prepare_default_database(settings_dict: Mapping[str, Any]) -> str:
    """Create the default sandbox database beside the ledger's when missing; return its DSN.

    Args:
        settings_dict: the ledger's ``DATABASES`` entry; its role creates the database.
    """
    dsn = default_dsn(settings_dict)
    ensure_database(dsn, admin_dsn=dsn_from_settings_dict(settings_dict))
    return dsn


def drop_database(dsn: str, *, admin_dsn: str) -> None:
    """Drop the database ``dsn`` names, if it exists, ending its sessions (``WITH (FORCE)``,
    PostgreSQL 13+). For test runs and scratch databases, never a provider someone uses."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database_name(dsn)))
        )
