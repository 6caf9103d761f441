"""Issue 18, items 1-4 and case C22: ceilings as reservations at claim, money rules per
currency, a ceiling reached waits for an approver, and an approval that lapsed before execution
goes back to the approvers. Real PostgreSQL; concurrent claims in real threads."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from operations.engine.protocol import execute_intent
from operations.models import Attempt, AuditEvent, Intent, Reservation, SpendWindow
from operations.policies.reading import PolicyError
from operations.policies.rules import Policy
from operations.services import intent_approve, intent_claim
from operations.services.approvals import intent_reject
from operations.services.claims import CeilingWait
from operations.services.execution import (
    intent_record_failure,
    intent_schedule_retry,
    precheck_refusal,
)
from tests.factories import charge_arguments, submit

pytestmark = pytest.mark.django_db

S = Intent.Status


def ceilings(settings: Any, **values: Any) -> None:
    settings.EFFECT_LEDGER_POLICIES = {
        **settings.EFFECT_LEDGER_POLICIES,
        "payments.charge": {"approval": "never", "ceilings": values},
    }


def claim(intent: Intent) -> Any:
    try:
        return intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    except CeilingWait:
        return "ceiling"


def window(currency: str = "EUR") -> SpendWindow:
    return SpendWindow.objects.get(tenant="acme", action="payments.charge", currency=currency)


# --- item 1: the ceiling holds under concurrency -------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_c19_eight_concurrent_claims_never_pass_the_spend_and_effects_ceilings(settings: Any) -> None:
    # given: ceilings of 10,000 EUR and 3 effects a day; eight charges of 3,000 EUR
    ceilings(settings, spend_per_day_minor={"EUR": 10_000}, effects_per_day=3)
    intents = [submit(arguments=charge_arguments(3_000)) for _ in range(8)]
    barrier = threading.Barrier(len(intents))

    def run(intent: Intent) -> str:
        barrier.wait()
        try:
            result = claim(intent)
            return "claimed" if result not in (None, "ceiling") else str(result)
        finally:
            connection.close()

    # when: all eight claimed at the same moment
    with ThreadPoolExecutor(max_workers=len(intents)) as pool:
        results = list(pool.map(run, intents))
    # then: three claimed (9,000), the other five wait for an approver with the reason
    assert sorted(results) == ["ceiling"] * 5 + ["claimed"] * 3
    assert (window().spent_minor, window("").effects) == (9_000, 3)
    waiting = Intent.objects.filter(status=S.AWAITING_APPROVAL)
    assert waiting.count() == 5 and set(waiting.values_list("wait_reason", flat=True)) == {"ceiling"}
    assert not Attempt.objects.filter(intent__in=waiting).exists()
    event = AuditEvent.objects.filter(event="ceiling_reached").first()
    assert event is not None and "ceiling reached" in event.reason
    assert event.data["cap"] in (3, 10_000) and "reserved" in event.data


def test_i18_1_what_surely_made_no_effect_gives_its_reservation_back(settings: Any) -> None:
    ceilings(settings, spend_per_day_minor={"EUR": 10_000}, effects_per_day=3)
    intent = submit(arguments=charge_arguments(3_000))
    claimed = claim(intent)
    assert window().spent_minor == 3_000
    # when: refused by the provider (FAILED: no effect)
    intent_record_failure(claim=claimed, error="card declined")
    # then
    assert (window().spent_minor, window("").effects) == (0, 0)
    assert not Reservation.objects.filter(intent=intent, released_at__isnull=True).exists()


def test_i18_1_a_retry_keeps_its_reservation_and_does_not_reserve_twice(settings: Any) -> None:
    ceilings(settings, spend_per_day_minor={"EUR": 10_000}, effects_per_day=3)
    intent = submit(arguments=charge_arguments(3_000))
    first = claim(intent)
    # when: the attempt timed out (it may have taken effect): READY again, then claimed again
    intent_schedule_retry(claim=first, error="timeout")
    Intent.objects.filter(id=intent.id).update(not_before=None)  # due now
    assert window().spent_minor == 3_000  # a retry may still be the same effect: kept
    second = claim(intent)
    # then: one reservation for the intent, not two
    assert second is not None and second != "ceiling"
    assert (window().spent_minor, window("").effects) == (3_000, 1)
    assert (
        Reservation.objects.filter(intent=intent, released_at__isnull=True).count() == 2
    )  # EUR + effects rows


def test_i18_4_the_claim_reads_no_past_intents(settings: Any) -> None:
    # given: many charges already succeeded today
    ceilings(settings, spend_per_day_minor={"EUR": 10_000_000}, effects_per_day=10_000)
    for _ in range(30):
        done = submit(arguments=charge_arguments(100))
        Intent.objects.filter(id=done.id).update(status=S.SUCCEEDED)
    intent = submit(arguments=charge_arguments(100))
    # when
    with CaptureQueriesContext(connection) as queries:
        claimed = claim(intent)
        assert precheck_refusal(claimed.intent) is None
    # then: the claim's two statements and nothing that reads other intents
    sql = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    assert len(sql) == 2, sql
    assert not any("SUCCEEDED" in statement for statement in sql), sql


# --- item 2: money per currency --------------------------------------------------------------------


def test_i18_2_amounts_of_different_currencies_are_never_added(settings: Any) -> None:
    ceilings(settings, spend_per_day_minor={"EUR": 10_000, "JPY": 1_500_000})
    eur = submit(arguments=charge_arguments(9_000))
    jpy = submit(arguments=charge_arguments(5_000, currency="JPY"))
    assert claim(eur) not in (None, "ceiling")
    assert claim(jpy) not in (None, "ceiling")  # 9,000 EUR + 5,000 JPY was refused before
    assert (window("EUR").spent_minor, window("JPY").spent_minor) == (9_000, 5_000)


@pytest.mark.parametrize(
    "configured",
    [
        {"approval": "above_amount", "approval_threshold_minor": 10_000},
        {"ceilings": {"spend_per_day_minor": 10_000}},
        {"ceilings": {"max_amount_minor": 500}},
        {"ceilings": {"spend_per_day_minor": {"EURO": 10_000}}},
        {"ceilings": {"spend_per_day_minor": {"*": 10_000}}},
        {"ceilings": {"spend_per_day_minor": {"EUR": -1}}},
    ],
    ids=["bare-threshold", "bare-spend", "bare-max", "not-iso-4217", "wildcard", "negative"],
)
def test_i18_2_an_amount_rule_without_its_currency_is_refused_at_start_up(configured: dict[str, Any]) -> None:
    with pytest.raises(PolicyError):
        Policy.from_config("payments.charge", configured)


def test_i18_2_the_threshold_is_per_currency_and_an_unnamed_currency_needs_approval() -> None:
    policy = Policy.from_config(
        "payments.charge",
        {"approval": "above_amount", "approval_threshold_minor": {"EUR": 10_000, "JPY": 1_500_000}},
    )
    assert not policy.needs_approval(charge_arguments(10_000, currency="JPY"))  # about 60 EUR
    assert policy.needs_approval(charge_arguments(10_001))
    assert not policy.needs_approval(charge_arguments(10_000))
    assert policy.needs_approval(charge_arguments(5, currency="KWD"))  # not named: fail safe
    spend_only = Policy.from_config("payments.charge", {"ceilings": {"spend_per_day_minor": {"EUR": 1}}})
    assert spend_only.needs_approval(charge_arguments(5, currency="USD"))
    assert not spend_only.needs_approval({"to": "a@example.test"})  # moves no money


def test_i18_2_a_charge_in_an_unnamed_currency_awaits_approval_at_submission(settings: Any) -> None:
    ceilings(settings, spend_per_day_minor={"EUR": 10_000})
    intent = submit(arguments=charge_arguments(100, currency="KWD"))
    assert intent.status == S.AWAITING_APPROVAL


def test_i18_2_a_snapshot_from_before_currencies_keeps_its_rule_for_every_currency() -> None:
    legacy = Policy.from_snapshot({"approval": "above_amount", "approval_threshold_minor": 10_000})
    assert legacy.needs_approval(charge_arguments(10_001, currency="JPY"))
    assert not legacy.needs_approval(charge_arguments(9_999, currency="USD"))


# --- item 3: a ceiling reached waits for a person ---------------------------------------------------


def test_i18_3_approving_lets_this_one_intent_pass_the_ceiling_audited(settings: Any, approver: Any) -> None:
    ceilings(settings, spend_per_day_minor={"EUR": 5_000})
    assert claim(submit(arguments=charge_arguments(4_000))) not in (None, "ceiling")
    held = submit(arguments=charge_arguments(3_000))
    assert claim(held) == "ceiling"
    held.refresh_from_db()
    assert held.status == S.AWAITING_APPROVAL and held.wait_reason == "ceiling"
    assert window().spent_minor == 4_000  # the refused claim reserved nothing
    # when: an approver lets it through
    intent_approve(intent_id=held.id, user=approver, request_hash=held.request_hash, reason="known customer")
    held.refresh_from_db()
    assert held.status == S.READY and held.ceiling_override
    approved = AuditEvent.objects.get(intent=held, event="approved")
    assert approved.data.get("over_ceiling") is True
    # then: it is claimed past the cap, and only it
    assert claim(held) not in (None, "ceiling")
    assert window().spent_minor == 7_000
    assert Reservation.objects.get(intent=held, currency="EUR").over_ceiling
    assert claim(submit(arguments=charge_arguments(1))) == "ceiling"


def test_i18_3_rejecting_ends_it_and_nothing_is_sent(settings: Any, approver: Any) -> None:
    ceilings(settings, effects_per_day=1)
    claim(submit())
    held = submit()
    assert claim(held) == "ceiling"
    held.refresh_from_db()
    intent_reject(intent_id=held.id, user=approver, request_hash=held.request_hash, reason="over budget")
    held.refresh_from_db()
    assert held.status == S.REJECTED and not Attempt.objects.filter(intent=held).exists()


def test_i18_3_one_effect_above_the_per_effect_ceiling_waits_too(settings: Any) -> None:
    ceilings(settings, max_amount_minor={"EUR": 1_000})
    intent = submit(arguments=charge_arguments(1_001))
    assert claim(intent) == "ceiling"
    intent.refresh_from_db()
    assert intent.status == S.AWAITING_APPROVAL
    assert "per-effect ceiling" in AuditEvent.objects.get(intent=intent, event="ceiling_reached").reason


# --- C22: an approval that lapsed before execution ------------------------------------------------


def test_c22_a_lapsed_approval_goes_back_to_the_approvers_never_failed(
    sandbox: Any, settings: Any, approver: Any, django_user_model: Any
) -> None:
    # given: approval always, valid 1 s; approved while no worker runs
    settings.EFFECT_LEDGER_POLICIES = {
        **settings.EFFECT_LEDGER_POLICIES,
        "payments.charge": {"approval": "always", "approval_ttl_seconds": 1},
    }
    intent = submit(arguments=charge_arguments(500, reference="c22"), reference="c22")
    intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash)
    # when: a worker runs it after the approval lapsed
    time.sleep(1.5)
    assert execute_intent(intent.id) == "awaiting_approval"
    # then: nothing reached the provider, the intent is back in the inbox with the reason
    intent.refresh_from_db()
    assert intent.status == S.AWAITING_APPROVAL and intent.wait_reason == "approval_lapsed"
    event = AuditEvent.objects.get(intent=intent, event="approval_lapsed")
    assert "approval lapsed before execution" in event.reason
    assert not AuditEvent.objects.filter(intent=intent, to_status=S.FAILED).exists()
    assert sandbox.request_count("payments") == 0
    # and the same approver may decide again in the new round; then it runs once
    intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash)
    assert execute_intent(intent.id) == "succeeded"
    assert len(sandbox.ledger("payments", reference="c22")) == 1


def test_i38_a_charge_already_sent_never_goes_back_to_its_approvers_when_the_approval_lapses(
    sandbox: Any, settings: Any, approver: Any
) -> None:
    from django.db.models.functions import Now

    from operations.models import Approval

    # given: approval always; approved; the first attempt made the charge and answered 500
    # (READY for a same-key retry); then the approval lapsed
    settings.EFFECT_LEDGER_POLICIES = {
        **settings.EFFECT_LEDGER_POLICIES,
        "payments.charge": {"approval": "always", "approval_ttl_seconds": 600},
    }
    intent = submit(arguments=charge_arguments(25_000, reference="i38-lapse"), reference="i38-lapse")
    intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash)
    sandbox.inject("error_500_after_effect", product="payments")
    assert execute_intent(intent.id) == "retry"
    sandbox.clear_faults()
    Approval.objects.filter(intent=intent).update(expires_at=Now())
    Intent.objects.filter(id=intent.id).update(not_before=Now())
    # when: the worker runs the retry
    outcome = execute_intent(intent.id)
    # then: the retry is the same approved request: it replays the charge (same key), never
    # goes back to the approvers (where an expiry or a reject would end it "without effect")
    assert outcome == "succeeded"
    intent.refresh_from_db()
    assert intent.status == S.SUCCEEDED
    assert not AuditEvent.objects.filter(intent=intent, event="approval_lapsed").exists()
    assert len(sandbox.ledger("payments", reference="i38-lapse")) == 1


def test_i18_3_the_approver_sees_why_it_is_back_and_the_current_spend(settings: Any, approver: Any) -> None:
    # given: one charge reserved 4,000 of a 5,000 EUR day; the next waits for a person
    ceilings(settings, spend_per_day_minor={"EUR": 5_000})
    claim(submit(arguments=charge_arguments(4_000)))
    held = submit(arguments=charge_arguments(3_000))
    assert claim(held) == "ceiling"
    client = Client()
    client.force_login(approver)
    # when / then: the inbox marks it, the page says which ceiling and what is reserved
    inbox = client.get(reverse("approvals")).content.decode()
    assert "ceiling reached" in inbox
    page = client.get(reverse("approval-detail", args=[held.id])).content.decode()
    assert (
        'id="wait-note"' in page
        and "40.00 EUR + 30.00 EUR would pass 50.00 EUR (4000 + 3000 &gt; 5000 minor units)" in page
    )


def test_i18_3_an_override_whose_approval_lapsed_is_not_used(
    sandbox: Any, settings: Any, approver: Any
) -> None:
    # given: the day's one effect is taken; the next charge waits and is approved (valid 1 s)
    settings.EFFECT_LEDGER_POLICIES = {
        **settings.EFFECT_LEDGER_POLICIES,
        "payments.charge": {
            "approval": "never",
            "approval_ttl_seconds": 1,
            "ceilings": {"effects_per_day": 1},
        },
    }
    assert (
        execute_intent(submit(arguments=charge_arguments(100, reference="o-1"), reference="o-1").id)
        == "succeeded"
    )
    held = submit(arguments=charge_arguments(100, reference="o-2"), reference="o-2")
    assert execute_intent(held.id) == "awaiting_approval"
    held.refresh_from_db()
    intent_approve(intent_id=held.id, user=approver, request_hash=held.request_hash)
    # when: no worker ran it before the approval lapsed
    time.sleep(1.5)
    # then: the override is not used: back to the approvers, nothing sent, the window unchanged
    assert execute_intent(held.id) == "awaiting_approval"
    held.refresh_from_db()
    assert held.status == S.AWAITING_APPROVAL and held.wait_reason == "approval_lapsed"
    assert not held.ceiling_override
    assert len(sandbox.ledger("payments", reference="o-2")) == 0
    assert window("").effects == 1
