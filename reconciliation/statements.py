"""Two-way statement reconciliation (issue 19): a provider's statement of one day against the
ledger's intents of that statement source.

A run stores the statement (``StatementRun`` and its ``StatementLine`` rows, insert-only) and
matches its lines to intents one to one: by our idempotency key, then the provider's reference
(an ``Outcome.provider_reference``: the effect is already that intent's), then our business
reference — within one tenant only: a reference that intents of several tenants hold matches
none of them (an extra line for a person to link, as for an event; C34). Then it compares amount and
currency, for intents whose arguments move money (``amount`` in minor units and ``currency``).

Results, each non-matched one a ``ProviderFinding`` made with ``get_or_create`` on its
fingerprint (contract: ``missing:<source>:<date>:<intent id>``, ``extra:<source>:<provider
reference>``, ``mismatch:<source>:<intent id>:<provider reference>``), so running a day again
makes no second finding:

* matched: the line has an intent (the first line for it) whose effect the ledger holds or will
  hold, and the amounts agree. By the intent's status: SUCCEEDED, COMPENSATING, COMPENSATED hold
  it; UNKNOWN: the line proves the effect, so the intent ends SUCCEEDED with the line's provider
  reference (``intent_resolve_found``, source ``reconciler``); RUNNING, or READY after an attempt
  was sent: in flight, and its own end records the effect (nothing is done to it here);
* ``amount_mismatch``: matched, but the amount or the currency differ (each compared only when
  the line has one: a statement without amounts proves no amount);
* a line repeating an earlier line's provider reference (one effect listed twice): kept as read,
  matched to nothing, no finding (a CSV upload refuses such a file);
* late evidence: a line of an intent that ended without effect (FAILED, CANCELLED, REJECTED,
  EXPIRED) and was sent, whose effect is surely its own (``reconciliation.late_evidence``): the
  intent moves to SUCCEEDED with an ``effect_after_ending`` finding, and the line is matched;
* ``extra_at_provider``: a line no intent has, a second line (another provider reference) for an
  intent already matched, or
  a line of an intent that holds no effect and never will (never sent: AWAITING_APPROVAL, HELD,
  READY, or ended before any attempt; or not surely its effect, ``reconciliation.attribution``):
  the provider holds an effect the ledger does not.
  One stray effect is one finding: an orphan event of the same provider reference made
  ``extra:<source>:<reference>`` first (``reconciliation.events``), and the line's run and line
  are attached to it (it keeps its kind);
* ``missing_at_provider``: a SUCCEEDED intent whose effect falls on the day and that no line of
  this source's statements (this run's or another day's) was matched to. A statement is final
  only after the provider's settlement window: when a later run matches a line to the intent,
  its open finding is resolved by the reconciler (``found_later``).

Which day an effect falls on: the UTC date of the intent's first ``Outcome``'s ``created_at`` (the
outcome that recorded its effect). The provider stamps the
effect when it makes it, before our outcome is written, so an effect made just before midnight
can be on day D's statement with our outcome on day D+1 (or, after an operator's late
``confirmed``, much later). Hence an intent is only reported missing when *no* statement line
of the source was ever matched to it, not just none of this day's: a neighbouring day's
statement that holds it clears it, and the daily beat runs days in order, so the earlier day
is always read first.

The whole run is one transaction: a failure (a line that cannot be stored, the database) stores
nothing but the run with its ``error``. A finished run is audited as ``statement_reconciled`` on
the chain of events without an intent (source, date, origin, counts, actor), in the same
transaction.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Min, OuterRef, Subquery
from django.utils import timezone

from operations import services
from operations.adapters.base import StatementEntry
from operations.adapters.errors import AdapterError, StatementsUnsupported
from operations.adapters.events import key_from_message_id
from operations.adapters.registry import evidence_source_actions, evidence_sources, get_adapter
from operations.audit.trail import audit_append_unattached
from operations.exceptions import IntentMoved
from operations.models import ENDED_WITHOUT_EFFECT, Intent, Outcome
from reconciliation.late_evidence import LateProof, apply_late_proof
from reconciliation.models import ProviderFinding, StatementLine, StatementRun

#: Seconds a provider's statement fetch may take.
FETCH_DEADLINE_SECONDS = 30.0


class StatementRefused(ValueError):
    """A run that cannot start: an unknown source, or a source without a statement API.
    ``str()`` says which, for operators."""


#: Statuses whose intent holds its effect on record: a line for one is matched.
HOLDS_EFFECT = (Intent.Status.SUCCEEDED, Intent.Status.COMPENSATING, Intent.Status.COMPENSATED)

_DAY = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")


def statement_day(text: str, *, today: dt.date | None = None) -> dt.date:
    """A statement's day from ``YYYY-MM-DD`` (only that form: not ``20261202`` nor
    ``2026-W49-3``, which ``date.fromisoformat`` also reads), at most ``today`` (UTC; no
    provider has a statement of a day to come).

    Raises:
        ValueError: not that form or no such date (``str()``: "is not a date (YYYY-MM-DD)"),
            or a day after today (``str()``: "is after today (UTC)").
    """
    text = text.strip()
    try:
        if not _DAY.match(text):
            raise ValueError(text)
        day = dt.date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text[:40]!r} is not a date (YYYY-MM-DD)") from None
    today = today or timezone.now().astimezone(dt.UTC).date()
    if day > today:
        raise ValueError(
            f"{day.isoformat()} is after today (UTC), {today.isoformat()}: no statement exists yet"
        )
    return day


@dataclass
class _Intent:
    intent: Intent
    amount: int | None
    currency: str
    moves_money: bool


def source_actions(source: str) -> list[str]:
    """Every served action whose adapter declares ``source`` as its ``evidence_source``, sorted.

    Raises:
        StatementRefused: no served action declares it (the known sources are named).
    """
    actions = evidence_source_actions(source)
    if not actions:
        known = ", ".join(sorted(evidence_sources())) or "none"
        raise StatementRefused(f"unknown statement source {source!r}; known sources: {known}")
    return list(actions)


def statement_actions(source: str) -> list[str]:
    """The actions of ``source`` whose effects are statement lines (``Adapter.statement_actions``),
    sorted: the intents a run matches lines to and reports missing.

    Raises:
        StatementRefused: an unknown source.
    """
    actions = source_actions(source)
    return sorted(action for action in actions if action in get_adapter(action).statement_actions())


def api_sources() -> list[str]:
    """The evidence sources whose adapter publishes a statement through an API (overrides
    ``Adapter.statement``), sorted: the ones the daily beat reconciles."""
    from operations.adapters.base import Adapter

    return sorted(
        slug
        for slug, adapter in evidence_sources().items()
        if type(adapter).statement is not Adapter.statement
    )


def fetch_and_run(*, source: str, day: dt.date, actor: str = "reconciler") -> StatementRun:
    """Fetch ``source``'s statement of ``day`` from its provider and reconcile it (``run``).
    A provider that cannot be read stores a run with its ``error`` and no lines.

    Raises:
        StatementRefused: an unknown source, or one without a statement API (upload a CSV).
    """
    actions = source_actions(source)
    adapter = get_adapter(actions[0])
    try:
        entries = adapter.statement(day, deadline_seconds=FETCH_DEADLINE_SECONDS)
    except StatementsUnsupported as exc:
        raise StatementRefused(
            f"{source} publishes no statement API: upload its statement as a CSV in the console"
        ) from exc
    except AdapterError as exc:
        return StatementRun.objects.create(
            source=source,
            statement_date=day,
            origin=StatementRun.Origin.API,
            actor=actor,
            finished_at=timezone.now(),
            error=f"the provider's statement could not be read: {exc}"[:2000],
        )
    return run(source=source, day=day, entries=entries, origin=StatementRun.Origin.API, actor=actor)


def run(
    *,
    source: str,
    day: dt.date,
    entries: Sequence[StatementEntry],
    origin: str,
    actor: str = "reconciler",
    filename: str = "",
    raw: Sequence[dict[str, Any]] | None = None,
) -> StatementRun:
    """Store ``entries`` (``source``'s statement of ``day``, amounts in minor units) as a run
    and reconcile them with the intents of the source's actions (the module docstring).

    Args:
        origin: ``StatementRun.Origin`` (``api`` or ``upload``).
        raw: per entry, what was read (a CSV row), kept on the line.

    Returns:
        the finished run with its counts; on a failure, a run holding only its ``error``.

    Raises:
        StatementRefused: an unknown source.
    """
    actions = statement_actions(source)
    try:
        with transaction.atomic():
            return _run(source, day, entries, origin, actor, filename, raw, actions)
    except Exception as exc:  # the run's writes are rolled back; the error is stored instead
        return StatementRun.objects.create(
            source=source,
            statement_date=day,
            origin=origin,
            actor=actor,
            filename=filename,
            finished_at=timezone.now(),
            error=f"the run failed and stored nothing: {exc!r}"[:2000],
        )


def _key_of(value: str) -> str:
    """Our key in a line's key column: the key itself, or an email's Message-ID carrying it."""
    return key_from_message_id(value) or value


def _money(intent: Intent) -> _Intent:
    args = intent.arguments if isinstance(intent.arguments, dict) else {}
    amount = args.get("amount")
    moves = isinstance(amount, int) and not isinstance(amount, bool)
    return _Intent(intent, amount if moves else None, str(args.get("currency") or "").upper(), moves)


def _run(
    source: str,
    day: dt.date,
    entries: Sequence[StatementEntry],
    origin: str,
    actor: str,
    filename: str,
    raw: Sequence[dict[str, Any]] | None,
    actions: list[str],
) -> StatementRun:
    statement_run = StatementRun.objects.create(
        source=source, statement_date=day, origin=origin, actor=actor, filename=filename
    )
    intents = Intent.objects.filter(action__in=actions)
    keys = {_key_of(e.idempotency_key) for e in entries if e.idempotency_key}
    references = {e.reference for e in entries if e.reference}
    provider_refs = {e.provider_reference for e in entries if e.provider_reference}
    by_key = {i.idempotency_key: i for i in intents.filter(idempotency_key__in=keys)}
    by_reference: dict[str, list[Intent]] = {}
    for candidate in intents.filter(reference__in=references).order_by("created_at"):
        by_reference.setdefault(candidate.reference, []).append(candidate)
    by_provider: dict[str, Intent] = {}
    for outcome in (
        Outcome.objects.filter(provider_reference__in=provider_refs, intent__action__in=actions)
        .select_related("intent")
        .order_by("created_at")
    ):
        by_provider.setdefault(outcome.provider_reference, outcome.intent)

    matched_ids: set[Any] = set()
    listed: set[str] = set()  # provider references already on an earlier line
    counts = {"matched": 0, "extra": 0, "mismatch": 0}
    for number, entry in enumerate(entries, start=1):
        read = raw[number - 1] if raw is not None else {}
        if entry.provider_reference and entry.provider_reference in listed:
            # One effect listed twice is not a second effect: kept as read, matched to nothing,
            # no finding (a CSV upload refuses such a file; a provider's API is taken as is).
            _store_line(statement_run, number, entry, {**read, "repeats_an_earlier_line": True}, None)
            continue
        listed.add(entry.provider_reference)
        intent: Intent | None = by_key.get(_key_of(entry.idempotency_key)) if entry.idempotency_key else None
        if intent is None and entry.provider_reference:
            # An effect already recorded on an intent is that intent's (``reconciliation.attribution``).
            intent = by_provider.get(entry.provider_reference)
        shared = ""
        if intent is None and entry.reference:
            candidates = by_reference.get(entry.reference, [])
            tenants = sorted({candidate.tenant for candidate in candidates})
            if len(tenants) > 1:
                # A business reference is the caller's: held by intents of several tenants it
                # names none of them (as for an event; C34). A person links the line.
                shared = f"intents of {len(tenants)} tenants have reference {entry.reference!r}: link it to the right one"
                candidates = []
            free = [i for i in candidates if i.id not in matched_ids]
            succeeded = [i for i in free if i.status == Intent.Status.SUCCEEDED]
            pick = succeeded or free or candidates
            intent = pick[0] if pick else None
        line = _store_line(statement_run, number, entry, read, intent)
        finding: dict[str, Any] | None = None
        why = _no_effect(intent, statement_run, day, line) if intent is not None else shared
        if intent is None or intent.id in matched_ids or why:
            counts["extra"] += 1
            if not why:
                why = "second line for one intent" if intent else "no intent has this effect"
            finding = {
                "fingerprint": f"extra:{source}:{entry.provider_reference}",
                "kind": ProviderFinding.Kind.EXTRA_AT_PROVIDER,
                "intent": intent,
                "detail": {"why": why},
            }
        else:
            assert intent is not None
            matched_ids.add(intent.id)
            money = _money(intent)
            # A line without an amount (or currency) proves none: only what it states is compared.
            if money.moves_money and (
                (entry.amount is not None and entry.amount != money.amount)
                or (entry.currency and entry.currency.upper() != money.currency)
            ):
                counts["mismatch"] += 1
                finding = {
                    "fingerprint": f"mismatch:{source}:{intent.id}:{entry.provider_reference}",
                    "kind": ProviderFinding.Kind.AMOUNT_MISMATCH,
                    "intent": intent,
                    "expected_amount": money.amount,
                    "expected_currency": money.currency,
                    "detail": {},
                }
            else:
                counts["matched"] += 1
        if finding is not None:
            found, created = ProviderFinding.objects.get_or_create(
                fingerprint=finding.pop("fingerprint"),
                defaults={
                    **finding,
                    "source": source,
                    "run": statement_run,
                    "line": line,
                    "provider_reference": entry.provider_reference,
                    "amount": entry.amount,
                    "currency": entry.currency,
                    "detail": {**finding["detail"], "statement_date": day.isoformat(), "line_no": number},
                },
            )
            if not created and found.run_id is None:
                # The same effect seen first as an orphan event: one finding, now with its line too.
                ProviderFinding.objects.filter(id=found.id, run__isnull=True).update(
                    run=statement_run,
                    line=line,
                    detail={**found.detail, "statement_date": day.isoformat(), "line_no": number},
                )

    # A line seen late (the provider's settlement window) closes an open "missing" of another day.
    ProviderFinding.objects.filter(
        source=source,
        kind=ProviderFinding.Kind.MISSING_AT_PROVIDER,
        state=ProviderFinding.State.OPEN,
        intent_id__in=matched_ids,
    ).update(
        state=ProviderFinding.State.RESOLVED,
        resolution="found_later",
        resolved_by="reconciler",
        note=f"its line is on the statement of {day.isoformat()} (run {statement_run.id})",
    )
    missing = _record_missing(statement_run, source, day, actions)
    statement_run.lines = len(entries)
    statement_run.matched = counts["matched"]
    statement_run.extra_at_provider = counts["extra"]
    statement_run.amount_mismatches = counts["mismatch"]
    statement_run.missing_at_provider = missing
    statement_run.finished_at = timezone.now()
    statement_run.save()
    audit_append_unattached(
        event="statement_reconciled",
        actor=actor,
        data={
            "run": statement_run.id,
            "source": source,
            "date": day.isoformat(),
            "origin": origin,
            "lines": statement_run.lines,
            "matched": statement_run.matched,
            "missing_at_provider": missing,
            "extra_at_provider": statement_run.extra_at_provider,
            "amount_mismatches": statement_run.amount_mismatches,
        },
    )
    return statement_run


def _store_line(
    statement_run: StatementRun,
    number: int,
    entry: StatementEntry,
    read: dict[str, Any],
    intent: Intent | None,
) -> StatementLine:
    return StatementLine.objects.create(
        run=statement_run,
        line_no=number,
        provider_reference=entry.provider_reference,
        idempotency_key=entry.idempotency_key,
        reference=entry.reference,
        amount=entry.amount,
        currency=entry.currency,
        raw=read,
        intent=intent,
    )


def _in_flight(intent: Intent) -> bool:
    """Sent and not yet ended: its own end records the effect (RUNNING, or READY to be sent again)."""
    return intent.status == Intent.Status.RUNNING or (
        intent.status == Intent.Status.READY and intent.attempt_count > 0
    )


def _no_effect(intent: Intent, statement_run: StatementRun, day: dt.date, line: StatementLine) -> str:
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
            by_key=bool(line.idempotency_key) and _key_of(line.idempotency_key) == intent.idempotency_key,
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


def _record_missing(statement_run: StatementRun, source: str, day: dt.date, actions: list[str]) -> int:
    """Findings for SUCCEEDED intents of ``actions`` whose effect outcome falls on ``day`` (UTC)
    and that no statement line of ``source`` was ever matched to; returns how many."""
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
    for intent in effect_at.annotate(
        effect_reference=Subquery(
            Outcome.objects.filter(intent=OuterRef("pk"))
            .exclude(provider_reference="")
            .order_by("created_at")
            .values("provider_reference")[:1]
        )
    ):
        money = _money(intent)
        missing += 1
        ProviderFinding.objects.get_or_create(
            fingerprint=f"missing:{source}:{day.isoformat()}:{intent.id}",
            defaults={
                "kind": ProviderFinding.Kind.MISSING_AT_PROVIDER,
                "source": source,
                "intent": intent,
                "run": statement_run,
                "provider_reference": intent.effect_reference or "",
                "expected_amount": money.amount,
                "expected_currency": money.currency,
                "detail": {"statement_date": day.isoformat()},
            },
        )
    return missing
