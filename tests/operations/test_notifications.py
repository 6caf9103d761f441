"""Notifications to approvers and operators (issue 15 part 4): written with the event (the
outbox), sent by the beat to the people who may act, with the deep link and a summary but never
the arguments, digested and rate-limited per recipient, retried until sent."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.db import transaction
from django.db.models import F
from django.db.models.functions import Now
from django.urls import reverse
from django.utils import timezone

from console import settings as settings_module
from operations.access.tenants import may_act, users_holding
from operations.models import Intent, Notification, NotificationDelivery, NotificationRecipient, RoleGrant
from operations.policies.rules import Policy
from operations.selectors.notifications import OPERATOR_ROLES
from operations.services import intent_approve, intent_claim, intent_escalate, intent_mark_unknown
from operations.services.execution import intent_wait_for_lapsed_approval
from operations.services.notifications import (
    notifications_deliver,
    notifications_fan_out,
    notifications_prune,
    notifications_send,
)
from operations.tasks import send_notifications
from reconciliation.decision_checks import RESOLVER_GROUPS
from reconciliation.resolution import resolve_confirmed
from tests.factories import UserFactory, charge_arguments, submit

pytestmark = pytest.mark.django_db

PUBLIC_URL = "https://ledger.example.test"
SECRET_CUSTOMER = "cus_Zq81_never_in_a_notice"
EMAIL = {"to": "a@example.test", "subject": "hi", "body": "hello", "reference": "m-1"}


@pytest.fixture(autouse=True)
def _notify_settings(settings: Any) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "PUBLIC_URL": PUBLIC_URL,
        "SLACK_WEBHOOK_URL": "",
        "NOTIFY_INTERVAL_SECONDS": 300.0,
    }


def warn_ahead(settings: Any, seconds: float) -> None:
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "NOTIFY_EXPIRY_WARNING_SECONDS": seconds}


def gated(reference: str = "order-17", **kwargs: Any) -> Intent:
    intent = submit(
        arguments=charge_arguments(25_000, customer=SECRET_CUSTOMER), reference=reference, **kwargs
    )
    assert intent.status == Intent.Status.AWAITING_APPROVAL
    return intent


def approval_link(intent: Intent) -> str:
    return PUBLIC_URL + reverse("approval-detail", args=[intent.id])


def unknown_link(intent: Intent) -> str:
    return PUBLIC_URL + reverse("unknown-detail", args=[intent.id])


def mails_to(address: str) -> list[Any]:
    return [message for message in mail.outbox if message.to == [address]]


def links_in(text: str) -> set[str]:
    return set(re.findall(rf"{re.escape(PUBLIC_URL)}/\S+", text))


def rate_limit_passed() -> None:
    """The recipients' interval is over (database time cannot be travelled: move it back)."""
    NotificationRecipient.objects.update(due_at=Now())


@pytest.fixture
def acme_approvers(db: Any) -> list[Any]:
    """Two approvers on tenant acme (one on every tenant, one on acme only)."""
    return [
        UserFactory(username="alice", groups=["approver"]),
        UserFactory(username="bob", groups=["approver"], tenants=["acme"]),
    ]


def test_a_gated_submission_emails_each_approver_the_deep_link_and_the_summary_not_the_arguments(
    acme_approvers: list[Any],
) -> None:
    # given: besides acme's approvers, one limited to another tenant, one without an email
    # address, and an operator (who approves nothing)
    UserFactory(username="carol", groups=["approver"], tenants=["globex"])
    UserFactory(username="dave", groups=["approver"], email="")
    UserFactory(username="olga", groups=["operator"])
    intent = gated()
    # when
    assert notifications_send() == 2
    # then: one email to each of acme's approvers, nobody else
    assert sorted(message.to[0] for message in mail.outbox) == ["alice@example.test", "bob@example.test"]
    for message in mail.outbox:
        assert links_in(message.body) == {approval_link(intent)}
        assert message.subject == "[Effect Ledger] Approval requested: payments.charge v1"
        for line in (
            "Amount: 250.00 EUR",
            'Reference: "order-17"',
            'Principal: "agent:agent-1"',
            'Tenant: "acme"',
            "Risk: high",
            "Expires: ",
        ):
            assert line in message.body
        # the arguments stay on the approval page, behind the sign-in
        assert SECRET_CUSTOMER not in message.body + message.subject
    # and a second pass sends nothing again
    rate_limit_passed()
    assert notifications_send() == 0


def test_the_requester_of_an_intent_is_not_asked_to_approve_it(acme_approvers: list[Any]) -> None:
    # given: alice (an approver) asks for the charge herself; four eyes means she cannot approve it
    gated(principal="user:alice")
    # when
    notifications_send()
    # then
    assert [message.to for message in mail.outbox] == [["bob@example.test"]]


