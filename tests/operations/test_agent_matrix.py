"""Issue 18: the API rows of the authorization matrix (the console's rows are in
tests/console/test_authorization_matrix.py).

Every agent kind (narrow: ``email.*`` and its own intents; wide: every action and its tenant's
intents) × every API operation (list, detail, cancel, submit, preview) × whose intent (its own,
another agent's of its tenant, another tenant's) gets exactly the expected answer, and a refusal
changes nothing.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from operations.models import Intent
from tests.factories import charge_arguments, make_agent, submit

pytestmark = pytest.mark.django_db

URL = "/api/v1/intents"
EMAIL = {"to": "a@example.test", "subject": "hi", "body": "hello", "reference": "m-1"}

AGENTS = {
    "narrow": {"actions": ["email.*"], "scope": "own"},
    "wide": {"actions": ["*"], "scope": "tenant"},
}
WHOSE = ("own", "same-tenant", "other-tenant")
# (agent kind, whose intent) -> may read and cancel it
MAY_REACH = {
    ("narrow", "own"): True,
    ("narrow", "same-tenant"): False,
    ("narrow", "other-tenant"): False,
    ("wide", "own"): True,
    ("wide", "same-tenant"): True,
    ("wide", "other-tenant"): False,
}
# (agent kind, action) -> may submit and preview it
MAY_SUBMIT = {
    ("narrow", "email.send"): True,
    ("narrow", "payments.charge"): False,
    ("wide", "email.send"): True,
    ("wide", "payments.charge"): True,
}


def _client(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def _intent(whose: str, agent_name: str) -> Intent:
    principal = {
        "own": f"agent:{agent_name}",
        "same-tenant": "agent:colleague",
        "other-tenant": "agent:stranger",
    }
    tenant = "globex" if whose == "other-tenant" else "acme"
    return submit(tenant=tenant, principal=principal[whose], action="email.send", arguments=EMAIL)


@pytest.mark.parametrize("whose", WHOSE)
@pytest.mark.parametrize("kind", list(AGENTS))
def test_i18_matrix_read_list_and_cancel(kind: str, whose: str) -> None:
    # given
    agent, token = make_agent(name=f"{kind}-agent", tenant="acme", **AGENTS[kind])
    client = _client(token)
    intent = _intent(whose, agent.name)
    allowed = MAY_REACH[(kind, whose)]
    # when / then: detail
    detail = client.get(f"{URL}/{intent.id}")
    assert detail.status_code == (200 if allowed else 404), detail.content
    # list
    listed = {row["intent_id"] for row in client.get(URL).json()["results"]}
    assert (str(intent.id) in listed) == allowed
    # cancel: done when allowed, 404 (never 403: nothing confirms it exists) and nothing changed otherwise
    cancel = client.post(
        f"{URL}/{intent.id}/cancel", data=json.dumps({"reason": "x"}), content_type="application/json"
    )
    assert cancel.status_code == (200 if allowed else 404), cancel.content
    intent.refresh_from_db()
    assert intent.status == ("CANCELLED" if allowed else "READY")


@pytest.mark.parametrize("action", ["email.send", "payments.charge"])
@pytest.mark.parametrize("kind", list(AGENTS))
def test_i18_matrix_submit_and_preview(kind: str, action: str) -> None:
    # given
    _, token = make_agent(name=f"{kind}-agent", tenant="acme", **AGENTS[kind])
    client = _client(token)
    body = {"action": action, "arguments": EMAIL if action == "email.send" else charge_arguments()}
    allowed = MAY_SUBMIT[(kind, action)]
    # when
    preview = client.post(f"{URL}/preview", data=json.dumps(body), content_type="application/json")
    created = client.post(
        URL, data=json.dumps(body), content_type="application/json", HTTP_IDEMPOTENCY_KEY=f"{kind}-{action}"
    )
    # then: allowed, or a 403 problem and nothing stored
    assert preview.status_code == (200 if allowed else 403), preview.content
    assert created.status_code == (201 if allowed else 403), created.content
    if not allowed:
        assert created["Content-Type"].startswith("application/problem+json")
    assert Intent.objects.filter(action=action).exists() == allowed


@pytest.mark.parametrize("tenant", ["*", "", " ", "x" * 101])
def test_i18_an_agent_cannot_be_created_for_every_tenant_or_none(tenant: str) -> None:
    # "*" means every tenant in console role grants: an agent's tenant is one name
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="tenant name"):
        call_command("create_agent", "bot", "--tenant", tenant)
    from operations.models import Agent

    assert not Agent.objects.filter(name="bot").exists()


def test_i18_an_own_scope_agent_is_held_but_not_told_whose_intent_it_waits_for() -> None:
    # given: a colleague's open charge for order-9
    _, first = make_agent(name="first", tenant="acme", scope="own")
    _, second = make_agent(name="second", tenant="acme", scope="own")
    _, wide = make_agent(name="wide", tenant="acme", scope="tenant")
    body = {"action": "payments.charge", "arguments": charge_arguments(700), "reference": "order-9"}
    earlier = _client(first).post(
        URL, data=json.dumps(body), content_type="application/json", HTTP_IDEMPOTENCY_KEY="k1"
    )
    # when: another agent of the tenant submits the same business action
    held = _client(second).post(
        URL, data=json.dumps(body), content_type="application/json", HTTP_IDEMPOTENCY_KEY="k2"
    )
    # then: held (one business action per tenant), but the colleague's intent id is not disclosed
    assert held.status_code == 201 and held.json()["status"] == "HELD"
    assert held.json()["held_behind"] is None
    # an agent that reads its whole tenant is told
    seen = _client(wide).get(f"{URL}/{held.json()['intent_id']}").json()
    assert seen["held_behind"] == earlier.json()["intent_id"]


def test_i18_6_the_admin_sets_an_agents_actions_scope_and_revokes_a_token(client: Any) -> None:
    # given: a Django admin and an agent with every action
    from django.contrib.auth import get_user_model

    from operations.api import authentication
    from operations.models import Agent

    agent, token = make_agent(name="bot", tenant="acme", actions=["*"], scope="tenant")
    root = get_user_model().objects.create_superuser("root", password="y" * 20)
    client.force_login(root)
    url = f"/admin/operations/agent/{agent.pk}/change/"
    page = client.get(url)
    assert page.status_code == 200 and b"actions_text" in page.content
    (row,) = agent.tokens.all()
    form = {
        "actions_text": "email.*", "scope": "own", "is_active": "on",
        "tokens-TOTAL_FORMS": "1", "tokens-INITIAL_FORMS": "1", "tokens-MIN_NUM_FORMS": "0",
        "tokens-MAX_NUM_FORMS": "1000", "tokens-0-id": str(row.pk), "tokens-0-agent": str(agent.pk),
        "tokens-0-expires_at_0": "", "tokens-0-expires_at_1": "",
        "tokens-0-revoked_at_0": "2020-01-01", "tokens-0-revoked_at_1": "00:00:00",
    }  # fmt: skip
    # a malformed pattern is refused and changes nothing
    bad = client.post(url, {**form, "actions_text": "payments.*.x y"})
    assert bad.status_code == 200 and b"not an action pattern" in bad.content
    assert Agent.objects.get(pk=agent.pk).actions == ["*"]
    # when
    saved = client.post(url, form)
    # then: narrowed, and the revoked token is refused
    assert saved.status_code == 302, saved.content[:2000]
    agent.refresh_from_db()
    assert (agent.actions, agent.scope) == (["email.*"], "own")
    authentication.forget_verified_tokens()
    assert _client(token).get(URL).status_code == 401
