"""The console audits every decision it refuses, also those refused before any service runs
(no permission, an invalid form), and a decision is one transaction with its answer: an error
while answering leaves nothing changed (issue 11 items 3 and 4)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from console.views import held as held_views
from console.views import unknown as unknown_views
from console.views.common import SHOWN_MAX_CHARS
from operations.audit.trail import REFUSAL_EVENT
from operations.models import Approval, AuditEvent, Intent, OutboxMessage
from operations.selectors import last_audit_seq
from tests.console.conftest import gated, make_unknown, seen
from tests.console.test_held import held_pair
from tests.factories import charge_arguments

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


def refusals(intent: Intent) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(intent=intent, event=REFUSAL_EVENT).order_by("seq"))


def test_i11_4_a_viewer_resolving_an_unknown_intent_is_refused_and_audited(viewer_client: Client) -> None:
    intent = make_unknown(arguments=charge_arguments())
    seq = seen(intent)
    response = viewer_client.post(
        reverse("unknown-resolve", args=[intent.id, "absent"]),
        {"reason": "looked", "accept_duplicate_risk": "on", "seen_seq": seq},
        **HTMX,
    )
    assert response.status_code == 403
    (event,) = refusals(intent)
    assert event.actor == "user:vera" and event.data["decision"] == "resolve absent"
    assert event.data["shown"] == {"seen_seq": seq}
    assert "operators and admins" in event.reason
    assert Intent.objects.get(id=intent.id).status == Intent.Status.UNKNOWN
    assert last_audit_seq(intent.id) == int(seq)  # a refusal makes no page stale
    page = viewer_client.get(reverse("intent-detail", args=[intent.id]))
    assert page.status_code == 200 and REFUSAL_EVENT in page.content.decode()


def test_i11_4_an_invalid_held_decision_is_refused_and_audited(operator_client: Client) -> None:
    _, held = held_pair()
    response = operator_client.post(
        reverse("held-resolve", args=[held.id, "reject"]), {"reason": "", "seen_seq": seen(held)}, **HTMX
    )
    assert response.status_code == 422
    (event,) = refusals(held)
    assert event.actor == "user:otto" and event.data["decision"] == "reject held"
    assert Intent.objects.get(id=held.id).status == Intent.Status.HELD


def test_i11_4_a_service_refusal_is_audited_once(operator_client: Client) -> None:
    # the page state is from before the intent moved: the service refuses and audits it, the
    # view must not audit it a second time
    intent = make_unknown(arguments=charge_arguments())
    response = operator_client.post(
        reverse("unknown-resolve", args=[intent.id, "absent"]),
        {"reason": "looked", "accept_duplicate_risk": "on", "seen_seq": "1"},
        **HTMX,
    )
    assert response.status_code == 409
    (event,) = refusals(intent)
    assert event.data["shown"] == {"seen_seq": 1}


def test_i11_4_a_malformed_approval_is_audited_with_what_was_posted_cut_short(
    approver_client: Client,
) -> None:
    intent = gated()
    posted = "x" * 5000
    response = approver_client.post(
        reverse("approval-approve", args=[intent.id]), {"request_hash": posted}, **HTMX
    )
    assert response.status_code == 422
    (event,) = refusals(intent)
    assert event.data["decision"] == "approve"
    assert event.data["shown"] == {"request_hash": posted[:SHOWN_MAX_CHARS]}
    assert not Approval.objects.filter(intent=intent).exists()


def failing_on_success(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> Client:
    """Make ``module.name`` (a page context builder) fail when it builds the answer to a
    decision that succeeded; return a client that reports the 500 instead of raising."""
    real = getattr(module, name)

    def failing(request: Any, shown: Any, **extra: Any) -> dict[str, Any]:
        if "success" in extra:
            raise RuntimeError("rendering failed after the decision")
        return real(request, shown, **extra)

    monkeypatch.setattr(module, name, failing)
    return Client(raise_request_exception=False)


def test_i11_3_an_error_while_answering_a_held_release_leaves_nothing_changed(
    operator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: a held intent, and a page that fails while answering its release
    _, held = held_pair()
    client = failing_on_success(monkeypatch, held_views, "held_context")
    client.force_login(operator)
    events = AuditEvent.objects.filter(intent=held).count()
    # when
    response = client.post(
        reverse("held-resolve", args=[held.id, "release"]),
        {"reason": "checked", "accept_duplicate_risk": "on", "seen_seq": seen(held)},
        **HTMX,
    )
    # then: a 500, and the release was rolled back with it
    assert response.status_code == 500
    assert Intent.objects.get(id=held.id).status == Intent.Status.HELD
    assert AuditEvent.objects.filter(intent=held).count() == events
    assert not OutboxMessage.objects.filter(intent=held).exists()


def test_i11_3_an_error_while_answering_a_resolution_leaves_nothing_changed(
    operator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    intent = make_unknown(arguments=charge_arguments())
    client = failing_on_success(monkeypatch, unknown_views, "detail_context")
    client.force_login(operator)
    events = AuditEvent.objects.filter(intent=intent).count()
    response = client.post(
        reverse("unknown-resolve", args=[intent.id, "absent"]),
        {"reason": "looked", "accept_duplicate_risk": "on", "seen_seq": seen(intent)},
        **HTMX,
    )
    assert response.status_code == 500
    assert Intent.objects.get(id=intent.id).status == Intent.Status.UNKNOWN
    assert AuditEvent.objects.filter(intent=intent).count() == events


@pytest.mark.parametrize(
    ("verb", "data"),
    [
        ("reject", {"request_hash": "\x00abc", "reason": "no"}),
        ("approve", {"request_hash": "ab\x00" * 30}),
    ],
    ids=["nul-reject", "nul-approve"],
)
def test_i11_4_a_nul_in_a_posted_hash_is_refused_and_audited_not_a_500(
    approver_client: Client, verb: str, data: dict[str, str]
) -> None:
    intent = gated()
    response = approver_client.post(reverse(f"approval-{verb}", args=[intent.id]), data, **HTMX)
    assert response.status_code == 422
    (event,) = refusals(intent)
    assert "\x00" not in event.data["shown"]["request_hash"]
    assert Intent.objects.get(id=intent.id).status == Intent.Status.AWAITING_APPROVAL


@pytest.mark.parametrize("seen_seq", ["\x00", "999999999999999999999999999999", "-1"])
def test_i11_4_a_crafted_seen_seq_is_refused_and_audited_not_a_500(
    operator_client: Client, seen_seq: str
) -> None:
    intent = make_unknown(arguments=charge_arguments())
    response = operator_client.post(
        reverse("unknown-resolve", args=[intent.id, "absent"]),
        {"reason": "looked", "accept_duplicate_risk": "on", "seen_seq": seen_seq},
        **HTMX,
    )
    assert response.status_code == 422
    (event,) = refusals(intent)
    assert event.data["shown"] == {"seen_seq": seen_seq.replace("\x00", "")}
    assert Intent.objects.get(id=intent.id).status == Intent.Status.UNKNOWN


def test_i11_4_a_refusal_of_a_crafted_service_call_is_still_audited(approver: Any) -> None:
    # a caller of the service itself (not the console form) passing a page state beyond I-JSON
    from operations.services import intent_record_refusal

    intent = gated()
    event = intent_record_refusal(
        intent_id=intent.id,
        actor="user:alice",
        decision="resolve absent",
        reason="stale\x00page",
        shown={"seen_seq": 10**30, "request_hash": "\x00" * 3},
    )
    assert event is not None
    assert event.reason == "stalepage" and event.data["shown"] == {
        "seen_seq": str(10**30),
        "request_hash": "",
    }