def test_a_burst_of_20_gated_intents_is_one_digest_per_approver_with_20_links(
    acme_approvers: list[Any],
) -> None:
    # given
    intents = [gated(reference=f"order-{n}") for n in range(20)]
    # when
    assert notifications_send() == 2
    # then: one message each, listing every intent's approval page
    for approver in acme_approvers:
        (message,) = mails_to(approver.email)
        assert message.subject == "[Effect Ledger] 20 notices: 20 approvals requested"
        assert links_in(message.body) == {approval_link(intent) for intent in intents}
        assert SECRET_CUSTOMER not in message.body


def test_a_second_burst_inside_the_interval_waits_for_the_next_digest(acme_approvers: list[Any]) -> None:
    # given: the first notice went out
    gated(reference="first")
    assert notifications_send() == 2
    # when: three more arrive inside the interval
    later = [gated(reference=f"later-{n}") for n in range(3)]
    # then: nothing more is sent until the interval has passed ...
    assert notifications_send() == 0
    assert len(mail.outbox) == 2
    assert NotificationDelivery.objects.filter(status=NotificationDelivery.Status.PENDING).count() == 6
    # ... and then one digest each with exactly those three
    rate_limit_passed()
    assert notifications_send() == 2
    for approver in acme_approvers:
        first, digest = mails_to(approver.email)
        assert links_in(digest.body) == {approval_link(intent) for intent in later}


def test_an_escalated_unknown_intent_tells_the_tenants_operators_with_the_unknown_page(
    acme_approvers: list[Any],
) -> None:
    # given: operators on acme and on every tenant, one on another tenant
    UserFactory(username="olga", groups=["operator"], tenants=["acme"])
    UserFactory(username="oscar", groups=["operator"])
    UserFactory(username="otto", groups=["operator"], tenants=["globex"])
    intent = submit(arguments=charge_arguments(500, customer=SECRET_CUSTOMER), reference="r-unknown")
    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None and intent_mark_unknown(
        claim=claim, error="timeout after send", cause="ambiguous"
    )
    # when
    assert intent_escalate(intent_id=intent.id, reason="patience exhausted")
    notifications_send()
    # then: the operators of acme only; approvers are not operators
    assert sorted(message.to[0] for message in mail.outbox) == ["olga@example.test", "oscar@example.test"]
    for message in mail.outbox:
        assert message.subject == "[Effect Ledger] Escalated to operators: payments.charge v1"
        assert links_in(message.body) == {unknown_link(intent)}
        assert "Status: UNKNOWN" in message.body and SECRET_CUSTOMER not in message.body


def escalated_unknown_email() -> Intent:
    """An email intent whose outcome is UNKNOWN, escalated to the operators."""
    intent = submit(action="email.send", arguments=dict(EMAIL), reference="m-1")
    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None and intent_mark_unknown(
        claim=claim, error="timeout after send", cause="ambiguous"
    )
    assert intent_escalate(intent_id=intent.id, reason="patience exhausted")
    return intent


@pytest.mark.parametrize("resolved", ["before the fan-out", "before the delivery"])
def test_an_escalation_resolved_by_an_operator_before_the_send_is_not_announced(resolved: str) -> None:
    # given: an escalated UNKNOWN email, and the operator who will resolve it
    olga = UserFactory(username="olga", groups=["operator"], tenants=["acme"])
    intent = escalated_unknown_email()
    if resolved == "before the delivery":
        notifications_fan_out(batch=100)
    # when: olga confirms it (manage.py resolve ID --as confirmed --unverified ...), then the beat
    resolve_confirmed(
        intent_id=intent.id, user=olga, provider_reference="msg_x", reason="seen in the outbox",
        accept_unverified=True,
    )  # fmt: skip
    intent.refresh_from_db()
    assert intent.status == Intent.Status.SUCCEEDED
    notifications_send()
    # then: no message about it (it would say "Status: SUCCEEDED" in the operators' queue)
    assert mail.outbox == []
    notice = Notification.objects.get(intent=intent)
    if resolved == "before the fan-out":
        assert notice.outcome == "obsolete"
    else:
        assert set(NotificationDelivery.objects.values_list("status", flat=True)) == {"dropped"}


def test_the_about_to_expire_notice_is_sent_once_per_round(settings: Any, acme_approvers: list[Any]) -> None:
    # given: the request went out; later its expiry comes within the warning window (15 minutes)
    warn_ahead(settings, 900.0)
    intent = gated()
    notifications_send()
    Intent.objects.filter(id=intent.id).update(approval_expires_at=Now() + timedelta(minutes=10))
    Notification.objects.filter(intent=intent).update(created_at=Now() - timedelta(minutes=60))
    rate_limit_passed()
    # when: the scan runs on two passes
    notifications_send()
    rate_limit_passed()
    notifications_send()
    # then: one warning each, with the approval page
    for approver in acme_approvers:
        request, warning = mails_to(approver.email)
        assert warning.subject == "[Effect Ledger] Approval request about to expire: payments.charge v1"
        assert links_in(warning.body) == {approval_link(intent)}
    assert Notification.objects.filter(intent=intent, kind=Notification.Kind.APPROVAL_EXPIRING).count() == 1


