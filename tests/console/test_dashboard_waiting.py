"""Issue 39 item 5: the dashboard lists only what waits for a person, most urgent first, and says
"Nothing waits for you" when nothing does (``reconciliation.waiting_for_people``)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.db.models.functions import Now
from django.test import Client
from django.urls import reverse

from operations.access.tenants import EVERY_TENANT, TenantScope
from operations.models import Intent
from operations.services import intent_escalate
from reconciliation.models import DuplicateFinding, ProviderFinding
from reconciliation.waiting_for_people import URGENCY, waiting_for_people
from tests.console.conftest import gated, make_unknown
from tests.console.test_held import held_pair, likely_duplicate

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
#: The ids of every count the list may show (a provider finding kind's: per kind).
ROW_IDS = (
    "unknown-escalated",
    "approvals-expiring",
    "escalated-compensations",
    "open-duplicate-findings",
    "held-after-restore",
    "held-request-mismatch",
    "held-likely-duplicates",
    "held-unserved",
    "approvals-waiting",
    "unknown-looking",
    "held-behind",
    "compensating-provider-findings",
)


def counts_in_order(body: str) -> list[tuple[str, int]]:
    """The waiting list's counts as the page shows them, top to bottom: ``[(id, count), ...]``."""
    card = body[body.index('id="waiting-card"') :]
    card = card[: card.index("</section>")]
    return [
        (found.group(1), int(found.group(2)))
        for found in re.finditer(r'<td class="num" id="([a-z_-]+)">(\d+)</td>', card)
    ]


def escalated_unknown(**kwargs: Any) -> Intent:
    intent = make_unknown(**kwargs)
    assert intent_escalate(intent_id=intent.id, reason="patience exhausted")
    return intent


def test_i39_5_nothing_waits_for_you_on_a_quiet_ledger(viewer_client: Client) -> None:
    # given: no intent at all
    # when
    pages = [
        viewer_client.get(reverse("dashboard")).content.decode(),
        viewer_client.get(reverse("dashboard"), **HTMX).content.decode(),  # type: ignore[arg-type]
    ]
    # then: the sentence, and not one row of zeros
    for body in pages:
        assert '<p class="empty" id="nothing-waits">Nothing waits for you.</p>' in body
        assert counts_in_order(body) == []
        assert not any(f'id="{row}"' in body for row in ROW_IDS)
        assert 'id="open-provider-findings-' not in body


def test_i39_5_only_waiting_kinds_are_listed_most_urgent_first(operator_client: Client) -> None:
    # given, created least urgent first so that the order cannot come from creation: an
    # approval with two hours left, a likely duplicate held for a person, an open provider
    # finding, a duplicate finding, an approval expiring in ten minutes, an escalated UNKNOWN,
    # and an UNKNOWN intent the reconciler still looks up
    relaxed = gated(reference="relaxed-1")
    Intent.objects.filter(id=relaxed.id).update(approval_expires_at=Now() + timedelta(hours=2))
    likely_duplicate(reference="order-2")
    looked_up = make_unknown(reference="still-looking")
    ProviderFinding.objects.create(
        fingerprint="missing:sandbox-payments:ch_pf_1",
        kind=ProviderFinding.Kind.MISSING_AT_PROVIDER,
        source="sandbox-payments",
        intent=looked_up,
        provider_reference="ch_pf_1",
    )
    DuplicateFinding.objects.create(
        intent=looked_up,
        provider_reference="ch_extra",
        kept_reference="ch_kept",
        state=DuplicateFinding.State.OPEN,
    )
    gated(reference="hurry-1")
    escalated_unknown(reference="escalated-1")
    # when
    for body in (
        operator_client.get(reverse("dashboard")).content.decode(),
        operator_client.get(reverse("dashboard"), **HTMX).content.decode(),  # type: ignore[arg-type]
    ):
        # then: exactly the kinds that wait, in urgency order; the one the reconciler still
        # looks up is listed apart, after them
        assert counts_in_order(body) == [
            ("unknown-escalated", 1),
            ("approvals-expiring", 1),
            ("open-duplicate-findings", 1),
            ("open-provider-findings-missing_at_provider", 1),
            ("held-likely-duplicates", 1),
            ("approvals-waiting", 1),
            ("unknown-looking", 1),
        ]
        assert "Nothing waits for you." not in body
        assert (
            body.index('id="approvals-waiting"')
            < body.index('id="in-hand"')
            < body.index('id="unknown-looking"')
        )
        # each row links where it is decided; the expiring approvals say when the first expires
        assert 'href="/approvals/?sort=expiry">Approval requests expiring within 15 minutes</a>' in body
        assert 'href="/findings/?state=open&amp;kind=missing_at_provider"' in body
        assert re.search(r'first expires in <time class="countdown" datetime="[^"]+">', body)


def test_i39_5_what_the_ledger_still_handles_is_not_waiting_for_you(viewer_client: Client) -> None:
    # given: an UNKNOWN intent the reconciler still looks up and an intent held behind an
    # earlier one that is still open: neither needs a person yet
    make_unknown(reference="still-looking")
    held_pair(reference="order-9")
    # when
    body = viewer_client.get(reverse("dashboard")).content.decode()
    # then: nothing waits for a person; both are shown apart, as the ledger's
    assert "Nothing waits for you." in body
    assert counts_in_order(body) == [("unknown-looking", 1), ("held-behind", 1)]


def test_i39_5_the_waiting_list_counts_the_readers_tenants_only() -> None:
    # given: an escalated UNKNOWN in each of two tenants
    escalated_unknown(tenant="acme", reference="a-1")
    escalated_unknown(tenant="globex", reference="g-1")
    # when / then
    assert [(row.key, row.count) for row in waiting_for_people(scope=EVERY_TENANT)] == [
        ("unknown_escalated", 2)
    ]
    one = TenantScope(every=False, names=frozenset({"acme"}))
    assert [(row.key, row.count) for row in waiting_for_people(scope=one)] == [("unknown_escalated", 1)]
    none = TenantScope(every=False, names=frozenset())
    assert waiting_for_people(scope=none) == []


def test_i39_5_every_provider_finding_kind_has_its_place_in_the_order() -> None:
    keys = [key for key, _ in URGENCY]
    assert len(keys) == len(set(keys))
    for kind in ProviderFinding.Kind.values:
        assert f"provider_findings:{kind}" in keys


def test_i39_5_what_only_an_operator_resolves_does_not_wait_for_an_approver(approver_client: Client) -> None:
    # given: an escalated UNKNOWN intent (operators resolve it) and an approval request
    # (newcomer: an approver's "Waiting for a person" listed the UNKNOWN intent as theirs)
    escalated_unknown(reference="escalated-2")
    # when / then: nothing waits for the approver; the UNKNOWN intent is listed as an operator's
    body = approver_client.get(reverse("dashboard")).content.decode()
    assert "Nothing waits for you." in body
    assert body.index('id="for-operators"') < body.index('id="unknown-escalated"')
    # when: an approval request comes: it is theirs, first; the UNKNOWN intent still the operators'
    gated(reference="approve-me")
    body = approver_client.get(reverse("dashboard")).content.decode()
    assert "Nothing waits for you." not in body
    assert (
        body.index('id="approvals-') < body.index('id="for-operators"') < body.index('id="unknown-escalated"')
    )
