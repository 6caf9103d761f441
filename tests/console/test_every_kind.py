"""Every console page renders for every provider kind in every state that kind can reach.

Issue 10, fault 1: the UNKNOWN queue (and the approvals inbox) answered 500 as soon as one
listed intent had no ``currency`` argument (email.send, reservations.*, generic actions),
because a template filter argument that does not resolve raises ``VariableDoesNotExist``.
These tests build one intent per (kind, state) through the services and open every page, the
full page and the htmx partial, as a viewer.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.test import Client
from django.urls import reverse

from operations.adapters.base import ExecutionResult
from operations.audit.trail import REFUSAL_EVENT
from operations.engine.protocol import execute_intent
from operations.models import Intent
from operations.services import (
    intent_cancel,
    intent_claim,
    intent_escalate,
    intent_expire_approval,
    intent_mark_unknown,
    intent_record_failure,
    intent_record_success,
    intent_reject,
    intent_release_held,
)
from operations.services.compensation import intent_begin_compensation
from operations.services.execution import intent_hold_restored
from operations.services.failover import RESTORE_GUARD_HOLD, intents_mark_forgotten_changes
from tests.console.conftest import seen, signed_in, status_count
from tests.factories import submit, user_named
from tests.support.stripe_server import stripe_declaration

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
S = Intent.Status

#: Generic HTTP actions (operations/adapters/generic_http.py); nothing is ever sent to them.
GENERIC_HTTP = {
    "acme.transfer": {
        "url": "http://127.0.0.1:9/v1/transfers",
        "lookup_url": "http://127.0.0.1:9/v1/transfers?idempotency_key={idempotency_key}",
        "target_field": "account",
    },
    "acme.notify": {"url": "http://127.0.0.1:9/v1/notifications"},
    # A declared provider without keys (issue 33): form body, named secret, a lagging listing by
    # our reference, no compensation.
    "crm.create_ticket": {
        "url": "http://127.0.0.1:9/api/tickets",
        "keys": "none",
        "encoding": "form",
        "auth": {"scheme": "header", "header": "X-Api-Key", "secret": "env:CRM_API_KEY"},
        "lookup": {
            "url": "http://127.0.0.1:9/api/tickets?external_ref={reference}",
            "by": "reference",
            "items": "/results",
            "fields": {"id": "/id", "reference": "/external_ref", "status": "/state"},
            "proving_statuses": ["open", "closed"],
            "consistency_window_seconds": 120,
        },
        "target_field": "customer",
    },
}

#: The shipped Stripe declaration (docs/providers/stripe.json: form body, keys sent but not
#: trusted here, lookup listing by reference, refund as compensation, Stripe-signed events),
#: pointed at a closed port; nothing is ever sent to it.
STRIPE = stripe_declaration(
    "http://127.0.0.1:9",
    **{
        a: {"keys": {"header": "Idempotency-Key", "deduplicates": False}}
        for a in ("stripe.charge", "stripe.refund")
    },
)

#: An SMTP action (operations/adapters/smtp/); nothing is ever sent to it either.
SMTP = {"mail.notify": {"host": "127.0.0.1", "port": 9, "from": "Ledger <ledger@example.test>"}}

#: kind -> (action, arguments). The generic action without lookup_url has an integer
#: ``amount`` but no ``currency`` (a count, not money).
KINDS: dict[str, tuple[str, dict[str, Any]]] = {
    "payments.charge": ("payments.charge", {"amount": 4990, "currency": "EUR", "customer": "cus_42"}),
    "payments.refund": ("payments.refund", {"charge": "ch_1", "amount": 1500, "currency": "EUR"}),
    "email.send": ("email.send", {"to": "ana@example.test", "subject": "Receipt", "body": "Thanks"}),
    "reservations.create": (
        "reservations.create",
        {"resource": "room-101", "start": "2030-01-01T10:00:00Z", "seats": 2, "reference": "booking-1"},
    ),
    "reservations.cancel": ("reservations.cancel", {"reservation": "res_1", "reference": "cancel-1"}),
    "generic-with-lookup": ("acme.transfer", {"amount": 1250, "currency": "USD", "account": "acc_9"}),
    "generic-without-lookup": ("acme.notify", {"amount": 3, "channel": "ops", "text": "deployed"}),
    "declared-without-keys": ("crm.create_ticket", {"title": "Refund request", "customer": "cus_77"}),
    "smtp": ("mail.notify", {"to": "ana@example.test", "subject": "Receipt", "body": "Thanks"}),
    "stripe": ("stripe.charge", {"amount": 4990, "currency": "EUR", "customer": "cus_42"}),
    "stripe.refund": ("stripe.refund", {"charge": "ch_1", "amount": 1500, "currency": "EUR"}),
}

#: Only these kinds have a compensation (payments.refund, reservations.cancel): the others
#: never reach COMPENSATING or COMPENSATED.
COMPENSABLE = {"payments.charge", "reservations.create", "stripe"}

UNKNOWN_ESCALATED = "UNKNOWN-escalated"
#: HELD for a person: its adapter cannot be loaded any more (issue 21), so nothing can run it.
HELD_UNSERVED = "HELD-unserved"
#: HELD for a person: its row was edited after submission, so the worker sent nothing (issue 11).
HELD_MISMATCH = "HELD-mismatch"
#: UNKNOWN without any attempt: a recovery found a forgotten timeline changed it (issue 22).
UNKNOWN_FORGOTTEN = "UNKNOWN-forgotten"
#: HELD for a person by the restore guard after a failover or restore (issue 22).
HELD_RESTORE = "HELD-restore"
STATES = [
    S.AWAITING_APPROVAL,
    S.READY,
    S.RUNNING,
    S.SUCCEEDED,
    S.FAILED,
    S.UNKNOWN,
    UNKNOWN_ESCALATED,
    S.COMPENSATING,
    S.COMPENSATED,
    S.REJECTED,
    S.EXPIRED,
    S.CANCELLED,
    S.HELD,
    HELD_UNSERVED,
    HELD_MISMATCH,
    UNKNOWN_FORGOTTEN,
    HELD_RESTORE,
]
GATED_STATES = {S.AWAITING_APPROVAL, S.REJECTED, S.EXPIRED}

CASES = [
    pytest.param(kind, state, id=f"{kind}-{state}")
    for kind in KINDS
    for state in STATES
    if kind in COMPENSABLE or state not in (S.COMPENSATING, S.COMPENSATED)
]


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    """The users these many tests create need no slow password hashing."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def serve_every_kind(settings: Any) -> None:
    """Serve every kind's action: the generic HTTP ones, the Stripe declaration and SMTP."""
    settings.EFFECT_LEDGER_GENERIC_HTTP = {**GENERIC_HTTP, **STRIPE}
    settings.EFFECT_LEDGER_SMTP = SMTP


