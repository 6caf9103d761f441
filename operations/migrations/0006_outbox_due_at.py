"""Outbox rows carry ``due_at``: delays live in the database and the relay publishes a row only
when it is due (shared/cases C15). Pending rows get their intent's ``not_before`` (or their
creation time); rows already sent keep the migration's time, which nothing reads. The relay's
partial index moves from ``created_at`` to ``due_at``."""

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("operations", "0005_intent_risk_rank"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="outboxmessage",
            name="outbox_pending_q",
        ),
        migrations.AddField(
            model_name="outboxmessage",
            name="due_at",
            field=models.DateTimeField(
                db_default=django.db.models.functions.datetime.Now(),
                help_text="when the message may be delivered: the intent's not_before, or the time it was written",
            ),
        ),
        migrations.RunSQL(
            """
            UPDATE operations_outboxmessage AS o
            SET due_at = GREATEST(o.created_at, COALESCE(i.not_before, o.created_at))
            FROM operations_intent AS i
            WHERE o.sent_at IS NULL AND i.id = o.intent_id
            """,
            migrations.RunSQL.noop,
        ),
        migrations.RunSQL(
            "UPDATE operations_outboxmessage SET due_at = created_at WHERE sent_at IS NULL AND intent_id IS NULL",
            migrations.RunSQL.noop,
        ),
        migrations.AddIndex(
            model_name="outboxmessage",
            index=models.Index(
                condition=models.Q(("sent_at__isnull", True)), fields=["due_at"], name="outbox_due_q"
            ),
        ),
    ]
