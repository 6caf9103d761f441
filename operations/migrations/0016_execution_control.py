"""The execution control row (fence epoch, pause, restore guard) and recovery runs (issue 22).
The one control row is inserted here; every claim reads it in its own UPDATE."""

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("operations", "0015_audit_checkpoint_accepted"),
    ]

    operations = [
        migrations.CreateModel(
            name="ExecutionControl",
            fields=[
                ("id", models.PositiveSmallIntegerField(default=1, primary_key=True, serialize=False)),
                ("fence_epoch", models.BigIntegerField(default=0)),
                ("paused_at", models.DateTimeField(blank=True, null=True)),
                ("pause_reason", models.TextField(blank=True, default="")),
                ("paused_by", models.CharField(blank=True, default="", max_length=200)),
                ("guard_started_at", models.DateTimeField(blank=True, null=True)),
                ("guard_until", models.DateTimeField(blank=True, null=True)),
                ("updated_at", models.DateTimeField(default=django.db.models.functions.datetime.Now)),
            ],
            options={
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("id", 1)), name="execution_control_single_row"
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("fence_epoch__gte", 0)),
                        name="execution_control_epoch_non_negative",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="RecoveryRun",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("started_at", models.DateTimeField(default=django.db.models.functions.datetime.Now)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                (
                    "since",
                    models.DateTimeField(
                        help_text="the restore point given (or the newest checkpoint the database kept)"
                    ),
                ),
                ("margin_seconds", models.FloatField(default=0.0)),
                ("trigger", models.CharField(help_text="operator or detector", max_length=20)),
                ("actor", models.CharField(max_length=200)),
                ("reason", models.TextField(blank=True, default="")),
                ("fence_epoch_before", models.BigIntegerField(default=0)),
                ("fence_epoch_after", models.BigIntegerField(default=0)),
                ("guard_until", models.DateTimeField(blank=True, null=True)),
                ("checkpoint_number", models.PositiveIntegerField(blank=True, null=True)),
                ("counts", models.JSONField(blank=True, default=dict)),
                ("error", models.TextField(blank=True, default="")),
            ],
            options={
                "indexes": [models.Index(fields=["-started_at"], name="recovery_run_started")],
            },
        ),
        migrations.RunSQL(
            "INSERT INTO operations_executioncontrol (id, fence_epoch, pause_reason, paused_by, updated_at) "
            "VALUES (1, 0, '', '', now()) ON CONFLICT (id) DO NOTHING",
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
