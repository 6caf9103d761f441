"""Signed audit checkpoints (issue 11 item 1): the ``AuditCheckpoint`` table, append-only like
the events.

The same refusals as the events' (migrations 0002 and 0011): a row trigger refuses UPDATE and
DELETE, a statement trigger TRUNCATE, through a function of its own so the message names this
table. Only a superuser's ``session_replication_role = replica`` or the owner's ``DISABLE
TRIGGER`` get past them; deleting checkpoint rows that way shows as a gap in the series, and
deleting the newest ones shows against an outside copy of the checkpoint file
(``verify_audit --checkpoint-file``).
"""

from django.db import migrations, models

APPEND_ONLY = """
CREATE OR REPLACE FUNCTION operations_audit_checkpoint_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit checkpoints are append-only: % refused on operations_auditcheckpoint', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER operations_auditcheckpoint_append_only
    BEFORE UPDATE OR DELETE ON operations_auditcheckpoint
    FOR EACH ROW EXECUTE FUNCTION operations_audit_checkpoint_append_only();

CREATE TRIGGER operations_auditcheckpoint_no_truncate
    BEFORE TRUNCATE ON operations_auditcheckpoint
    FOR EACH STATEMENT EXECUTE FUNCTION operations_audit_checkpoint_append_only();
"""

DROP = """
DROP TRIGGER IF EXISTS operations_auditcheckpoint_no_truncate ON operations_auditcheckpoint;
DROP TRIGGER IF EXISTS operations_auditcheckpoint_append_only ON operations_auditcheckpoint;
DROP FUNCTION IF EXISTS operations_audit_checkpoint_append_only();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("operations", "0012_intent_requested_by"),
    ]

    operations = [
        migrations.CreateModel(
            name="AuditCheckpoint",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "number",
                    models.PositiveBigIntegerField(help_text="1-based position in the series", unique=True),
                ),
                ("created_at", models.DateTimeField()),
                (
                    "chains",
                    models.PositiveBigIntegerField(
                        help_text="chains (intents) covered: the Merkle tree size"
                    ),
                ),
                (
                    "events",
                    models.PositiveBigIntegerField(help_text="events covered: the sum of the heads' seqs"),
                ),
                (
                    "root",
                    models.CharField(help_text="RFC 9162 Merkle tree hash of the heads, hex", max_length=64),
                ),
                (
                    "prev_hash",
                    models.CharField(
                        help_text="sha256 of the previous checkpoint's statement", max_length=64
                    ),
                ),
                (
                    "key_id",
                    models.CharField(help_text="sha256 hex of the raw Ed25519 public key", max_length=64),
                ),
                (
                    "signature",
                    models.CharField(help_text="Ed25519 signature of the statement, hex", max_length=128),
                ),
                (
                    "heads",
                    models.BinaryField(
                        help_text="zlib-compressed JSON [[intent_id, seq, hash], ...] in leaf order"
                    ),
                ),
            ],
        ),
        migrations.RunSQL(APPEND_ONLY, DROP),
    ]
