"""The archive's index (``ArchiveSegment``, ``ArchivedIntent``), and two rules in the database
(issue 36):

- audit events stay append-only (UPDATE and TRUNCATE refused as before); a DELETE is let through
  only in a transaction that set ``effect_ledger.archiving`` to ``on`` (``SET LOCAL``), which the
  archiver does once the intent's chain is in a committed, signed archive segment. Anybody who
  can set it could delete events, as anybody who can drop the trigger could: what catches a chain
  deleted without being archived is ``verify_audit`` against the signed checkpoints, which
  accepts a missing chain only when a signed archive manifest holds it.
- a new intent under an Idempotency-Key that was archived and still replays
  (``key_expires_at`` in the future) is refused with ``unique_violation`` (constraint
  ``intent_client_key_archived``), so the submission answers from the archive instead. An AFTER
  trigger: it runs after the unique index made a concurrent insert wait for the archiver's
  deleting transaction, and its query (a volatile function in READ COMMITTED) sees that commit.
"""

import django.db.models.deletion
from django.db import migrations, models

AUDIT_DELETE_WHEN_ARCHIVING = """
CREATE OR REPLACE FUNCTION operations_audit_append_only() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('effect_ledger.archiving', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit events are append-only: % refused on operations_auditevent', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""

AUDIT_APPEND_ONLY = """
CREATE OR REPLACE FUNCTION operations_audit_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit events are append-only: % refused on operations_auditevent', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""

KEY_ARCHIVED = """
CREATE FUNCTION operations_intent_key_archived() RETURNS trigger AS $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM operations_archivedintent a
        WHERE a.tenant = NEW.tenant AND a.principal = NEW.principal AND a.client_key = NEW.client_key
          AND a.state = 'archived' AND a.key_expires_at > statement_timestamp()
    ) THEN
        RAISE EXCEPTION 'Idempotency-Key % was archived and still replays', NEW.client_key
            USING ERRCODE = 'unique_violation', CONSTRAINT = 'intent_client_key_archived';
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql VOLATILE;

CREATE TRIGGER intent_client_key_archived
    AFTER INSERT ON operations_intent
    FOR EACH ROW EXECUTE FUNCTION operations_intent_key_archived();
"""

DROP_KEY_ARCHIVED = """
DROP TRIGGER IF EXISTS intent_client_key_archived ON operations_intent;
DROP FUNCTION IF EXISTS operations_intent_key_archived();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("operations", "0034_periodic_claims_beats"),
    ]

    operations = [
        migrations.CreateModel(
            name="ArchiveSegment",
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
                ("period", models.DateField(help_text="the UTC day its intents were submitted")),
                (
                    "file_name",
                    models.CharField(help_text="relative to ARCHIVE_DIR", max_length=300, unique=True),
                ),
                (
                    "state",
                    models.CharField(
                        choices=[("written", "Written; live rows being deleted"), ("complete", "Complete")],
                        default="written",
                        max_length=10,
                    ),
                ),
                ("intents", models.PositiveIntegerField(help_text="intents (records) in the file")),
                ("events", models.PositiveBigIntegerField(help_text="audit events in the file")),
                ("bytes", models.PositiveBigIntegerField(help_text="size of the compressed file")),
                (
                    "file_sha256",
                    models.CharField(help_text="sha256 hex of the compressed file", max_length=64),
                ),
                (
                    "root",
                    models.CharField(
                        help_text="RFC 9162 Merkle tree hash of the archived chains' heads", max_length=64
                    ),
                ),
                (
                    "manifest",
                    models.JSONField(help_text="the signed statement (operations.archive.manifests)"),
                ),
                (
                    "signature",
                    models.CharField(help_text="Ed25519 signature of the statement, hex", max_length=128),
                ),
                ("created_at", models.DateTimeField(auto_now_add=True)),
            ],
            options={
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("state__in", ["written", "complete"])),
                        name="archive_segment_state_valid",
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="ArchivedIntent",
            fields=[
                ("intent_id", models.UUIDField(primary_key=True, serialize=False)),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("pending", "Written; live rows not deleted yet"),
                            ("archived", "Archived"),
                            ("superseded", "Changed after it was written; still live"),
                        ],
                        default="pending",
                        max_length=10,
                    ),
                ),
                ("tenant", models.CharField(max_length=100)),
                ("principal", models.CharField(max_length=200)),
                ("client_key", models.CharField(max_length=255)),
                ("idempotency_key", models.CharField(max_length=200)),
                ("reference", models.CharField(blank=True, default="", max_length=200)),
                ("action", models.CharField(max_length=100)),
                ("status", models.CharField(help_text="the status it was archived in", max_length=20)),
                ("request_hash", models.CharField(max_length=64)),
                ("fingerprint_version", models.PositiveSmallIntegerField()),
                ("head_seq", models.PositiveIntegerField(help_text="the last audit event's seq in the file")),
                (
                    "head_hash",
                    models.CharField(help_text="the last audit event's hash in the file", max_length=64),
                ),
                (
                    "rows_digest",
                    models.CharField(
                        help_text="md5 of every row about the intent as written (operations.archive.records.ROWS_DIGEST_SQL): the rows are deleted only while they still hash to it",
                        max_length=32,
                    ),
                ),
                (
                    "answer",
                    models.JSONField(
                        blank=True,
                        help_text="the API's representation of the intent when it was archived; cleared when its key's retention ends",
                        null=True,
                    ),
                ),
                ("created_at", models.DateTimeField(help_text="when the intent was submitted")),
                ("settled_at", models.DateTimeField(help_text="its last change before it was archived")),
                (
                    "key_expires_at",
                    models.DateTimeField(help_text="until then a submit with its key replays this answer"),
                ),
                (
                    "segment",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="archived_intents",
                        to="operations.archivesegment",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(fields=["tenant", "principal", "client_key"], name="archived_intent_key"),
                    models.Index(fields=["reference"], name="archived_intent_reference"),
                    models.Index(fields=["client_key"], name="archived_intent_client_key"),
                    models.Index(fields=["idempotency_key"], name="archived_intent_provider_key"),
                    models.Index(fields=["segment", "state"], name="archived_intent_segment"),
                ],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("state__in", ["pending", "archived", "superseded"])),
                        name="archived_intent_state_valid",
                    )
                ],
            },
        ),
        migrations.RunSQL(AUDIT_DELETE_WHEN_ARCHIVING, AUDIT_APPEND_ONLY),
        migrations.RunSQL(KEY_ARCHIVED, DROP_KEY_ARCHIVED),
    ]
