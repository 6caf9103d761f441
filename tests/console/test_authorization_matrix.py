"""Issue 18 item 5: the console is tenant-scoped. One matrix: every principal kind (each console
role, held on one tenant or on every tenant) x every console page and action x its own tenant
and another tenant.

Rules under test (docs/how-to/add-approvers.md):

* a page lists, counts and exports the reader's tenants only; another tenant's intent, finding or
  audit event is a 404, the answer for one that does not exist;
* approve and reject need the approver (or admin) role on the intent's tenant, resolutions and
  held or duplicate decisions the operator (or admin) role there; refused otherwise (403 on a
  tenant the user reads, 404 on one it does not);
* pages of no tenant (the audit chains' verification, drills) need a role on every tenant, and
  starting a drill the admin role on every tenant.

Every URL name of ``console/urls.py`` and ``console/lab/urls.py`` is either in ``CASES`` or in
``NOT_CONSOLE`` (with the reason): a new URL fails ``test_i18_5_every_console_url_is_in_the_matrix``
until it is placed in one of them.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone

from operations.models import ArchivedIntent, ArchiveSegment, Attempt, Intent, WebhookDelivery
from operations.services import agent_callback_set, intent_cancel
from reconciliation.models import (
    DuplicateFinding,
    ProviderEvent,
    ProviderFinding,
    StatementMapping,
    StatementRun,
)
from tests.console.conftest import gated, make_unknown, seen, signed_in
from tests.factories import UserFactory, make_agent, submit

pytestmark = pytest.mark.django_db

OWN, OTHER = "acme", "globex"
ROLES = ("viewer", "approver", "operator", "admin")
SCOPES = ("one", "every")  # the role on OWN only, or on every tenant
HTMX = {"HTTP_HX_REQUEST": "true"}

#: URL names served under ``console/urls.py`` that are not console pages, and why.
NOT_CONSOLE = {
    "schema": "the API's OpenAPI document (no data)",
    "api-docs": "Swagger UI for the API (agents' bearer tokens, tenant-scoped by the agent)",
    "metrics": "Prometheus text behind its own bearer token; fleet-wide by design",
    "healthz": "liveness, no data",
    "login": "the sign-in form",
    "logout": "signing out",
    "provider-event-inbox": "providers' signed events (issue 19): the signature authenticates, no session",
}


@dataclass
class World:
    """One tenant's items: a gated intent, an UNKNOWN one, a HELD one and an open finding."""

    gated: Intent
    unknown: Intent
    held: Intent
    finding: DuplicateFinding
    provider_finding: ProviderFinding


def build(tenant: str) -> World:
    unknown = make_unknown(tenant=tenant, reference=f"unk-{tenant}")
    first = submit(tenant=tenant, reference=f"order-{tenant}")
    held = submit(tenant=tenant, reference=f"order-{tenant}")
    assert held.status == Intent.Status.HELD, held.status
    finding = DuplicateFinding.objects.create(
        intent=unknown,
        provider_reference=f"ch_extra_{tenant}",
        kept_reference=f"ch_kept_{tenant}",
        state=DuplicateFinding.State.OPEN,
    )
    assert first.id != held.id
    provider_finding = ProviderFinding.objects.create(
        fingerprint=f"mismatch:sandbox-payments:{unknown.id}:ch_pf_{tenant}",
        kind=ProviderFinding.Kind.AMOUNT_MISMATCH,
        source="sandbox-payments",
        intent=unknown,
        provider_reference=f"ch_pf_{tenant}",
    )
    return World(
        gated=gated(tenant=tenant, reference=f"gated-{tenant}"),
        unknown=unknown,
        held=held,
        finding=finding,
        provider_finding=provider_finding,
    )


def may_read(scope: str, tenant: str) -> bool:
    return scope == "every" or tenant == OWN


def may_approve(role: str, scope: str, tenant: str) -> bool:
    return role in ("approver", "admin") and may_read(scope, tenant)


