"""``GET /api/v1/actions`` and what an intent's representation tells an agent waiting on it
(``links``, ``resolution``): issue 15, for the MCP server's ``list_actions`` and
``wait_for_intent``."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from operations.adapters.registry import served_argument_schemas
from operations.models import Intent
from operations.services import intent_approve, intent_reject
from tests.factories import charge_arguments, make_agent, submit
from tests.operations.test_openapi import assert_matches_document

pytestmark = pytest.mark.django_db

ACTIONS = "/api/v1/actions"


def client_for(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def by_action(response: Any) -> dict[str, dict[str, Any]]:
    return {entry["action"]: entry for entry in response.json()["results"]}


def test_i15_actions_lists_every_served_action_with_its_schema_tier_and_approval_rule(api: APIClient) -> None:
    # when
    response = api.get(ACTIONS)
    # then
    assert response.status_code == 200
    assert_matches_document(response)
    actions = by_action(response)
    assert list(actions) == sorted(served_argument_schemas())
    charge = actions["payments.charge"]
    assert charge["versions"] == [
        {"action_version": 1, "arguments_schema": served_argument_schemas()["payments.charge"][1]}
    ]
    assert (charge["risk_tier"], charge["needs_approval"], charge["approval"]) == (
        "high",
        "depends_on_arguments",
        "above_amount",
    )
    assert charge["approval_threshold_minor"]["EUR"] == 10_000
    assert (actions["payments.refund"]["needs_approval"], actions["email.send"]["needs_approval"]) == (
        "always",
        "never",
    )


def test_i15_actions_lists_only_what_the_agents_scopes_allow() -> None:
    # given: an agent that may only send email and charge
    _, token = make_agent(name="mailer", actions=["email.send", "payments.charge"])
    # when
    response = client_for(token).get(ACTIONS)
    # then
    assert response.status_code == 200
    assert list(by_action(response)) == ["email.send", "payments.charge"]


def test_i15_actions_refuses_a_request_without_a_valid_token() -> None:
    # when
    response = client_for("elk_not-a-token").get(ACTIONS)
    # then
    assert response.status_code == 401
    assert response["Content-Type"].startswith("application/problem+json")


def test_i15_an_intent_awaiting_approval_links_to_its_approval_page(api: APIClient) -> None:
    # given: a charge above the EUR threshold waits for a person
    intent = submit(arguments=charge_arguments(amount=50_000))
    assert intent.status == Intent.Status.AWAITING_APPROVAL
    # when
    response = api.get(f"/api/v1/intents/{intent.id}")
    # then
    assert response.status_code == 200
    assert_matches_document(response)
    body = response.json()
    assert body["links"] == {
        "self": f"http://testserver/api/v1/intents/{intent.id}",
        "console": f"http://testserver/approvals/{intent.id}/",
    }
    assert body["resolution"] is None


def test_i15_a_settled_intent_links_to_its_detail_page_in_lists_too(api: APIClient) -> None:
    # given
    intent = submit()
    # when
    listed = api.get("/api/v1/intents").json()["results"][0]
    # then: READY, no person decided; its page is the intent's detail
    assert listed["links"]["console"] == f"http://testserver/intents/{intent.id}/"
    assert "resolution" not in listed


def test_i15_the_detail_names_the_approval_and_the_rejection_as_its_resolution(
    api: APIClient, approver: Any
) -> None:
    # given: one approved, one rejected
    approved = submit(arguments=charge_arguments(amount=50_000))
    rejected = submit(arguments=charge_arguments(amount=60_000))
    intent_approve(intent_id=approved.id, user=approver, request_hash=approved.request_hash, reason="ok")
    intent_reject(intent_id=rejected.id, user=approver, request_hash=rejected.request_hash, reason="too much")
    # when
    approved_body = api.get(f"/api/v1/intents/{approved.id}").json()
    rejected_response = api.get(f"/api/v1/intents/{rejected.id}")
    # then
    assert_matches_document(rejected_response)
    assert {k: approved_body["resolution"][k] for k in ("event", "actor", "to_status", "reason")} == {
        "event": "approved",
        "actor": "user:alice",
        "to_status": "READY",
        "reason": "ok",
    }
    resolution = rejected_response.json()["resolution"]
    assert (resolution["event"], resolution["to_status"], resolution["reason"]) == (
        "rejected",
        "REJECTED",
        "too much",
    )
