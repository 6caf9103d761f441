"""Indexes for the console's list filters (issue 16 item 3).

* ``intent_reference_upper``: ``UPPER(reference)`` with ``text_pattern_ops``, so a reference
  typed in any case, whole or by its start (``LIKE 'ORDER-1%'``), is a range of an index
  whatever the database's collation. (An intent id prefix needs no index: it is a range of
  the primary key.)
* ``audit_actor``: ``(actor, created_at DESC, id DESC)``, so the audit log filtered by an
  actor (``otto`` meaning ``user:otto`` or ``agent:otto``) reads that actor's events in page
  order instead of walking the whole log for a rare one.

``intent_reference_upper`` keeps a 1,000-bucket histogram (see the ``RunSQL``). Built ``CONCURRENTLY`` (hence ``atomic = False``): both tables take a write for every
transition, and a plain ``CREATE INDEX`` would block those writes (a SHARE lock) for as long as
the build takes on a large ledger. A concurrent build that fails leaves an INVALID index:
drop it and migrate again.
"""

import django.contrib.postgres.indexes
import django.db.models.functions.text
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("operations", "0024_intent_assignment")]

    operations = [
        AddIndexConcurrently(
            model_name="auditevent",
            index=models.Index(fields=["actor", "-created_at", "-id"], name="audit_actor"),
        ),
        AddIndexConcurrently(
            model_name="intent",
            index=models.Index(
                django.contrib.postgres.indexes.OpClass(
                    django.db.models.functions.text.Upper("reference"), name="text_pattern_ops"
                ),
                name="intent_reference_upper",
            ),
        ),
        # References often share a long start ("order-1042", "order-1043"): with the default 100
        # histogram buckets PostgreSQL guesses a prefix matches a whole bucket (1% of the table)
        # and may walk intent_created filtering every row instead of this index. A finer
        # histogram of UPPER(reference) keeps its estimate near the truth.
        migrations.RunSQL(
            "ALTER INDEX intent_reference_upper ALTER COLUMN 1 SET STATISTICS 1000",
            "ALTER INDEX intent_reference_upper ALTER COLUMN 1 SET STATISTICS -1",
        ),
    ]