def may_resolve(role: str, scope: str, tenant: str) -> bool:
    return role in ("operator", "admin") and may_read(scope, tenant)


def decision_status(allowed: bool, readable: bool) -> set[int]:
    """What an action answers: done (200 htmx fragment, or 302 without htmx), refused for a
    missing role on a readable tenant (403), or 404 on a tenant the user cannot read."""
    if not readable:
        return {404}
    return {200, 302} if allowed else {403}


Check = Callable[[Client, str, str, World, World], None]


def _list_page(name: str, markers: Callable[[World], list[str]]) -> Check:
    def check(client: Client, role: str, scope: str, own: World, other: World) -> None:
        response = client.get(reverse(name))
        assert response.status_code == 200
        body = (
            b"".join(response.streaming_content).decode() if response.streaming else response.content.decode()
        )
        for marker in markers(own):
            assert marker in body, f"{name}: own tenant's {marker} missing"
        for marker in markers(other):
            assert (marker in body) == (scope == "every"), f"{name}: other tenant's {marker}"

    return check


def _detail(name: str, target: Callable[[World], Any]) -> Check:
    def check(client: Client, role: str, scope: str, own: World, other: World) -> None:
        assert client.get(reverse(name, args=[target(own).id])).status_code == 200
        expected = 200 if scope == "every" else 404
        assert client.get(reverse(name, args=[target(other).id])).status_code == expected

    return check


def _approve(verb: str) -> Check:
    def check(client: Client, role: str, scope: str, own: World, other: World) -> None:
        for tenant, world in ((OWN, own), (OTHER, other)):
            intent = world.gated
            data = {"request_hash": intent.request_hash, "reason": "matrix"}
            response = client.post(reverse(f"approval-{verb}", args=[intent.id]), data, **HTMX)
            expected = decision_status(may_approve(role, scope, tenant), may_read(scope, tenant))
            assert response.status_code in expected, (tenant, response.status_code)
            moved = Intent.objects.get(id=intent.id).status != Intent.Status.AWAITING_APPROVAL
            assert moved == (response.status_code == 200), tenant

    return check


def _resolve_absent(client: Client, role: str, scope: str, own: World, other: World) -> None:
    for tenant, world in ((OWN, own), (OTHER, other)):
        intent = world.unknown
        data = {"reason": "matrix", "accept_duplicate_risk": "on", "seen_seq": seen(intent)}
        response = client.post(reverse("unknown-resolve", args=[intent.id, "absent"]), data, **HTMX)
        allowed = may_resolve(role, scope, tenant)
        assert response.status_code in decision_status(allowed, may_read(scope, tenant)), tenant
        moved = Intent.objects.get(id=intent.id).status != Intent.Status.UNKNOWN
        assert moved == allowed, tenant


def _lookup(client: Client, role: str, scope: str, own: World, other: World) -> None:
    for tenant, world in ((OWN, own), (OTHER, other)):
        response = client.post(reverse("unknown-lookup", args=[world.unknown.id]), **HTMX)
        allowed = may_resolve(role, scope, tenant)
        # Allowed: the lookup runs (no provider here: the answer is recorded as inconclusive).
        assert response.status_code in (
            decision_status(allowed, may_read(scope, tenant)) | ({409} if allowed else set())
        )


def _assign(client: Client, role: str, scope: str, own: World, other: World) -> None:
    for tenant, world in ((OWN, own), (OTHER, other)):
        intent = world.unknown
        response = client.post(reverse("intent-assign", args=[intent.id]))
        allowed = may_resolve(role, scope, tenant)
        assert response.status_code in decision_status(allowed, may_read(scope, tenant)), tenant
        assert (Intent.objects.get(id=intent.id).assigned_to != "") == allowed, tenant