def test_a_request_that_expires_within_the_warning_window_gets_no_separate_warning(
    settings: Any, acme_approvers: list[Any]
) -> None:
    # given: requests valid for 10 minutes, warnings 15 minutes ahead
    warn_ahead(settings, 900.0)
    settings.EFFECT_LEDGER_POLICIES = {
        **settings.EFFECT_LEDGER_POLICIES,
        "payments.charge": {"approval": "always", "approval_ttl_seconds": 600},
    }
    gated()
    # when
    notifications_send()
    rate_limit_passed()
    notifications_send()
    # then: the request itself (which says when it expires) and nothing more
    assert len(mail.outbox) == 2 and not Notification.objects.filter(kind=Notification.Kind.APPROVAL_EXPIRING)


def time_passes(seconds: float, intent: Intent) -> None:
    """``seconds`` pass for ``intent``'s approval request and the notices (database time cannot
    be travelled: everything that counts it is moved back instead)."""
    back = timedelta(seconds=seconds)
    Intent.objects.filter(id=intent.id).update(approval_expires_at=F("approval_expires_at") - back)
    Notification.objects.update(created_at=F("created_at") - back)
    NotificationRecipient.objects.update(due_at=F("due_at") - back)


def test_with_the_default_settings_an_approver_is_warned_before_the_request_expires(
    acme_approvers: list[Any],
) -> None:
    # given: the defaults (a request valid for 600 s, the beat every 15 s, one message per
    # recipient per 300 s); the request goes out at once
    intent = gated()
    assert Policy.from_snapshot(intent.policy).approval_ttl_seconds == 600
    assert notifications_send() == 2
    period = settings_module.EFFECT_LEDGER["NOTIFY_PERIOD_SECONDS"]
    # when: the beat runs every period until the request expires
    warned_with: list[float] = []
    while True:
        time_passes(period, intent)
        intent.refresh_from_db()
        left = (intent.approval_expires_at - timezone.now()).total_seconds()
        if left <= 0:
            break
        before = len(mail.outbox)
        notifications_send()
        warned_with += [left] * sum("about to expire" in message.subject for message in mail.outbox[before:])
    # then: each approver was warned once, with time left to decide
    for approver in acme_approvers:
        subjects = [message.subject for message in mails_to(approver.email)]
        assert subjects[1:] == ["[Effect Ledger] Approval request about to expire: payments.charge v1"]
    assert len(warned_with) == 2 and min(warned_with) >= 60


def test_an_intent_sent_back_to_its_approvers_asks_them_again_in_its_new_round(
    acme_approvers: list[Any],
) -> None:
    # given: approved, claimed, then its approval lapsed before the provider call (C22)
    alice, bob = acme_approvers
    intent = gated()
    notifications_send()
    intent_approve(intent_id=intent.id, user=alice, request_hash=intent.request_hash)
    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None
    # when: the transition back to AWAITING_APPROVAL
    assert intent_wait_for_lapsed_approval(claim=claim, reason="approval lapsed before execution")
    rate_limit_passed()
    notifications_send()
    # then: a notice for round 1, sent to both again
    assert Notification.objects.filter(intent=intent, kind=Notification.Kind.APPROVAL_REQUESTED).count() == 2
    for approver in acme_approvers:
        assert [links_in(m.body) for m in mails_to(approver.email)] == [{approval_link(intent)}] * 2


def test_an_intent_approved_before_the_send_is_not_announced(acme_approvers: list[Any]) -> None:
    # given: one approved before the sender's pass, one between fan-out and delivery
    alice, bob = acme_approvers
    early, late = gated(reference="early"), gated(reference="late")
    intent_approve(intent_id=early.id, user=alice, request_hash=early.request_hash)
    # when
    notifications_fan_out(batch=100)
    intent_approve(intent_id=late.id, user=alice, request_hash=late.request_hash)
    notifications_deliver(batch=100)
    # then: nothing was sent, the notices are kept as obsolete or dropped
    assert mail.outbox == []
    assert Notification.objects.get(intent=early).outcome == "obsolete"
    assert set(NotificationDelivery.objects.values_list("status", flat=True)) == {"dropped"}


