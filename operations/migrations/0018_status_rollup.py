"""Intents by state without reading the whole table (issue 13): a partial index over the open
states, which the dashboard and ``/metrics`` count exactly, and the status rollup, where the
beat stores the counts of SUCCEEDED and the terminal states.

The index is built ``CONCURRENTLY`` so that migrating a large, live ledger does not block writes."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("operations", "0017_intent_forgotten_changes")]

    operations = [
        migrations.CreateModel(
            name="StatusRollup",
            fields=[
                ("status", models.CharField(max_length=20, primary_key=True, serialize=False)),
                ("count", models.BigIntegerField()),
                (
                    "computed_at",
                    models.DateTimeField(help_text="database time of the statement that counted"),
                ),
            ],
            options={
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(
                            (
                                "status__in",
                                ["SUCCEEDED", "FAILED", "COMPENSATED", "REJECTED", "EXPIRED", "CANCELLED"],
                            )
                        ),
                        name="status_rollup_settled_status",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("count__gte", 0)), name="status_rollup_count_non_negative"
                    ),
                ],
            },
        ),
        AddIndexConcurrently(
            model_name="intent",
            index=models.Index(
                condition=models.Q(
                    (
                        "status__in",
                        ["AWAITING_APPROVAL", "READY", "RUNNING", "UNKNOWN", "COMPENSATING", "HELD"],
                    )
                ),
                fields=["status"],
                name="intent_open_status",
            ),
        ),
    ]
