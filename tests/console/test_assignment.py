"""Issue 16 item 4: "I'm on it". An operator assigns an item of the operators' queue to themself
(``operations.services.assignment``); the queue and the item's page say who and since when;
another operator's decision is refused until they take it over explicitly; any resolution ends
the assignment, and so does ``EFFECT_LEDGER_ASSIGNMENT_SECONDS``."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from operations.exceptions import ResolutionRefused
from operations.models import AuditEvent, Intent
from operations.services import AssignmentRefused, intent_assign, intent_cancel
from operations.services.compensation import intent_begin_compensation
from reconciliation import resolution
from reconciliation.duplicates import sweep_compensations
from tests.console.conftest import make_unknown, seen, signed_in
from tests.console.test_every_kind import KINDS, UNKNOWN_ESCALATED, build, serve_every_kind
from tests.factories import UserFactory, submit

pytestmark = pytest.mark.django_db

S = Intent.Status


@pytest.fixture(autouse=True)
def no_provider(settings: Any) -> None:
    """No sandbox provider answers here (a closed port): the lookups a resolution makes find
    nothing to say, whatever else runs on this machine's default sandbox port."""
    settings.SANDBOX_PROVIDER_URL = "http://127.0.0.1:9"


@pytest.fixture
def otto(db: Any) -> Any:
    return UserFactory(username="otto", groups=["operator"])


@pytest.fixture
def anna(db: Any) -> Any:
    return UserFactory(username="anna", groups=["operator"])


def _absent(intent: Intent, user: Any) -> dict[str, Any]:
    return {
        "intent_id": intent.id,
        "user": user,
        "reason": "not at the provider",
        "accept_duplicate_risk": True,
    }


def test_i16_4_im_on_it_assigns_audits_and_shows_in_queue_and_detail(otto: Any, anna: Any) -> None:
    # given: an UNKNOWN intent nobody is on
    intent = make_unknown(reference="order-1")
    client = signed_in(otto)
    # when: otto presses "I'm on it" (a plain form post)
    response = client.post(reverse("intent-assign", args=[intent.id]))
    # then: back to the item's page, assigned to otto, audited
    assert response.status_code == 302 and response["Location"] == reverse("unknown-detail", args=[intent.id])
    intent.refresh_from_db()
    assert intent.assigned_to == "otto" and intent.assigned_at is not None
    event = AuditEvent.objects.get(intent=intent, event="assigned")
    assert event.actor == "user:otto" and event.data["assigned_to"] == "otto"
    # and anna's queue and the detail page say who and since when
    queue = signed_in(anna).get(reverse("unknown")).content.decode()
    assert "<strong>otto</strong>" in queue and f"since {intent.assigned_at:%H:%M} UTC" in queue
    detail = signed_in(anna).get(reverse("unknown-detail", args=[intent.id])).content.decode()
    assert "<strong>otto</strong> is on it since" in detail
    assert "Take over from otto" in detail and "I&#x27;m on it</button>" not in detail


def test_i16_4_a_second_assignment_is_refused_naming_who_has_it(otto: Any, anna: Any) -> None:
    # given: otto is on it
    intent = make_unknown(reference="order-1")
    intent_assign(intent_id=intent.id, user=otto)
    # when: anna presses "I'm on it" too
    response = signed_in(anna).post(reverse("intent-assign", args=[intent.id]), follow=True)
    # then: refused with who has it; still otto's; the refusal is audited
    body = response.content.decode()
    assert "otto is on it since" in body and "take it over first" in body
    intent.refresh_from_db()
    assert intent.assigned_to == "otto"
    refusal = AuditEvent.objects.get(intent=intent, event="decision_refused")
    assert refusal.actor == "user:anna" and refusal.data["decision"] == "assign"


def test_i16_4_another_operator_cannot_resolve_while_it_is_assigned(otto: Any, anna: Any) -> None:
    # given: otto is on an UNKNOWN intent
    intent = make_unknown(reference="order-1")
    intent_assign(intent_id=intent.id, user=otto)
    # when: anna resolves it through the console
    data = {"reason": "not there", "accept_duplicate_risk": "on", "seen_seq": seen(intent)}
    response = signed_in(anna).post(reverse("unknown-resolve", args=[intent.id, "absent"]), data)
    # then: refused in place, nothing changed, the refusal audited
    assert response.status_code == 409
    assert "otto is on it since" in response.content.decode()
    intent.refresh_from_db()
    assert intent.status == S.UNKNOWN and intent.assigned_to == "otto"
    refusal = AuditEvent.objects.filter(intent=intent, event="decision_refused").get()
    assert refusal.actor == "user:anna" and "otto is on it" in refusal.reason


