"""Approving a second effect for the same reference (issue 16 item 2): a warning on the approval
page and a badge in the inbox, linking the other intents, and an explicit confirmation that the
approval service itself requires."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from operations.adapters.base import ExecutionResult
from operations.exceptions import ApprovalRefused
from operations.models import Approval, AuditEvent, Intent, OutboxMessage
from operations.selectors.duplicate_risk import duplicate_risks
from operations.services import (
    intent_approve,
    intent_cancel,
    intent_claim,
    intent_record_failure,
    intent_record_success,
)
from operations.services.business import intent_release_held
from tests.console.conftest import gated
from tests.factories import charge_arguments, submit

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
S = Intent.Status


@pytest.fixture(autouse=True)
def _no_reuse_window(settings: Any) -> None:
    """Charges without a reuse window (``reuse_window_seconds: 0``), so a second charge for an
    order already charged goes straight to its approvers: this module tests the approval page's
    warning, the guard that remains when the window does not hold the second one (turned off, or
    past it, or after an operator released it: test_every_kind). The window's own hold is tested
    in tests/operations/test_reuse_window.py."""
    policies = settings.EFFECT_LEDGER_POLICIES
    settings.EFFECT_LEDGER_POLICIES = {
        **policies,
        "payments.charge": {**policies["payments.charge"], "reuse_window_seconds": 0},
    }


def succeeded(reference: str, **kwargs: Any) -> Intent:
    """A charge for ``reference`` that ran and succeeded (through the services)."""
    intent = submit(arguments=charge_arguments(4990), reference=reference, **kwargs)
    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None
    assert intent_record_success(
        claim=claim, result=ExecutionResult(provider_reference="ch_1", response_digest="0" * 64)
    )
    intent.refresh_from_db()
    assert intent.status == S.SUCCEEDED
    return intent


def failed(reference: str) -> Intent:
    intent = submit(arguments=charge_arguments(4990), reference=reference)
    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None
    assert intent_record_failure(claim=claim, error="card declined")
    intent.refresh_from_db()
    return intent


def in_flight_pair(reference: str) -> tuple[Intent, Intent]:
    """An earlier charge READY (about to be sent) and a second one for the same reference that an
    operator released from HELD, now awaiting approval beside it."""
    earlier = submit(arguments=charge_arguments(4990), reference=reference)
    assert earlier.status == S.READY
    second = submit(arguments=charge_arguments(25_000), reference=reference)
    assert second.status == S.HELD
    released = intent_release_held(
        intent_id=second.id, actor="user:otto", reason="customer asked twice", duplicate_risk_accepted=True
    )
    assert released.status == S.AWAITING_APPROVAL
    return earlier, released


def row_of(body: str, intent: Intent) -> str:
    """The inbox row (``<tr>`` .. ``</tr>``) of ``intent``."""
    start = body.rindex("<tr>", 0, body.index(str(intent.id)))
    return body[start : body.index("</tr>", start)]


def approval_page(client: Client, intent: Intent) -> str:
    response = client.get(reverse("approval-detail", args=[intent.id]))
    assert response.status_code == 200
    return response.content.decode()


def approve(client: Client, intent: Intent, **extra: str) -> Any:
    data = {"request_hash": intent.request_hash, "reason": "checked", **extra}
    return client.post(reverse("approval-approve", args=[intent.id]), data)


def test_i16_2_warning_shown_for_a_succeeded_earlier_charge(approver_client: Client) -> None:
    # given: order-1 was charged; a new charge for order-1 awaits approval
    earlier = succeeded("order-1")
    intent = gated(25_000, reference="order-1")
    # when
    body = approval_page(approver_client, intent)
    # then: a prominent warning linking the earlier charge, and the confirmation in the form
    assert 'id="duplicate-risk"' in body and 'role="alert"' in body
    warning = body[
        body.index('id="duplicate-risk"') : body.index("</section>", body.index('id="duplicate-risk"'))
    ]
    assert reverse("intent-detail", args=[earlier.id]) in warning and "SUCCEEDED" in warning
    assert (
        'name="accept_duplicate_risk"' in body and "required" in body[body.index('id="approve-ack"') - 80 :]
    )


def test_i16_2_warning_shown_for_an_in_flight_earlier_charge(approver_client: Client) -> None:
    earlier, intent = in_flight_pair("order-2")
    body = approval_page(approver_client, intent)
    assert 'id="duplicate-risk"' in body
    assert reverse("intent-detail", args=[earlier.id]) in body and ">READY<" in body


@pytest.mark.parametrize("ending", ["failed", "cancelled"])
def test_i16_2_no_warning_for_an_earlier_charge_that_ended_without_effect(
    approver_client: Client, ending: str
) -> None:
    # given: the earlier charge for order-3 failed or was cancelled
    if ending == "failed":
        failed("order-3")
    else:
        earlier = submit(arguments=charge_arguments(4990), reference="order-3")
        intent_cancel(intent_id=earlier.id, actor="agent:agent-1", reason="re-planned")
    intent = gated(25_000, reference="order-3")
    # when / then
    body = approval_page(approver_client, intent)
    assert 'id="duplicate-risk"' not in body and 'name="accept_duplicate_risk"' not in body
    assert approve(approver_client, intent).status_code == 302  # approved without a confirmation
    intent.refresh_from_db()
    assert intent.status == S.READY


def test_i16_2_no_warning_for_another_action_or_another_tenant(approver_client: Client) -> None:
    # given: order-4 succeeded as a charge of another tenant, and as a refund of this one
    succeeded("order-4", tenant="globex")
    refund = submit(
        action="payments.refund",
        arguments={"charge": "ch_9", "amount": 100, "currency": "EUR"},
        reference="order-4",
    )
    assert refund.status not in (S.HELD,)
    intent = gated(25_000, reference="order-4")
    # when / then
    assert 'id="duplicate-risk"' not in approval_page(approver_client, intent)
    assert duplicate_risks([intent]) == {}


def test_i16_2_the_warning_names_only_the_intents_that_may_duplicate(approver_client: Client) -> None:
    # given: for order-11, a failed and a cancelled charge, another tenant's charge, a refund
    # (another action) that succeeded, and one charge of this tenant that succeeded
    failed("order-11")
    cancelled = submit(arguments=charge_arguments(4990), reference="order-11")
    intent_cancel(intent_id=cancelled.id, actor="agent:agent-1", reason="re-planned")
    other_tenant = succeeded("order-11", tenant="globex")
    refund = submit(
        action="payments.refund",
        arguments={"charge": "ch_9", "amount": 100, "currency": "EUR"},
        reference="order-11",
    )
    charged = succeeded("order-11")
    intent = gated(25_000, reference="order-11")
    # when
    body = approval_page(approver_client, intent)
    # then: the warning links the one charge that happened here, and nothing else
    start = body.index('id="duplicate-risk"')
    warning = body[start : body.index("</section>", start)]
    linked = set(re.findall(r'href="/intents/([0-9a-f-]+)/"', warning))
    assert linked == {str(charged.id)}
    assert str(other_tenant.id) not in body and str(refund.id) not in warning


def test_i16_2_approve_without_the_confirmation_is_refused_and_changes_nothing(
    approver_client: Client,
) -> None:
    # given
    succeeded("order-5")
    intent = gated(25_000, reference="order-5")
    before = (Approval.objects.count(), OutboxMessage.objects.count(), intent.status)
    # when: a plain form POST without the box ticked (or with a value that is no tick)
    refused = approve(approver_client, intent)
    refused_off = approve(approver_client, intent, accept_duplicate_risk="off")
    # then: refused in place, nothing changed, the refusal audited
    for response in (refused, refused_off):
        assert response.status_code == 409 or response.status_code == 422 or response.status_code == 403
        body = response.content.decode()
        assert "Refused:" in body and "already succeeded or is in flight" in body
        assert 'id="duplicate-risk"' in body
    intent.refresh_from_db()
    assert (Approval.objects.count(), OutboxMessage.objects.count(), intent.status) == before
    refusals = AuditEvent.objects.filter(intent=intent, event="decision_refused")
    assert refusals.count() == 2
    assert "approve" in str(refusals.first().data)  # type: ignore[union-attr]


def test_i16_2_approve_with_the_confirmation_is_approved_and_audited(approver_client: Client) -> None:
    # given
    earlier = succeeded("order-6")
    intent = gated(25_000, reference="order-6")
    # when
    response = approve(
        approver_client, intent, accept_duplicate_risk="on", duplicate_risk_seen=str(earlier.id)
    )
    # then
    assert response.status_code == 302
    intent.refresh_from_db()
    assert intent.status == S.READY
    approved = AuditEvent.objects.get(intent=intent, event="approved")
    assert approved.data["duplicate_risk_accepted"] == [str(earlier.id)]


def test_i16_2_the_service_refuses_whoever_calls_it(approver: Any) -> None:
    # given: an in-flight charge for order-7 and a second one awaiting approval
    earlier, intent = in_flight_pair("order-7")
    # when / then: the service itself refuses, whatever the caller
    with pytest.raises(ApprovalRefused, match="already succeeded or is in flight"):
        intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash)
    intent.refresh_from_db()
    assert intent.status == S.AWAITING_APPROVAL and not intent.approvals.exists()
    approved = intent_approve(
        intent_id=intent.id, user=approver, request_hash=intent.request_hash, accepted_duplicates=[earlier.id]
    )
    assert approved.status == S.READY


def test_i16_2_a_risk_that_appeared_after_the_page_loaded_is_refused_not_approved_unseen(
    approver_client: Client,
) -> None:
    # given: order-8 was charged; the approver opens the second charge's page, which lists it
    earlier = succeeded("order-8")
    intent = gated(25_000, reference="order-8")
    page = approval_page(approver_client, intent)
    listed = page.split('name="duplicate_risk_seen" value="', 1)[1].split('"', 1)[0]
    assert listed == str(earlier.id)
    # and, while the page is open, a third charge for order-8 is held behind it, then released
    # by an operator: it now awaits approval too (the reviewer's case)
    third = submit(arguments=charge_arguments(26_000), reference="order-8")
    assert third.status == S.HELD
    intent_release_held(
        intent_id=third.id, actor="user:otto", reason="asked twice", duplicate_risk_accepted=True
    )
    before = (Approval.objects.count(), OutboxMessage.objects.count())
    # when: the approver ticks the box on the page as it was
    response = approve(approver_client, intent, accept_duplicate_risk="on", duplicate_risk_seen=listed)
    # then: refused in place, naming the one not shown; nothing changed
    body = response.content.decode()
    assert response.status_code in {403, 409, 422}
    assert "since the page loaded" in body and str(third.id) in body
    intent.refresh_from_db()
    assert intent.status == S.AWAITING_APPROVAL
    assert (Approval.objects.count(), OutboxMessage.objects.count()) == before
    # and after a reload that lists both, the approval goes through and records both
    reloaded = approval_page(approver_client, intent)
    both = reloaded.split('name="duplicate_risk_seen" value="', 1)[1].split('"', 1)[0]
    assert set(both.split(",")) == {str(earlier.id), str(third.id)}
    assert (
        approve(approver_client, intent, accept_duplicate_risk="on", duplicate_risk_seen=both).status_code
        == 302
    )
    approved = AuditEvent.objects.get(intent=intent, event="approved")
    assert set(approved.data["duplicate_risk_accepted"]) == {str(earlier.id), str(third.id)}


def test_i16_2_every_risk_is_listed_and_recorded_beyond_the_inbox_badge_limit(
    approver_client: Client,
) -> None:
    # given: seven earlier intents for order-9 that succeeded (more than the badge names)
    earlier = {str(succeeded("order-9").id) for _ in range(7)}
    intent = gated(25_000, reference="order-9")
    # when: the page lists them and the approver accepts what it listed
    page = approval_page(approver_client, intent)
    listed = page.split('name="duplicate_risk_seen" value="', 1)[1].split('"', 1)[0]
    response = approve(approver_client, intent, accept_duplicate_risk="on", duplicate_risk_seen=listed)
    # then: all seven were listed, accepted and recorded
    assert set(listed.split(",")) == earlier
    assert response.status_code == 302
    approved = AuditEvent.objects.get(intent=intent, event="approved")
    assert set(approved.data["duplicate_risk_accepted"]) == earlier


def test_i16_2_a_crafted_list_of_seen_intents_is_a_clear_error_not_a_500(approver_client: Client) -> None:
    # given
    succeeded("order-10")
    intent = gated(25_000, reference="order-10")
    # when
    response = approve(
        approver_client, intent, accept_duplicate_risk="on", duplicate_risk_seen="not-an-id,42"
    )
    # then
    assert response.status_code == 422
    assert "not a list of ids" in response.content.decode()
    intent.refresh_from_db()
    assert intent.status == S.AWAITING_APPROVAL


def test_i16_2_inbox_badge_links_the_other_intents_in_one_query(approver_client: Client) -> None:
    # given: two awaiting charges with a risk each, one without
    first = succeeded("order-8")
    risky = gated(25_000, reference="order-8")
    flying, released = in_flight_pair("order-9")
    calm = gated(30_000, reference="order-10")
    # when
    with CaptureQueriesContext(connection) as queries:
        full = approver_client.get(reverse("approvals")).content.decode()
    risk_queries = [q for q in queries.captured_queries if "ROW_NUMBER()" in q["sql"]]
    rows = approver_client.get(reverse("approvals"), **HTMX).content.decode()  # type: ignore[arg-type]
    # then: a badge on the risky rows, linking the other intents; none on the calm one
    for body in (full, rows):
        for intent, other in ((risky, first), (released, flying)):
            row = row_of(body, intent)
            assert "possible duplicate" in row and reverse("intent-detail", args=[other.id]) in row
        assert "possible duplicate" not in row_of(body, calm)
    assert len(risk_queries) == 1  # one query for every row, not one per row


def test_i37_console_inbox_risks_are_one_query_whose_text_does_not_grow_with_the_rows() -> None:
    # given: two awaiting charges, then thirty, each with its own reference
    few = [gated(25_000, reference=f"order-{n}") for n in range(2)]
    many = few + [gated(25_000, reference=f"order-{n}") for n in range(2, 30)]

    def risk_query(intents: list[Intent]) -> str:
        with CaptureQueriesContext(connection) as queries:
            duplicate_risks(intents)
        (query,) = queries.captured_queries
        return query["sql"]

    # when
    sql_few, sql_many = risk_query(few), risk_query(many)
    # then: one "= ANY" list per column, not one OR-ed condition per row (30 rows took longer
    # to build and plan than to run; the inbox asks for 200)
    assert sql_few.count(" OR ") == sql_many.count(" OR ") == 0
    assert sql_many.count("order-") == 30


def test_i37_console_inbox_badge_ignores_another_tenants_intent_with_a_listed_reference(
    approver: Any,
) -> None:
    # given: acme awaits order-1, globex awaits order-2, and globex charged order-1 (its own
    # business, though order-1 is in the list through acme's row) and acme charged order-2
    acme = gated(25_000, reference="order-1")
    globex = gated(25_000, tenant="globex", reference="order-2")
    succeeded("order-1", tenant="globex")
    charged = succeeded("order-2")
    # when
    risks = duplicate_risks([acme, globex])
    # then: neither row names the other tenant's intent (read together, dropped here)
    assert risks == {}
    # and an awaiting acme charge for order-2 does name acme's own
    second = gated(25_000, reference="order-2")
    assert [o.id for o in duplicate_risks([acme, globex, second])[second.id]] == [charged.id]
