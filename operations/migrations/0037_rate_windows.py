"""The API's rate-limit windows in PostgreSQL (issue 37): one row per limit's key, updated in
place by one ``INSERT ... ON CONFLICT DO UPDATE`` per request (``operations.api.rate_windows``).

UNLOGGED: a window is worthless after a crash, so its writes skip the write-ahead log (no disk
flush per request) and are not copied to standbys; after a crash or a failover every window
starts empty. Created by hand so the key has only its primary-key index (Django would add a
``varchar_pattern_ops`` index a LIKE never uses). The database cache table ``effect_ledger_cache``
of migration 0021 is left in place, unused, so an older release rolled back to still finds it.
"""

from django.db import migrations, models

CREATE = """
CREATE UNLOGGED TABLE operations_ratewindow (
    key varchar(120) PRIMARY KEY,
    window_start bigint NOT NULL,
    hits integer NOT NULL,
    previous integer NOT NULL,
    allowed boolean NOT NULL
)
"""


class Migration(migrations.Migration):
    dependencies = [("operations", "0036_outbox_acked_prune_index")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(CREATE, reverse_sql="DROP TABLE operations_ratewindow"),
            ],
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
                        (
                            "allowed",
                            models.BooleanField(help_text="whether the last request counted here was served"),
                        ),
                    ],
                ),
            ],
        ),
    ]
