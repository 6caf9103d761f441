"""The operators' queue beyond UNKNOWN intents (issue 10 faults 3, 6, 7, console side):
compensations that need a decision, open duplicate findings, "Look up now", confirmations
without provider verification, and the dashboard counts, for every provider kind."""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest
from django.db import transaction
from django.test import Client
from django.urls import reverse

from operations.adapters.registry import capabilities_for
from operations.models import Intent
from operations.services import intent_cancel
from reconciliation.duplicates import record_duplicates, sweep_compensations
from reconciliation.models import DuplicateFinding
from tests.console.conftest import make_unknown, seen, unknown_with_effect
from tests.console.test_every_kind import COMPENSABLE, KINDS, build, serve_every_kind
from tests.reconciliation.test_reconciliation import email

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
S = Intent.Status


@pytest.fixture
def kinds(settings: Any) -> None:
    """The generic HTTP actions registered; no action needs approval."""
    serve_every_kind(settings)
    settings.EFFECT_LEDGER_POLICIES = {action: {"approval": "never"} for action, _ in KINDS.values()}


def post(client: Client, url: str, htmx: bool = True, **data: Any) -> Any:
    return client.post(url, data, **(HTMX if htmx else {}))  # type: ignore[arg-type]


def open_finding(kind: str, *, settings: Any, approver: Any) -> DuplicateFinding:
    """A SUCCEEDED intent of ``kind`` with an extra effect ``prov-extra`` that needs an
    operator: recorded by the duplicate check's service; where the action has a compensation,
    that compensation is cancelled and the sweep re-opens the finding."""
    intent = build(kind, S.SUCCEEDED, settings=settings, approver=approver)
    with transaction.atomic():
        assert record_duplicates(intent=intent, references=["prov-1", "prov-extra"], keep="prov-1") == 1
    finding = DuplicateFinding.objects.get(intent=intent)
    if finding.compensation is not None:
        intent_cancel(intent_id=finding.compensation.id, actor="user:vera", reason="wrong one")
        sweep_compensations()
        finding.refresh_from_db()
    assert finding.state == DuplicateFinding.State.OPEN
    return finding


def escalated_compensation(kind: str, *, settings: Any, approver: Any) -> Intent:
    """A COMPENSATING intent of ``kind`` whose compensation was cancelled, escalated by the sweep."""
    intent = build(kind, S.COMPENSATING, settings=settings, approver=approver)
    compensation = intent.compensations.get()
    intent_cancel(intent_id=compensation.id, actor="user:vera", reason="not now")
    sweep_compensations()
    intent.refresh_from_db()
    assert intent.status == S.COMPENSATING and intent.escalated_at is not None
    return intent


# --- duplicate findings ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(KINDS))
def test_open_finding_is_listed_and_its_page_renders_for_every_kind(
    kind: str, kinds: None, settings: Any, approver: Any, viewer_client: Client, operator_client: Client
) -> None:
    # given
    finding = open_finding(kind, settings=settings, approver=approver)
    link = reverse("duplicate-detail", args=[finding.id])
    # when
    full = viewer_client.get(reverse("unknown")).content.decode()
    rows = viewer_client.get(reverse("unknown"), **HTMX).content.decode()  # type: ignore[arg-type]
    dashboard = viewer_client.get(reverse("dashboard")).content.decode()
    response = operator_client.get(link)
    # then: in the queue with both references, counted on the dashboard
    for body in (full, rows):
        assert link in body and "prov-extra" in body and "prov-1" in body
        assert "No duplicate finding is open." not in body
    assert '<td class="num" id="open-duplicate-findings">1</td>' in dashboard
    assert f"{reverse('unknown')}#duplicates" in dashboard
    # and its page offers compensate only where the action has a compensation
    assert response.status_code == 200
    body = response.content.decode()
    assert "prov-extra" in body and "Acknowledge" in body
    has_compensation = bool(capabilities_for(finding.intent.action).compensation_action)
    assert ("Compensate the extra effect" in body) == has_compensation
    assert has_compensation == (kind in COMPENSABLE)


