"""The audit log: each intent's hash-chained events (``AuditEvent``) and the signed checkpoints
of the whole log (``AuditCheckpoint``). Both are append-only (database triggers).
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from operations.models.intents import Intent


class AuditEvent(models.Model):
    """Append-only, hash-chained record of a transition (a PostgreSQL trigger refuses UPDATE and
    DELETE). Each intent's events form one chain: ``prev_hash`` is the previous event's ``hash``.
    """

    intent = models.ForeignKey(
        Intent, null=True, blank=True, on_delete=models.PROTECT, related_name="audit_events"
    )
    seq = models.PositiveIntegerField(help_text="1-based position in the intent's chain")
    event = models.CharField(max_length=50)
    from_status = models.CharField(max_length=20, blank=True, default="")
    to_status = models.CharField(max_length=20, blank=True, default="")
    actor = models.CharField(max_length=200)
    reason = models.TextField(blank=True, default="")
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    class Meta:
        constraints = [
            # Two writers can never fork one chain: the second insert of a seq fails.
            models.UniqueConstraint(fields=["intent", "seq"], name="audit_chain_seq_unique"),
        ]
        indexes = [
            models.Index(fields=["-created_at", "-id"], name="audit_created"),
            # The audit log filtered by actor, newest first (issue 16 item 3): one actor's
            # events as an index range in page order, however rare they are in the log.
            models.Index(fields=["actor", "-created_at", "-id"], name="audit_actor"),
            # The dashboard's last hour of throughput (operations.selectors.throughput_last_hour):
            # the finished events only, with their state, read without the table (issue 37).
            models.Index(
                fields=["created_at"],
                include=["to_status"],
                condition=Q(to_status__in=["SUCCEEDED", "FAILED"]),
                name="audit_finished",
            ),
        ]


class AuditCheckpoint(models.Model):
    """A signed checkpoint of the whole audit log (operations/audit/checkpoints.py): every chain's
    head (intent, last seq, last hash) at one moment, summarised by an RFC 9162 Merkle tree
    head and signed with Ed25519 by a key kept outside the database. Append-only like the
    events (a trigger refuses UPDATE, DELETE and TRUNCATE, migration 0013); checkpoints chain
    to each other through ``prev_hash`` and gap-free ``number``s.
    """

    number = models.PositiveBigIntegerField(unique=True, help_text="1-based position in the series")
    created_at = models.DateTimeField()
    chains = models.PositiveBigIntegerField(help_text="chains (intents) covered: the Merkle tree size")
    events = models.PositiveBigIntegerField(help_text="events covered: the sum of the heads' seqs")
    root = models.CharField(max_length=64, help_text="RFC 9162 Merkle tree hash of the heads, hex")
    prev_hash = models.CharField(max_length=64, help_text="sha256 of the previous checkpoint's statement")
    key_id = models.CharField(max_length=64, help_text="sha256 hex of the raw Ed25519 public key")
    signature = models.CharField(max_length=128, help_text="Ed25519 signature of the statement, hex")
    heads = models.BinaryField(help_text="zlib-compressed JSON [[intent_id, seq, hash], ...] in leaf order")
    accepted = models.JSONField(
        null=True,
        blank=True,
        help_text="faults an operator acknowledged to sign this checkpoint anyway (audit_checkpoint "
        "--accept-faults): {faults: [text], omitted: n, reason: text}; part of the signed statement",
    )
