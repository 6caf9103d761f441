"""The dashboard's index on audit events (issue 37): the finished events (``to_status``
SUCCEEDED or FAILED) by ``created_at``, carrying ``to_status``, so the last hour's throughput
(``operations.selectors.throughput_last_hour``) is an index-only range scan of the intents that
finished in the hour, not an index scan of every event of the hour with a visit to the table for
each. One entry per finished intent (not per event).

Built ``CONCURRENTLY`` (hence ``atomic = False``): every transition appends an audit event, and
a plain ``CREATE INDEX`` would block those writes for the build. A concurrent build that fails
leaves an INVALID index: drop it and migrate again.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("operations", "0038_outcome_operator_recent")]

    operations = [
        AddIndexConcurrently(
            model_name="auditevent",
            index=models.Index(
                condition=models.Q(("to_status__in", ["SUCCEEDED", "FAILED"])),
                fields=["created_at"],
                include=("to_status",),
                name="audit_finished",
            ),
        ),
    ]