@pytest.fixture
def every_kind(settings: Any) -> None:
    """Register the generic HTTP and SMTP actions; no action needs approval unless a test gates it.

    ``get_adapter`` caches generic and SMTP adapters per configuration, so changing the setting
    here yields this configuration's adapters.
    """
    serve_every_kind(settings)
    settings.EFFECT_LEDGER_POLICIES = {action: {"approval": "never"} for action, _ in KINDS.values()}


def _claim(intent: Intent) -> Any:
    claim = intent_claim(intent_id=intent.id, worker="test-worker", lease_seconds=30)
    assert claim is not None
    return claim


def _succeed(intent: Intent, provider_reference: str) -> None:
    result = ExecutionResult(provider_reference=provider_reference, response_digest="0" * 64)
    assert intent_record_success(claim=_claim(intent), result=result)


def build(kind: str, state: str, *, settings: Any, approver: Any) -> Intent:
    """One intent of ``kind`` brought to ``state`` through the services, as production does."""
    action, arguments = KINDS[kind]
    if state in GATED_STATES:
        settings.EFFECT_LEDGER_POLICIES = {
            **settings.EFFECT_LEDGER_POLICIES,
            action: {"approval": "always", "approval_ttl_seconds": 600},
        }
    # One reference per (kind, state): intents of one kind built side by side are not one
    # business action (a second one would be HELD behind the first).
    reference = f"ref-{kind}-{state}"
    if "reference" in arguments:  # the provider's reference is the business identity when present
        arguments = {**arguments, "reference": reference}
    earlier = submit(action=action, arguments=arguments, reference=reference) if state == S.HELD else None
    intent = submit(action=action, arguments=arguments, reference=reference)
    if state == S.REJECTED:
        intent_reject(intent_id=intent.id, user=approver, request_hash=intent.request_hash, reason="no")
    elif state == S.EXPIRED:
        # A TTL of 0 is refused by policy validation: the expiry is moved to now instead.
        Intent.objects.filter(id=intent.id).update(approval_expires_at=Now())
        assert intent_expire_approval(intent_id=intent.id)
    elif state == S.CANCELLED:
        intent_cancel(intent_id=intent.id, actor="user:vera", reason="not needed")
    elif state == S.RUNNING:
        _claim(intent)
    elif state in (S.SUCCEEDED, S.COMPENSATING, S.COMPENSATED):
        _succeed(intent, "prov-1")
        if state != S.SUCCEEDED:
            compensation = intent_begin_compensation(
                intent_id=intent.id,
                from_status=S.SUCCEEDED,
                provider_reference="prov-1",
                actor="user:otto",
                reason="customer changed their mind",
                requested_by=user_named("otto"),
            )
            if state == S.COMPENSATED:
                _succeed(compensation, "prov-2")
    elif state == S.FAILED:
        assert intent_record_failure(claim=_claim(intent), error="declined by the provider")
    elif state == HELD_UNSERVED:
        adapters = getattr(settings, "EFFECT_LEDGER_ADAPTERS", {})
        settings.EFFECT_LEDGER_ADAPTERS = {**adapters, action: "operations.adapters.withdrawn.Adapter"}
        assert execute_intent(intent.id) == "held"
    elif state == HELD_MISMATCH:
        with connection.cursor() as cursor:  # a database writer edits the arguments
            cursor.execute(
                "UPDATE operations_intent SET arguments = arguments || '{\"tampered\": true}' WHERE id = %s",
                [intent.id],
            )
        assert execute_intent(intent.id) == "held"
    elif state == UNKNOWN_FORGOTTEN:
        head = intent.audit_events.order_by("-seq").values_list("seq", flat=True).first()
        assert intents_mark_forgotten_changes(
            [(str(intent.id), head + 1, "0" * 64)], actor="user:ops", recovery=1
        )
    elif state == HELD_RESTORE:
        assert intent_hold_restored(
            claim=_claim(intent), problem=f"{RESTORE_GUARD_HOLD} confirm with the provider"
        )
    elif state in (S.UNKNOWN, UNKNOWN_ESCALATED):
        assert intent_mark_unknown(claim=_claim(intent), error="timeout after send", cause="ambiguous")
        if state == UNKNOWN_ESCALATED:
            assert intent_escalate(intent_id=intent.id, reason="patience exhausted")
    intent.refresh_from_db()
    assert intent.held_behind_id == (earlier.id if earlier else None)
    expected = {
        UNKNOWN_ESCALATED: S.UNKNOWN,
        UNKNOWN_FORGOTTEN: S.UNKNOWN,
        HELD_UNSERVED: S.HELD,
        HELD_MISMATCH: S.HELD,
        HELD_RESTORE: S.HELD,
    }.get(state, state)
    assert intent.status == expected
    escalated = (UNKNOWN_ESCALATED, HELD_UNSERVED, HELD_MISMATCH, HELD_RESTORE)
    assert (intent.escalated_at is not None) == (state in escalated)
    assert bool(intent.hold_reason) == (state in (HELD_UNSERVED, HELD_MISMATCH, HELD_RESTORE))
    return intent


