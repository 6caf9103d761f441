"""Two-way statement reconciliation (issue 19, case C21): the run service on lines given in
memory (the matching rules), and the management command."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from operations.adapters.base import StatementEntry
from operations.models import Intent, Outcome
from reconciliation.models import ProviderFinding, StatementLine, StatementRun
from reconciliation.statement_sources import StatementRefused, source_actions
from reconciliation.statements import run
from tests.factories import charge_arguments, submit

pytestmark = pytest.mark.django_db

SOURCE = "sandbox-payments"


def succeeded(
    reference: str, provider_reference: str, *, amount: int = 4990, at: dt.datetime | None = None
) -> Intent:
    """A SUCCEEDED charge with its outcome (written directly: only matching is under test)."""
    intent = submit(arguments=charge_arguments(amount, reference=reference), reference=reference)
    Intent.objects.filter(id=intent.id).update(status=Intent.Status.SUCCEEDED)
    outcome = Outcome.objects.create(
        intent=intent, source=Outcome.Source.PROVIDER, provider_reference=provider_reference
    )
    if at is not None:
        Outcome.objects.filter(id=outcome.id).update(created_at=at)
    intent.refresh_from_db()
    return intent


def line(intent: Intent, provider_reference: str, **changes: Any) -> StatementEntry:
    fields = {
        "provider_reference": provider_reference,
        "idempotency_key": intent.idempotency_key,
        "reference": intent.reference,
        "amount": intent.arguments["amount"],
        "currency": "EUR",
        **changes,
    }
    return StatementEntry(**fields)


def kinds() -> list[str]:
    return sorted(ProviderFinding.objects.values_list("kind", flat=True))


def test_c21_sources_of_the_sandbox() -> None:
    assert source_actions("sandbox-payments") == ["payments.charge", "payments.refund"]
    assert source_actions("sandbox-email") == ["email.send"]
    with pytest.raises(StatementRefused, match="unknown statement source 'nope'"):
        source_actions("nope")


def test_c21_extra_missing_and_mismatch_are_exactly_three_findings_and_a_rerun_adds_none() -> None:
    today = timezone.now().date()
    kept = succeeded("order-1", "ch_1")
    omitted = succeeded("order-2", "ch_2")
    changed = succeeded("order-3", "ch_3", amount=1000)
    entries = [
        line(kept, "ch_1"),
        line(changed, "ch_3", amount=999),
        StatementEntry(
            provider_reference="ch_x",
            idempotency_key="direct-key",
            reference="nobody",
            amount=500,
            currency="EUR",
        ),
    ]
    first = run(source=SOURCE, day=today, entries=entries, origin=StatementRun.Origin.API)
    assert first.error == ""
    assert (
        first.lines,
        first.matched,
        first.missing_at_provider,
        first.extra_at_provider,
        first.amount_mismatches,
    ) == (3, 1, 1, 1, 1)
    assert kinds() == ["amount_mismatch", "extra_at_provider", "missing_at_provider"]
    missing = ProviderFinding.objects.get(kind="missing_at_provider")
    assert missing.intent_id == omitted.id and missing.provider_reference == "ch_2"
    assert missing.fingerprint == f"missing:{SOURCE}:{today.isoformat()}:{omitted.id}"
    mismatch = ProviderFinding.objects.get(kind="amount_mismatch")
    assert (mismatch.intent_id, mismatch.amount, mismatch.expected_amount) == (changed.id, 999, 1000)
    extra = ProviderFinding.objects.get(kind="extra_at_provider")
    assert extra.intent_id is None and extra.fingerprint == f"extra:{SOURCE}:ch_x"

    again = run(source=SOURCE, day=today, entries=entries, origin=StatementRun.Origin.API)
    assert again.error == "" and ProviderFinding.objects.count() == 3


def test_c21_matching_by_reference_then_provider_reference_and_a_second_line_is_extra() -> None:
    today = timezone.now().date()
    by_ref = succeeded("order-r", "ch_r")
    by_provider = succeeded("order-p", "ch_p")
    entries = [
        line(by_ref, "ch_r", idempotency_key=""),
        line(by_provider, "ch_p", idempotency_key="", reference=""),
        line(by_provider, "ch_p2", idempotency_key="", reference="order-p"),
    ]
    result = run(source=SOURCE, day=today, entries=entries, origin=StatementRun.Origin.API)
    assert (result.matched, result.extra_at_provider, result.missing_at_provider) == (2, 1, 0)
    finding = ProviderFinding.objects.get()
    assert finding.kind == "extra_at_provider" and finding.intent_id == by_provider.id
    assert list(
        StatementLine.objects.filter(run=result).order_by("line_no").values_list("intent_id", flat=True)
    ) == [
        by_ref.id,
        by_provider.id,
        by_provider.id,
    ]


def test_c21_missing_counts_the_outcomes_utc_day_and_a_neighbouring_days_line_clears_it() -> None:
    day = dt.date(2026, 3, 10)
    late = succeeded("order-late", "ch_late", at=dt.datetime(2026, 3, 11, 0, 0, 2, tzinfo=dt.UTC))
    inside = succeeded("order-in", "ch_in", at=dt.datetime(2026, 3, 10, 12, 0, tzinfo=dt.UTC))
    # The provider stamped ch_late before midnight: it is on the 10th's statement.
    run(source=SOURCE, day=day, entries=[line(late, "ch_late"), line(inside, "ch_in")], origin="api")
    following = run(source=SOURCE, day=dt.date(2026, 3, 11), entries=[], origin="api")
    assert following.missing_at_provider == 0 and not ProviderFinding.objects.exists()
    previous = run(source=SOURCE, day=dt.date(2026, 3, 9), entries=[], origin="api")
    assert previous.missing_at_provider == 0


def test_c21_a_failing_run_stores_nothing_but_its_error(monkeypatch: pytest.MonkeyPatch) -> None:
    omitted = succeeded("order-2", "ch_2")
    import reconciliation.statements as statements

    def broken(*args: Any) -> int:
        raise RuntimeError("database went away")

    monkeypatch.setattr(statements, "record_missing", broken)
    result = run(
        source=SOURCE, day=timezone.now().date(), entries=[line(omitted, "ch_9", amount=1)], origin="api"
    )
    assert "database went away" in result.error
    assert StatementRun.objects.get() == result and result.lines == 0
    assert not StatementLine.objects.exists() and not ProviderFinding.objects.exists()


def test_c21_reconcile_statement_command_refuses_clearly() -> None:
    with pytest.raises(CommandError, match="not a date"):
        call_command("reconcile_statement", "--adapter", SOURCE, "--date", "2026-13-01")
    with pytest.raises(CommandError, match="unknown statement source 'nope'"):
        call_command("reconcile_statement", "--adapter", "nope", "--date", "2026-01-01")
    assert not StatementRun.objects.exists()


def test_c21_the_daily_job_reconciles_yesterday_of_every_source_with_an_api(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import reconciliation.tasks as tasks
    from console.celery import app
    from operations.models import PeriodicJobRun

    asked: list[tuple[str, dt.date]] = []

    def fake(*, source: str, day: dt.date, scheduled: bool = False) -> StatementRun:
        assert scheduled  # the beat's run: one per source and day (issue 35)
        asked.append((source, day))
        return StatementRun.objects.create(source=source, statement_date=day, origin="api", scheduled=True)

    monkeypatch.setattr(tasks, "fetch_and_run", fake)
    tasks.reconcile_statements()
    yesterday = (timezone.now() - dt.timedelta(days=1)).astimezone(dt.UTC).date()
    assert asked == [(s, yesterday) for s in ("sandbox-email", "sandbox-payments", "sandbox-reservations")]
    assert PeriodicJobRun.objects.get(name="reconciliation.reconcile_statements").last_error == ""
    assert app.conf.beat_schedule["reconcile-statements"]["task"] == "reconciliation.reconcile_statements"


def test_c21_reconcile_statement_refuses_a_source_without_an_api(settings: Any) -> None:
    settings.EFFECT_LEDGER_GENERIC_HTTP = {
        "crm.note": {"url": "http://127.0.0.1:9/notes", "statements": {"source": "crm"}}
    }
    with pytest.raises(CommandError, match="crm publishes no statement API: upload its statement as a CSV"):
        call_command("reconcile_statement", "--adapter", "crm", "--date", "2026-01-01")
    assert not StatementRun.objects.exists()


def test_c21_a_reservation_cancellation_is_no_statement_line() -> None:
    from reconciliation.statement_sources import statement_actions

    assert statement_actions("sandbox-reservations") == ["reservations.create"]
    assert statement_actions(SOURCE) == ["payments.charge", "payments.refund"]


def test_c21_a_line_seen_late_resolves_the_open_missing_finding() -> None:
    day = dt.date(2026, 3, 10)
    late = succeeded("order-late", "ch_late", at=dt.datetime(2026, 3, 10, 23, 0, tzinfo=dt.UTC))
    run(source=SOURCE, day=day, entries=[], origin="api")
    finding = ProviderFinding.objects.get(kind="missing_at_provider")
    assert finding.state == "open"
    # the provider settled it a day late: it is on the next day's statement
    run(source=SOURCE, day=dt.date(2026, 3, 11), entries=[line(late, "ch_late")], origin="api")
    finding.refresh_from_db()
    assert (finding.state, finding.resolution, finding.resolved_by) == (
        "resolved",
        "found_later",
        "reconciler",
    )
    assert ProviderFinding.objects.count() == 1


def test_c21_a_provider_that_cannot_be_read_leaves_a_run_with_its_error(settings: Any) -> None:
    settings.SANDBOX_PROVIDER_URL = "http://127.0.0.1:9"  # nothing listens there
    with pytest.raises(CommandError, match="the provider's statement could not be read"):
        call_command("reconcile_statement", "--adapter", SOURCE, "--date", "2026-01-01")
    failed = StatementRun.objects.get()
    assert failed.lines == 0 and "could not be read" in failed.error
    assert not ProviderFinding.objects.exists()


def test_c21_an_email_line_is_matched_by_the_key_in_its_message_id() -> None:
    email = submit(action="email.send", arguments={"to": "a@example.com", "subject": "s", "body": "b"})
    Intent.objects.filter(id=email.id).update(status=Intent.Status.SUCCEEDED)
    Outcome.objects.create(intent=email, source=Outcome.Source.PROVIDER, provider_reference="em_1")
    entry = StatementEntry("em_other", f"<{email.idempotency_key}@effect-ledger.local>", "", None, "")
    result = run(source="sandbox-email", day=timezone.now().date(), entries=[entry], origin="api")
    assert (result.matched, result.missing_at_provider, result.extra_at_provider) == (1, 0, 0)
    assert StatementLine.objects.get().intent_id == email.id


def in_status(reference: str, status: str, *, attempts: int = 0) -> Intent:
    """A charge put in ``status`` directly (with ``attempts`` sent), no outcome: only matching is under test."""
    intent = submit(arguments=charge_arguments(4990, reference=reference), reference=reference)
    Intent.objects.filter(id=intent.id).update(status=status, attempt_count=attempts)
    intent.refresh_from_db()
    return intent


def test_c21_a_line_for_an_intent_without_an_effect_is_decided_by_its_status() -> None:
    from operations.models import AuditEvent

    unknown = in_status("o-unknown", Intent.Status.UNKNOWN, attempts=1)
    running = in_status("o-running", Intent.Status.RUNNING, attempts=1)
    resent = in_status("o-ready-sent", Intent.Status.READY, attempts=1)
    failed = in_status("o-failed", Intent.Status.FAILED, attempts=1)
    never = in_status("o-ready-never", Intent.Status.READY)
    entries = [
        line(unknown, "ch_u"),
        line(running, "ch_r"),
        line(resent, "ch_s"),
        line(failed, "ch_f"),
        line(never, "ch_n"),
    ]
    result = run(source=SOURCE, day=dt.date(2026, 3, 10), entries=entries, origin="api")
    assert result.error == ""
    # The FAILED intent was sent: its line is late evidence (issue 38), matched, not extra.
    assert (result.matched, result.extra_at_provider, result.amount_mismatches) == (4, 1, 0)
    unknown.refresh_from_db()
    assert unknown.status == Intent.Status.SUCCEEDED
    outcome = Outcome.objects.get(intent=unknown)
    assert (outcome.source, outcome.provider_reference) == (Outcome.Source.RECONCILER, "ch_u")
    assert outcome.detail == {"statement_run": result.id, "line_no": 1}
    running.refresh_from_db()
    resent.refresh_from_db()
    assert (running.status, resent.status) == (Intent.Status.RUNNING, Intent.Status.READY)
    extra = {f.provider_reference: f for f in ProviderFinding.objects.filter(kind="extra_at_provider")}
    assert sorted(extra) == ["ch_n"]
    assert "is READY: the ledger holds no effect for it" in extra["ch_n"].detail["why"]
    failed.refresh_from_db()
    assert failed.status == Intent.Status.SUCCEEDED
    late = ProviderFinding.objects.get(kind="effect_after_ending")
    assert (late.intent_id, late.provider_reference, late.state) == (failed.id, "ch_f", "open")
    found = AuditEvent.objects.get(intent_id=unknown.id, event="outcome_found")
    assert (found.actor, found.to_status) == ("reconciler", "SUCCEEDED")
    assert found.reason == f"on the provider's statement of 2026-03-10 (run {result.id})"


def test_c21_a_line_without_an_amount_is_no_amount_mismatch() -> None:
    no_amount = succeeded("order-a", "ch_a")
    no_currency = succeeded("order-b", "ch_b")
    entries = [line(no_amount, "ch_a", amount=None, currency=""), line(no_currency, "ch_b", currency="")]
    result = run(source=SOURCE, day=timezone.now().date(), entries=entries, origin="api")
    assert (result.matched, result.amount_mismatches) == (2, 0)
    assert not ProviderFinding.objects.exists()


def test_c21_one_stray_effect_is_one_finding_from_its_event_and_its_line() -> None:
    from reconciliation.events import process_provider_event
    from reconciliation.models import ProviderEvent

    payload = {
        "id": "evt_stray",
        "type": "charge.succeeded",
        "created": "2026-03-10T12:00:00Z",
        "data": {
            "object": "charge",
            "id": "ch_stray",
            "idempotency_key": "made-outside",
            "reference": "",
            "amount": 700,
            "currency": "EUR",
            "status": "succeeded",
        },
    }
    event = ProviderEvent.objects.create(
        source=SOURCE,
        event_id="evt_stray",
        event_type="charge.succeeded",
        payload=payload,
        idempotency_key="made-outside",
        provider_reference="ch_stray",
        amount=700,
        currency="EUR",
    )
    assert process_provider_event(event_pk=event.id) == "orphan"
    entry = StatementEntry("ch_stray", "made-outside", "", 700, "EUR")
    result = run(source=SOURCE, day=dt.date(2026, 3, 10), entries=[entry], origin="api")
    assert result.extra_at_provider == 1
    finding = ProviderFinding.objects.get()
    assert finding.fingerprint == f"extra:{SOURCE}:ch_stray" and finding.kind == "orphan_event"
    assert (finding.event_id, finding.run_id, finding.line_id) == (
        event.id,
        result.id,
        StatementLine.objects.get().id,
    )


@pytest.mark.parametrize("text", ["20261202", "2026-W49-3", "2026-12-2"])
def test_c21_reconcile_statement_takes_only_yyyy_mm_dd(text: str) -> None:
    with pytest.raises(CommandError, match=f"--date {text!r} is not a date: use YYYY-MM-DD"):
        call_command("reconcile_statement", "--adapter", SOURCE, "--date", text)
    assert not StatementRun.objects.exists()


def test_c21_reconcile_statement_refuses_a_day_after_today() -> None:
    tomorrow = (timezone.now().astimezone(dt.UTC) + dt.timedelta(days=1)).date().isoformat()
    with pytest.raises(CommandError, match=f"--date {tomorrow} is after today \\(UTC\\)"):
        call_command("reconcile_statement", "--adapter", SOURCE, "--date", tomorrow)
    assert not StatementRun.objects.exists()


def test_c21_a_run_is_audited_on_the_chain_without_an_intent() -> None:
    from operations.audit.chain_checks import audit_verify
    from operations.models import AuditEvent

    kept = succeeded("order-1", "ch_1")
    result = run(
        source=SOURCE,
        day=timezone.now().date(),
        entries=[line(kept, "ch_1")],
        origin="api",
        actor="reconciler",
    )
    event = AuditEvent.objects.get(intent_id__isnull=True, event="statement_reconciled")
    assert event.actor == "reconciler"
    assert event.data == {
        "run": result.id,
        "source": SOURCE,
        "date": timezone.now().date().isoformat(),
        "origin": "api",
        "lines": 1,
        "matched": 1,
        "missing_at_provider": 0,
        "extra_at_provider": 0,
        "amount_mismatches": 0,
    }
    # the chain without an intent verifies (the test's intents were moved without transitions)
    assert [b for b in audit_verify() if b.intent_id is None] == []


def test_c21_one_effect_listed_twice_by_the_provider_is_not_an_extra_effect() -> None:
    # given: the provider's statement lists one charge twice (same provider reference)
    kept = succeeded("order-twice", "ch_twice")
    entries = [line(kept, "ch_twice"), line(kept, "ch_twice")]
    # when
    result = run(source=SOURCE, day=timezone.now().date(), entries=entries, origin=StatementRun.Origin.API)
    # then: matched once; the repeat is kept as read and is no finding (nothing to refund)
    assert (result.lines, result.matched, result.extra_at_provider) == (2, 1, 0)
    assert kinds() == []
    repeat = StatementLine.objects.get(run=result, line_no=2)
    assert repeat.intent_id is None and repeat.raw["repeats_an_earlier_line"] is True


def test_i39_10_a_run_stores_its_lines_a_batch_at_a_time_with_no_savepoint_per_line() -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    # given: a statement of 50 effects no intent has (each an extra finding) and one matched line
    kept = succeeded("order-1", "ch_1")
    entries = [line(kept, "ch_1")] + [
        StatementEntry(
            provider_reference=f"ch_x{n}", idempotency_key="", reference="", amount=100, currency="EUR"
        )
        for n in range(50)
    ]
    # when
    with CaptureQueriesContext(connection) as queries:
        result = run(
            source=SOURCE, day=timezone.now().date(), entries=entries, origin=StatementRun.Origin.API
        )
    # then: the same verdicts as line by line
    assert (result.lines, result.matched, result.extra_at_provider, result.error) == (51, 1, 50, "")
    assert ProviderFinding.objects.filter(kind="extra_at_provider").count() == 50
    # and: one INSERT for the lines, one for the findings; the run's own savepoint (its
    # transaction, inside the test's) and its audit event's, not one per line
    sql = [q["sql"] for q in queries.captured_queries]
    assert len([s for s in sql if s.startswith('INSERT INTO "reconciliation_statementline"')]) == 1
    assert len([s for s in sql if s.startswith('INSERT INTO "reconciliation_providerfinding"')]) == 1
    assert len([s for s in sql if s.startswith("SAVEPOINT")]) == 2