def _held(client: Client, role: str, scope: str, own: World, other: World) -> None:
    for tenant, world in ((OWN, own), (OTHER, other)):
        intent = world.held
        data = {"reason": "matrix", "seen_seq": seen(intent)}
        response = client.post(reverse("held-resolve", args=[intent.id, "reject"]), data, **HTMX)
        allowed = may_resolve(role, scope, tenant)
        assert response.status_code in decision_status(allowed, may_read(scope, tenant)), tenant
        assert (Intent.objects.get(id=intent.id).status == Intent.Status.REJECTED) == allowed, tenant


def _duplicate(client: Client, role: str, scope: str, own: World, other: World) -> None:
    for tenant, world in ((OWN, own), (OTHER, other)):
        finding = world.finding
        response = client.post(
            reverse("duplicate-resolve", args=[finding.id, "acknowledge"]), {"reason": "matrix"}, **HTMX
        )
        allowed = may_resolve(role, scope, tenant)
        assert response.status_code in decision_status(allowed, may_read(scope, tenant)), tenant
        finding.refresh_from_db()
        assert (finding.state == DuplicateFinding.State.RESOLVED) == allowed, tenant


def _provider_finding(client: Client, role: str, scope: str, own: World, other: World) -> None:
    for tenant, world in ((OWN, own), (OTHER, other)):
        finding = world.provider_finding
        response = client.post(
            reverse("provider-finding-resolve", args=[finding.id, "close"]), {"reason": "matrix"}, **HTMX
        )
        allowed = may_resolve(role, scope, tenant)
        assert response.status_code in decision_status(allowed, may_read(scope, tenant)), tenant
        finding.refresh_from_db()
        assert (finding.state == ProviderFinding.State.RESOLVED) == allowed, tenant


def _statement_post(name: str) -> Check:
    """Uploads and mappings span tenants: 403 for a role on named tenants, a refusal (403) for
    viewers and approvers of every tenant, and for operators and admins of every tenant the
    service's own refusal of the empty form (422); nothing stored in any case."""

    def check(client: Client, role: str, scope: str, own: World, other: World) -> None:
        response = client.post(reverse(name), {"source": "nope", "date": "2026-01-01"}, **HTMX)
        if scope != "every" or role not in ("operator", "admin"):
            assert response.status_code == 403
        else:
            assert response.status_code == 422
        assert not StatementRun.objects.exists() and not StatementMapping.objects.exists()

    return check


def _every_tenant_page(name: str) -> Check:
    def check(client: Client, role: str, scope: str, own: World, other: World) -> None:
        assert client.get(reverse(name)).status_code == (200 if scope == "every" else 403)

    return check


def _drill_start(client: Client, role: str, scope: str, own: World, other: World) -> None:
    response = client.post(reverse("drill-start"), {"kind": "no-such-drill"})
    if scope != "every":
        assert response.status_code == 403
        return
    assert response.status_code == 302
    page = client.get(reverse("drills")).content.decode()
    if role == "admin":  # allowed: the service itself refuses the made-up kind
        assert "unknown drill kind" in page
    else:
        assert "Only admins of every tenant can start a drill." in page


def _dashboard(client: Client, role: str, scope: str, own: World, other: World) -> None:
    body = client.get(reverse("dashboard")).content.decode()
    # the gated intents expire in ten minutes: "expiring" (issue 39 item 5)
    waiting = re.search(r'id="approvals-expiring">(\d+)<', body)
    assert waiting is not None
    assert int(waiting.group(1)) == (2 if scope == "every" else 1)
    assert ('id="held-behind">2<' in body) == (scope == "every")
    assert ("Outbox pending" in body) == (scope == "every")  # figures of no tenant


