"""The sandbox's reset survives a request still being served (found in CI: the crash lab's
``POST /_sandbox/reset`` answered 500 on a deadlock with a previous cell's straggler)."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from django.db import connection

from console.lab.bench.database import server_dsn
from console.lab.sandbox_provider import store

pytestmark = pytest.mark.django_db(transaction=True)


def test_i37_a_reset_that_deadlocks_with_a_request_in_flight_is_tried_again() -> None:
    # given: the sandbox's tables, and a request's transaction holding the last table TRUNCATE locks
    dsn = server_dsn(str(connection.settings_dict["NAME"]))
    pool = store.open_pool(dsn, max_size=4)
    try:
        store.ensure_schema(pool)
        first, last = store.TABLES[0], store.TABLES[-1]
        with psycopg.connect(dsn) as request:
            request.execute(f"LOCK TABLE sandbox.{last} IN ROW EXCLUSIVE MODE")
            # when: the reset starts (it takes the first tables, then waits for the last) ...
            errors: list[BaseException] = []

            def reset() -> None:
                try:
                    store.truncate_all(pool)
                except BaseException as error:  # noqa: BLE001 - reported below
                    errors.append(error)

            resetting = threading.Thread(target=reset)
            resetting.start()
            _wait_until_waiting(request, f"sandbox.{last}")
            # ... and the request then needs the first table: a deadlock, the reset its victim
            request.execute(f"LOCK TABLE sandbox.{first} IN ROW EXCLUSIVE MODE")
            request.commit()
            resetting.join(timeout=30)
        # then: the reset went through on its next try
        assert not resetting.is_alive() and errors == [], errors
    finally:
        pool.close()


def _wait_until_waiting(conn: Any, table: str) -> None:
    """Until another session waits for a lock on ``table``."""
    import time

    with psycopg.connect(conn.info.dsn, autocommit=True) as watcher:
        for _ in range(200):
            row = watcher.execute(
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = %s::regclass", [table]
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.05)
    raise AssertionError(f"nothing waited for {table}")
