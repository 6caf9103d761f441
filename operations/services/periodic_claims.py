"""The claim of a periodic job's run per period, so two beats scheduling the same job (two
hosts, each with its beat) make it run once per period (issue 35, C27; DESIGN.md "Topology":
every periodic job safe when two schedulers run it).

A claim is a row ``(job, slot)`` inserted with ``INSERT ... ON CONFLICT DO NOTHING`` in its own
short transaction: the unique index decides, so it holds behind PgBouncer in transaction mode
(no session state: no advisory lock, no ``SET``) and across any number of beats and workers.
``slot`` counts periods on the database clock, ``floor(epoch / period)``, so two beats whose
ticks fall in the same period share one slot whatever their own clocks say. A run that claimed
its slot and then died leaves the period without a run; the next period runs again (every job
here is a safety net that catches up on its next pass).
"""

from __future__ import annotations

import math

from django.db import connection, transaction

from operations.models import PeriodicClaim

#: Claims older than this are deleted by the next claim of the same job.
CLAIM_RETENTION_SECONDS = 86400.0 * 2


def periodic_claim(*, job: str, period_seconds: float, claimed_by: str) -> bool:
    """Claim job ``job``'s run in the current period; True when this caller won it.

    Args:
        job: the Celery task name (optionally with a part, ``reconciliation.reconcile_statements``).
        period_seconds: the job's period (seconds, finite, > 0); the slot is
            ``floor(database epoch / period_seconds)``.
        claimed_by: who claims (the worker process), kept on the row.

    Raises:
        ValueError: ``job`` is blank or longer than 100 characters, or ``period_seconds`` is not
            a finite positive number.
    """
    if not job.strip() or len(job) > 100:
        raise ValueError(f"a periodic claim needs a job name of 1 to 100 characters, not {job!r}")
    if not (isinstance(period_seconds, int | float) and math.isfinite(period_seconds) and period_seconds > 0):
        raise ValueError(f"a periodic claim needs a finite period > 0 seconds, not {period_seconds!r}")
    table = PeriodicClaim._meta.db_table
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {table} (job, slot, period_seconds, claimed_at, claimed_by)
            VALUES (%s, floor(extract(epoch FROM statement_timestamp()) / %s)::bigint, %s,
                    statement_timestamp(), %s)
            ON CONFLICT (job, slot) DO NOTHING
            RETURNING slot
            """,
            [job, float(period_seconds), float(period_seconds), claimed_by[:255]],
        )
        won = cursor.fetchone() is not None
        if won:
            cursor.execute(
                f"DELETE FROM {table} WHERE job = %s"
                " AND claimed_at < statement_timestamp() - make_interval(secs => %s)",
                [job, max(CLAIM_RETENTION_SECONDS, 2 * float(period_seconds))],
            )
    return won
