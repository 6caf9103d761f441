"""``AuditCheckpoint.accepted``: the faults an operator acknowledged to sign a checkpoint
anyway (``audit_checkpoint --accept-faults --reason``), part of its signed statement. Adding a
nullable column fires no row trigger, so the append-only triggers of 0013 stay as they are."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("operations", "0014_intent_fingerprint_version"),
    ]

    operations = [
        migrations.AddField(
            model_name="auditcheckpoint",
            name="accepted",
            field=models.JSONField(
                blank=True,
                help_text="faults an operator acknowledged to sign this checkpoint anyway (audit_checkpoint --accept-faults): {faults: [text], omitted: n, reason: text}; part of the signed statement",
                null=True,
            ),
        ),
    ]
