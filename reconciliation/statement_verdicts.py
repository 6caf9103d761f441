"""What a statement's lines say about the ledger's intents (issue 19; the rules are
``reconciliation.statements``' module docstring): whether a line's intent holds the line's effect
(an UNKNOWN intent is ended SUCCEEDED, late evidence applied to one that ended without effect),
and which SUCCEEDED intents of a day no line of the source holds (``missing_at_provider``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db.models import Min, OuterRef, Subquery

from operations import services
from operations.adapters.events import key_from_message_id
from operations.exceptions import IntentMoved
from operations.models import ENDED_WITHOUT_EFFECT, Intent, Outcome
from reconciliation.late_evidence import LateProof, apply_late_proof
from reconciliation.models import ProviderFinding, StatementLine, StatementRun

#: Missing intents read and their findings written at a time.
MISSING_CHUNK = 2000

#: Statuses whose intent holds its effect on record: a line for one is matched.
HOLDS_EFFECT = (Intent.Status.SUCCEEDED, Intent.Status.COMPENSATING, Intent.Status.COMPENSATED)


@dataclass
class IntentMoney:
    """What ``intent``'s arguments ask: ``amount`` in minor units (None unless it moves money)
    and ``currency`` (ISO 4217, upper case; "" when none)."""

    intent: Intent
    amount: int | None
    currency: str
    moves_money: bool


def key_of(value: str) -> str:
    """Our key in a line's key column: the key itself, or an email's Message-ID carrying it."""
    return key_from_message_id(value) or value


def intent_money(intent: Intent) -> IntentMoney:
    """The money ``intent`` moves: its arguments' ``amount`` (an int, minor units) and
    ``currency``; ``moves_money`` False when the amount is absent or not an int."""
    args = intent.arguments if isinstance(intent.arguments, dict) else {}
    amount = args.get("amount")
    moves = isinstance(amount, int) and not isinstance(amount, bool)
    return IntentMoney(intent, amount if moves else None, str(args.get("currency") or "").upper(), moves)


def _in_flight(intent: Intent) -> bool:
    """Sent and not yet ended: its own end records the effect (RUNNING, or READY to be sent again)."""
    return intent.status == Intent.Status.RUNNING or (
        intent.status == Intent.Status.READY and intent.attempt_count > 0
    )


def line_without_effect(
    intent: Intent, statement_run: StatementRun, day: dt.date, line: StatementLine
) -> str:
    """Why ``line``'s intent holds no effect the line could be matched to ("" when it holds or
    will hold one). An UNKNOWN intent is ended SUCCEEDED here: the line proves its effect."""
    if intent.status == Intent.Status.UNKNOWN and line.provider_reference:
        try:
            services.intent_resolve_found(
                intent_id=intent.id,
                provider_reference=line.provider_reference,
                source=Outcome.Source.RECONCILER,
                actor="reconciler",
                reason=f"on the provider's statement of {day.isoformat()} (run {statement_run.id})",
                detail={"statement_run": statement_run.id, "line_no": line.line_no},
            )
        except IntentMoved:  # it ended meanwhile (a lookup, an event, an operator): judge it now
            intent.refresh_from_db(fields=["status", "attempt_count"])
        else:
            intent.status = Intent.Status.SUCCEEDED
            return ""
    if intent.status in HOLDS_EFFECT or _in_flight(intent):
        return ""
    if intent.status == Intent.Status.UNKNOWN:  # moved back to UNKNOWN meanwhile: still unproven here
        return ""
    if intent.status in ENDED_WITHOUT_EFFECT and line.provider_reference:
        return _late(intent, statement_run, day, line)
    return f"intent {intent.id} is {intent.status}: the ledger holds no effect for it"


def _late(intent: Intent, statement_run: StatementRun, day: dt.date, line: StatementLine) -> str:
    """A line of an intent that ended without effect: late evidence (``reconciliation.
    late_evidence``), "" when applied (the line is matched); else why it is extra."""
    locked = Intent.objects.select_for_update().get(id=intent.id)
    if locked.status not in ENDED_WITHOUT_EFFECT:
        return ""
    late = apply_late_proof(
        locked,
        LateProof(
            provider_reference=line.provider_reference,
            source=Outcome.Source.RECONCILER,
            actor="reconciler",
            what=f"the provider's statement of {day.isoformat()} (run {statement_run.id}, line {line.line_no}) lists its effect",
            by_key=bool(line.idempotency_key) and key_of(line.idempotency_key) == intent.idempotency_key,
            amount=line.amount,
            currency=line.currency,
            detail={"statement_run": statement_run.id, "line_no": line.line_no},
        ),
        run=statement_run,
        line=line,
    )
    if late.result != "applied":
        return f"intent {intent.id} is {intent.status}, and the line is not surely its effect: {late.why}"
    intent.status = locked.status
    return ""


def effect_day_bounds(day: dt.date) -> tuple[dt.datetime, dt.datetime]:
    """``day`` as the half-open UTC interval ``[00:00, next 00:00)``."""
    start = dt.datetime.combine(day, dt.time.min, tzinfo=dt.UTC)
    return start, start + dt.timedelta(days=1)


def record_missing(statement_run: StatementRun, source: str, day: dt.date, actions: list[str]) -> int:
    """Findings for SUCCEEDED intents of ``actions`` whose effect outcome falls on ``day`` (UTC)
    and that no statement line of ``source`` was ever matched to; returns how many. Each finding
    is made once per fingerprint (``INSERT ... ON CONFLICT DO NOTHING``, a chunk at a time)."""
    start, end = effect_day_bounds(day)
    effect_at = (
        Intent.objects.filter(action__in=actions, status=Intent.Status.SUCCEEDED)
        .annotate(
            effect_at=Min("outcomes__created_at"),
        )
        .filter(effect_at__gte=start, effect_at__lt=end)
        .exclude(statement_lines__run__source=source)
    )
    missing = 0
    chunk: list[ProviderFinding] = []
    for intent in effect_at.annotate(
        effect_reference=Subquery(
            Outcome.objects.filter(intent=OuterRef("pk"))
            .exclude(provider_reference="")
            .order_by("created_at")
            .values("provider_reference")[:1]
        )
    ).iterator(chunk_size=MISSING_CHUNK):
        money = intent_money(intent)
        missing += 1
        chunk.append(
            ProviderFinding(
                fingerprint=f"missing:{source}:{day.isoformat()}:{intent.id}",
                kind=ProviderFinding.Kind.MISSING_AT_PROVIDER,
                source=source,
                intent=intent,
                run=statement_run,
                provider_reference=intent.effect_reference or "",
                expected_amount=money.amount,
                expected_currency=money.currency,
                detail={"statement_date": day.isoformat()},
            )
        )
        if len(chunk) >= MISSING_CHUNK:
            ProviderFinding.objects.bulk_create(chunk, ignore_conflicts=True)
            chunk = []
    ProviderFinding.objects.bulk_create(chunk, ignore_conflicts=True)
    return missing