def page(client: Client, url: str, **headers: str) -> str:
    response = client.get(url, **headers)  # type: ignore[arg-type]
    assert response.status_code == 200, (url, response.status_code)
    return response.content.decode()


@pytest.mark.parametrize(("kind", "state"), CASES)
def test_every_page_renders_for_every_kind_and_state(
    kind: str, state: str, every_kind: None, settings: Any, approver: Any, viewer_client: Client
) -> None:
    # given
    intent = build(kind, state, settings=settings, approver=approver)
    the_id, detail_link = str(intent.id), reverse("intent-detail", args=[intent.id])
    # when / then: the queues list it exactly when it is theirs
    assert status_count(page(viewer_client, reverse("dashboard")), intent.status) >= 1
    assert (the_id in page(viewer_client, reverse("unknown"))) == (intent.status in (S.UNKNOWN, S.HELD))
    in_inbox = the_id in page(viewer_client, reverse("approvals"))
    assert in_inbox == (intent.status == S.AWAITING_APPROVAL)
    # and every page about it renders and names it
    assert detail_link in page(viewer_client, reverse("intents"))
    assert the_id in page(viewer_client, detail_link)
    assert the_id in page(viewer_client, reverse("unknown-detail", args=[intent.id]))
    assert the_id in page(viewer_client, reverse("approval-detail", args=[intent.id]))
    assert the_id in page(viewer_client, reverse("held-detail", args=[intent.id]))
    assert detail_link in page(viewer_client, reverse("audit"))