def test_a_rolled_back_transaction_enqueues_nothing(acme_approvers: list[Any]) -> None:
    # when: a submission and an escalation whose transactions roll back
    with pytest.raises(RuntimeError), transaction.atomic():
        gated()
        raise RuntimeError("the caller failed after submitting")
    intent = submit(arguments=charge_arguments(500), reference="r")
    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None and intent_mark_unknown(claim=claim, error="lost", cause="ambiguous")
    with pytest.raises(RuntimeError), transaction.atomic():
        intent_escalate(intent_id=intent.id, reason="patience exhausted")
        raise RuntimeError("rolled back")
    # then
    assert not Notification.objects.exists()
    assert notifications_send() == 0 and mail.outbox == []


def test_a_user_without_an_email_address_gets_nothing_and_nothing_breaks(db: Any) -> None:
    # given: the only approver has no address
    UserFactory(username="dave", groups=["approver"], email="")
    intent = gated()
    # when
    assert notifications_send() == 0
    # then
    assert mail.outbox == []
    assert Notification.objects.get(intent=intent).outcome == "no_recipient"


class _Receiver(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        server: Any = self.server
        body = self.rfile.read(int(self.headers["Content-Length"]))
        server.received.append((self.headers["Content-Type"], json.loads(body)))
        self.send_response(server.status)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def slack(settings: Any) -> Iterator[Any]:
    """A Slack-compatible incoming webhook on loopback: ``.received`` (content type, JSON) and
    ``.status`` (what it answers); EFFECT_LEDGER_SLACK_WEBHOOK_URL points at it."""
    server: Any = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    server.received, server.status = [], 200
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "SLACK_WEBHOOK_URL": f"http://127.0.0.1:{server.server_address[1]}/services/T0/B0/x",
    }
    yield server
    server.shutdown()
    server.server_close()


def test_the_slack_webhook_receives_the_json_text_with_the_link(
    slack: Any, acme_approvers: list[Any]
) -> None:
    # given
    intent = gated()
    # when
    assert send_notifications() == 3  # the beat's task: two emails and the webhook
    # then
    ((content_type, payload),) = slack.received
    assert content_type == "application/json" and set(payload) == {"text"}
    assert approval_link(intent) in payload["text"] and "Amount: 250.00 EUR" in payload["text"]
    assert SECRET_CUSTOMER not in payload["text"]


def test_a_slack_receiver_answering_500_is_retried_later_and_nothing_is_lost(
    slack: Any, acme_approvers: list[Any]
) -> None:
    # given: the receiver fails
    slack.status = 500
    intent = gated()
    # when
    notifications_send()
    # then: the notice is still pending, the webhook waits for its backoff
    webhook = NotificationRecipient.objects.get(channel="slack")
    assert webhook.failures == 1 and "500" in webhook.last_error
    assert NotificationDelivery.objects.get(recipient=webhook).status == "pending"
    assert notifications_send() == 0 and len(slack.received) == 1  # not before the backoff
    # when: it recovers and the backoff has passed
    slack.status = 200
    rate_limit_passed()
    assert notifications_send() == 1
    # then: the same notice arrives, and is marked sent
    assert approval_link(intent) in slack.received[-1][1]["text"]
    delivery = NotificationDelivery.objects.get(recipient=webhook)
    assert delivery.status == "sent" and delivery.attempts == 1
    webhook.refresh_from_db()
    assert webhook.failures == 0 and webhook.last_error == ""


def test_the_operator_roles_are_the_resolution_services_roles() -> None:
    assert OPERATOR_ROLES == RESOLVER_GROUPS


def test_users_holding_a_role_are_exactly_those_who_may_act(db: Any) -> None:
    # given: every way to hold, or not hold, the approver role on acme
    UserFactory(username="everywhere", groups=["approver"])
    UserFactory(username="here", groups=["approver"], tenants=["acme"])
    UserFactory(username="elsewhere", groups=["approver"], tenants=["globex"])
    RoleGrant.objects.create(user=UserFactory(username="grant_without_group"), role="approver", tenant="acme")
    UserFactory(username="inactive", groups=["approver"], is_active=False)
    UserFactory(username="root", is_superuser=True)
    UserFactory(username="viewer", groups=["viewer"])
    # when
    holding = set(users_holding(["approver"], "acme").values_list("username", flat=True))
    # then
    expected = {u.username for u in get_user_model().objects.all() if may_act(u, ["approver"], "acme")}
    assert holding == expected == {"everywhere", "here", "root"}


def test_old_notices_are_pruned_only_once_nothing_is_pending(slack: Any, acme_approvers: list[Any]) -> None:
    # given: two old notices; the webhook never took the second one
    gated(reference="done")
    waiting = gated(reference="waiting")
    notifications_send()
    NotificationDelivery.objects.filter(notification__intent=waiting, recipient__channel="slack").update(
        status="pending"
    )
    Notification.objects.update(fanned_out_at=Now() - timedelta(days=31))
    # when
    assert notifications_prune(batch=100) == 1
    # then: the notice still waiting for the webhook is kept
    assert list(Notification.objects.values_list("intent", flat=True)) == [waiting.id]