def test_i16_4_the_rule_is_in_the_services_every_path_obeys_it(otto: Any, anna: Any) -> None:
    # given: otto is on an UNKNOWN intent and on a HELD one
    intent = make_unknown(reference="order-1")
    submit(reference="order-2")
    held = submit(reference="order-2")
    assert held.status == S.HELD
    for item in (intent, held):
        intent_assign(intent_id=item.id, user=otto)
    # when / then: every decision by anna is refused, whatever path calls it
    with pytest.raises(AssignmentRefused, match="otto is on it"):
        resolution.resolve_absent(**_absent(intent, anna))
    with pytest.raises(AssignmentRefused, match="otto is on it"):
        intent_begin_compensation(
            intent_id=intent.id, from_status=S.UNKNOWN, provider_reference="ch_1", actor="user:anna",
            reason="undo", requested_by=anna,
        )  # fmt: skip
    with pytest.raises(AssignmentRefused):
        resolution.reject_held(intent_id=held.id, user=anna, reason="a duplicate")
    with pytest.raises(ResolutionRefused):
        resolution.lookup_now(intent_id=intent.id, user=anna)
    # and otto's own decision goes through and ends his assignment
    resolved = resolution.resolve_absent(**_absent(intent, otto))
    assert resolved.status == S.READY and resolved.assigned_to == "" and resolved.assigned_at is None


@pytest.mark.parametrize("verb", ["confirmed", "absent", "compensate"])
def test_i16_4_any_resolution_releases_the_assignment(verb: str, otto: Any, settings: Any) -> None:
    # given: otto is on an UNKNOWN charge
    intent = make_unknown(reference="order-1")
    intent_assign(intent_id=intent.id, user=otto)
    # when: he resolves it
    if verb == "confirmed":
        resolution.resolve_confirmed(
            intent_id=intent.id, user=otto, provider_reference="ch_1", reason="seen", accept_unverified=True
        )
    elif verb == "absent":
        resolution.resolve_absent(**_absent(intent, otto))
    else:
        resolution.resolve_compensate(
            intent_id=intent.id, user=otto, reason="undo", provider_reference="ch_1"
        )
    # then: nobody is on it any more
    intent.refresh_from_db()
    assert intent.status != S.UNKNOWN
    assert (intent.assigned_to, intent.assigned_at) == ("", None)


def test_i16_4_the_reconcilers_resolution_is_never_refused_and_releases(otto: Any) -> None:
    # given: otto is on it
    intent = make_unknown(reference="order-1")
    intent_assign(intent_id=intent.id, user=otto)
    # when: the reconciler's lookup finds the effect
    from operations.adapters.base import LookupResult, LookupStatus
    from reconciliation.lookups import record_lookup

    found = LookupResult(status=LookupStatus.FOUND, provider_references=("ch_9",))
    assert record_lookup(intent.id, found) == "resolved"
    # then
    intent.refresh_from_db()
    assert intent.status == S.SUCCEEDED and intent.assigned_to == ""


def test_i16_4_an_assignment_lapses_after_the_setting(otto: Any, anna: Any, settings: Any) -> None:
    # given: otto assigned himself 31 minutes ago (the default lasts 30)
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "ASSIGNMENT_SECONDS": 1800}
    intent = make_unknown(reference="order-1")
    intent_assign(intent_id=intent.id, user=otto)
    Intent.objects.filter(id=intent.id).update(assigned_at=timezone.now() - timedelta(minutes=31))
    # when: the queue is read, and anna presses "I'm on it"
    queue = signed_in(anna).get(reverse("unknown")).content.decode()
    assignment = intent_assign(intent_id=intent.id, user=anna)
    # then: it showed nobody, and anna has it without taking over
    assert "<strong>otto</strong>" not in queue
    assert assignment.username == "anna"
    # and anna may resolve it
    assert resolution.resolve_absent(**_absent(intent, anna)).status == S.READY


