"""Issue 18 item 5: the services that act re-check the tenant, not only the views: called
directly, they refuse another tenant's intent or finding, and never confirm that it exists."""

from __future__ import annotations

from typing import Any

import pytest

from operations.exceptions import ApprovalRefused, ResolutionRefused
from operations.models import Approval, Intent
from operations.services import intent_approve, intent_reject
from reconciliation import resolution
from reconciliation.models import DuplicateFinding
from tests.console.conftest import gated, make_unknown
from tests.factories import UserFactory, submit

pytestmark = pytest.mark.django_db


def acme_only(*roles: str) -> Any:
    return UserFactory(username="acme-" + "-".join(roles), groups=list(roles), tenants=["acme"])


@pytest.mark.parametrize("decide", [intent_approve, intent_reject])
def test_i18_5_approve_and_reject_refuse_another_tenants_intent_as_missing(decide: Any) -> None:
    # given: an approver of acme, and an intent of globex awaiting approval
    user = acme_only("approver")
    intent = gated(tenant="globex")
    # when / then
    with pytest.raises(ApprovalRefused, match=f"no intent {intent.id}"):
        decide(intent_id=intent.id, user=user, request_hash=intent.request_hash, reason="not mine")
    assert Intent.objects.get(id=intent.id).status == Intent.Status.AWAITING_APPROVAL
    assert not Approval.objects.exists()


def test_i18_5_a_viewer_of_a_tenant_is_not_its_approver() -> None:
    # given: approver on acme, viewer on globex (each role on its own tenants)
    user = UserFactory(username="mixed", groups=["approver", "viewer"], tenants=["acme"])
    from operations.access.tenants import role_grants_set

    role_grants_set(user=user, roles=["viewer"], tenants=["globex"])
    intent = gated(tenant="globex")
    # when / then: it may see the intent, so the refusal says why
    with pytest.raises(ApprovalRefused, match="not in the 'approver' group .* on tenant globex"):
        intent_approve(intent_id=intent.id, user=user, request_hash=intent.request_hash)
    # and on its own tenant it approves
    own = gated(tenant="acme")
    assert (
        intent_approve(intent_id=own.id, user=user, request_hash=own.request_hash).status
        == Intent.Status.READY
    )


def test_i18_5_a_group_member_without_a_grant_approves_nowhere() -> None:
    # given: in the approver group, no grant (fail closed)
    from operations.models import RoleGrant

    user = UserFactory(username="grantless", groups=["approver"])
    RoleGrant.objects.filter(user=user).delete()
    intent = gated(tenant="acme")
    # when / then
    with pytest.raises(ApprovalRefused):
        intent_approve(intent_id=intent.id, user=user, request_hash=intent.request_hash)


def test_i18_5_resolutions_refuse_another_tenants_intent_as_missing() -> None:
    # given: an operator of acme and globex's UNKNOWN and HELD intents and finding
    user = acme_only("operator")
    unknown = make_unknown(tenant="globex")
    submit(tenant="globex", reference="order-1")
    held = submit(tenant="globex", reference="order-1")
    finding = DuplicateFinding.objects.create(
        intent=unknown, provider_reference="ch_x", kept_reference="ch_k", state=DuplicateFinding.State.OPEN
    )
    calls = [
        lambda: resolution.resolve_absent(
            intent_id=unknown.id, user=user, reason="r", accept_duplicate_risk=True
        ),
        lambda: resolution.resolve_confirmed(
            intent_id=unknown.id, user=user, provider_reference="ch", reason="r"
        ),
        lambda: resolution.resolve_compensate(
            intent_id=unknown.id, user=user, reason="r", provider_reference="ch"
        ),
        lambda: resolution.lookup_now(intent_id=unknown.id, user=user),
        lambda: resolution.resolve_failed_compensation(
            intent_id=unknown.id, user=user, verb="kept", reason="r"
        ),
        lambda: resolution.release_held(intent_id=held.id, user=user, reason="r", accept_duplicate_risk=True),
        lambda: resolution.reject_held(intent_id=held.id, user=user, reason="r"),
    ]
    # when / then
    for call in calls:
        with pytest.raises(ResolutionRefused, match="no intent"):
            call()
    with pytest.raises(ResolutionRefused, match=f"no duplicate finding {finding.id}"):
        resolution.resolve_duplicate_finding(finding_id=finding.id, user=user, verb="acknowledge", reason="r")
    assert Intent.objects.get(id=unknown.id).status == Intent.Status.UNKNOWN
    assert Intent.objects.get(id=held.id).status == Intent.Status.HELD
    finding.refresh_from_db()
    assert finding.state == DuplicateFinding.State.OPEN


def test_i18_5_an_operator_of_every_tenant_still_resolves_anywhere() -> None:
    user = UserFactory(username="everywhere", groups=["operator"])  # every tenant
    unknown = make_unknown(tenant="globex")
    resolved = resolution.resolve_absent(
        intent_id=unknown.id, user=user, reason="r", accept_duplicate_risk=True
    )
    assert resolved.status != Intent.Status.UNKNOWN
