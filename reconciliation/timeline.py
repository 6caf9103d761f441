"""An intent's timeline: every step once, and runs of alike lookups as one line (issue 16 item 6).

The ledger records one step in several places: a worker's claim is an audit event and an attempt
row, the end of an attempt is an audit event and the attempt's close, an operator's decision is
a resolution (evidence of what they were shown), an audit event and, for ``confirmed``, an
outcome; a lookup that found the effect is evidence, an audit event and an outcome. Listing
each record on its own repeated the step two or three times.

The audit event is authoritative (it is the hash chain, and it carries the transition);
the other records of the same step are merged into it (``merge_steps``): their titles are kept
as ``also``, their notes when they say something else, and the fields of their detail the audit
event does not have (a field both have with different values is kept under ``<kind>.<field>``).
Records of the same step are matched by ``keys`` (the attempt number, the fence, the provider
reference, the decider and their reason), nearest in time and no more than ``SAME_STEP_SECONDS``
apart: they are written in one transaction.

Then consecutive lookups with the same result are one line (``group_lookups``): "5 lookups,
inconclusive, 23:29:27–23:29:52", which opens on each of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model

from operations.archive.selectors import archived_rows
from operations.models import Approval, Attempt, AuditEvent, Intent, Outcome
from reconciliation.models import Evidence, ProviderEvent

#: Records of one step are written in one transaction: further apart, they are two steps.
SAME_STEP_SECONDS = 5.0


@dataclass(frozen=True)
class TimelineEntry:
    """One step of an intent's timeline.

    ``kind``: ``audit``, ``approval``, ``attempt``, ``outcome``, ``evidence`` or
    ``provider_event`` (a provider's signed event, issue 19) (the source of the
    entry; after merging, the authoritative one). ``keys`` say which step it is (for merging);
    ``group`` is set on lookups (``lookup:<result>``) for ``group_lookups``. ``also``: the titles
    of the other records merged into this entry; ``sources``: the kinds merged into it.
    """

    at: datetime
    kind: str
    title: str
    actor: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    keys: tuple[str, ...] = ()
    group: str = ""
    also: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()

    @property
    def is_run(self) -> bool:
        return False


@dataclass(frozen=True)
class LookupRun:
    """Two or more consecutive lookups with the same result, shown as one line that opens on each."""

    entries: tuple[TimelineEntry, ...]
    kind: str = "lookups"

    @property
    def is_run(self) -> bool:
        return True

    @property
    def at(self) -> datetime:
        return self.entries[0].at

    @property
    def until(self) -> datetime:
        return self.entries[-1].at

    @property
    def result(self) -> str:
        return self.entries[0].group.removeprefix("lookup:")

    @property
    def actors(self) -> str:
        """Who looked, in order of first appearance (``reconciler``, ``user:otto``)."""
        return ", ".join(dict.fromkeys(entry.actor for entry in self.entries if entry.actor))

    @property
    def title(self) -> str:
        """``5 lookups, inconclusive, 23:29:27–23:29:52`` (UTC, to the second; ``not_found_yet``
        written ``not found yet``)."""
        words = self.result.replace("_", " ")  # as the UNKNOWN page's lookup groups say it
        return f"{len(self.entries)} lookups, {words}, {self.at:%H:%M:%S}–{self.until:%H:%M:%S}"


Line = TimelineEntry | LookupRun


def merge_steps(entries: Iterable[TimelineEntry]) -> list[TimelineEntry]:
    """Merge the records of one step into its audit event, oldest first.

    Every non-audit entry that shares a key with an audit event no more than
    ``SAME_STEP_SECONDS`` away is merged into the nearest such event (at most one record of each
    kind per event); the rest stay as they are. Pure: no database.
    """
    ordered = sorted(entries, key=lambda entry: entry.at)
    audits = [entry for entry in ordered if entry.kind == "audit"]
    merged: dict[int, TimelineEntry] = {id(entry): entry for entry in audits}
    taken: set[tuple[int, str]] = set()
    kept: list[TimelineEntry] = []
    for entry in ordered:
        if entry.kind == "audit":
            continue
        candidates = [
            audit
            for audit in audits
            if set(audit.keys) & set(entry.keys)
            and (id(audit), entry.kind) not in taken
            and abs((audit.at - entry.at).total_seconds()) <= SAME_STEP_SECONDS
        ]
        if not candidates or not entry.keys:
            kept.append(entry)
            continue
        audit = min(candidates, key=lambda candidate: abs((candidate.at - entry.at).total_seconds()))
        taken.add((id(audit), entry.kind))
        merged[id(audit)] = _absorb(merged[id(audit)], entry)
    return sorted([merged[id(audit)] for audit in audits] + kept, key=lambda entry: entry.at)


def _absorb(into: TimelineEntry, other: TimelineEntry) -> TimelineEntry:
    """``into`` with what only ``other`` says: its title (as ``also``), a different note, and the
    fields of its detail ``into`` lacks (a different value under ``<kind>.<field>``)."""
    detail = dict(into.detail)
    for name, value in other.detail.items():
        if name not in detail:
            detail[name] = value
        elif detail[name] != value:
            detail[f"{other.kind}.{name}"] = value
    note = into.note
    if other.note and other.note not in note:
        note = f"{note} · {other.note}" if note else other.note
    return replace(
        into,
        detail=detail,
        note=note,
        also=(*into.also, other.title),
        sources=(*into.sources, other.kind),
        keys=(*into.keys, *other.keys),
    )


def group_lookups(entries: Sequence[TimelineEntry]) -> list[Line]:
    """Consecutive entries with the same ``group`` (lookups with one result), two or more, as
    one ``LookupRun``; everything else as it is. Pure: no database."""
    lines: list[Line] = []
    run: list[TimelineEntry] = []

    def flush() -> None:
        if len(run) >= 2:
            lines.append(LookupRun(tuple(run)))
        else:
            lines.extend(run)
        run.clear()

    for entry in entries:
        if run and (not entry.group or entry.group != run[0].group):
            flush()
        if entry.group:
            run.append(entry)
        else:
            lines.append(entry)
    flush()
    return lines


def _audit_keys(event: AuditEvent) -> tuple[str, ...]:
    data = event.data or {}
    keys: list[str] = []
    if event.event == "claimed" and "attempt_no" in data:
        keys.append(f"attempt-start:{data['attempt_no']}")
    elif "fence" in data and (
        event.from_status == Intent.Status.RUNNING or event.event == "stale_write_refused"
    ):
        keys.append(f"attempt-end:{data['fence']}")
    if event.event in ("succeeded", "outcome_found") and data.get("provider_reference"):
        keys.append(f"outcome:{data['provider_reference']}")
    if event.event in ("outcome_found", "outcome_absent"):
        keys.append(f"lookup:{event.actor}:{event.event}")
    if event.event in ("approved", "approval_recorded", "rejected"):
        keys.append(f"approval:{event.actor}")
    if event.actor.startswith("user:"):
        keys.append(f"decision:{event.actor}:{event.reason}")
    return tuple(keys)


def _evidence_entry(evidence: Evidence) -> TimelineEntry:
    detail = {"provider_references": evidence.provider_references, **(evidence.detail or {})}
    keys: tuple[str, ...] = ()
    group = ""
    if evidence.kind == Evidence.Kind.RESOLUTION:
        keys = (f"decision:{evidence.actor}:{(evidence.detail or {}).get('reason', '')}",)
    elif evidence.kind == Evidence.Kind.LOOKUP:
        group = f"lookup:{evidence.result}"
        if evidence.result == "found":
            keys = (f"lookup:{evidence.actor}:outcome_found",)
        elif evidence.result == "absent":
            keys = (f"lookup:{evidence.actor}:outcome_absent",)
    return TimelineEntry(
        evidence.created_at,
        "evidence",
        f"{evidence.get_kind_display()}: {evidence.result}",
        evidence.actor,
        detail,
        keys=keys,
        group=group,
    )


def timeline_records(intent: Intent) -> list[TimelineEntry]:
    """Every audit event, approval, attempt (start and finish), outcome, piece of evidence and
    provider event of ``intent``, one entry each, oldest first (before merging and grouping)."""
    return _entries_of(
        events=intent.audit_events.order_by("seq"),
        approvals=(
            (approval, approval.approver.get_username())
            for approval in intent.approvals.select_related("approver").order_by("created_at")
        ),
        attempts=intent.attempts.order_by("attempt_no"),
        outcomes=intent.outcomes.order_by("created_at"),
        evidence=Evidence.objects.filter(intent=intent).order_by("created_at", "id"),
        provider_events=ProviderEvent.objects.filter(intent=intent).order_by("received_at", "id"),
    )


def _entries_of(
    *,
    events: Iterable[AuditEvent],
    approvals: Iterable[tuple[Approval, str]],
    attempts: Iterable[Attempt],
    outcomes: Iterable[Outcome],
    evidence: Iterable[Evidence],
    provider_events: Iterable[ProviderEvent],
) -> list[TimelineEntry]:
    """One entry per record given (approvals with their approver's username), oldest first:
    the live intent's rows (``timeline_records``) or an archived record's (``record_timeline``)."""
    entries: list[TimelineEntry] = []
    for event in events:
        moved = f"{event.from_status or '·'} → {event.to_status}" if event.to_status else ""
        entries.append(
            TimelineEntry(
                event.created_at,
                "audit",
                f"{event.event} {moved}".strip(),
                event.actor,
                event.data,
                event.reason,
                keys=_audit_keys(event),
            )
        )
    for approval, username in approvals:
        entries.append(
            TimelineEntry(
                approval.created_at,
                "approval",
                f"{approval.decision} by {username}",
                f"user:{username}",
                {"request_hash": approval.request_hash, "expires_at": approval.expires_at.isoformat()},
                approval.reason,
                keys=(f"approval:user:{username}",),
            )
        )
    for attempt in attempts:
        entries.append(
            TimelineEntry(
                attempt.started_at,
                "attempt",
                f"attempt {attempt.attempt_no} started, fence {attempt.fence}",
                f"worker:{attempt.worker}",
                keys=(f"attempt-start:{attempt.attempt_no}",),
            )
        )
        if attempt.finished_at:
            entries.append(
                TimelineEntry(
                    attempt.finished_at,
                    "attempt",
                    f"attempt {attempt.attempt_no} (fence {attempt.fence}) {attempt.result}",
                    f"worker:{attempt.worker}",
                    attempt.detail,
                    attempt.error,
                    keys=(f"attempt-end:{attempt.fence}",),
                )
            )
    for outcome in outcomes:
        entries.append(
            TimelineEntry(
                outcome.created_at,
                "outcome",
                f"outcome from {outcome.source}: {outcome.provider_reference or '(no reference)'}",
                outcome.source,
                outcome.detail,
                keys=(f"outcome:{outcome.provider_reference}",) if outcome.provider_reference else (),
            )
        )
    entries.extend(_evidence_entry(piece) for piece in evidence)
    entries.extend(_provider_event_entry(event) for event in provider_events)
    return sorted(entries, key=lambda entry: entry.at)


def record_timeline(record: dict[str, Any]) -> list[Line]:
    """The timeline of an archived intent, from its record as read from its archive file
    (docs/reference/archive-format.md): the same lines as ``intent_timeline`` gives a live
    intent. An approver is named by username when the account still exists, else ``#<id>``."""
    approvals = sorted(archived_rows(record, Approval), key=lambda approval: approval.created_at)
    users = dict(
        get_user_model()
        .objects.filter(pk__in={approval.approver_id for approval in approvals})
        .values_list("pk", "username")
    )
    entries = _entries_of(
        events=archived_rows(record, AuditEvent),
        approvals=(
            (approval, users.get(approval.approver_id, f"#{approval.approver_id}")) for approval in approvals
        ),
        attempts=archived_rows(record, Attempt),
        outcomes=archived_rows(record, Outcome),
        evidence=archived_rows(record, Evidence),
        provider_events=archived_rows(record, ProviderEvent),
    )
    return group_lookups(merge_steps(entries))


def body_removed_note() -> str:
    """What a page says of a provider event whose body the pruning removed (issue 36):
    ``body removed after 30 days (retention)``, by ``EFFECT_LEDGER["RAW_BODY_RETENTION_DAYS"]``."""
    days = float(settings.EFFECT_LEDGER["RAW_BODY_RETENTION_DAYS"])
    return f"body removed after {days:g} days (retention)"


def _provider_event_entry(event: ProviderEvent) -> TimelineEntry:
    """A provider's signed event, when it arrived; never merged (it is the provider's record,
    not the ledger's), so every event shows once on its own line."""
    detail: dict[str, Any] = {
        "event_id": event.event_id,
        "occurred_at": event.occurred_at.isoformat() if event.occurred_at else None,
        "provider_reference": event.provider_reference,
        **(event.detail or {}),
    }
    if event.body_removed_at is not None:
        detail["body"] = body_removed_note()
        detail["body_sha256"] = event.body_sha256 or "(none: the body could not be canonicalised)"
    return TimelineEntry(
        event.received_at,
        "provider_event",
        f"provider event {event.event_type}: {event.get_result_display().lower()}",
        f"provider:{event.source}",
        detail,
    )


def intent_timeline(intent: Intent) -> list[Line]:
    """``intent``'s timeline for a page: every step once (``merge_steps``), consecutive lookups
    with one result as one line (``group_lookups``), oldest first."""
    return group_lookups(merge_steps(timeline_records(intent)))