def test_i16_4_take_over_needs_confirmation_and_is_audited_with_both_names(otto: Any, anna: Any) -> None:
    # given: otto is on it; anna's page shows "Take over from otto"
    intent = make_unknown(reference="order-1")
    intent_assign(intent_id=intent.id, user=otto)
    client = signed_in(anna)
    url = reverse("intent-assign", args=[intent.id])
    # when: she sends the form without ticking the confirmation
    unconfirmed = client.post(url, {"take_over_from": "otto"}, follow=True).content.decode()
    # then: refused, still otto's
    assert "tick the box to confirm that you take it over from otto" in unconfirmed
    assert Intent.objects.get(id=intent.id).assigned_to == "otto"
    # when: she confirms
    client.post(url, {"take_over_from": "otto", "confirm_take_over": "on", "reason": "otto is off sick"})
    # then: hers, audited with both names; and she may resolve it
    intent.refresh_from_db()
    assert intent.assigned_to == "anna"
    event = AuditEvent.objects.get(intent=intent, event="assignment_taken_over")
    assert event.data["from"] == "otto" and event.data["to"] == "anna" and event.actor == "user:anna"
    assert event.reason == "otto is off sick"
    # and otto is now the one refused
    with pytest.raises(AssignmentRefused, match="anna is on it"):
        resolution.resolve_absent(**_absent(intent, otto))


def test_i16_4_a_take_over_from_an_out_of_date_page_changes_nothing(otto: Any, anna: Any) -> None:
    # given: the page showed otto, but vera took it over meanwhile
    vera = UserFactory(username="vera", groups=["operator"])
    intent = make_unknown(reference="order-1")
    intent_assign(intent_id=intent.id, user=otto)
    intent_assign(intent_id=intent.id, user=vera, take_over_from="otto")
    # when: anna takes over "from otto"
    with pytest.raises(AssignmentRefused, match="it is not otto's: vera is on it"):
        intent_assign(intent_id=intent.id, user=anna, take_over_from="otto")
    # then
    assert Intent.objects.get(id=intent.id).assigned_to == "vera"


def test_i16_4_a_crafted_take_over_names_what_is_true(otto: Any, anna: Any) -> None:
    # given: otto is on it
    intent = make_unknown(reference="order-1")
    intent_assign(intent_id=intent.id, user=otto)
    # when / then: anna "takes over from herself", or from someone who never held it
    with pytest.raises(AssignmentRefused, match="you cannot take it over from yourself"):
        intent_assign(intent_id=intent.id, user=anna, take_over_from="anna")
    with pytest.raises(AssignmentRefused, match="it is not nobody's: otto is on it"):
        intent_assign(intent_id=intent.id, user=anna, take_over_from="nobody")
    assert Intent.objects.get(id=intent.id).assigned_to == "otto"


def test_i16_4_the_page_says_how_long_an_assignment_lasts(otto: Any, settings: Any) -> None:
    # given: assignments of 90 s (the old text said "1 minutes"; 5 s said "0 minutes")
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "ASSIGNMENT_SECONDS": 90}
    intent = make_unknown(reference="order-1")
    intent_assign(intent_id=intent.id, user=otto)
    # when
    body = signed_in(otto).get(reverse("unknown-detail", args=[intent.id])).content.decode()
    # then
    assert "An assignment lapses 1 min 30 s after it was taken" in body


def test_i16_4_assigning_does_not_make_a_colleagues_page_out_of_date(otto: Any, anna: Any) -> None:
    # given: anna loaded the page, then otto pressed "I'm on it" and took the item back off... by resolving
    intent = make_unknown(reference="order-1")
    shown = seen(intent)
    intent_assign(intent_id=intent.id, user=anna)
    # when: anna decides from the page she loaded before assigning herself
    resolved = resolution.resolve_absent(**_absent(intent, anna), seen_seq=int(shown))
    # then: not refused as out of date
    assert resolved.status == S.READY


def test_i16_4_only_operators_of_the_tenant_can_assign(db: Any) -> None:
    # given: an operator of globex only, and a viewer of acme
    intent = make_unknown(reference="order-1", tenant="acme")
    outsider = UserFactory(username="olga", groups=["operator"], tenants=["globex"])
    viewer = UserFactory(username="vic", groups=["viewer"])
    # when / then: the outsider is told no such intent (404 in the console); the viewer 403
    with pytest.raises(AssignmentRefused, match="no intent"):
        intent_assign(intent_id=intent.id, user=outsider)
    assert signed_in(outsider).post(reverse("intent-assign", args=[intent.id])).status_code == 404
    assert signed_in(viewer).post(reverse("intent-assign", args=[intent.id])).status_code == 403
    assert Intent.objects.get(id=intent.id).assigned_to == ""


