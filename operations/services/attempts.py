"""How an attempt ends: the one fenced write (``attempt_finish``) that moves a RUNNING intent
on, releases its lease and closes its attempt row, and the record of a write the fence refused
(a newer attempt took over while this worker called the provider).

The transitions of ``operations.services.execution`` all go through ``attempt_finish``.
"""

from __future__ import annotations

from typing import Any

from django.db.models import F
from django.db.models.functions import Coalesce, Now

from operations import metrics
from operations.adapters.bounds import clean_detail, clean_text
from operations.audit.trail import audit_append
from operations.models import Attempt, Intent
from operations.services.claims import Claim
from operations.services.duplicates import duplicate_check_updates
from operations.services.transitions import transition
from operations.statements import Statement, update_statement


def _close_attempt(
    claim: Claim, result: str, *, error: str = "", detail: dict[str, Any] | None = None
) -> Statement:
    # An attempt row is inserted at claim and closed exactly once (finished_at IS NULL guard).
    # ``attempt_finish`` hands it text and JSON already made storable (``operations.adapters.bounds``).
    return update_statement(
        Attempt.objects.filter(id=claim.attempt.id, finished_at__isnull=True),
        {"finished_at": Now(), "result": result, "error": error, "detail": detail or {}},
    )


def release_lease() -> dict[str, Any]:
    """The columns that release a lease (set in the same UPDATE as the transition)."""
    return {"lease_owner": "", "lease_expires_at": None}


def attempt_finish(
    claim: Claim,
    *,
    to_status: str,
    event: str,
    attempt_result: str,
    error: str = "",
    detail: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
    updates: dict[str, Any] | None = None,
    dispatch: bool = False,
    also: tuple[Statement, ...] = (),
) -> bool:
    """RUNNING -> ``to_status`` for the claim's fence (a stale worker's write moves nothing),
    releasing the lease and closing the attempt (and running ``also``, e.g. the outcome's
    INSERT) in the statement that appends the audit event (``transition``). Call inside the
    caller's transaction.

    A refused write is recorded too (``_record_fenced_out``): the attempt row says it was
    fenced out and what the provider answered, and the intent's chain gets an audit event.

    ``error`` and ``detail`` usually carry what a provider sent: they are made storable here
    (``operations.adapters.bounds``: NUL characters, lone surrogates, length, depth, NaN), so nothing a
    provider sends can make this write fail.
    """
    error = clean_text(error)
    detail = clean_detail(detail) if detail else None
    moved = transition(
        intent_id=claim.intent.id,
        from_status=Intent.Status.RUNNING,
        to_status=to_status,
        fence=claim.fence,
        actor=f"worker:{claim.worker}",
        event=event,
        reason=error[:500],
        data={"fence": claim.fence, **(data or {}), **(detail or {})},
        updates={**release_lease(), "last_error": error, **(updates or {})},
        dispatch=dispatch,
        also=(_close_attempt(claim, attempt_result, error=error, detail=detail), *also),
    )
    if not moved:
        _record_fenced_out(
            claim,
            would_be=to_status,
            answer={"result": attempt_result, "error": error[:500], **(detail or {})},
        )
    return moved


def _record_fenced_out(claim: Claim, *, would_be: str, answer: dict[str, Any]) -> None:
    """Record a write refused by the fence: a newer attempt (a lease takeover) moved the intent
    while this worker was calling the provider. Its answer still matters — a stale worker that
    did apply the effect is the one a duplicate check or a lookup must account for.

    The attempt (still pending, or marked ``abandoned`` by the takeover) becomes ``fenced_out``
    with the provider's answer; an audit event ``stale_write_refused`` is appended. At a
    provider without keys, a stale success on an intent that already SUCCEEDED schedules a
    duplicate check. Call inside the caller's transaction.
    """
    # Lock the intent row: the audit chain is appended under it (operations.audit.trail).
    row = (
        Intent.objects.select_for_update()
        .filter(id=claim.intent.id)
        .values_list("status", "attempt_count")
        .first()
    )
    if row is None:
        return
    current, attempts = row
    Attempt.objects.filter(
        id=claim.attempt.id, result__in=[Attempt.Result.PENDING, Attempt.Result.ABANDONED]
    ).update(
        finished_at=Coalesce(F("finished_at"), Now()),
        result=Attempt.Result.FENCED_OUT,
        error="fenced out: a newer attempt took over before this one recorded its outcome",
        detail={"provider_answer": answer, "would_have_become": would_be},
    )
    audit_append(
        intent_id=claim.intent.id,
        event="stale_write_refused",
        actor=f"worker:{claim.worker}",
        reason="a newer attempt took over; this attempt's outcome was not applied",
        data={
            "fence": claim.fence,
            "attempt_no": claim.attempt.attempt_no,
            "would_have_become": would_be,
            "provider_answer": answer,
        },
    )
    metrics.FENCED_OUT_ATTEMPTS.labels(answer=answer.get("result", "")).inc()
    if would_be == Intent.Status.SUCCEEDED and current == Intent.Status.SUCCEEDED:
        Intent.objects.filter(id=claim.intent.id).update(
            **duplicate_check_updates(action=claim.intent.action, attempts=attempts)
        )