def test_acknowledge_a_finding_in_place_then_again_is_refused(
    kinds: None, settings: Any, approver: Any, operator_client: Client
) -> None:
    # given
    finding = open_finding("email.send", settings=settings, approver=approver)
    url = reverse("duplicate-resolve", args=[finding.id, "acknowledge"])
    # when
    done = post(operator_client, url, reason="customer told, harmless")
    again = post(operator_client, url, reason="twice")
    # then
    assert done.status_code == 200 and b"Decided: acknowledge. The finding is resolved." in done.content
    assert done.content.lstrip().startswith(b'<section id="decision"')
    finding.refresh_from_db()
    assert finding.state == "resolved" and finding.resolved_by == "user:otto"
    assert again.status_code == 409 and b"this finding is resolved, not open" in again.content
    queue = operator_client.get(reverse("unknown")).content.decode()
    assert "No duplicate finding is open." in queue


def test_acknowledge_without_javascript_redirects_to_the_finding(
    kinds: None, settings: Any, approver: Any, operator_client: Client
) -> None:
    finding = open_finding("reservations.create", settings=settings, approver=approver)
    response = post(
        operator_client, reverse("duplicate-resolve", args=[finding.id, "acknowledge"]), False, reason="fine"
    )
    assert response.status_code == 302 and response["Location"] == reverse(
        "duplicate-detail", args=[finding.id]
    )
    page = operator_client.get(response["Location"]).content.decode()
    assert "Decided: acknowledge" in page and "Resolved" in page


def test_compensate_a_reservation_finding_opens_a_compensation(
    kinds: None, settings: Any, approver: Any, operator_client: Client
) -> None:
    finding = open_finding("reservations.create", settings=settings, approver=approver)
    response = post(
        operator_client, reverse("duplicate-resolve", args=[finding.id, "compensate"]), reason="cancel it"
    )
    assert response.status_code == 200 and b"Compensation running" in response.content
    finding.refresh_from_db()
    assert finding.state == "compensating" and finding.compensation is not None
    assert finding.compensation.action == "reservations.cancel"
    assert str(finding.compensation.id).encode() in response.content


def test_compensate_an_email_finding_is_refused_in_place(
    kinds: None, settings: Any, approver: Any, operator_client: Client
) -> None:
    finding = open_finding("email.send", settings=settings, approver=approver)
    response = post(
        operator_client, reverse("duplicate-resolve", args=[finding.id, "compensate"]), reason="undo"
    )
    assert response.status_code == 409
    assert b"Refused (compensate)" in response.content and b"no compensation" in response.content
    assert DuplicateFinding.objects.get(id=finding.id).state == "open"


def test_finding_decisions_need_a_reason_and_an_operator(
    kinds: None, settings: Any, approver: Any, operator_client: Client, viewer_client: Client
) -> None:
    # given
    finding = open_finding("payments.charge", settings=settings, approver=approver)
    url = reverse("duplicate-resolve", args=[finding.id, "acknowledge"])
    # when
    no_reason = post(operator_client, url, reason="  ")
    viewer = post(viewer_client, url, reason="I think it is fine")
    viewer_page = viewer_client.get(reverse("duplicate-detail", args=[finding.id])).content.decode()
    # then: visible refusals, nothing changed
    assert no_reason.status_code == 422 and b"Reason" in no_reason.content
    assert viewer.status_code == 403 and b"Only operators and admins can decide" in viewer.content
    assert "Only operators and admins can decide" in viewer_page and 'name="reason"' not in viewer_page
    assert DuplicateFinding.objects.get(id=finding.id).state == "open"
    assert (
        post(
            operator_client, reverse("duplicate-resolve", args=[finding.id, "shrug"]), reason="x"
        ).status_code
        == 404
    )


def test_email_finding_found_at_the_sandbox_is_in_the_queue(sandbox: Any, viewer_client: Client) -> None:
    # given: an UNKNOWN email sent twice at the provider; the reconciler finds both
    import httpx

    from reconciliation.lookups import reconcile_unknown

    intent = make_unknown(action="email.send", arguments=email(40))
    for _ in range(2):
        httpx.post(
            f"{sandbox.url}/v1/emails",
            json=email(40),
            headers={"Message-ID": f"<{intent.idempotency_key}@effect-ledger.local>"},
        ).raise_for_status()
    reconcile_unknown()
    finding = DuplicateFinding.objects.get(intent=intent)
    # when
    body = viewer_client.get(reverse("unknown")).content.decode()
    # then
    assert reverse("duplicate-detail", args=[finding.id]) in body and finding.provider_reference in body


