"""The API's rate-limit windows in PostgreSQL (issue 37): one row per limit's key, and the
function that checks and counts a request's limits in one call
(``operations.api.rate_windows.postgres_check``).

UNLOGGED: a window is worthless after a crash, so its writes skip the write-ahead log (no disk
flush per request) and are not copied to standbys; after a crash or a failover every window
starts empty. Created by hand so the key has only its primary-key index (Django would add a
``varchar_pattern_ops`` index a LIKE never uses). The database cache table ``effect_ledger_cache``
of migration 0021 is left in place, unused, so an older release rolled back to still finds it.

``effect_ledger_rate_check`` takes the limits in order (key, current window's start in Unix
seconds, period in seconds, weight of the previous window, requests allowed) and:

1. for each limit, makes its row if missing and locks it (``FOR UPDATE``: requests of one key
   are counted one at a time, whatever the web process), rolls it to the current window (the
   current count becomes the previous one after one period, both reset after two) and checks
   ``previous * weight + hits + 1 <= requests``; the first limit that refuses ends the call and
   nothing is counted anywhere (answer: its 1-based position, its hits and previous);
2. when all serve the request, counts it in each (answer: 0, 0, 0).

A row already in a later window than the caller's clock says (a request that read its clock
before the window's edge and reached the row after another moved it on, or a web process whose
clock is behind) is counted in the row's window with the previous window at full weight: never
reset backwards, which would forget both windows' counts. Locks are taken in the order given
(agent, then tenant), the same for every request, so two requests never wait for each other in a
cycle.
"""

from django.db import migrations, models

CREATE = """
CREATE UNLOGGED TABLE operations_ratewindow (
    key varchar(120) PRIMARY KEY,
    window_start bigint NOT NULL,
    hits integer NOT NULL,
    previous integer NOT NULL
);

CREATE FUNCTION effect_ledger_rate_check(
    keys text[], starts bigint[], periods integer[], weights double precision[], requests integer[]
) RETURNS TABLE (refused integer, hits integer, previous integer)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n integer := coalesce(array_length(keys, 1), 0);
    rolled_start bigint[] := '{}';
    rolled_hits integer[] := '{}';
    rolled_previous integer[] := '{}';
    row_start bigint;
    row_hits integer;
    row_previous integer;
    weight double precision;
BEGIN
    FOR i IN 1..n LOOP
        INSERT INTO operations_ratewindow (key, window_start, hits, previous)
        VALUES (keys[i], starts[i], 0, 0) ON CONFLICT (key) DO NOTHING;
        SELECT w.window_start, w.hits, w.previous INTO row_start, row_hits, row_previous
        FROM operations_ratewindow w WHERE w.key = keys[i] FOR UPDATE;
        weight := weights[i];
        IF row_start >= starts[i] THEN
            rolled_start[i] := row_start; rolled_hits[i] := row_hits; rolled_previous[i] := row_previous;
            IF row_start > starts[i] THEN weight := 1.0; END IF;
        ELSIF row_start = starts[i] - periods[i] THEN
            rolled_start[i] := starts[i]; rolled_hits[i] := 0; rolled_previous[i] := row_hits;
        ELSE
            rolled_start[i] := starts[i]; rolled_hits[i] := 0; rolled_previous[i] := 0;
        END IF;
        IF rolled_previous[i] * weight + rolled_hits[i] + 1 > requests[i] THEN
            RETURN QUERY SELECT i, rolled_hits[i], rolled_previous[i];
            RETURN;
        END IF;
    END LOOP;
    FOR i IN 1..n LOOP
        UPDATE operations_ratewindow w
        SET window_start = rolled_start[i], hits = rolled_hits[i] + 1, previous = rolled_previous[i]
        WHERE w.key = keys[i];
    END LOOP;
    RETURN QUERY SELECT 0, 0, 0;
END
$$;
"""
DROP = "DROP FUNCTION effect_ledger_rate_check; DROP TABLE operations_ratewindow;"


class Migration(migrations.Migration):
    dependencies = [("operations", "0036_outbox_acked_prune_index")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(CREATE, reverse_sql=DROP)],
            state_operations=[
                migrations.CreateModel(
                    name="RateWindow",
                    fields=[
                        (
                            "key",
                            models.CharField(
                                help_text="scope:ident:period seconds",
                                max_length=120,
                                primary_key=True,
                                serialize=False,
                            ),
                        ),  # fmt: skip
                        (
                            "window_start",
                            models.BigIntegerField(help_text="Unix seconds, a multiple of the period"),
                        ),
                        ("hits", models.IntegerField(help_text="requests served in the current window")),
                        (
                            "previous",
                            models.IntegerField(help_text="requests served in the window before it"),
                        ),
                    ],
                ),
            ],
        ),
    ]
