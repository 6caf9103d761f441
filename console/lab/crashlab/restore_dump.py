"""The restore drill's dump and restore of one ledger database with the PostgreSQL client tools
(``pg_dump -Fc``, ``pg_restore``), on the server of Django's connection.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from django.db import connections

from console.lab.bench.database import recreate_database, server_dsn
from console.lab.cluster import HarnessError


def _pg_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise HarnessError(f"the restore drill needs {name} (PostgreSQL client tools) on PATH")
    return path


def dump_database(database: str, dump: Path) -> None:
    """Write ``pg_dump -Fc`` of ``database`` to file ``dump``.

    Raises:
        HarnessError: ``pg_dump`` is not on PATH or failed.
    """
    completed = subprocess.run(  # noqa: S603 - the PostgreSQL client, fixed arguments
        [
            _pg_tool("pg_dump"),
            "-Fc",
            "-f",
            str(dump),
            "--dbname",
            server_dsn(database),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if completed.returncode:
        raise HarnessError(f"pg_dump failed: {completed.stderr[-1000:]}")


def restore_database(scratch: str, dump: Path, *, admin_db: str) -> None:
    """Drop, create and restore the scratch ledger database from the dump (every other
    session ended first), as onto a new server after a failover.

    Args:
        scratch: the database to restore (never the one the lab was pointed at).
        dump: a ``pg_dump -Fc`` file.
        admin_db: a database of the same server to connect to while ``scratch`` is recreated.

    Raises:
        HarnessError: ``pg_restore`` is not on PATH or failed.
    """
    connections.close_all()
    recreate_database(scratch, admin_db=admin_db)
    completed = subprocess.run(  # noqa: S603 - the PostgreSQL client, fixed arguments
        [_pg_tool("pg_restore"), "--no-owner", "--dbname", server_dsn(scratch), str(dump)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if completed.returncode:
        raise HarnessError(f"pg_restore failed: {completed.stderr[-1000:]}")