def test_i16_4_items_outside_the_queue_cannot_be_assigned(otto: Any) -> None:
    # given: a READY intent
    intent = submit(reference="order-9")
    # when / then
    with pytest.raises(AssignmentRefused, match="not in the operators' queue"):
        intent_assign(intent_id=intent.id, user=otto)


def test_i16_4_failed_compensation_and_held_items_can_be_assigned(otto: Any, anna: Any) -> None:
    # given: an escalated COMPENSATING intent (its compensation failed) and a HELD one
    intent = make_unknown(reference="order-1")
    resolution.resolve_compensate(intent_id=intent.id, user=anna, reason="undo", provider_reference="ch_1")
    intent_cancel(intent_id=intent.compensations.get().id, actor="user:vera", reason="not now")
    sweep_compensations()
    assert Intent.objects.get(id=intent.id).escalated_at is not None
    submit(reference="order-2")
    held = submit(reference="order-2")
    # when
    for item in (intent, held):
        intent_assign(intent_id=item.id, user=otto)
    # then: the queue's compensations and held sections and both pages show otto
    client = signed_in(anna)
    assert client.get(reverse("unknown")).content.decode().count("<strong>otto</strong>") == 2
    assert (
        "<strong>otto</strong> is on it"
        in client.get(reverse("unknown-detail", args=[intent.id])).content.decode()
    )
    assert (
        "<strong>otto</strong> is on it"
        in client.get(reverse("held-detail", args=[held.id])).content.decode()
    )
    # and anna's reopen is refused; otto's releases it
    with pytest.raises(AssignmentRefused):
        resolution.resolve_failed_compensation(intent_id=intent.id, user=anna, verb="reopen", reason="again")
    resolution.resolve_failed_compensation(intent_id=intent.id, user=otto, verb="reopen", reason="again")
    assert Intent.objects.get(id=intent.id).assigned_to == ""


@pytest.mark.django_db(transaction=True)
def test_i16_4_two_operators_pressing_at_once_one_wins(otto: Any, anna: Any) -> None:
    # given: an UNKNOWN intent; two operators press "I'm on it" at the same moment
    intent = make_unknown(reference="order-1")
    barrier = threading.Barrier(2)
    results: dict[str, Any] = {}

    def press(user: Any) -> None:
        try:
            barrier.wait()
            results[user.username] = intent_assign(intent_id=intent.id, user=user)
        except AssignmentRefused as exc:
            results[user.username] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=press, args=(user,)) for user in (otto, anna)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # then: exactly one won; the other was told who has it
    winners = [name for name, result in results.items() if not isinstance(result, Exception)]
    assert len(winners) == 1
    loser = next(result for result in results.values() if isinstance(result, Exception))
    assert f"{winners[0]} is on it since" in loser.detail
    assert Intent.objects.get(id=intent.id).assigned_to == winners[0]
    assert AuditEvent.objects.filter(intent=intent, event="assigned").count() == 1


@pytest.mark.parametrize("kind", list(KINDS))
def test_i16_4_assignment_renders_for_every_action_kind(
    kind: str, settings: Any, approver: Any, otto: Any
) -> None:
    # given: an escalated UNKNOWN intent of every kind, otto on it
    serve_every_kind(settings)
    settings.EFFECT_LEDGER_POLICIES = {action: {"approval": "never"} for action, _ in KINDS.values()}
    intent = build(kind, UNKNOWN_ESCALATED, settings=settings, approver=approver)
    intent_assign(intent_id=intent.id, user=otto)
    viewer = signed_in(UserFactory(username="vic", groups=["viewer"]))
    # when / then: the queue (page and partial) and the item's page say who is on it
    for body in (
        viewer.get(reverse("unknown")).content.decode(),
        viewer.get(reverse("unknown"), HTTP_HX_REQUEST="true").content.decode(),
        viewer.get(reverse("unknown-detail", args=[intent.id])).content.decode(),
    ):
        assert "<strong>otto</strong>" in body