def _health(client: Client, role: str, scope: str, own: World, other: World) -> None:
    # Every role reads it; provider calls count the user's tenants (the two worlds' attempts are
    # alike, so a scoped user sees half); workers, broker, outbox and jobs need every tenant.
    response = client.get(reverse("health"))
    body = response.content.decode()
    assert response.status_code == 200
    calls = re.search(r"(\d+) calls, ", body)
    assert calls is not None
    assert (
        int(calls.group(1))
        == Attempt.objects.filter(intent__tenant__in=[OWN, OTHER] if scope == "every" else [OWN]).count()
    )
    assert ('id="signal-workers"' in body) == (scope == "every")
    assert ('id="outbox-pending"' in body) == (scope == "every")


def _delivery(tenant: str) -> WebhookDelivery:
    """A webhook delivery of ``tenant``: its agent's intent cancelled, announced to its callback."""
    agent, _ = make_agent(name="hook-bot", tenant=tenant)
    agent_callback_set(agent=agent, url="https://hooks.example.test/ledger")
    intent = submit(tenant=tenant, principal="agent:hook-bot")
    intent_cancel(intent_id=intent.id, actor="agent:hook-bot")
    return WebhookDelivery.objects.get(intent=intent)


def _webhooks(client: Client, role: str, scope: str, own: World, other: World) -> None:
    ours, theirs = _delivery(OWN), _delivery(OTHER)
    body = client.get(reverse("webhooks")).content.decode()
    assert ours.message_id in body
    assert (theirs.message_id in body) == (scope == "every")


def _webhook_resend(client: Client, role: str, scope: str, own: World, other: World) -> None:
    for tenant in (OWN, OTHER):
        delivery = _delivery(tenant)
        WebhookDelivery.objects.filter(id=delivery.id).update(state="failed", next_attempt_at=None)
        response = client.post(reverse("webhook-resend", args=[delivery.id]), **HTMX)
        allowed = may_resolve(role, scope, tenant)
        assert response.status_code in decision_status(allowed, may_read(scope, tenant)), tenant
        delivery.refresh_from_db()
        assert (delivery.state == "pending") == allowed, tenant


def _provider_events(client: Client, role: str, scope: str, own: World, other: World) -> None:
    """Events of a tenant's intents are read in that tenant's scope; an orphan event (no
    intent, so no tenant) only in a scope of every tenant."""
    rows = {
        name: ProviderEvent.objects.create(
            source="sandbox-payments", event_id=f"evt_matrix_{name}", event_type="charge.succeeded",
            intent=intent, result="recorded" if intent else "orphan",
        )
        for name, intent in (("own", own.unknown), ("other", other.unknown), ("orphan", None))
    }  # fmt: skip
    body = client.get(reverse("provider-events")).content.decode()
    assert rows["own"].event_id in body
    assert (rows["other"].event_id in body) == (scope == "every")
    assert (rows["orphan"].event_id in body) == (scope == "every")


def _archived(tenant: str, number: int) -> ArchivedIntent:
    """An archived intent of ``tenant`` as the archive's index holds it (issue 36); its file is
    not written, so its page shows the missing file by name (the archiver's own tests write
    files: tests/console/test_archive_pages.py)."""
    now = timezone.now()
    segment = ArchiveSegment.objects.create(
        number=number, period=now.date(), file_name=f"matrix/{tenant}.jsonl.gz", intents=1, events=1,
        bytes=10, file_sha256="0" * 64, root="0" * 64, manifest={}, signature="0" * 128,
    )  # fmt: skip
    return ArchivedIntent.objects.create(
        intent_id=uuid.uuid4(), segment=segment, state=ArchivedIntent.State.ARCHIVED, tenant=tenant,
        principal="agent:agent-1", client_key=f"key-{tenant}", idempotency_key=f"ik-{tenant}",
        reference=f"archived-{tenant}", action="payments.charge", status="SUCCEEDED", request_hash="0" * 64,
        fingerprint_version=2, head_seq=1, head_hash="0" * 64, rows_digest="0" * 32, created_at=now,
        settled_at=now, key_expires_at=now,
    )  # fmt: skip