@pytest.mark.parametrize(("kind", "state"), CASES)
def test_htmx_partials_render_for_every_kind_and_state(
    kind: str, state: str, every_kind: None, settings: Any, approver: Any, viewer_client: Client
) -> None:
    # given
    intent = build(kind, state, settings=settings, approver=approver)
    the_id, detail_link = str(intent.id), reverse("intent-detail", args=[intent.id])
    # when: the partials the pages poll or swap
    stats = page(viewer_client, reverse("dashboard"), **HTMX)
    unknown_rows = page(viewer_client, reverse("unknown"), **HTMX)
    approval_rows = page(viewer_client, reverse("approvals"), **HTMX)
    status_line = page(viewer_client, detail_link, **HTMX)
    results = page(viewer_client, reverse("intents"), **HTMX)
    audit_rows = page(viewer_client, reverse("audit"), **HTMX)
    held_decision = page(viewer_client, reverse("held-detail", args=[intent.id]), **HTMX)
    # then: fragments, not pages, each with what it should list
    for fragment in (stats, unknown_rows, approval_rows, status_line, results, audit_rows, held_decision):
        assert "<html" not in fragment
    assert status_count(stats, intent.status) >= 1
    assert unknown_rows.lstrip().startswith('<div id="unknown-rows"')
    assert (the_id in unknown_rows) == (intent.status in (S.UNKNOWN, S.HELD))
    assert approval_rows.lstrip().startswith('<div id="approval-rows"')
    assert (the_id in approval_rows) == (intent.status == S.AWAITING_APPROVAL)
    assert f">{intent.status}</strong>" in status_line
    assert ('id="held-behind"' in status_line) == (intent.held_behind_id is not None)
    assert held_decision.lstrip().startswith('<section id="decision"')
    assert detail_link in results
    assert detail_link in audit_rows


def test_unknown_queue_renders_for_every_action_kind(
    every_kind: None, settings: Any, approver: Any, viewer_client: Client
) -> None:
    # given: one UNKNOWN intent of every kind, escalated and not, all in the queue at once
    intents = [
        build(kind, state, settings=settings, approver=approver)
        for kind in KINDS
        for state in (S.UNKNOWN, UNKNOWN_ESCALATED)
    ]
    # when
    full = page(viewer_client, reverse("unknown"))
    rows = page(viewer_client, reverse("unknown"), **HTMX)
    # then: every one is listed, with money only where there is an amount and a currency
    for body in (full, rows):
        assert all(str(intent.id) in body for intent in intents)
        assert "No intent is UNKNOWN." not in body
        assert "49.90 EUR" in body and "12.50 USD" in body
        assert '<td class="num">—</td>' in body  # email, reservations, the count without currency


