"""The archive's index in the database (``operations.archive``): one ``ArchiveSegment`` per
archive file written, and one ``ArchivedIntent`` per intent written to one.

The archive files themselves (JSON Lines, gzip-compressed, one per day of settlement and part)
and their signed manifests live in ``EFFECT_LEDGER["ARCHIVE_DIR"]``; these rows say which file
holds which intent, let a replayed ``Idempotency-Key`` be answered from the archive, and keep
the deletion resumable (DESIGN.md, "Retention").
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class ArchiveSegment(models.Model):
    """One archive file and its signed manifest (``operations.archive.manifests``).

    ``state``: ``written`` once the file and manifest are on disk and this row committed (its
    intents are indexed, and their live rows are being deleted); ``complete`` once none of its
    intents is left to delete. The series is gap-free (``number``) and each manifest names its
    predecessor's hash, so a removed segment is seen like a removed checkpoint.
    """

    class State(models.TextChoices):
        WRITTEN = "written", "Written; live rows being deleted"
        COMPLETE = "complete", "Complete"

    number = models.PositiveBigIntegerField(unique=True, help_text="1-based position in the series")
    period = models.DateField(help_text="the UTC day its intents were submitted")
    file_name = models.CharField(max_length=300, unique=True, help_text="relative to ARCHIVE_DIR")
    state = models.CharField(max_length=10, choices=State.choices, default=State.WRITTEN)
    intents = models.PositiveIntegerField(help_text="intents (records) in the file")
    events = models.PositiveBigIntegerField(help_text="audit events in the file")
    bytes = models.PositiveBigIntegerField(help_text="size of the compressed file")
    file_sha256 = models.CharField(max_length=64, help_text="sha256 hex of the compressed file")
    root = models.CharField(
        max_length=64, help_text="RFC 9162 Merkle tree hash of the archived chains' heads"
    )
    manifest = models.JSONField(help_text="the signed statement (operations.archive.manifests)")
    signature = models.CharField(max_length=128, help_text="Ed25519 signature of the statement, hex")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=["written", "complete"]), name="archive_segment_state_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"archive segment {self.number} ({self.file_name})"


class ArchivedIntent(models.Model):
    """An intent written to an archive segment: where it is, and what a replay of its key answers.

    ``state``: ``pending`` while its live rows still exist (written, not yet deleted);
    ``archived`` once they were deleted in the transaction that checked the live chain still
    ended at ``head_seq``/``head_hash``; ``superseded`` when it changed after it was written
    (late evidence, a compensation): its live rows stay, and the record in the file is an
    earlier state of a chain that continues live.

    The columns that identify the intent (tenant, principal, client_key, reference) are kept so
    a search finds it and a trigger on ``operations_intent`` refuses a new intent under an
    archived key until ``key_expires_at`` (migration 0035): the submission answers from here.
    """

    class State(models.TextChoices):
        PENDING = "pending", "Written; live rows not deleted yet"
        ARCHIVED = "archived", "Archived"
        SUPERSEDED = "superseded", "Changed after it was written; still live"

    intent_id = models.UUIDField(primary_key=True)
    segment = models.ForeignKey(ArchiveSegment, on_delete=models.PROTECT, related_name="archived_intents")
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    tenant = models.CharField(max_length=100)
    principal = models.CharField(max_length=200)
    client_key = models.CharField(max_length=255)
    idempotency_key = models.CharField(max_length=200)
    reference = models.CharField(max_length=200, blank=True, default="")
    action = models.CharField(max_length=100)
    status = models.CharField(max_length=20, help_text="the status it was archived in")
    request_hash = models.CharField(max_length=64)
    fingerprint_version = models.PositiveSmallIntegerField()
    head_seq = models.PositiveIntegerField(help_text="the last audit event's seq in the file")
    head_hash = models.CharField(max_length=64, help_text="the last audit event's hash in the file")
    rows_digest = models.CharField(
        max_length=32,
        help_text="md5 of every row about the intent as written (operations.archive.records.ROWS_DIGEST_SQL): "
        "the rows are deleted only while they still hash to it",
    )
    answer = models.JSONField(
        null=True,
        blank=True,
        help_text="the API's representation of the intent when it was archived; "
        "cleared when its key's retention ends",
    )
    created_at = models.DateTimeField(help_text="when the intent was submitted")
    settled_at = models.DateTimeField(help_text="its last change before it was archived")
    key_expires_at = models.DateTimeField(help_text="until then a submit with its key replays this answer")

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=["pending", "archived", "superseded"]),
                name="archived_intent_state_valid",
            ),
        ]
        indexes = [
            models.Index(fields=["tenant", "principal", "client_key"], name="archived_intent_key"),
            models.Index(fields=["reference"], name="archived_intent_reference"),
            # The console's search matches a whole Idempotency-Key or provider key.
            models.Index(fields=["client_key"], name="archived_intent_client_key"),
            models.Index(fields=["idempotency_key"], name="archived_intent_provider_key"),
            models.Index(fields=["segment", "state"], name="archived_intent_segment"),
        ]

    def __str__(self) -> str:
        return f"archived intent {self.intent_id} ({self.state})"
