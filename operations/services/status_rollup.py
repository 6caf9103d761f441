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

from operations.models import ALL_TENANTS, SETTLED_STATUS_VALUES


def status_rollup_refresh() -> dict[str, int]:
    """Count the intents in each settled state (``SETTLED_STATUS_VALUES``) per tenant and store
    the counts, with the database time they were taken, in ``StatusRollup``: one row per
    (tenant, state) that has or had intents, and one row per state for every tenant together
    (tenant ``ALL_TENANTS``, 0 included), so a reader of every tenant reads six rows and a reader
    of a few tenants sums theirs (issue 18 item 5). A tenant's row whose intents all left that
    state is rewritten to 0, never left behind.

    One statement: the counts and ``computed_at`` come from the same snapshot. Returns the
    every-tenant counts ``{status: count}`` as written; empty when a refresh that counted later
    had already written (two refreshes can overlap when one is slow and the beat fires again).
    """
    with connection.cursor() as cursor:
        # The WHERE of the upsert is a compare-and-swap on computed_at: of two overlapping
        # refreshes, the later count wins whichever commits last, so the rollup never goes back.
        cursor.execute(
            """
            WITH counted AS (
                SELECT tenant, status, count(*) AS n FROM operations_intent
                WHERE status = ANY(%(settled)s) GROUP BY tenant, status
            ),
            totals AS (
                SELECT tenant, status, n FROM counted
                UNION ALL
                SELECT %(all)s, status, sum(n) FROM counted GROUP BY status
            ),
            keys AS (
                SELECT %(all)s AS tenant, settled.status FROM unnest(%(settled)s::varchar[]) AS settled(status)
                UNION SELECT tenant, status FROM counted
                UNION SELECT tenant, status FROM operations_statusrollup
            )
            INSERT INTO operations_statusrollup (tenant, status, count, computed_at)
            SELECT keys.tenant, keys.status, COALESCE(totals.n, 0), statement_timestamp()
            FROM keys LEFT JOIN totals ON totals.tenant = keys.tenant AND totals.status = keys.status
            ON CONFLICT (tenant, status) DO UPDATE
                SET count = EXCLUDED.count, computed_at = EXCLUDED.computed_at
                WHERE operations_statusrollup.computed_at < EXCLUDED.computed_at
            RETURNING tenant, status, count
            """,
            {"settled": SETTLED_STATUS_VALUES, "all": ALL_TENANTS},
        )
        return {status: int(count) for tenant, status, count in cursor.fetchall() if tenant == ALL_TENANTS}