def test_approvals_inbox_renders_for_every_action_kind(
    every_kind: None, settings: Any, approver: Any, viewer_client: Client
) -> None:
    # given: one intent of every kind awaiting approval
    intents = [build(kind, S.AWAITING_APPROVAL, settings=settings, approver=approver) for kind in KINDS]
    # when
    full = page(viewer_client, reverse("approvals"))
    rows = page(viewer_client, reverse("approvals"), **HTMX)
    # then
    for body in (full, rows):
        assert all(str(intent.id) in body for intent in intents)
        assert "49.90 EUR" in body and "15.00 EUR" in body and "12.50 USD" in body


def test_dashboard_open_the_queue_link_renders_with_an_email_unknown(
    every_kind: None, settings: Any, approver: Any, viewer_client: Client
) -> None:
    # given: an UNKNOWN email (no currency argument)
    email = build("email.send", S.UNKNOWN, settings=settings, approver=approver)
    dashboard = page(viewer_client, reverse("dashboard"))
    # when: the operator follows "Open the queue"
    link = re.search(r'<a href="([^"]+)">Open the queue</a>', dashboard)
    assert link and link.group(1) == reverse("unknown")
    queue = page(viewer_client, link.group(1))
    # then: the queue renders and lists the email
    assert str(email.id) in queue


def test_approval_detail_shows_no_money_for_an_amount_without_currency(
    every_kind: None, settings: Any, approver: Any, viewer_client: Client
) -> None:
    # given: a generic action whose integer "amount" is a count (no currency)
    intent = build("generic-without-lookup", S.AWAITING_APPROVAL, settings=settings, approver=approver)
    # when
    body = page(viewer_client, reverse("approval-detail", args=[intent.id]))
    # then: the preview's Amount is not rendered as 0.03 of nothing
    assert "<dt>Amount</dt><dd>—</dd>" in body
    assert "0.03" not in body


def test_i18_3_a_ceiling_wait_renders_for_every_action_kind(
    every_kind: None, settings: Any, viewer_client: Client
) -> None:
    # given: every kind with an effects ceiling already reached today (a cap of 0), so each one's
    # claim sends it back to its approvers with the reason
    from operations.services.claims import CeilingWait

    settings.EFFECT_LEDGER_POLICIES = {
        action: {"approval": "never", "ceilings": {"effects_per_day": 0}} for action, _ in KINDS.values()
    }
    waiting = []
    for kind, (action, arguments) in KINDS.items():
        intent = submit(action=action, arguments=dict(arguments), reference=f"cap-{kind}")
        with pytest.raises(CeilingWait):
            intent_claim(intent_id=intent.id, worker="test-worker", lease_seconds=30)
        waiting.append(intent)
    # when / then: the inbox marks each, and each approval page and intent page names the reason
    for body in (
        page(viewer_client, reverse("approvals")),
        page(viewer_client, reverse("approvals"), **HTMX),
    ):
        assert all(str(intent.id) in body for intent in waiting) and "ceiling reached" in body
    for intent in waiting:
        detail = page(viewer_client, reverse("approval-detail", args=[intent.id]))
        assert 'id="wait-note"' in detail and "effects ceiling reached" in detail
        assert "ceiling_reached" in page(viewer_client, reverse("intent-detail", args=[intent.id]))


#: What the intent page's Amount shows per kind: money only with an amount and a currency.
AMOUNT_SHOWN = {
    "payments.charge": "49.90 EUR",
    "payments.refund": "15.00 EUR",
    "generic-with-lookup": "12.50 USD",
    "stripe": "49.90 EUR",
    "stripe.refund": "15.00 EUR",
}


def test_i16_1_intent_page_shows_the_amount_for_every_action_kind(
    every_kind: None, settings: Any, approver: Any, viewer_client: Client
) -> None:
    for kind in KINDS:
        # given
        intent = build(kind, S.SUCCEEDED, settings=settings, approver=approver)
        # when
        body = page(viewer_client, reverse("intent-detail", args=[intent.id]))
        # then: converted by the currency's exponent, or a dash (email, reservations, a count)
        assert f'<dd id="intent-amount">{AMOUNT_SHOWN.get(kind, "—")}</dd>' in body, kind