# --- compensations that need a decision --------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(COMPENSABLE))
def test_escalated_compensation_is_listed_and_decidable_for_every_compensable_kind(
    kind: str, kinds: None, settings: Any, approver: Any, viewer_client: Client, operator_client: Client
) -> None:
    # given
    intent = escalated_compensation(kind, settings=settings, approver=approver)
    compensation = intent.compensations.get()
    # when
    full = viewer_client.get(reverse("unknown")).content.decode()
    rows = viewer_client.get(reverse("unknown"), **HTMX).content.decode()  # type: ignore[arg-type]
    dashboard = viewer_client.get(reverse("dashboard")).content.decode()
    operator_page = operator_client.get(reverse("unknown-detail", args=[intent.id])).content.decode()
    viewer_page = viewer_client.get(reverse("unknown-detail", args=[intent.id])).content.decode()
    # then
    for body in (full, rows):
        assert reverse("unknown-detail", args=[intent.id]) in body
        assert f"{compensation.action} <span" in body and "CANCELLED" in body
        assert "No compensation waits for a decision." not in body
    assert '<td class="num" id="escalated-compensations">1</td>' in dashboard
    assert str(compensation.id) in operator_page
    for label in ("Reopen the compensation", "Settle as compensated", "Settle as kept"):
        assert label in operator_page and label not in viewer_page
    assert "Only operators and admins can decide on compensations." in viewer_page
    assert "Look up now" not in operator_page


def test_reopen_in_place_opens_a_new_compensation(
    kinds: None, settings: Any, approver: Any, operator_client: Client
) -> None:
    intent = escalated_compensation("payments.charge", settings=settings, approver=approver)
    response = post(
        operator_client,
        reverse("unknown-resolve", args=[intent.id, "reopen"]),
        reason="try again",
        seen_seq=seen(intent),
    )
    assert (
        response.status_code == 200 and b"Resolved as reopen. The intent is COMPENSATING." in response.content
    )
    intent.refresh_from_db()
    assert intent.escalated_at is None and intent.compensations.count() == 2
    # a second decision while the new compensation runs is refused with the service's reason
    again = post(
        operator_client,
        reverse("unknown-resolve", args=[intent.id, "kept"]),
        reason="keep",
        seen_seq=seen(intent),
    )
    assert again.status_code == 409 and b"still running" in again.content


@pytest.mark.parametrize(("verb", "status"), [("compensated", S.COMPENSATED), ("kept", S.SUCCEEDED)])
def test_settle_without_javascript_redirects_and_a_stale_decision_is_refused(
    verb: str, status: str, kinds: None, settings: Any, approver: Any, operator_client: Client
) -> None:
    # given
    intent = escalated_compensation("reservations.create", settings=settings, approver=approver)
    url = reverse("unknown-resolve", args=[intent.id, verb])
    # when
    page = seen(intent)
    done = post(operator_client, url, False, reason="handled by support", seen_seq=page)
    stale = post(operator_client, url, reason="again", seen_seq=page)
    # then
    assert done.status_code == 302 and done["Location"] == reverse("intent-detail", args=[intent.id])
    assert Intent.objects.get(id=intent.id).status == status
    assert stale.status_code == 409 and b"expected in COMPENSATING" in stale.content


def test_compensation_decisions_need_a_reason_and_an_operator(
    kinds: None, settings: Any, approver: Any, operator_client: Client, viewer_client: Client
) -> None:
    intent = escalated_compensation("payments.charge", settings=settings, approver=approver)
    url = reverse("unknown-resolve", args=[intent.id, "kept"])
    no_reason = post(operator_client, url, seen_seq=seen(intent))
    viewer = post(viewer_client, url, reason="keep it", seen_seq=seen(intent))
    assert no_reason.status_code == 422 and b"Reason" in no_reason.content
    assert viewer.status_code == 403 and b"Only operators and admins" in viewer.content
    assert Intent.objects.get(id=intent.id).status == S.COMPENSATING


# --- look up now -------------------------------------------------------------------------------


def test_look_up_now_resolves_an_unknown_charge_found_at_the_provider(
    sandbox: Any, operator_client: Client
) -> None:
    # given: the charge reached the sandbox; its answer was lost
    intent, charge_id = unknown_with_effect()
    page = operator_client.get(reverse("unknown-detail", args=[intent.id])).content.decode()
    assert "Look up now" in page
    # when
    response = post(operator_client, reverse("unknown-lookup", args=[intent.id]))
    # then
    assert response.status_code == 200 and b"Looked up now: resolved" in response.content
    intent.refresh_from_db()
    assert intent.status == S.SUCCEEDED and intent.outcomes.get().provider_reference == charge_id


