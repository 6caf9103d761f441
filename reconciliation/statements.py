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

Which sources and actions a statement has: ``reconciliation.statement_sources``; the verdict on
a line's intent and the missing intents: ``reconciliation.statement_verdicts``.

Lines are matched a batch at a time, with no savepoint per line
(``reconciliation.statement_matching``). A run of a provider's statement (``run``: the daily job,
the command) is one transaction: a failure (a line that cannot be stored, the database) stores
nothing but the run with its ``error``. An uploaded CSV statement is imported by a background
task, one transaction per batch of lines (``reconciliation.statement_uploads``). A finished run
is audited as ``statement_reconciled`` on the chain of events without an intent (source, date,
origin, counts, actor), in the transaction that finishes it (``run_finish``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from operations.adapters.base import StatementEntry
from operations.adapters.errors import AdapterError, StatementsUnsupported
from operations.adapters.registry import get_adapter
from operations.audit.trail import audit_append_unattached
from reconciliation.models import StatementRun
from reconciliation.statement_matching import BATCH_LINES, Counts, MatchState, match_batch
from reconciliation.statement_sources import StatementRefused, source_actions, statement_actions
from reconciliation.statement_verdicts import record_missing

#: Seconds a provider's statement fetch may take.
FETCH_DEADLINE_SECONDS = 30.0


def fetch_and_run(
    *, source: str, day: dt.date, actor: str = "reconciler", scheduled: bool = False
) -> StatementRun:
    """Fetch ``source``'s statement of ``day`` from its provider and reconcile it (``run``).
    A provider that cannot be read stores a run with its ``error`` and no lines.

    Args:
        scheduled: the beat's daily run: at most one finished run per source and day (the
            ``statement_run_one_scheduled`` constraint); a day already reconciled so returns
            that run without fetching, and a concurrent second run stores nothing and returns
            the first (issue 35, C27). An operator's run (False) is never limited.

    Raises:
        StatementRefused: an unknown source, or one without a statement API (upload a CSV).
    """
    if scheduled and (done := _scheduled_run(source, day)) is not None:
        return done
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
            scheduled=scheduled,
        )
    return run(
        source=source,
        day=day,
        entries=entries,
        origin=StatementRun.Origin.API,
        actor=actor,
        scheduled=scheduled,
    )


def _scheduled_run(source: str, day: dt.date) -> StatementRun | None:
    """The finished scheduled run of ``source`` and ``day``, if any."""
    return StatementRun.objects.filter(source=source, statement_date=day, scheduled=True, error="").first()


def run(
    *,
    source: str,
    day: dt.date,
    entries: Sequence[StatementEntry],
    origin: str,
    actor: str = "reconciler",
    filename: str = "",
    raw: Sequence[dict[str, Any]] | None = None,
    scheduled: bool = False,
) -> StatementRun:
    """Store ``entries`` (``source``'s statement of ``day``, amounts in minor units) as a run
    and reconcile them with the intents of the source's actions (the module docstring).

    Args:
        origin: ``StatementRun.Origin`` (``api`` or ``upload``).
        raw: per entry, what was read (a CSV row), kept on the line.
        scheduled: the beat's run (``fetch_and_run``): when another scheduled run of the source
            and day committed first, this one stores nothing and returns that one.

    Returns:
        the finished run with its counts; on a failure, a run holding only its ``error``.

    Raises:
        StatementRefused: an unknown source.
    """
    actions = statement_actions(source)
    try:
        with transaction.atomic():
            return _run(source, day, entries, origin, actor, filename, raw, actions, scheduled)
    except Exception as exc:  # the run's writes are rolled back; the error is stored instead
        if scheduled and isinstance(exc, IntegrityError) and (first := _scheduled_run(source, day)):
            return first  # another beat's run of this source and day won the unique constraint
        return StatementRun.objects.create(
            scheduled=scheduled,
            source=source,
            statement_date=day,
            origin=origin,
            actor=actor,
            filename=filename,
            finished_at=timezone.now(),
            error=f"the run failed and stored nothing: {exc!r}"[:2000],
        )


def _run(
    source: str,
    day: dt.date,
    entries: Sequence[StatementEntry],
    origin: str,
    actor: str,
    filename: str,
    raw: Sequence[dict[str, Any]] | None,
    actions: list[str],
    scheduled: bool = False,
) -> StatementRun:
    # The insert waits on the unique index while another scheduled run of this source and day
    # is uncommitted, then fails once it committed: one scheduled run per source and day.
    statement_run = StatementRun.objects.create(
        source=source, statement_date=day, origin=origin, actor=actor, filename=filename, scheduled=scheduled
    )
    state = MatchState()
    counts = Counts()
    for start in range(0, len(entries), BATCH_LINES):
        counts.add(
            match_batch(
                statement_run=statement_run,
                source=source,
                day=day,
                actions=actions,
                entries=entries[start : start + BATCH_LINES],
                first_number=start + 1,
                raw=raw[start : start + BATCH_LINES] if raw is not None else None,
                state=state,
            )
        )
    statement_run.lines = counts.lines
    statement_run.matched = counts.matched
    statement_run.extra_at_provider = counts.extra
    statement_run.amount_mismatches = counts.mismatch
    return run_finish(statement_run=statement_run, actions=actions)


def run_finish(*, statement_run: StatementRun, actions: list[str]) -> StatementRun:
    """Finish ``statement_run`` once every line is matched (its line counts set): record the
    intents missing at the provider, stamp ``finished_at`` and audit the run as
    ``statement_reconciled`` on the chain of events without an intent. Call inside the
    transaction that commits the finish."""
    day = statement_run.statement_date
    missing = record_missing(statement_run, statement_run.source, day, actions)
    statement_run.missing_at_provider = missing
    statement_run.finished_at = timezone.now()
    statement_run.save()
    audit_append_unattached(
        event="statement_reconciled",
        actor=statement_run.actor,
        data={
            "run": statement_run.id,
            "source": statement_run.source,
            "date": day.isoformat(),
            "origin": statement_run.origin,
            "lines": statement_run.lines,
            "matched": statement_run.matched,
            "missing_at_provider": missing,
            "extra_at_provider": statement_run.extra_at_provider,
            "amount_mismatches": statement_run.amount_mismatches,
        },
    )
    return statement_run
