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
from reconciliation.statements import StatementRefused, run, source_actions
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

    monkeypatch.setattr(statements, "_record_missing", broken)
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

    def fake(*, source: str, day: dt.date) -> StatementRun:
        asked.append((source, day))
        return StatementRun.objects.create(source=source, statement_date=day, origin="api")

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
    from reconciliation.statements import statement_actions

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
