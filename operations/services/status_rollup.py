"""The status rollup: how many intents are in each settled state, counted every period.

Why a periodic count and not a counter kept by every transition (a trigger, or the services):
every intent ends in SUCCEEDED or a terminal state, so every worker's recording transaction
would update the same counter row, and each would wait on that row's lock until the previous
one commits: the workers, concurrent everywhere else, would be serialised on one row for the
length of a transaction (and a table of deltas to avoid that needs its own compaction job).
One ``GROUP BY`` over the settled states reads the status index once per period instead
(about 100 ms at 1,000,000 intents, the bench's console phase) and costs the writers nothing;
the dashboard shows how old the counts are. The open states stay exact on every request
(``operations.selectors.status_counts``).
"""

from __future__ import annotations

from django.db import connection

from operations.models import SETTLED_STATUS_VALUES


def status_rollup_refresh() -> dict[str, int]:
    """Count the intents in each settled state (``SETTLED_STATUS_VALUES``) and store the counts,
    with the database time they were taken, in ``StatusRollup`` (one row per state, 0 included).

    One statement: the counts and ``computed_at`` come from the same snapshot. Returns
    ``{status: count}`` as written; empty when a refresh that counted later had already written
    (two refreshes can overlap when one is slow and the beat fires again).
    """
    with connection.cursor() as cursor:
        # The WHERE of the upsert is a compare-and-swap on computed_at: of two overlapping
        # refreshes, the later count wins whichever commits last, so the rollup never goes back.
        cursor.execute(
            """
            WITH counted AS (
                SELECT status, count(*) AS n FROM operations_intent
                WHERE status = ANY(%s) GROUP BY status
            )
            INSERT INTO operations_statusrollup (status, count, computed_at)
            SELECT settled.status, COALESCE(counted.n, 0), statement_timestamp()
            FROM unnest(%s::varchar[]) AS settled(status)
            LEFT JOIN counted ON counted.status = settled.status
            ON CONFLICT (status) DO UPDATE
                SET count = EXCLUDED.count, computed_at = EXCLUDED.computed_at
                WHERE operations_statusrollup.computed_at < EXCLUDED.computed_at
            RETURNING status, count
            """,
            [SETTLED_STATUS_VALUES, SETTLED_STATUS_VALUES],
        )
        return {status: int(count) for status, count in cursor.fetchall()}
