"""Issue 10's unhappy paths against the real sandbox provider process: duplicates at providers
without keys (C18), a reconcile pass that never dies of one item, compensations that end
badly, escalated lookups that back off, unverified confirmations and fenced-out attempts."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.db.models.functions import Now
from rest_framework.test import APIClient

from operations import services
from operations.adapters.base import ExecutionResult
from operations.engine.protocol import execute_intent
from operations.exceptions import ResolutionRefused
from operations.models import Attempt, AuditEvent, Intent, Outcome
from operations.services import intent_claim, intent_record_success, intent_take_over_lease
from reconciliation import lookups
from reconciliation.duplicates import run_duplicate_checks, sweep_compensations
from reconciliation.lookups import lookup_delay_seconds, reconcile_unknown
from reconciliation.models import DuplicateFinding, ReconciliationRun
from reconciliation.resolution import (
    lookup_now,
    resolve_absent,
    resolve_compensate,
    resolve_confirmed,
    resolve_duplicate_finding,
    resolve_failed_compensation,
)
from reconciliation.services import reconcile_pass
from tests.factories import UserFactory, charge_arguments, make_agent, settled, submit, user_named
from tests.reconciliation.test_reconciliation import email, reservation, unknown

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(db: Any) -> Any:
    return UserFactory(username="olga", groups=["operator"])


def due() -> None:
    """Make every scheduled lookup and duplicate check due now."""
    Intent.objects.filter(status="UNKNOWN").update(next_lookup_at=Now())
    Intent.objects.filter(next_duplicate_check_at__isnull=False).update(next_duplicate_check_at=Now())


def unknown_charge_with_effect(sandbox: Any) -> tuple[Intent, str]:
    """An UNKNOWN charge whose effect the provider applied (the answer was lost); returns
    (intent, the charge id)."""
    intent = submit()
    charge = httpx.post(
        f"{sandbox.url}/v1/charges",
        json=charge_arguments(),
        headers={"Idempotency-Key": intent.idempotency_key},
    ).json()["id"]
    return unknown(intent), charge


def events(intent: Intent) -> list[str]:
    return list(AuditEvent.objects.filter(intent=intent).order_by("seq").values_list("event", flat=True))


# --- fault 2: duplicates at providers without keys --------------------------------------------


def test_c18_email_duplicate_behind_a_lagging_lookup_is_found_and_flagged(
    sandbox: Any, operator: Any, settings: Any
) -> None:
    # given: an email sent, its answer lost, the lookup lagging; an operator accepts the
    # duplicate risk and it is sent again
    settings.SANDBOX_EMAIL_CONSISTENCY_WINDOW_SECONDS = 30
    sandbox.configure(email_lookup_lag_seconds=3600)
    sandbox.inject("crash_after_effect", product="email")
    intent = submit(action="email.send", arguments=email(18), reference="mail-018")
    assert execute_intent(intent.id) == "unknown"
    settled(
        resolve_absent(
            intent_id=intent.id, user=operator, reason="bounced, resend", accept_duplicate_risk=True
        )
    )
    assert execute_intent(intent.id) == "succeeded"
    assert len(sandbox.ledger("email")) == 2
    intent.refresh_from_db()
    assert intent.next_duplicate_check_at is not None and intent.duplicate_check_until is not None
    # when: the first check sees nothing (lag) ...
    first = run_duplicate_checks()
    assert (first.examined, first.found, first.errors) == (1, 0, [])
    assert not DuplicateFinding.objects.exists()
    # ... and a later check within the window sees both
    sandbox.configure(email_lookup_lag_seconds=0)
    due()
    second = run_duplicate_checks()
    # then: the extra email is a finding for operators (email has no compensation), audited
    assert (second.found, second.errors) == (1, [])
    (finding,) = DuplicateFinding.objects.filter(intent=intent)
    outcome = Outcome.objects.get(intent=intent)
    assert finding.state == "open" and finding.kept_reference == outcome.provider_reference
    assert {finding.provider_reference, finding.kept_reference} == {e["id"] for e in sandbox.ledger("email")}
    assert "duplicate_found" in events(intent)
    assert not Intent.objects.filter(compensates=intent).exists()
    # and a further check records nothing new
    due()
    assert run_duplicate_checks().found == 0
    assert DuplicateFinding.objects.filter(intent=intent).count() == 1


def test_duplicate_checks_stop_after_the_consistency_window(
    sandbox: Any, operator: Any, settings: Any
) -> None:
    # given: a second attempt ended the intent; its window has passed
    settings.SANDBOX_EMAIL_CONSISTENCY_WINDOW_SECONDS = 0
    sandbox.inject("crash_before_effect", product="email")
    intent = submit(action="email.send", arguments=email(19))
    assert execute_intent(intent.id) == "unknown"
    settled(
        resolve_absent(intent_id=intent.id, user=operator, reason="never sent", accept_duplicate_risk=True)
    )
    assert execute_intent(intent.id) == "succeeded"
    # when: the last check runs
    run_duplicate_checks()
    # then: no further check is scheduled
    intent.refresh_from_db()
    assert intent.next_duplicate_check_at is None


def test_reservation_late_second_effect_after_reconciler_found_success_is_compensated(
    sandbox: Any, operator: Any
) -> None:
    # given: attempt 1 unknown, an operator retries blind (attempt 2 unknown too); the
    # reconciler finds one reservation and ends the intent
    sandbox.inject("crash_before_effect", product="reservations")
    intent = submit(action="reservations.create", arguments=reservation("late-1"), reference="late-1")
    assert execute_intent(intent.id) == "unknown"
    settled(resolve_absent(intent_id=intent.id, user=operator, reason="retry", accept_duplicate_risk=True))
    sandbox.inject("crash_after_effect", product="reservations")
    assert execute_intent(intent.id) == "unknown"
    due()
    assert reconcile_unknown().resolved == 1
    intent.refresh_from_db()
    assert intent.status == "SUCCEEDED" and intent.next_duplicate_check_at is not None
    # when: the first request lands late at the provider, after the success was recorded
    httpx.post(f"{sandbox.url}/v1/reservations", json=reservation("late-1")).raise_for_status()
    due()
    counts = run_duplicate_checks()
    # then: the extra reservation gets its own compensation intent, which cancels it
    assert counts.found == 1
    (finding,) = DuplicateFinding.objects.filter(intent=intent)
    assert finding.state == "compensating" and finding.compensation is not None
    assert execute_intent(finding.compensation.id) == "succeeded"
    sweep_compensations()
    finding.refresh_from_db()
    assert finding.state == "resolved"
    assert [r["status"] for r in sandbox.ledger("reservations")].count("confirmed") == 1
    assert Intent.objects.get(id=intent.id).status == "SUCCEEDED"  # a duplicate's undo keeps the original


def test_email_found_twice_by_lookup_resolves_and_flags_without_aborting_the_pass(sandbox: Any) -> None:
    # given: two UNKNOWN emails; the first has two effects at the provider (email has no
    # compensation, which used to raise and abort the pass)
    first = unknown(submit(action="email.send", arguments=email(20)))
    second = unknown(submit(action="email.send", arguments=email(21)))
    for target in (first, first, second):
        httpx.post(
            f"{sandbox.url}/v1/emails",
            json=email(20 if target == first else 21),
            headers={"Message-ID": f"<{target.idempotency_key}@effect-ledger.local>"},
        ).raise_for_status()
    # when
    reconcile_pass()
    # then: both resolved, the extra one flagged, the run finished without errors
    assert Intent.objects.get(id=first.id).status == "SUCCEEDED"
    assert Intent.objects.get(id=second.id).status == "SUCCEEDED"
    assert DuplicateFinding.objects.get(intent=first).state == "open"
    run = ReconciliationRun.objects.get()
    assert run.finished_at is not None and run.errors == 0


def test_one_failing_item_never_aborts_the_pass_and_still_escalates(
    sandbox: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: two UNKNOWN reservations found at the provider; acting on the first one raises
    bad = unknown(submit(action="reservations.create", arguments=reservation("bad-1"), reference="bad-1"))
    good = unknown(submit(action="reservations.create", arguments=reservation("good-1"), reference="good-1"))
    for ref in ("bad-1", "good-1"):
        httpx.post(f"{sandbox.url}/v1/reservations", json=reservation(ref)).raise_for_status()
    real = lookups.record_duplicates

    def flaky(*, intent: Intent, references: list[str], keep: str) -> int:
        if intent.id == bad.id:
            raise RuntimeError("simulated failure while recording")
        return real(intent=intent, references=references, keep=keep)

    monkeypatch.setattr(lookups, "record_duplicates", flaky)
    # when: passes run until the bad item's patience is spent
    patience = bad.policy["unknown_patience"]["lookups"]
    for _ in range(patience):
        due()
        reconcile_pass()
    # then: the good one resolved on the first pass; the bad one stayed UNKNOWN (its
    # resolution rolled back), was looked at on every pass, and is escalated; every run finished
    assert Intent.objects.get(id=good.id).status == "SUCCEEDED"
    bad.refresh_from_db()
    assert bad.status == "UNKNOWN" and bad.lookup_count == patience and bad.escalated_at is not None
    assert ReconciliationRun.objects.filter(finished_at__isnull=True).count() == 0


# --- fault 3: compensation has an end for every outcome ----------------------------------------


def compensating_reservation(sandbox: Any, operator: Any, reference: str) -> tuple[Intent, Intent]:
    """An UNKNOWN reservation with its effect at the provider, compensated by an operator."""
    intent = unknown(
        submit(action="reservations.create", arguments=reservation(reference), reference=reference)
    )
    booking = httpx.post(f"{sandbox.url}/v1/reservations", json=reservation(reference)).json()["id"]
    resolve_compensate(
        intent_id=intent.id, user=operator, reason="customer cancelled", provider_reference=booking
    )
    (cancel,) = Intent.objects.filter(compensates=intent)
    return Intent.objects.get(id=intent.id), cancel


def test_failed_compensation_puts_the_original_back_in_front_of_an_operator(
    sandbox: Any, operator: Any
) -> None:
    # given: the compensation fails (the provider answers 410 for a withdrawn reservation)
    intent, cancel = compensating_reservation(sandbox, operator, "comp-1")
    sandbox.withdraw("reservations", cancel.arguments["reservation"])
    assert execute_intent(cancel.id) == "failed"
    # when
    counts = sweep_compensations()
    # then: escalated with the evidence; a second sweep does nothing more
    intent.refresh_from_db()
    assert (intent.status, counts.escalated) == ("COMPENSATING", 1)
    assert intent.escalated_at is not None
    failed = AuditEvent.objects.get(intent=intent, event="compensation_failed")
    assert (
        failed.data["compensation_intent"] == str(cancel.id)
        and failed.data["compensation_status"] == "FAILED"
    )
    assert sweep_compensations().escalated == 0
    # and: the operator opens a new compensation (its own key), which un-escalates it
    resolve_failed_compensation(intent_id=intent.id, user=operator, verb="reopen", reason="try again")
    second = Intent.objects.filter(compensates=intent).exclude(id=cancel.id).get()
    assert second.idempotency_key != cancel.idempotency_key
    assert Intent.objects.get(id=intent.id).escalated_at is None
    # which fails again; this time the operator keeps the effect
    assert execute_intent(second.id) == "failed"
    sweep_compensations()
    with pytest.raises(ResolutionRefused, match="reason"):
        resolve_failed_compensation(intent_id=intent.id, user=operator, verb="kept", reason=" ")
    kept = resolve_failed_compensation(
        intent_id=intent.id, user=operator, verb="kept", reason="customer kept the booking"
    )
    assert kept.status == "SUCCEEDED"


@pytest.mark.parametrize("ending", ["rejected", "expired", "cancelled"])
def test_refund_rejected_expired_or_cancelled_escalates_the_charge(
    sandbox: Any, operator: Any, approver: Any, ending: str
) -> None:
    # given: an UNKNOWN charge compensated by a refund that needs approval
    intent, charge = unknown_charge_with_effect(sandbox)
    resolve_compensate(intent_id=intent.id, user=operator, reason="refund it", provider_reference=charge)
    (refund,) = Intent.objects.filter(compensates=intent)
    assert refund.status == "AWAITING_APPROVAL"
    # when: the refund ends without effect
    if ending == "rejected":
        services.intent_reject(
            intent_id=refund.id, user=approver, request_hash=refund.request_hash, reason="no"
        )
    elif ending == "expired":
        Intent.objects.filter(id=refund.id).update(approval_expires_at=Now())
        assert services.intent_expire_approval(intent_id=refund.id)
    else:
        services.intent_cancel(intent_id=refund.id, actor="user:olga", reason="wrong amount")
    sweep_compensations()
    # then: the charge is back in front of an operator, who settles it as compensated elsewhere
    intent.refresh_from_db()
    assert intent.status == "COMPENSATING" and intent.escalated_at is not None
    settled = resolve_failed_compensation(
        intent_id=intent.id, user=operator, verb="compensated", reason="refunded by provider support"
    )
    assert settled.status == "COMPENSATED"


def test_settling_is_refused_while_a_compensation_runs(sandbox: Any, operator: Any) -> None:
    intent, _cancel = compensating_reservation(sandbox, operator, "comp-2")
    with pytest.raises(ResolutionRefused, match="still running"):
        resolve_failed_compensation(intent_id=intent.id, user=operator, verb="kept", reason="keep it")
    assert Intent.objects.get(id=intent.id).status == "COMPENSATING"


def test_agents_cannot_cancel_compensation_intents(sandbox: Any, operator: Any) -> None:
    # given: a refund opened by an operator, waiting for approval, in the tenant of an agent that
    # sees its whole tenant (an agent of scope "own" does not even see it: 404)
    intent, charge = unknown_charge_with_effect(sandbox)
    resolve_compensate(intent_id=intent.id, user=operator, reason="refund", provider_reference=charge)
    (refund,) = Intent.objects.filter(compensates=intent)
    _, token = make_agent(name="tenant-wide", tenant=refund.tenant, scope="tenant")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    # when
    response = api.post(f"/api/v1/intents/{refund.id}/cancel", {"reason": "agent says no"}, format="json")
    # then
    assert response.status_code == 403
    assert response["Content-Type"].startswith("application/problem+json")
    assert response.json()["type"].endswith("cancel-refused")
    assert Intent.objects.get(id=refund.id).status == "AWAITING_APPROVAL"


def test_open_finding_can_be_acknowledged_and_email_cannot_be_compensated(
    sandbox: Any, operator: Any
) -> None:
    intent = unknown(submit(action="email.send", arguments=email(22)))
    for _ in range(2):
        httpx.post(
            f"{sandbox.url}/v1/emails",
            json=email(22),
            headers={"Message-ID": f"<{intent.idempotency_key}@effect-ledger.local>"},
        ).raise_for_status()
    reconcile_unknown()
    finding = DuplicateFinding.objects.get(intent=intent)
    with pytest.raises(ResolutionRefused, match="no compensation"):
        resolve_duplicate_finding(finding_id=finding.id, user=operator, verb="compensate", reason="undo")
    assert DuplicateFinding.objects.get(id=finding.id).state == "open"
    done = resolve_duplicate_finding(
        finding_id=finding.id, user=operator, verb="acknowledge", reason="customer told, harmless"
    )
    assert done.state == "resolved" and done.resolved_by == "user:olga"


# --- fault 6: escalated lookups back off -------------------------------------------------------


def test_lookup_backoff_doubles_to_an_hour() -> None:
    delays = [lookup_delay_seconds(n) for n in range(1, 16)]
    assert delays[:7] == [1, 2, 4, 8, 15, 30, 60]
    assert delays[7:10] == [120, 240, 480]
    assert max(delays) == 3600 and delays[-1] == 3600
    assert delays == sorted(delays)


def test_escalated_intent_is_looked_up_at_most_hourly_and_on_request(sandbox: Any, operator: Any) -> None:
    # given: an escalated email whose lookup keeps lagging, after many lookups
    sandbox.configure(email_lookup_lag_seconds=3600)
    intent = unknown(submit(action="email.send", arguments=email(23)))
    Intent.objects.filter(id=intent.id).update(lookup_count=20, escalated_at=Now())
    # when
    due()
    reconcile_unknown()
    # then: the next lookup is an hour away
    intent.refresh_from_db()
    wait = Intent.objects.filter(
        id=intent.id,
        next_lookup_at__gt=Now() + timedelta(seconds=3500),
        next_lookup_at__lte=Now() + timedelta(seconds=3600),
    )
    assert wait.exists()
    assert reconcile_unknown().examined == 0
    # and an operator's fresh lookup runs now, and acts on what it finds
    sandbox.configure(email_lookup_lag_seconds=0)
    httpx.post(
        f"{sandbox.url}/v1/emails",
        json=email(23),
        headers={"Message-ID": f"<{intent.idempotency_key}@effect-ledger.local>"},
    ).raise_for_status()
    assert lookup_now(intent_id=intent.id, user=operator) == "resolved"
    assert Intent.objects.get(id=intent.id).status == "SUCCEEDED"
    assert Outcome.objects.get(intent=intent).source == "reconciler"


# --- fault 7: "confirmed" without verification is explicit ------------------------------------


def test_confirmed_with_an_unverifiable_reference_needs_an_explicit_acknowledgement(
    sandbox: Any, operator: Any
) -> None:
    # given: an UNKNOWN email and a reference the provider cannot verify
    intent = unknown(submit(action="email.send", arguments=email(24)))
    # when / then: refused without the acknowledgement, nothing changes
    with pytest.raises(ResolutionRefused, match="cannot verify em_doesnotexist123"):
        resolve_confirmed(
            intent_id=intent.id, user=operator, provider_reference="em_doesnotexist123", reason="I think so"
        )
    assert Intent.objects.get(id=intent.id).status == "UNKNOWN"
    # with it, the outcome and the audit event say unverified
    resolved = resolve_confirmed(
        intent_id=intent.id,
        user=operator,
        provider_reference="em_doesnotexist123",
        reason="customer forwarded it",
        accept_unverified=True,
    )
    assert resolved.status == "SUCCEEDED"
    assert Outcome.objects.get(intent=intent).detail["verified"] is False
    event = AuditEvent.objects.get(intent=intent, event="outcome_found")
    assert event.data["verified"] is False and event.data["verification"].startswith("unverified")


def test_confirmed_by_lookup_is_verified_without_acknowledgement(sandbox: Any, operator: Any) -> None:
    intent, charge = unknown_charge_with_effect(sandbox)
    resolve_confirmed(intent_id=intent.id, user=operator, provider_reference=charge, reason="seen")
    assert Outcome.objects.get(intent=intent).detail["verified"] is True


# --- fault 8: a stale worker's refused write leaves a trace ------------------------------------


@pytest.mark.parametrize("action", ["payments.charge", "email.send"])
def test_fenced_out_attempt_records_the_provider_answer_and_an_audit_event(sandbox: Any, action: str) -> None:
    # given: worker A (fence 1) froze; the reconciler took over; worker B (fence 2) succeeded
    arguments = charge_arguments() if action == "payments.charge" else email(25)
    intent = submit(action=action, arguments=arguments)
    claim_a = intent_claim(intent_id=intent.id, worker="A", lease_seconds=30)
    assert claim_a is not None
    Intent.objects.filter(id=intent.id).update(lease_expires_at=Now())
    assert intent_take_over_lease(intent_id=intent.id, fence=1, provider_deduplicates=True)
    claim_b = intent_claim(intent_id=intent.id, worker="B", lease_seconds=30)
    assert claim_b is not None
    assert intent_record_success(claim=claim_b, result=ExecutionResult("ref_b", "d" * 64))
    # when: A wakes up; the provider had applied its call too
    assert intent_record_success(claim=claim_a, result=ExecutionResult("ref_a", "e" * 64)) is False
    # then: A's attempt says it was fenced out, with what the provider answered
    attempt = Attempt.objects.get(intent=intent, fence=1)
    assert attempt.result == "fenced_out" and attempt.finished_at is not None
    assert attempt.detail["provider_answer"]["provider_reference"] == "ref_a"
    event = AuditEvent.objects.get(intent=intent, event="stale_write_refused")
    assert event.data["fence"] == 1 and event.data["would_have_become"] == "SUCCEEDED"
    assert list(Outcome.objects.filter(intent=intent).values_list("provider_reference", flat=True)) == [
        "ref_b"
    ]
    # and at a provider without keys, a duplicate check is scheduled for the stale effect
    scheduled = Intent.objects.get(id=intent.id).next_duplicate_check_at is not None
    assert scheduled is (action == "email.send")


def test_compensating_an_escalated_unknown_is_not_a_decision_while_its_refund_waits(
    sandbox: Any, operator: Any, approver: Any
) -> None:
    # given: an escalated UNKNOWN charge that an operator compensates; the refund waits for approval
    intent, charge = unknown_charge_with_effect(sandbox)
    Intent.objects.filter(id=intent.id).update(escalated_at=Now())
    resolve_compensate(intent_id=intent.id, user=operator, reason="refund it", provider_reference=charge)
    (refund,) = Intent.objects.filter(compensates=intent)
    # then: it is out of the operators' queue, and neither "kept" nor "reopen" is accepted
    intent.refresh_from_db()
    assert intent.status == "COMPENSATING" and intent.escalated_at is None
    assert sweep_compensations().escalated == 0
    for verb in ("kept", "reopen", "compensated"):
        with pytest.raises(ResolutionRefused, match="still running"):
            resolve_failed_compensation(intent_id=intent.id, user=operator, verb=verb, reason="decide")
    # and when the refund is rejected, the failure is audited and the intent escalated again
    services.intent_reject(intent_id=refund.id, user=approver, request_hash=refund.request_hash, reason="no")
    assert sweep_compensations().escalated == 1
    assert AuditEvent.objects.filter(intent=intent, event="compensation_failed").count() == 1


def test_reopen_and_settle_are_refused_while_a_reopened_compensation_runs(
    sandbox: Any, operator: Any
) -> None:
    # given: a failed compensation, escalated, reopened by one operator
    intent, cancel = compensating_reservation(sandbox, operator, "comp-3")
    sandbox.withdraw("reservations", cancel.arguments["reservation"])
    assert execute_intent(cancel.id) == "failed"
    sweep_compensations()
    services.intent_reopen_compensation(
        intent_id=intent.id, actor="user:olga", reason="again", requested_by=user_named("olga")
    )
    Intent.objects.filter(id=intent.id).update(escalated_at=Now())  # a stale page's view of it
    # when / then: a second operator's decision is refused while the new one can still succeed
    with pytest.raises(ResolutionRefused, match="still running"):
        services.intent_settle_compensation(
            intent_id=intent.id, compensated=False, actor="user:bob", reason="x"
        )
    with pytest.raises(ResolutionRefused, match="still running"):
        services.intent_reopen_compensation(
            intent_id=intent.id, actor="user:bob", reason="x", requested_by=user_named("bob")
        )
    assert Intent.objects.filter(compensates=intent).count() == 2


def test_c18_duplicate_checks_go_on_past_the_window_while_the_lookup_has_not_caught_up(
    sandbox: Any, operator: Any, settings: Any
) -> None:
    # given: the lookup lags far beyond the declared window (30 s here vs an hour at the provider)
    settings.SANDBOX_EMAIL_CONSISTENCY_WINDOW_SECONDS = 0
    sandbox.configure(email_lookup_lag_seconds=3600)
    sandbox.inject("crash_after_effect", product="email")
    intent = submit(action="email.send", arguments=email(26))
    assert execute_intent(intent.id) == "unknown"
    settled(resolve_absent(intent_id=intent.id, user=operator, reason="resend", accept_duplicate_risk=True))
    assert execute_intent(intent.id) == "succeeded"
    # when: checks past the window see nothing, not even the email the intent keeps
    for _ in range(3):
        due()
        run_duplicate_checks()
    # then: they have not ended ...
    assert Intent.objects.get(id=intent.id).next_duplicate_check_at is not None
    # ... and once the read path catches up, the duplicate is found; after that conclusive
    # check past the window, the checks end
    sandbox.configure(email_lookup_lag_seconds=0)
    due()
    assert run_duplicate_checks().found == 1
    assert DuplicateFinding.objects.get(intent=intent).state == "open"
    assert Intent.objects.get(id=intent.id).next_duplicate_check_at is None
