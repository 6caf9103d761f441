"""Writes that schedule the reconciler's work on an intent row: when its next lookup is due
(UNKNOWN) and when its next duplicate check is due (sent more than once to a provider without
keys). Not state transitions, but writes to the ledger's rows, so they live here with the others
(``reconciliation`` calls them and never updates an intent itself).

Claims push the due time 60 s forward under ``FOR UPDATE SKIP LOCKED`` and commit, so a second
reconciler skips the batch; each item then reschedules itself when it is done. Database time
(``statement_timestamp()``) throughout.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.db import connection, transaction
from django.db.models.functions import Now

from operations.audit.trail import audit_append
from operations.models import Intent

#: Seconds a claimed item is hidden from other reconcilers while it is being worked on.
CLAIM_SECONDS = 60


def _claim(column: str, condition: str, batch: int) -> list[uuid.UUID]:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE operations_intent
            SET {column} = statement_timestamp() + make_interval(secs => %s)
            WHERE id IN (
                SELECT id FROM operations_intent
                WHERE {condition} AND {column} <= statement_timestamp()
                ORDER BY {column}
                LIMIT %s
                FOR UPDATE SKIP LOCKED
            )
            RETURNING id
            """,  # noqa: S608 - column and condition are constants of this module
            [CLAIM_SECONDS, batch],
        )
        return [row[0] for row in cursor.fetchall()]


def intents_claim_due_lookups(*, batch: int) -> list[uuid.UUID]:
    """Claim up to ``batch`` UNKNOWN intents whose lookup is due (served by the partial index
    ``intent_unknown_q``); returns their ids."""
    return _claim("next_lookup_at", f"status = '{Intent.Status.UNKNOWN}'", batch)


def intent_schedule_lookup(*, intent_id: uuid.UUID, lookups: int, delay_seconds: float) -> None:
    """Record that ``lookups`` lookups were made and the next is due in ``delay_seconds``
    (only while the intent is still UNKNOWN: one resolved meanwhile is left alone)."""
    Intent.objects.filter(id=intent_id, status=Intent.Status.UNKNOWN).update(
        lookup_count=lookups, next_lookup_at=Now() + timedelta(seconds=delay_seconds)
    )


def intents_claim_due_duplicate_checks(*, batch: int) -> list[uuid.UUID]:
    """Claim up to ``batch`` intents whose duplicate check is due (partial index
    ``intent_duplicate_check_q``); returns their ids."""
    return _claim("next_duplicate_check_at", "next_duplicate_check_at IS NOT NULL", batch)


def intent_schedule_duplicate_check(
    *, intent_id: uuid.UUID, delay_seconds: float, end_after_window: bool
) -> None:
    """The next duplicate check in ``delay_seconds``. With ``end_after_window``, once the
    consistency window has passed the check just made was the last and none is scheduled;
    without it (an inconclusive check), checks go on whatever the window."""
    queryset = Intent.objects.filter(id=intent_id)
    if end_after_window:
        queryset = queryset.filter(duplicate_check_until__gt=Now())
    queryset.update(next_duplicate_check_at=Now() + timedelta(seconds=delay_seconds))
    if end_after_window:
        intent_end_duplicate_checks(intent_id=intent_id, only_after_window=True)


def intent_end_duplicate_checks(*, intent_id: uuid.UUID, only_after_window: bool = False) -> None:
    """Stop the duplicate checks of an intent (its window passed, or it ended without effect)."""
    queryset = Intent.objects.filter(id=intent_id)
    if only_after_window:
        queryset = queryset.filter(duplicate_check_until__lte=Now())
    queryset.update(next_duplicate_check_at=None)


def intent_note_duplicate(*, intent_id: uuid.UUID, provider_reference: str, kept: str, handling: str) -> None:
    """Append the audit event ``duplicate_found`` to the intent's chain: a second effect
    ``provider_reference`` exists at the provider; the intent keeps ``kept``; ``handling`` is
    ``compensating`` or ``flagged``. Call inside the caller's transaction."""
    # Lock the intent row: the audit chain is appended under it (operations.audit.trail).
    Intent.objects.select_for_update().filter(id=intent_id).values_list("id", flat=True).first()
    audit_append(
        intent_id=intent_id,
        event="duplicate_found",
        actor="reconciler",
        reason=f"a second effect {provider_reference} exists at the provider; kept {kept}",
        data={"provider_reference": provider_reference, "kept": kept, "handling": handling},
    )