def _archived_intent(client: Client, role: str, scope: str, own: World, other: World) -> None:
    """An archived intent is read in its tenant's scope, its page and the search alike."""
    ours, theirs = _archived(OWN, 1), _archived(OTHER, 2)
    page = client.get(reverse("archived-intent", args=[ours.intent_id]))
    assert page.status_code == 200 and ours.segment.file_name in page.content.decode()
    expected = 200 if scope == "every" else 404
    assert client.get(reverse("archived-intent", args=[theirs.intent_id])).status_code == expected
    assert client.get(reverse("intent-detail", args=[theirs.intent_id])).status_code == expected
    found = client.get(reverse("intents"), {"q": theirs.reference}).content.decode()
    assert (theirs.segment.file_name in found) == (scope == "every")


def _ids(world: World) -> list[str]:
    return [str(world.gated.id), str(world.unknown.id), str(world.held.id)]


CASES: dict[str, Check] = {
    "dashboard": _dashboard,
    "approvals": _list_page("approvals", lambda w: [str(w.gated.id)]),
    "approval-detail": _detail("approval-detail", lambda w: w.gated),
    "approval-approve": _approve("approve"),
    "approval-reject": _approve("reject"),
    "unknown": _list_page(
        "unknown", lambda w: [str(w.unknown.id), str(w.held.id), f"/duplicates/{w.finding.id}/"]
    ),
    "unknown-detail": _detail("unknown-detail", lambda w: w.unknown),
    "unknown-resolve": _resolve_absent,
    "unknown-lookup": _lookup,
    "intent-assign": _assign,
    "held-detail": _detail("held-detail", lambda w: w.held),
    "held-resolve": _held,
    "duplicate-detail": _detail("duplicate-detail", lambda w: w.finding),
    "duplicate-resolve": _duplicate,
    "intents": _list_page("intents", _ids),
    "intent-detail": _detail("intent-detail", lambda w: w.gated),
    "archived-intent": _archived_intent,
    "audit": _list_page("audit", _ids),
    "audit-export": _list_page("audit-export", _ids),
    "audit-export-jsonl": _list_page("audit-export-jsonl", _ids),
    "audit-verify": _every_tenant_page("audit-verify"),
    "drills": _every_tenant_page("drills"),
    "health": _health,
    "drill-start": _drill_start,
    "webhooks": _webhooks,
    "provider-findings": _list_page("provider-findings", lambda w: [w.provider_finding.provider_reference]),
    "provider-finding-detail": _detail("provider-finding-detail", lambda w: w.provider_finding),
    "provider-finding-resolve": _provider_finding,
    "statements": _every_tenant_page("statements"),
    "statement-upload": _statement_post("statement-upload"),
    "statement-mapping": _statement_post("statement-mapping"),
    "webhook-resend": _webhook_resend,
    "provider-events": _provider_events,
}


def _names(patterns: list[Any], prefix: str = "") -> set[str]:
    names: set[str] = set()
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            if prefix + str(pattern.pattern) in ("api/v1/", "admin/"):
                continue  # the API (agents, scoped by their token's tenant) and Django's admin (superusers)
            names |= _names(pattern.url_patterns, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern) and pattern.name:
            names.add(pattern.name)
    return names


def test_i18_5_every_console_url_is_in_the_matrix() -> None:
    served = _names(get_resolver().url_patterns)
    assert served - set(NOT_CONSOLE) == set(CASES), "place every console URL in CASES or NOT_CONSOLE"


@pytest.mark.parametrize("scope", SCOPES)
@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_i18_5_authorization_matrix(name: str, role: str, scope: str) -> None:
    # given: the same items in two tenants, and a user holding ``role`` on one tenant or on all
    own, other = build(OWN), build(OTHER)
    user = UserFactory(username=f"{role}-{scope}", groups=[role], tenants=None if scope == "every" else [OWN])
    # when / then
    CASES[name](signed_in(user), role, scope, own, other)
