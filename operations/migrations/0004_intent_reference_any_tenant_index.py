"""An index on ``reference`` alone: the console searches by reference across tenants, which
the ``(tenant, reference)`` index cannot serve (a full index scan at 1,000,000 intents).

Built ``CONCURRENTLY`` so that migrating a large, live ledger does not block writes."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("operations", "0003_reconciliation_fields")]

    operations = [
        AddIndexConcurrently(
            model_name="intent",
            index=models.Index(fields=["reference"], name="intent_reference_any_tenant"),
        ),
    ]
