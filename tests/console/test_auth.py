"""Sign-in, roles, agents and login throttling (the C14 cases are in test_signin.py)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from tests.console.conftest import gated, signed_in
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

PAGES = ["dashboard", "approvals", "unknown", "intents", "audit", "audit-verify"]


@pytest.mark.parametrize("name", PAGES)
def test_anonymous_is_sent_to_sign_in(name: str) -> None:
    response = Client().get(reverse(name))
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_anonymous_htmx_poll_reloads_on_the_sign_in_page_instead_of_swapping_it() -> None:
    response = Client().get(
        reverse("approvals"), HTTP_HX_REQUEST="true", HTTP_HX_CURRENT_URL="http://testserver/approvals/"
    )
    assert response.status_code == 200
    assert response["HX-Redirect"] == "/login/?next=%2Fapprovals%2F"


@pytest.mark.parametrize("name", PAGES)
def test_every_role_can_read_every_page(name: str, viewer_client: Client) -> None:
    assert viewer_client.get(reverse(name)).status_code == 200


def test_user_without_console_role_sees_a_visible_refusal() -> None:
    nobody = UserFactory(username="nobody")
    response = signed_in(nobody).get(reverse("dashboard"))
    assert response.status_code == 403
    assert b"no console role" in response.content


def test_agent_token_has_no_console_access(agent_token: str) -> None:
    # given: a valid agent bearer token and an intent awaiting approval
    intent = gated()
    client = Client(HTTP_AUTHORIZATION=f"Bearer {agent_token}")
    # when / then: pages redirect to sign-in and an approval is not accepted
    assert client.get(reverse("approvals"))["Location"].startswith("/login/")
    response = client.post(
        reverse("approval-approve", args=[intent.id]), {"request_hash": intent.request_hash}
    )
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    intent.refresh_from_db()
    assert intent.status == "AWAITING_APPROVAL"


def test_sign_in_and_out() -> None:
    UserFactory(username="carol", groups=["viewer"])
    client = Client()
    response = client.post(reverse("login"), {"username": "carol", "password": "correct horse battery"})
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.get("/").status_code == 200
    assert client.post(reverse("logout")).status_code == 302
    assert client.get("/").status_code == 302


def test_login_is_throttled_after_repeated_failures(settings: Any) -> None:
    # given
    UserFactory(username="carol", groups=["viewer"])
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        response = client.post(reverse("login"), {"username": "carol", "password": "wrong"})
        assert response.status_code == 200 and b"did not match" in response.content
    # the failure that reaches the limit is answered with the lock
    assert client.post(reverse("login"), {"username": "carol", "password": "wrong"}).status_code == 429
    # when: even the right password
    response = client.post(reverse("login"), {"username": "carol", "password": "correct horse battery"})
    # then
    assert response.status_code == 429
    assert b"Too many failed sign-ins" in response.content
    assert client.get("/").status_code == 302  # not signed in


def test_throttle_is_per_account_and_address(settings: Any) -> None:
    UserFactory(username="carol", groups=["viewer"])
    UserFactory(username="dave", groups=["viewer"])
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        client.post(reverse("login"), {"username": "carol", "password": "wrong"})
    # another account from the same address is not locked by carol's failures
    response = client.post(reverse("login"), {"username": "dave", "password": "correct horse battery"})
    assert response.status_code == 302


def test_successful_sign_in_clears_the_account_counter(settings: Any) -> None:
    UserFactory(username="carol", groups=["viewer"])
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        client.post(reverse("login"), {"username": "carol", "password": "wrong"})
    assert (
        client.post(reverse("login"), {"username": "carol", "password": "correct horse battery"}).status_code
        == 302
    )
    client.post(reverse("logout"))
    response = client.post(reverse("login"), {"username": "carol", "password": "wrong"})
    assert response.status_code == 200