def test_look_up_now_without_javascript_redirects_to_the_evidence(
    sandbox: Any, operator_client: Client
) -> None:
    intent = make_unknown(action="email.send", arguments=email(41))
    response = post(operator_client, reverse("unknown-lookup", args=[intent.id]), False)
    assert response.status_code == 302 and response["Location"] == reverse("unknown-detail", args=[intent.id])
    assert "Looked up now:" in operator_client.get(response["Location"]).content.decode()


def test_look_up_now_is_refused_to_a_viewer_and_for_an_intent_that_moved(
    sandbox: Any, operator_client: Client, viewer_client: Client
) -> None:
    intent = make_unknown()
    viewer = post(viewer_client, reverse("unknown-lookup", args=[intent.id]))
    assert viewer.status_code == 403 and b"Only operators and admins can look an intent up." in viewer.content
    post(
        operator_client,
        reverse("unknown-resolve", args=[intent.id, "absent"]),
        reason="never sent",
        seen_seq=seen(intent),
    )
    moved = post(operator_client, reverse("unknown-lookup", args=[intent.id]))
    assert moved.status_code == 409 and b"expected in UNKNOWN but is READY" in moved.content


# --- confirmed without provider verification ---------------------------------------------------


@pytest.mark.parametrize(
    ("action", "arguments"),
    [
        ("email.send", email(42)),  # the sandbox's email lookup cannot see this reference
        KINDS["generic-without-lookup"],  # no lookup at all; nothing is sent
    ],
    ids=["email", "generic-without-lookup"],
)
def test_unverified_confirmation_is_explicit_and_shown_everywhere(
    action: str, arguments: dict[str, Any], kinds: None, sandbox: Any, operator_client: Client
) -> None:
    # given
    intent = make_unknown(action=action, arguments=arguments)
    url = reverse("unknown-resolve", args=[intent.id, "confirmed"])
    # when: without the checkbox, refused with the service's explanation
    refused = post(
        operator_client,
        url,
        provider_reference="ref_unseen_1",
        reason="customer forwarded it",
        seen_seq=seen(intent),
    )
    assert refused.status_code == 409 and b"cannot verify ref_unseen_1" in refused.content
    assert Intent.objects.get(id=intent.id).status == S.UNKNOWN
    # with it
    done = post(
        operator_client,
        url,
        False,
        provider_reference="ref_unseen_1",
        reason="customer forwarded it",
        accept_unverified="on",
        seen_seq=seen(intent),
    )
    # then
    assert done.status_code == 302 and Intent.objects.get(id=intent.id).status == S.SUCCEEDED
    detail = operator_client.get(reverse("intent-detail", args=[intent.id])).content.decode()
    assert '<span class="warning" id="unverified">unverified</span>' in detail
    assert "without provider verification" in detail
    queue = operator_client.get(reverse("unknown")).content.decode()
    unverified_section = queue[queue.index('id="unverified-h"') :]
    assert str(intent.id) in unverified_section and "ref_unseen_1" in unverified_section
    export = operator_client.get(reverse("audit-export"), {"intent_id": str(intent.id)})
    rows = list(csv.DictReader(io.StringIO(b"".join(export.streaming_content).decode())))  # type: ignore[attr-defined]
    (found,) = [row for row in rows if row["event"] == "outcome_found"]
    assert found["verified"] == "false" and '"verified": false' in found["data"]
    assert all(row["verified"] == "" for row in rows if row["event"] != "outcome_found")


def test_verified_confirmation_shows_no_unverified_mark(sandbox: Any, operator_client: Client) -> None:
    intent, charge_id = unknown_with_effect()
    post(
        operator_client,
        reverse("unknown-resolve", args=[intent.id, "confirmed"]),
        provider_reference=charge_id,
        reason="seen",
        seen_seq=seen(intent),
    )
    detail = operator_client.get(reverse("intent-detail", args=[intent.id])).content.decode()
    assert 'id="unverified"' not in detail
    export = operator_client.get(reverse("audit-export"), {"intent_id": str(intent.id)})
    rows = list(csv.DictReader(io.StringIO(b"".join(export.streaming_content).decode())))  # type: ignore[attr-defined]
    assert [row["verified"] for row in rows if row["event"] == "outcome_found"] == ["true"]
