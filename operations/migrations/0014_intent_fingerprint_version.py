"""``Intent.fingerprint_version``: what an intent's request_hash covers.

Existing rows were hashed over {tenant, action, action_version, arguments} and get 1; their
stored hashes (which approvals and audit events record) are never rewritten. New rows get 2,
whose fingerprint also covers ``reference`` (issue 11 item 6).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("operations", "0013_audit_checkpoint"),
    ]

    operations = [
        # Fills every existing row with 1; then new rows default to 2, in the database too (a
        # raw INSERT that names no fingerprint_version is a new row).
        migrations.AddField(
            model_name="intent",
            name="fingerprint_version",
            field=models.PositiveSmallIntegerField(default=1),
        ),
        migrations.AlterField(
            model_name="intent",
            name="fingerprint_version",
            field=models.PositiveSmallIntegerField(
                default=2,
                db_default=2,
                help_text="what request_hash covers: 2 = {tenant, action, version, arguments, reference}; "
                "1 = the same without reference (intents submitted before migration 0014)",
            ),
        ),
        migrations.AlterField(
            model_name="intent",
            name="request_hash",
            field=models.CharField(
                help_text="sha256 hex of the canonical request fingerprint (fingerprint_version)",
                max_length=64,
            ),
        ),
        migrations.AddConstraint(
            model_name="intent",
            constraint=models.CheckConstraint(
                condition=models.Q(("fingerprint_version__in", [1, 2])),
                name="intent_fingerprint_version_known",
            ),
        ),
    ]
