"""A statement's lines matched to intents a batch at a time (the rules are
``reconciliation.statements``' module docstring; issue 39 item 10 made it set-based).

A batch reads the intents its lines name in three queries (by our key, by our business
reference, by the provider's reference), decides each line in memory, then writes the batch:
its lines in one ``INSERT`` and its findings in one ``INSERT ... ON CONFLICT (fingerprint) DO
NOTHING`` followed by one ``UPDATE`` that attaches the run and line to a finding an orphan event
made first. No savepoint per line: the one write a line may need on its own is its intent's
(an ``UNKNOWN`` intent ended ``SUCCEEDED``, late evidence for one that ended without effect),
through ``operations.services`` as before, and that line is stored first so the evidence can
name it.

What one line's verdict depends on from earlier lines (the intents already matched, the
provider references already listed) is a ``MatchState``: kept in memory by a run that goes on,
read back from the committed lines (``StatementLine.result``) by one that resumes.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import connection

from operations.adapters.base import StatementEntry
from operations.models import ENDED_WITHOUT_EFFECT, Intent, Outcome
from reconciliation.models import ProviderFinding, StatementLine, StatementRun
from reconciliation.statement_verdicts import intent_money, key_of, line_without_effect

#: Lines matched and written per batch (one ``INSERT`` of lines, one of findings).
BATCH_LINES = 1000

Result = StatementLine.Result

#: Statuses whose verdict may write evidence naming the line (``line_without_effect``): the
#: line is stored before it is judged.
_WRITES_EVIDENCE = (Intent.Status.UNKNOWN, *ENDED_WITHOUT_EFFECT)


@dataclass
class MatchState:
    """What earlier lines of a run decided: the intents matched (a second line for one is
    extra) and the provider references listed (a repeat is kept as read, matched to nothing)."""

    matched_ids: set[uuid.UUID] = field(default_factory=set)
    listed: set[str] = field(default_factory=set)

    @classmethod
    def of_run(cls, statement_run: StatementRun) -> MatchState:
        """The state after the committed lines of ``statement_run`` (a run resumed)."""
        lines = StatementLine.objects.filter(run=statement_run)
        matched = lines.filter(result__in=[Result.MATCHED, Result.AMOUNT_MISMATCH], intent__isnull=False)
        return cls(
            matched_ids=set(matched.values_list("intent_id", flat=True)),
            listed=set(lines.values_list("provider_reference", flat=True)),
        )


@dataclass
class Counts:
    """Lines stored, and how many were matched, extra, or an amount mismatch."""

    lines: int = 0
    matched: int = 0
    extra: int = 0
    mismatch: int = 0

    def add(self, other: Counts) -> None:
        """Add ``other``'s counts to these."""
        self.lines += other.lines
        self.matched += other.matched
        self.extra += other.extra
        self.mismatch += other.mismatch


@dataclass
class _Candidates:
    """The intents a batch's lines may name, read once per batch."""

    by_key: dict[str, Intent]
    by_reference: dict[str, list[Intent]]
    by_provider: dict[str, Intent]


def _candidates(entries: Sequence[StatementEntry], actions: list[str]) -> _Candidates:
    intents = Intent.objects.filter(action__in=actions)
    keys = {key_of(e.idempotency_key) for e in entries if e.idempotency_key}
    references = {e.reference for e in entries if e.reference}
    provider_refs = {e.provider_reference for e in entries if e.provider_reference}
    by_key = {i.idempotency_key: i for i in intents.filter(idempotency_key__in=keys)} if keys else {}
    by_reference: dict[str, list[Intent]] = {}
    if references:
        for candidate in intents.filter(reference__in=references).order_by("created_at"):
            by_reference.setdefault(candidate.reference, []).append(candidate)
    by_provider: dict[str, Intent] = {}
    if provider_refs:
        for outcome in (
            Outcome.objects.filter(provider_reference__in=provider_refs, intent__action__in=actions)
            .select_related("intent")
            .order_by("created_at")
        ):
            by_provider.setdefault(outcome.provider_reference, outcome.intent)
    return _Candidates(by_key, by_reference, by_provider)


def _intent_of(entry: StatementEntry, found: _Candidates, state: MatchState) -> tuple[Intent | None, str]:
    """The intent ``entry`` names (by key, then provider reference, then business reference),
    and why none when intents of several tenants share its reference."""
    intent = found.by_key.get(key_of(entry.idempotency_key)) if entry.idempotency_key else None
    if intent is None and entry.provider_reference:
        # An effect already recorded on an intent is that intent's (``reconciliation.attribution``).
        intent = found.by_provider.get(entry.provider_reference)
    if intent is not None or not entry.reference:
        return intent, ""
    candidates = found.by_reference.get(entry.reference, [])
    tenants = sorted({candidate.tenant for candidate in candidates})
    shared = ""
    if len(tenants) > 1:
        # A business reference is the caller's: held by intents of several tenants it names
        # none of them (as for an event; C34). A person links the line.
        shared = (
            f"intents of {len(tenants)} tenants have reference {entry.reference!r}: link it to the right one"
        )
        candidates = []
    free = [i for i in candidates if i.id not in state.matched_ids]
    succeeded = [i for i in free if i.status == Intent.Status.SUCCEEDED]
    pick = succeeded or free or candidates
    return (pick[0] if pick else None), shared