@pytest.mark.parametrize("kind", list(KINDS))
def test_i16_2_duplicate_risk_for_every_action_kind(
    kind: str, every_kind: None, settings: Any, approver: Any, viewer_client: Client
) -> None:
    # given: an intent of this kind that succeeded, and a second one for the same reference
    # awaiting approval: held as a likely duplicate within the reuse window (issue 38 item 5),
    # then released by an operator who accepted the risk, so its approvers decide
    earlier = build(kind, S.SUCCEEDED, settings=settings, approver=approver)
    action, arguments = KINDS[kind]
    if "reference" in arguments:
        arguments = {**arguments, "reference": earlier.reference}
    settings.EFFECT_LEDGER_POLICIES = {**settings.EFFECT_LEDGER_POLICIES, action: {"approval": "always"}}
    held = submit(action=action, arguments=arguments, reference=earlier.reference)
    assert (held.status, held.held_behind_id) == (S.HELD, earlier.id)
    second = intent_release_held(
        intent_id=held.id, actor="user:otto", reason="asked twice", duplicate_risk_accepted=True
    )
    assert second.status == S.AWAITING_APPROVAL
    earlier_link = reverse("intent-detail", args=[earlier.id])
    # when / then: the approval page warns and links the earlier one; the inbox marks the row
    detail = page(viewer_client, reverse("approval-detail", args=[second.id]))
    assert 'id="duplicate-risk"' in detail and earlier_link in detail
    for body in (
        page(viewer_client, reverse("approvals")),
        page(viewer_client, reverse("approvals"), **HTMX),
    ):
        row = body[body.rindex("<tr>", 0, body.index(str(second.id))) :]
        assert "possible duplicate" in row[: row.index("</tr>")] and earlier_link in row[: row.index("</tr>")]
    # and approving needs the confirmation, in the service
    approver_client = signed_in(approver)
    url = reverse("approval-approve", args=[second.id])
    refused = approver_client.post(url, {"request_hash": second.request_hash})
    assert "already succeeded or is in flight" in refused.content.decode()
    second.refresh_from_db()
    assert second.status == S.AWAITING_APPROVAL
    approved = approver_client.post(
        url,
        {
            "request_hash": second.request_hash,
            "accept_duplicate_risk": "on",
            "duplicate_risk_seen": str(earlier.id),
        },
    )
    assert approved.status_code == 302
    second.refresh_from_db()
    assert second.status == S.READY


#: kind -> what its lists show as "customer / target" (declared by its adapter: a charge's
#: customer, a refund's charge, an email's recipient, the reserved resource, the cancelled
#: reservation, a generic action's ``target_field``, or else the host it is sent to).
TARGETS = {
    "payments.charge": "cus_42",
    "payments.refund": "ch_1",
    "email.send": "ana@example.test",
    "reservations.create": "room-101",
    "reservations.cancel": "res_1",
    "generic-with-lookup": "acc_9",
    "generic-without-lookup": "127.0.0.1:9",
    "declared-without-keys": "cus_77",
    "smtp": "ana@example.test",
    "stripe": "cus_42",
    "stripe.refund": "ch_1",
}
#: kind -> its amount column (an email, a reservation and a count without currency: none).
AMOUNTS = {
    "payments.charge": "49.90",
    "payments.refund": "15.00",
    "generic-with-lookup": "12.50",
    "stripe": "49.90",
    "stripe.refund": "15.00",
}


