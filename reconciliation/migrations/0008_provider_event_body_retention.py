"""A provider event's body is removed after ``RAW_BODY_RETENTION_DAYS`` (issue 36): its digest
(``body_sha256``) and the time (``body_removed_at``) stay, and the pruning's queue is an index
of the processed events whose body is still kept.

The index is built ``CONCURRENTLY`` (hence ``atomic = False``): every provider event is
inserted into this table, and a plain ``CREATE INDEX`` would block those writes for the build.
Both columns are added without rewriting the table (a nullable column; a constant default in
the database, so the inbox's own INSERT, which names its columns, needs no change).
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("reconciliation", "0007_statement_run_scheduled")]

    operations = [
        migrations.AddField(
            model_name="providerevent",
            name="body_removed_at",
            field=models.DateTimeField(
                blank=True, help_text="when the payload was emptied (retention); null: kept", null=True
            ),
        ),
        migrations.AddField(
            model_name="providerevent",
            name="body_sha256",
            field=models.CharField(
                blank=True,
                db_default="",
                help_text="hex SHA-256 of the payload's RFC 8785 canonical JSON, taken when the body was removed",
                max_length=64,
            ),
        ),
        AddIndexConcurrently(
            model_name="providerevent",
            index=models.Index(
                condition=models.Q(("body_removed_at__isnull", True), ("processed_at__isnull", False)),
                fields=["processed_at"],
                name="provider_event_body_kept",
            ),
        ),
    ]
