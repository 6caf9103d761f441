"""An agent's reach (issue 18, item 6): the actions it may submit, whose intents it sees and
cancels, its tokens' expiry and rotation, and the per-process token cache's bound."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.apps import apps
from django.core.management import call_command
from django.db.models.functions import Now
from rest_framework.test import APIClient

from operations.api import authentication
from operations.api.authentication import agent_for_token, agent_token_rotate
from operations.audit.chain_checks import audit_verify
from operations.audit.trail import REFUSAL_EVENT
from operations.idempotency import sha256_hex
from operations.models import Agent, AgentToken, AuditEvent, Intent
from tests.factories import charge_arguments, make_agent

pytestmark = pytest.mark.django_db

URL = "/api/v1/intents"


def client_for(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def post(client: APIClient, url: str, body: Any, key: str | None = None) -> Any:
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    return client.post(url, data=json.dumps(body), content_type="application/json", **headers)


def charge() -> dict[str, Any]:
    return {"action": "payments.charge", "arguments": charge_arguments()}


def email() -> dict[str, Any]:
    return {
        "action": "email.send",
        "arguments": {"to": "a@example.test", "subject": "hi", "body": "hello", "reference": "m-1"},
    }


def test_i18_6_an_own_scope_agent_cannot_read_list_or_cancel_another_agents_intent() -> None:
    # given: two agents of tenant acme, the second limited to its own intents
    _, first_token = make_agent("first", scope="tenant")
    _, second_token = make_agent("second", scope="own")
    first, second = client_for(first_token), client_for(second_token)
    created = post(first, URL, charge(), key="k-1")
    assert created.status_code == 201
    intent_id = created.json()["intent_id"]
    mine = post(second, URL, charge(), key="k-1")
    assert mine.status_code == 201
    # when
    detail = second.get(f"{URL}/{intent_id}")
    listed = second.get(URL)
    cancel = post(second, f"{URL}/{intent_id}/cancel", {"reason": "not mine"})
    # then: 404 exactly as for another tenant's intent; the list holds only its own
    for response in (detail, cancel):
        assert response.status_code == 404, response.content
        assert response["Content-Type"] == "application/problem+json"
        assert response.json()["detail"] == f"no intent {intent_id} in your tenant"
    assert [row["intent_id"] for row in listed.json()["results"]] == [mine.json()["intent_id"]]
    assert Intent.objects.get(id=intent_id).status == Intent.Status.READY
    # the refused cancel is on the intent's audit chain
    (refused,) = AuditEvent.objects.filter(intent_id=intent_id, event=REFUSAL_EVENT)
    assert refused.actor == "agent:second" and refused.data["decision"] == "cancel"
    assert "own intents" in refused.reason
    # and an agent whose scope is its tenant still sees and cancels both
    assert len(first.get(URL).json()["results"]) == 2
    assert post(first, f"{URL}/{mine.json()['intent_id']}/cancel", {}).status_code == 200
    assert list(audit_verify()) == []


def test_i18_6_new_agents_default_to_their_own_intents_and_every_action() -> None:
    agent, _ = make_agent("fresh")
    assert (agent.scope, agent.actions) == (Agent.Scope.OWN, ["*"])


def test_i18_6_the_migration_keeps_existing_agents_reach() -> None:
    # given: an agent as the migration finds it (the columns just added, with their defaults)
    from importlib import import_module

    migration = import_module("operations.migrations.0021_agent_scopes_and_tokens")
    agent, _ = make_agent("old-timer", scope="own", actions=[])
    # when
    migration.keep_existing_agents_reach(apps, None)
    # then: it keeps reading its whole tenant and submitting every action, as before
    agent.refresh_from_db()
    assert (agent.scope, agent.actions) == ("tenant", ["*"])


def test_i18_6_an_action_outside_the_agents_scopes_is_403_and_audited() -> None:
    # given: an agent that may only send email
    agent, token = make_agent("mailer", actions=["email.*"])
    mailer = client_for(token)
    before = Intent.objects.count()
    # when
    submitted = post(mailer, URL, charge(), key="k-1")
    previewed = post(mailer, f"{URL}/preview", charge())
    allowed = post(mailer, f"{URL}/preview", email())
    # then: 403 problems naming what it may do, nothing stored
    for response in (submitted, previewed):
        assert response.status_code == 403, response.content
        assert response["Content-Type"] == "application/problem+json"
        problem = response.json()
        assert (problem["code"], problem["allowed_actions"]) == ("action-not-allowed", ["email.*"])
        assert "payments.charge" in problem["detail"]
    assert allowed.status_code == 200, allowed.content
    assert Intent.objects.count() == before
    # each refusal is an audit event without an intent, chained and verifiable
    events = AuditEvent.objects.filter(intent__isnull=True, event=REFUSAL_EVENT).order_by("seq")
    assert [(e.seq, e.actor, e.data["decision"], e.data["action"]) for e in events] == [
        (1, "agent:mailer", "submit", "payments.charge"),
        (2, "agent:mailer", "preview", "payments.charge"),
    ]
    assert events[0].data["tenant"] == "acme" and events[0].data["agent_id"] == agent.pk
    assert list(audit_verify()) == []


def test_i18_6_an_expired_token_is_401() -> None:
    # given: a token that expired a second ago
    agent, token = make_agent("short-lived", expires_in=timedelta(hours=1))
    AgentToken.objects.filter(agent=agent).update(expires_at=Now() - timedelta(seconds=1))
    # when
    response = client_for(token).get(URL)
    # then
    assert response.status_code == 401
    assert response["Content-Type"] == "application/problem+json"
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_i18_6_rotation_keeps_both_tokens_valid_during_the_overlap_then_refuses_the_old(
    settings: Any,
) -> None:
    # given: a verified token; processes keep verified tokens 0.5 s (shorter than the overlap, as
    # docs/how-to/connect-an-agent.md asks: a change to a cached token reaches a process within that bound)
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "TOKEN_CACHE_SECONDS": 0.5}
    make_agent("rotator")
    _, old = make_agent("rotator", tenant="globex")
    assert client_for(old).get(URL).status_code == 200
    # when: the token is rotated with a one-second overlap
    out = StringIO()
    call_command("rotate_agent_token", "rotator", tenant="globex", keep_old_for=1, stdout=out)
    new = out.getvalue().split("token: ")[1].strip()
    # then: both are valid during the overlap ...
    assert client_for(old).get(URL).status_code == 200
    assert client_for(new).get(URL).status_code == 200
    # ... and the old one is refused after it (and the cache bound), the new one still valid
    time.sleep(1.6)
    assert client_for(old).get(URL).status_code == 401
    assert client_for(new).get(URL).status_code == 200
    # the other tenant's agent of the same name kept its token untouched
    assert AgentToken.objects.filter(agent__tenant="acme", expires_at__isnull=True).count() == 1


def test_i18_6_rotation_without_overlap_revokes_the_old_token_now() -> None:
    agent, old = make_agent("rotator")
    _, new = agent_token_rotate(agent=agent, keep_old_for=timedelta(0))
    assert agent_for_token(old) is None and agent_for_token(new) == agent


def _advance_monotonic(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    now = time.monotonic()
    monkeypatch.setattr(authentication.time, "monotonic", lambda: now + seconds)


def test_i18_6_the_token_cache_never_keeps_a_token_past_its_expiry(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: a cache bound of 10 minutes and a token that expires in 30 s
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "TOKEN_CACHE_SECONDS": 600}
    agent, token = make_agent("expiring", expires_in=timedelta(seconds=30))
    assert agent_for_token(token) == agent
    # then: it is cached until its expiry at most, not for the whole bound
    until, _ = authentication._verified[sha256_hex(token.encode())]
    assert until - time.monotonic() <= 30
    # when: 31 s later (by both clocks) it is refused, without forgetting the cache
    AgentToken.objects.filter(agent=agent).update(expires_at=Now() - timedelta(seconds=1))
    _advance_monotonic(monkeypatch, 31)
    assert agent_for_token(token) is None


def test_i18_6_a_revoked_token_is_refused_within_the_cache_bound(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: a verified token, cached for 2 s
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "TOKEN_CACHE_SECONDS": 2}
    agent, token = make_agent("revoked")
    assert agent_for_token(token) == agent
    # when: it is revoked
    AgentToken.objects.filter(agent=agent).update(revoked_at=Now())
    # then: the cache may still answer within its bound, never after it
    _advance_monotonic(monkeypatch, 2.01)
    assert agent_for_token(token) is None


def test_i18_6_create_agent_takes_actions_scope_and_expiry() -> None:
    out = StringIO()
    call_command(
        "create_agent", "billing", tenant="acme", actions="payments.*, email.send", scope="tenant",
        expires_in_days=30, stdout=out,
    )  # fmt: skip
    agent = Agent.objects.get(name="billing", tenant="acme")
    assert (agent.actions, agent.scope) == (["payments.*", "email.send"], "tenant")
    token = agent.tokens.get()
    assert token.expires_at is not None
    assert abs(token.expires_at - token.created_at - timedelta(days=30)) < timedelta(minutes=1)
    assert "token: elk_" in out.getvalue()


@pytest.mark.parametrize("text", ["payments.", "pay ments.*", "*.charge", "payments.**"])
def test_i18_6_create_agent_refuses_a_malformed_pattern(text: str) -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="not an action pattern"):
        call_command("create_agent", "x", tenant="acme", actions=text, stdout=StringIO())
    assert not Agent.objects.filter(name="x").exists()


@pytest.mark.parametrize(
    "lifetime",
    [
        {"expires_in_days": 99_999_999},  # year 275817: written, then unreadable by Python
        {"expires_in_days": 99_999_999_999},  # beyond what a timedelta holds
        {"expires_in": float("nan")},
        {"expires_in": float("inf")},
        {"expires_in_days": 3661},  # one day past ten years of 366 days
        {"expires_in": 0},
    ],
    ids=["year-275817", "overflow", "nan", "inf", "over-ten-years", "zero"],
)
def test_create_agent_refuses_a_token_lifetime_it_cannot_keep_and_writes_nothing(lifetime: Any) -> None:
    # A newcomer's report: the agent was created, its token never shown, a rerun "already exists".
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="lifetime must|at most 3660 days"):
        call_command("create_agent", "ybot", tenant="acme", stdout=StringIO(), **lifetime)
    assert not Agent.objects.filter(name="ybot").exists()
    assert not AgentToken.objects.exists()


@pytest.mark.parametrize(
    "options",
    [
        {"expires_in_days": 99_999_999},
        {"keep_old_for": float("inf")},
        {"keep_old_for": float("nan")},
        {"keep_old_for": -1},
        {"keep_old_for": 10 * 366 * 86_400 + 1},
    ],
    ids=["new-token-year-275817", "keep-inf", "keep-nan", "keep-negative", "keep-over-ten-years"],
)
def test_rotation_refuses_a_duration_it_cannot_keep_and_changes_nothing(options: Any) -> None:
    # A newcomer's report: the new token was written but never printed, and the old ones were
    # already cut to an hour (or revoked) when the command failed; the agent's admin page a 500.
    from django.core.management.base import CommandError

    agent, old = make_agent("billing-bot")
    with pytest.raises(CommandError, match="at most 3660 days|zero or more"):
        call_command("rotate_agent_token", "billing-bot", tenant=agent.tenant, stdout=StringIO(), **options)
    assert list(agent.tokens.values_list("expires_at", "revoked_at")) == [(None, None)]
    assert agent_for_token(old) == agent


def test_the_longest_token_lifetime_is_kept_and_read_back() -> None:
    out = StringIO()
    call_command("create_agent", "longlived", tenant="acme", expires_in_days=3660, stdout=out)
    token = Agent.objects.get(name="longlived").tokens.get()
    assert token.expires_at is not None and token.expires_at.year >= token.created_at.year + 10
    assert "token: elk_" in out.getvalue()