def row_of(body: str, intent: Intent) -> str:
    """The table row of ``body`` that names ``intent``."""
    rows = [row for row in body.split("<tr>") if str(intent.id)[:13] in row]
    assert len(rows) == 1, (str(intent.id), body)
    return rows[0].split("</tr>")[0]


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize(("state", "list_name"), [(S.AWAITING_APPROVAL, "approvals"), (S.UNKNOWN, "unknown")])
def test_i16_3_lists_show_reference_target_and_amount_for_every_kind(
    kind: str,
    state: str,
    list_name: str,
    every_kind: None,
    settings: Any,
    approver: Any,
    viewer_client: Client,
) -> None:
    # given: an intent of this kind in the list's state
    intent = build(kind, state, settings=settings, approver=approver)
    # when: its list (the page and the htmx refresh) and the intents search are opened
    bodies = [
        page(viewer_client, reverse(list_name)),
        page(viewer_client, reverse(list_name), **HTMX),
        page(viewer_client, reverse("intents")),
    ]
    # then: its row names its reference, who or what it affects, and its amount
    for body in bodies:
        assert "Customer / target" in body
        row = row_of(body, intent)
        assert f"ref-{kind}-{state}" in row
        assert TARGETS[kind] in row
        if kind in AMOUNTS:
            assert AMOUNTS[kind] in row
        else:
            assert '<td class="num">—</td>' in row


#: The SMTP kind never reaches COMPENSATING or COMPENSATED (an email cannot be undone).
SMTP_STATES = [state for state in STATES if state not in (S.COMPENSATING, S.COMPENSATED)]


@pytest.mark.parametrize(
    ("kind", "state"),
    [("smtp", state) for state in SMTP_STATES] + [("stripe", state) for state in STATES],
)
def test_evidence_pages_render_with_an_smtp_or_stripe_intent_in_every_state(
    kind: str,
    state: str,
    every_kind: None,
    settings: Any,
    approver: Any,
    viewer_client: Client,
    operator_client: Client,
) -> None:
    # given: an SMTP intent (no keys, no lookup, no evidence source) or a Stripe one (keys not
    # trusted, a lagging listing, an events source) in this state
    intent = build(kind, state, settings=settings, approver=approver)
    # when / then: the findings and statements pages render, page and partial
    for name in ("provider-findings", "statements"):
        page(viewer_client, reverse(name))
        assert "<html" not in page(viewer_client, reverse(name), **HTMX)
    # and where it is UNKNOWN, its resolution page asks for the duplicate-risk acknowledgement
    resolution = page(operator_client, reverse("unknown-detail", args=[intent.id]))
    assert ('id="absent-ack"' in resolution) == (intent.status == S.UNKNOWN)


@pytest.mark.parametrize("kind", list(KINDS))
def test_i39_4_unknown_page_offers_the_verbs_each_kind_allows(
    kind: str, every_kind: None, settings: Any, approver: Any, operator_client: Client
) -> None:
    # given: an UNKNOWN intent of this kind; only some kinds declare a compensation
    intent = build(kind, S.UNKNOWN, settings=settings, approver=approver)
    url = reverse("unknown-detail", args=[intent.id])
    # when: an operator opens its page, whole and as the partial its actions answer with
    body = page(operator_client, url)
    partial = page(operator_client, url, **HTMX)
    # then: it renders, confirmed and absent are offered, compensate only where it can apply,
    # and otherwise the reason is shown where the button would be
    assert "<html" not in partial and 'id="unknown-page"' in partial
    for shown in (body, partial):
        assert str(intent.id) in shown
        assert 'id="resolve-confirmed"' in shown and 'id="resolve-absent"' in shown
        assert ('id="resolve-compensate"' in shown) == (kind in COMPENSABLE), kind
        assert ('id="compensate-not-offered"' in shown) == (kind not in COMPENSABLE), kind
    if kind in COMPENSABLE:
        return
    # and when compensate is posted anyway, it is refused with that reason and nothing changes
    before = intent.audit_events.exclude(event=REFUSAL_EVENT).count()
    refused = operator_client.post(
        reverse("unknown-resolve", args=[intent.id, "compensate"]),
        {"reason": "undo it", "provider_reference": "prov-1", "seen_seq": seen(intent)},
        **HTMX,  # type: ignore[arg-type]
    )
    assert refused.status_code == 409
    assert f"{intent.action} has no compensation" in refused.content.decode()
    intent.refresh_from_db()
    assert intent.status == S.UNKNOWN and not Intent.objects.filter(compensates=intent).exists()
    assert intent.audit_events.exclude(event=REFUSAL_EVENT).count() == before
