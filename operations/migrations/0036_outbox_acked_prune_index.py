"""The pruning's index on the outbox (issue 36): consumed rows by ``acked_at``, so a pruning
pass deletes those past ``OUTBOX_RETENTION_SECONDS`` oldest first, a bounded batch at a time,
without reading the rows still waiting.

Numbered 0036 beside the archive's 0035 (built in parallel); depends on 0034 until the two are
ordered. Built ``CONCURRENTLY`` (hence ``atomic = False``): the outbox takes a write for every
intent, and a plain ``CREATE INDEX`` would block those writes for the build. A concurrent build
that fails leaves an INVALID index: drop it and migrate again.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("operations", "0035_archive")]

    operations = [
        AddIndexConcurrently(
            model_name="outboxmessage",
            index=models.Index(
                condition=models.Q(("acked_at__isnull", False)), fields=["acked_at"], name="outbox_acked"
            ),
        ),
    ]
