"""Approvals inbox, detail, approve and reject, and every refusal (cases C10, C11)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from operations.models import Approval, Intent, OutboxMessage
from operations.services import intent_cancel
from tests.console.conftest import gated, signed_in
from tests.factories import UserFactory, charge_arguments, submit

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


def approve(client: Client, intent: Intent, request_hash: str | None = None, **extra: Any) -> Any:
    return client.post(
        reverse("approval-approve", args=[intent.id]),
        {"request_hash": request_hash or intent.request_hash, "reason": "checked the invoice"},
        **extra,
    )


def test_inbox_lists_what_awaits_a_decision_highest_risk_then_newest(
    approver_client: Client, settings: Any
) -> None:
    # given: a high-risk charge, then a newer one, and a critical refund
    settings.EFFECT_LEDGER_POLICIES = {
        **settings.EFFECT_LEDGER_POLICIES,
        "payments.refund": {"risk_tier": "critical", "approval": "always"},
    }
    older = gated(25_000)
    newer = gated(30_000)
    critical = submit(
        action="payments.refund", arguments={"charge": "ch_1", "amount": 500, "currency": "EUR"}
    )
    submit(arguments=charge_arguments(100))  # runs automatically, not in the inbox
    # when
    response = approver_client.get(reverse("approvals"))
    # then
    body = response.content.decode()
    positions = [body.index(str(i.id)) for i in (critical, newer, older)]
    assert positions == sorted(positions)
    assert "250.00 EUR" in body and "agent:agent-1" in body and "acme" in body
    assert 'class="countdown"' in body and "0 of 2" in body


def test_inbox_poll_returns_only_the_rows(approver_client: Client) -> None:
    gated()
    response = approver_client.get(reverse("approvals"), **HTMX)
    body = response.content.decode()
    assert response.status_code == 200 and 'id="approval-rows"' in body and "<html" not in body


def test_detail_shows_preview_canonical_payload_hash_and_diff(approver_client: Client) -> None:
    # given: an earlier intent with the same reference and a different amount, ended (an open
    # one would hold the second)
    earlier = submit(arguments=charge_arguments(4990), reference="order-7")
    intent_cancel(intent_id=earlier.id, actor="agent:agent-1", reason="re-planned")
    intent = gated(49_900, reference="order-7")
    # when
    body = approver_client.get(reverse("approval-detail", args=[intent.id])).content.decode()
    # then
    assert "Charge 499.00 EUR to cus_42" in body  # the adapter's preview
    assert "one card charge on the customer" in body  # scope
    assert "needs 1 approver(s) from" in body  # policy check
    assert intent.request_hash in body
    assert "{&quot;action&quot;:&quot;payments.charge&quot;" in body  # canonical document, escaped
    assert "Changes since the previous intent" in body
    assert ">amount<" in body and "4990" in body and "49900" in body
    assert f'name="request_hash" value="{intent.request_hash}"' in body


def test_preview_follows_the_intent_policy_snapshot_after_the_policy_changes(
    approver_client: Client, settings: Any
) -> None:
    # given: an intent submitted under the shipped policy (high tier, one approver)
    intent = gated(25_000)
    # when: the configured policy changes afterwards
    settings.EFFECT_LEDGER_POLICIES = {
        **settings.EFFECT_LEDGER_POLICIES,
        "payments.charge": {"risk_tier": "critical", "approver_group": "finance"},
    }
    body = approver_client.get(reverse("approval-detail", args=[intent.id])).content.decode()
    # then: the page judges the intent by the policy it was submitted under
    assert "needs 1 approver(s) from &#x27;approver&#x27;" in body
    assert "finance" not in body and "critical" not in body
    assert 'class="risk risk-high"' in body and "approvals 0 of 1" in body
    assert "Approve this payload" in body


def test_approve_commits_the_decision_and_the_dispatch_together_c11(approver_client: Client) -> None:
    # given
    intent = gated()
    # when
    response = approve(approver_client, intent)
    # then: without JavaScript, a redirect to the intent with a message
    assert response.status_code == 302
    assert response["Location"] == reverse("intent-detail", args=[intent.id])
    intent.refresh_from_db()
    assert intent.status == Intent.Status.READY
    assert OutboxMessage.objects.filter(intent=intent).count() == 1
    page = approver_client.get(response["Location"]).content.decode()
    assert "Approved. The intent is READY" in page


def test_approve_with_htmx_returns_the_decision_fragment(approver_client: Client) -> None:
    intent = gated()
    response = approve(approver_client, intent, **HTMX)
    body = response.content.decode()
    assert response.status_code == 200 and 'id="decision"' in body and "<html" not in body
    assert "Approved. The intent is READY" in body


def test_c10_hash_not_the_current_one_is_refused_visibly(approver_client: Client) -> None:
    # given: the page displayed hash A; meanwhile the intent's payload became B
    intent = gated()
    shown = intent.request_hash
    Intent.objects.filter(id=intent.id).update(request_hash="b" * 64, arguments=charge_arguments(99_999))
    # when
    response = approve(approver_client, intent, request_hash=shown, **HTMX)
    # then
    body = response.content.decode()
    assert response.status_code == 403 and response["X-Console-Fragment"] == "1"
    assert "request_hash differs" in body
    assert "Reload and review the current payload" in body
    assert 'name="request_hash"' not in body  # never hand back a form with an unreviewed hash
    assert not Approval.objects.exists() and not OutboxMessage.objects.filter(intent=intent).exists()


def test_c10_refusal_without_javascript_renders_the_page_with_the_reason(approver_client: Client) -> None:
    intent = gated()
    response = approve(approver_client, intent, request_hash="a" * 64)
    assert response.status_code == 403
    assert b"<html" in response.content and b"request_hash differs" in response.content


def test_expired_request_is_refused_and_the_intent_expires_with_the_answer(approver_client: Client) -> None:
    intent = gated()
    from django.db.models.functions import Now

    Intent.objects.filter(id=intent.id).update(approval_expires_at=Now())
    response = approve(approver_client, intent, **HTMX)
    assert response.status_code == 403 and b"expired" in response.content
    # issue 35 item 5: the refusal and the state agree, without waiting for the expiry sweep
    assert Intent.objects.get(id=intent.id).status == Intent.Status.EXPIRED
    detail = approver_client.get(reverse("approval-detail", args=[intent.id]))
    assert detail.status_code == 200 and b"EXPIRED" in detail.content


def test_missing_permission_is_refused(viewer_client: Client) -> None:
    intent = gated()
    page = viewer_client.get(reverse("approval-detail", args=[intent.id])).content.decode()
    assert "You are not in the &#x27;approver&#x27; group" in page and "Approve this payload" not in page
    response = approve(viewer_client, intent, **HTMX)
    assert response.status_code == 403 and b"not in the" in response.content
    assert not Approval.objects.exists()


def test_requester_approving_their_own_is_refused() -> None:
    # given: an approver who submitted the intent as a user principal
    alice = UserFactory(username="alice", groups=["approver"])
    intent = gated(principal="user:alice")
    client = signed_in(alice)
    page = client.get(reverse("approval-detail", args=[intent.id])).content.decode()
    assert "You requested this intent" in page and "Approve this payload" not in page
    # when
    response = approve(client, intent)
    # then
    assert response.status_code == 403 and b"four eyes" in response.content
    assert Intent.objects.get(id=intent.id).status == Intent.Status.AWAITING_APPROVAL


def test_critical_needs_two_different_approvers(settings: Any, approver: Any, second_approver: Any) -> None:
    # given
    settings.EFFECT_LEDGER_POLICIES = {
        **settings.EFFECT_LEDGER_POLICIES,
        "payments.charge": {"risk_tier": "critical"},
    }
    intent = gated(500)
    first, second = signed_in(approver), signed_in(second_approver)
    # when: the first approval
    response = approve(first, intent, **HTMX)
    # then: recorded, still waiting
    assert b"needs another approver" in response.content
    assert Intent.objects.get(id=intent.id).status == Intent.Status.AWAITING_APPROVAL
    # the same approver again is refused
    again = approve(first, intent, **HTMX)
    assert again.status_code == 403 and b"already decided" in again.content
    # a second, different approver releases it
    approve(second, intent)
    assert Intent.objects.get(id=intent.id).status == Intent.Status.READY


def test_reject_needs_a_reason_and_then_rejects(approver_client: Client) -> None:
    intent = gated()
    url = reverse("approval-reject", args=[intent.id])
    missing = approver_client.post(url, {"request_hash": intent.request_hash, "reason": ""}, **HTMX)
    assert missing.status_code == 422 and b"Reason" in missing.content
    response = approver_client.post(url, {"request_hash": intent.request_hash, "reason": "not ordered"})
    assert response.status_code == 302
    assert Intent.objects.get(id=intent.id).status == Intent.Status.REJECTED


def test_deciding_an_intent_that_moved_is_refused(approver_client: Client, second_approver: Any) -> None:
    intent = gated()
    approve(signed_in(second_approver), intent)
    response = approve(approver_client, intent, **HTMX)
    assert response.status_code == 409 and b"reload and decide again" in response.content


def test_malformed_hash_is_a_visible_422(approver_client: Client) -> None:
    intent = gated()
    response = approve(approver_client, intent, request_hash="short", **HTMX)
    assert response.status_code == 422 and b"Refused" in response.content


@pytest.mark.parametrize("posted", [{}, {"request_hash": "short"}], ids=["missing", "malformed"])
def test_a_missing_or_malformed_hash_is_not_called_a_changed_payload(
    approver_client: Client, posted: dict[str, str]
) -> None:
    # A newcomer's report: a 422 for a missing hash also said "The payload changed after this
    # page loaded", which was not true.
    intent = gated()
    response = approver_client.post(
        reverse("approval-approve", args=[intent.id]), {"reason": "checked", **posted}, **HTMX
    )
    body = response.content.decode()
    assert response.status_code == 422 and "request_hash" in body
    assert "The payload changed" not in body
    intent.refresh_from_db()
    assert intent.status == Intent.Status.AWAITING_APPROVAL


def test_a_well_formed_hash_of_another_payload_with_a_bad_reason_is_still_called_stale(
    approver_client: Client,
) -> None:
    intent = gated()
    response = approver_client.post(
        reverse("approval-approve", args=[intent.id]),
        {"request_hash": "0" * 64, "reason": "x" * 5000},
        **HTMX,
    )
    assert response.status_code == 422 and "The payload changed" in response.content.decode()


def test_get_on_an_action_is_not_allowed(approver_client: Client) -> None:
    intent = gated()
    assert approver_client.get(reverse("approval-approve", args=[intent.id])).status_code == 405


def test_post_without_csrf_is_refused_and_header_token_is_accepted(approver: Any) -> None:
    # given: a client that enforces CSRF like a browser
    intent = gated()
    client = Client(enforce_csrf_checks=True)
    client.force_login(approver)
    page = client.get(reverse("approval-detail", args=[intent.id]))
    token = client.cookies["csrftoken"].value
    assert 'hx-headers=\'{"X-CSRFToken": "' in page.content.decode()
    # when: no token at all
    refused = client.post(
        reverse("approval-approve", args=[intent.id]), {"request_hash": intent.request_hash}
    )
    assert refused.status_code == 403
    # then: a background poll does not rotate the token; the header token (as htmx sends it) works
    client.get(reverse("approvals"), **HTMX)
    client.get(reverse("dashboard"), **HTMX)
    assert client.cookies["csrftoken"].value == token
    accepted = client.post(
        reverse("approval-approve", args=[intent.id]),
        {"request_hash": intent.request_hash},
        HTTP_X_CSRFTOKEN=token,
        **HTMX,
    )
    assert accepted.status_code == 200
    assert Intent.objects.get(id=intent.id).status == Intent.Status.READY