def match_batch(
    *,
    statement_run: StatementRun,
    source: str,
    day: dt.date,
    actions: list[str],
    entries: Sequence[StatementEntry],
    first_number: int,
    raw: Sequence[dict[str, Any]] | None,
    state: MatchState,
) -> Counts:
    """Store ``entries`` as lines ``first_number``.. of ``statement_run`` and match them to the
    intents of ``actions`` (the rules: ``reconciliation.statements``); updates ``state``.
    Call inside the caller's transaction: the batch's writes commit together.

    Args:
        raw: per entry, what was read (a CSV row), kept on the line.

    Returns:
        the batch's counts (the run's own counts are the caller's to add them to).
    """
    found = _candidates(entries, actions)
    counts = Counts(lines=len(entries))
    new_lines: list[StatementLine] = []
    judged_after_storing: list[StatementLine] = []
    findings: list[ProviderFinding] = []
    matched_now: list[uuid.UUID] = []
    for offset, entry in enumerate(entries):
        number = first_number + offset
        read = raw[offset] if raw is not None else {}
        if entry.provider_reference and entry.provider_reference in state.listed:
            # One effect listed twice is not a second effect: kept as read, matched to nothing,
            # no finding (a CSV upload refuses such a file; a provider's API is taken as is).
            read = {**read, "repeats_an_earlier_line": True}
            new_lines.append(_line(statement_run, number, entry, read, None, Result.REPEAT))
            continue
        state.listed.add(entry.provider_reference)
        intent, shared = _intent_of(entry, found, state)
        line = _line(statement_run, number, entry, read, intent, "")
        if intent is not None and intent.status in _WRITES_EVIDENCE:
            line.save()  # the evidence the verdict may write names the line
            judged_after_storing.append(line)
        else:
            new_lines.append(line)
        why = line_without_effect(intent, statement_run, day, line) if intent is not None else shared
        finding: ProviderFinding | None = None
        if intent is None or intent.id in state.matched_ids or why:
            line.result = Result.EXTRA
            counts.extra += 1
            if not why:
                why = "second line for one intent" if intent else "no intent has this effect"
            finding = ProviderFinding(
                fingerprint=f"extra:{source}:{entry.provider_reference}",
                kind=ProviderFinding.Kind.EXTRA_AT_PROVIDER,
                intent=intent,
                detail={"why": why},
            )
        else:
            state.matched_ids.add(intent.id)
            matched_now.append(intent.id)
            money = intent_money(intent)
            # A line without an amount (or currency) proves none: only what it states is compared.
            if money.moves_money and (
                (entry.amount is not None and entry.amount != money.amount)
                or (entry.currency and entry.currency.upper() != money.currency)
            ):
                line.result = Result.AMOUNT_MISMATCH
                counts.mismatch += 1
                finding = ProviderFinding(
                    fingerprint=f"mismatch:{source}:{intent.id}:{entry.provider_reference}",
                    kind=ProviderFinding.Kind.AMOUNT_MISMATCH,
                    intent=intent,
                    expected_amount=money.amount,
                    expected_currency=money.currency,
                    detail={},
                )
            else:
                line.result = Result.MATCHED
                counts.matched += 1
        if finding is not None:
            finding.source = source
            finding.run = statement_run
            finding.line = line
            finding.provider_reference = entry.provider_reference
            finding.amount = entry.amount
            finding.currency = entry.currency
            finding.detail = {**finding.detail, "statement_date": day.isoformat(), "line_no": number}
            findings.append(finding)
    StatementLine.objects.bulk_create(new_lines)
    for stored in judged_after_storing:  # written in this transaction, so still as inserted to others
        StatementLine.objects.filter(id=stored.id).update(result=stored.result)
    _store_findings(findings, statement_run, day)
    _close_found_later(source, day, statement_run, matched_now)
    return counts


def _line(
    statement_run: StatementRun,
    number: int,
    entry: StatementEntry,
    read: dict[str, Any],
    intent: Intent | None,
    result: str,
) -> StatementLine:
    return StatementLine(
        run=statement_run,
        line_no=number,
        provider_reference=entry.provider_reference,
        idempotency_key=entry.idempotency_key,
        reference=entry.reference,
        amount=entry.amount,
        currency=entry.currency,
        raw=read,
        intent=intent,
        result=result,
    )


_ATTACH = f"""
    UPDATE {ProviderFinding._meta.db_table} AS f
    SET run_id = %s, line_id = v.line_id,
        detail = f.detail || jsonb_build_object('statement_date', %s::text, 'line_no', v.line_no)
    FROM unnest(%s::text[], %s::bigint[], %s::integer[]) AS v(fingerprint, line_id, line_no)
    WHERE f.fingerprint = v.fingerprint AND f.run_id IS NULL
"""


def _store_findings(findings: list[ProviderFinding], statement_run: StatementRun, day: dt.date) -> None:
    """Each finding once per fingerprint (running a day again makes no second one); one that an
    orphan event of the same effect made first gets this run and line attached (it keeps its
    kind): one stray effect is one finding."""
    if not findings:
        return
    for finding in findings:
        finding.line_id = finding.line.id if finding.line is not None else None
    ProviderFinding.objects.bulk_create(findings, ignore_conflicts=True)
    with connection.cursor() as cursor:
        cursor.execute(
            _ATTACH,
            [
                statement_run.id,
                day.isoformat(),
                [f.fingerprint for f in findings],
                [f.line_id for f in findings],
                [f.detail["line_no"] for f in findings],
            ],
        )


def _close_found_later(
    source: str, day: dt.date, statement_run: StatementRun, matched: list[uuid.UUID]
) -> None:
    """A line seen late (the provider's settlement window) closes an open "missing" of another day."""
    if not matched:
        return
    ProviderFinding.objects.filter(
        source=source,
        kind=ProviderFinding.Kind.MISSING_AT_PROVIDER,
        state=ProviderFinding.State.OPEN,
        intent_id__in=matched,
    ).update(
        state=ProviderFinding.State.RESOLVED,
        resolution="found_later",
        resolved_by="reconciler",
        note=f"its line is on the statement of {day.isoformat()} (run {statement_run.id})",
    )
