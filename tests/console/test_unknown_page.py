"""Issue 39 item 4: the UNKNOWN page puts the evidence summary and the decision at the top, groups
alike lookups, answers every action with the whole page, and offers only the verbs that can
apply (refusing the others when posted anyway)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from operations.adapters.base import LookupResult, LookupStatus
from operations.audit.trail import REFUSAL_EVENT
from operations.models import Intent
from reconciliation.lookups import record_lookup
from reconciliation.models import Evidence
from tests.console.conftest import make_unknown, seen

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
EMAIL = {"to": "ana@example.test", "subject": "Receipt", "body": "Thanks"}
RESERVATION = {"resource": "room-101", "start": "2030-01-01T10:00:00Z", "seats": 2, "reference": "booking-1"}


def looked_up(intent: Intent, status: LookupStatus, times: int, **detail: Any) -> None:
    for _ in range(times):
        record_lookup(intent.id, LookupResult(status=status, detail=detail))


def detail_page(client: Client, intent: Intent, **headers: Any) -> str:
    response = client.get(reverse("unknown-detail", args=[intent.id]), **headers)
    assert response.status_code == 200
    return response.content.decode()


def test_i39_4_the_summary_and_the_decision_come_before_the_evidence(operator_client: Client) -> None:
    # given: an UNKNOWN charge looked up five times
    intent = make_unknown(reference="order-3003")
    looked_up(intent, LookupStatus.NOT_FOUND_YET, 5, answer="lag")
    # when
    body = detail_page(operator_client, intent)
    # then: the summary, then the decision's buttons, then the attempts, lookups and timeline
    order = [
        body.index('id="summary-h"'),
        body.index('id="resolve-confirmed"'),
        body.index('id="resolve-absent"'),
        body.index('id="resolve-compensate"'),
        body.index('id="attempts-h"'),
        body.index('id="lookups-h"'),
        body.index('id="timeline-h"'),
    ]
    assert order == sorted(order)
    summary = body[body.index('id="summary-h"') : body.index('id="resolution"')]
    assert "49.90 EUR" in summary and "order-3003" in summary
    assert "5: not found yet ×5" in summary and "timeout after the request was sent" in summary


def test_i39_4_alike_lookups_are_one_group_that_opens_on_each(operator_client: Client) -> None:
    # given: five lookups that saw nothing yet, then two inconclusive ones
    intent = make_unknown()
    looked_up(intent, LookupStatus.NOT_FOUND_YET, 5, answer="lag")
    looked_up(intent, LookupStatus.INCONCLUSIVE, 2, answer="timeout")
    first, *_, fifth, sixth, seventh = Evidence.objects.filter(intent=intent, kind="lookup").order_by("id")
    # when
    body = detail_page(operator_client, intent)
    section = body[body.index('id="lookups-h"') : body.index('id="compensations-h"')]
    # then: two groups, each a <details> whose summary says how many, what and when, and which
    # opens on every lookup with its JSON
    titles = re.findall(r"<summary><strong>([^<]+)</strong>", section)
    assert titles == [
        f"5 lookups, not found yet, {first.created_at:%H:%M:%S}–{fifth.created_at:%H:%M:%S}",
        f"2 lookups, inconclusive, {sixth.created_at:%H:%M:%S}–{seventh.created_at:%H:%M:%S}",
    ]
    groups = section.split('<details class="lookup-group">')[1:]
    assert [group.count("<li><time") for group in groups] == [5, 2]
    assert groups[0].count("&quot;answer&quot;: &quot;lag&quot;") == 5
    assert section.count("<details") == 2  # not one table row per lookup


def test_i39_4_a_decision_answers_with_the_whole_page(operator_client: Client) -> None:
    # given: an UNKNOWN charge
    intent = make_unknown()
    # when: resolved as absent from the page (htmx)
    response = operator_client.post(
        reverse("unknown-resolve", args=[intent.id, "absent"]),
        {"reason": "nothing at the provider", "seen_seq": seen(intent)},
        **HTMX,  # type: ignore[arg-type]
    )
    # then: the whole page under its back link, its header and title saying READY, the
    # success in the resolution box, and no form left to decide with
    body = response.content.decode()
    assert response.status_code == 200 and "<html" not in body
    assert body.lstrip().startswith("<title>READY payments.charge · Effect Ledger</title>")
    assert '<div id="unknown-page">' in body
    assert '<span class="status status-ready" id="intent-status">READY</span>' in body
    assert "Resolved as absent. The intent is READY." in body and 'id="resolve-absent"' not in body
    assert 'id="summary-h"' in body and 'id="timeline-h"' in body


def test_i39_4_a_refusal_answers_with_the_whole_page_and_keeps_what_was_typed(
    operator_client: Client,
) -> None:
    # given: an UNKNOWN charge
    intent = make_unknown()
    # when: confirmed without a reference
    response = operator_client.post(
        reverse("unknown-resolve", args=[intent.id, "confirmed"]),
        {"reason": "seen in the dashboard", "seen_seq": seen(intent)},
        **HTMX,  # type: ignore[arg-type]
    )
    # then: refused in place, in the whole page, with the reason kept in the form
    body = response.content.decode()
    assert response.status_code == 422 and '<div id="unknown-page">' in body
    assert "Refused (confirmed)" in body and "Provider reference" in body
    assert ">seen in the dashboard</textarea>" in body
    assert Intent.objects.get(id=intent.id).status == Intent.Status.UNKNOWN


def test_i39_4_an_email_is_not_offered_compensate_and_its_refusal_is_clear(operator_client: Client) -> None:
    # given: an UNKNOWN email (a sent email cannot be undone: no compensation)
    intent = make_unknown(action="email.send", arguments=EMAIL)
    # when
    body = detail_page(operator_client, intent)
    # then: no compensate button; the reason where it would be
    assert 'id="resolve-compensate"' not in body and "Resolve by compensating" not in body
    assert 'id="compensate-not-offered">Not offered: email.send has no compensation' in body
    assert 'id="resolve-confirmed"' in body and 'id="resolve-absent"' in body
    # when: compensate is posted anyway (a stale page, a hand-made request), with no reference
    before = intent.audit_events.exclude(event=REFUSAL_EVENT).count()
    refused = operator_client.post(
        reverse("unknown-resolve", args=[intent.id, "compensate"]),
        {"reason": "undo it", "seen_seq": seen(intent)},
        **HTMX,  # type: ignore[arg-type]
    )
    # then: refused for what it is (not for a missing reference), and nothing changed
    text = refused.content.decode()
    assert refused.status_code == 409
    assert "Refused (compensate): email.send has no compensation" in text
    assert "no lookup has found one" not in text
    intent.refresh_from_db()
    assert intent.status == Intent.Status.UNKNOWN
    assert not Intent.objects.filter(compensates=intent).exists()
    assert not Evidence.objects.filter(intent=intent, kind="resolution").exists()
    assert intent.audit_events.exclude(event=REFUSAL_EVENT).count() == before
    assert intent.audit_events.filter(event=REFUSAL_EVENT).count() == 1  # the refusal is audited


def test_i39_4_absent_is_not_offered_once_a_lookup_found_the_effect(operator_client: Client) -> None:
    # given: a reservation whose effect a lookup found (it is still UNKNOWN)
    intent = make_unknown(action="reservations.create", arguments=RESERVATION, reference="booking-1")
    Evidence.objects.create(intent=intent, kind="lookup", result="found", provider_references=["rsv_77"])
    # when
    body = detail_page(operator_client, intent)
    # then: absent is not offered, with the evidence; confirmed is
    assert 'id="resolve-absent"' not in body and 'id="absent-ack"' not in body
    assert 'id="absent-not-offered">Not offered: the provider has this effect' in body and "rsv_77" in body
    assert 'id="resolve-confirmed"' in body


def test_i39_4_compensate_is_not_offered_when_its_compensation_action_is_not_served(
    settings: Any, operator_client: Client
) -> None:
    # given: a declared transfer whose contract names a reversal this deployment does not serve
    settings.EFFECT_LEDGER_GENERIC_HTTP = {
        "acme.transfer": {
            "url": "http://127.0.0.1:9/v1/transfers",
            "compensation": {"action": "acme.reverse", "arguments": {"transfer": "{provider_reference}"}},
        }
    }
    settings.EFFECT_LEDGER_POLICIES = {"acme.transfer": {"approval": "never"}}
    intent = make_unknown(
        action="acme.transfer", arguments={"amount": 1250, "currency": "USD", "account": "a"}
    )
    # when
    body = detail_page(operator_client, intent)
    # then: the page says why; the service refuses it the same way, nothing opened
    assert 'id="resolve-compensate"' not in body
    assert "acme.transfer&#x27;s compensation acme.reverse is not served by this deployment" in body
    refused = operator_client.post(
        reverse("unknown-resolve", args=[intent.id, "compensate"]),
        {"reason": "undo it", "provider_reference": "tr_1", "seen_seq": seen(intent)},
        **HTMX,  # type: ignore[arg-type]
    )
    assert refused.status_code == 409 and "acme.reverse is not served" in refused.content.decode()
    assert Intent.objects.get(id=intent.id).status == Intent.Status.UNKNOWN
    assert not Intent.objects.filter(compensates=intent).exists()
