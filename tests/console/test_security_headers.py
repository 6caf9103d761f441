"""Security headers and cookie flags (issue 12, item 3): the Content-Security-Policy, framing,
HTTPS (redirect, HSTS, Secure cookies) behind EFFECT_LEDGER_HTTPS, and the session length."""

from __future__ import annotations

from typing import Any

import pytest
from django.core import checks
from django.test import Client

from console.env import security_settings
from tests.factories import UserFactory

PASSWORD = "correct horse battery"
CONSOLE_POLICY = {
    "default-src": {"'self'"},
    "script-src": {"'self'"},
    "style-src": {"'self'"},
    "img-src": {"'self'"},
    "object-src": {"'none'"},
    "base-uri": {"'none'"},
    "form-action": {"'self'"},
    "frame-ancestors": {"'none'"},
}


def policy(response: Any) -> dict[str, set[str]]:
    """The response's Content-Security-Policy as {directive: {sources}}."""
    parsed: dict[str, set[str]] = {}
    for part in response.headers.get("Content-Security-Policy", "").split(";"):
        if part.strip():
            directive, *sources = part.split()
            parsed[directive] = set(sources)
    return parsed


def apply(settings: Any, environ: dict[str, str]) -> None:
    """Apply ``security_settings(environ)`` as ``console/settings.py`` does at start-up."""
    for name, value in security_settings(environ).items():
        setattr(settings, name, value)


@pytest.fixture
def https(settings: Any) -> None:
    apply(settings, {"EFFECT_LEDGER_HTTPS": "1"})


def sign_in(client: Client, **extra: Any) -> Any:
    UserFactory(username="vera", groups=["viewer"])
    return client.post("/login/", {"username": "vera", "password": PASSWORD}, **extra)


@pytest.mark.parametrize("path", ["/", "/approvals/", "/unknown/", "/intents/", "/audit/", "/drills/"])
def test_i12_3_console_pages_carry_the_strict_content_security_policy(
    viewer_client: Client, path: str
) -> None:
    # when
    response = viewer_client.get(path)
    # then: exactly the console's policy, no 'unsafe-inline', 'unsafe-eval' or data: anywhere
    assert response.status_code == 200
    assert policy(response) == CONSOLE_POLICY


def test_i12_3_the_sign_in_page_carries_the_policy_too(client: Client, db: Any) -> None:
    assert policy(client.get("/login/")) == CONSOLE_POLICY


def test_i12_3_only_the_api_docs_add_data_images(client: Client) -> None:
    # when: Swagger UI's page and its init script (a file of its own, not inline)
    page = client.get("/api/docs/")
    script = client.get("/api/docs/?script=")
    # then: the console's policy plus data: images, nothing else loosened
    assert page.status_code == 200 and script.status_code == 200
    assert "<script>" not in page.content.decode()
    assert script["Content-Type"].startswith("application/javascript")
    assert policy(page) == {**CONSOLE_POLICY, "img-src": {"'self'", "data:"}}


def test_i12_3_pages_cannot_be_framed_sniffed_or_leak_their_address(viewer_client: Client) -> None:
    # when
    response = viewer_client.get("/")
    # then
    assert response["X-Frame-Options"] == "DENY"
    assert policy(response)["frame-ancestors"] == {"'none'"}
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"
    assert response["Cross-Origin-Opener-Policy"] == "same-origin"


def test_i12_3_by_default_plain_http_works_and_sessions_last_a_working_day(settings: Any, db: Any) -> None:
    # given: the environment says nothing (quickstart on http://127.0.0.1)
    values = security_settings({})
    assert values["SESSION_COOKIE_AGE"] == 8 * 3600
    assert not values["SECURE_SSL_REDIRECT"] and values["SECURE_HSTS_SECONDS"] == 0
    assert not values["SESSION_COOKIE_SECURE"] and not values["CSRF_COOKIE_SECURE"]
    assert values["SECURE_PROXY_SSL_HEADER"] is None
    # ... and the running settings are those
    assert settings.SESSION_COOKIE_AGE == 8 * 3600
    # when: someone signs in over plain http
    response = sign_in(Client())
    # then: signed in, with a session cookie that expires after 8 h, HttpOnly, SameSite=Lax
    assert response.status_code == 302
    cookie = response.cookies["sessionid"]
    assert cookie["max-age"] == 8 * 3600
    assert cookie["httponly"] and cookie["samesite"] == "Lax"
    assert not cookie["secure"]
    assert "Strict-Transport-Security" not in response


def test_i12_3_session_length_comes_from_the_environment() -> None:
    assert security_settings({"EFFECT_LEDGER_SESSION_SECONDS": "3600"})["SESSION_COOKIE_AGE"] == 3600
    for wrong in ("8h", "0", "-60"):
        with pytest.raises(ValueError, match="EFFECT_LEDGER_SESSION_SECONDS"):
            security_settings({"EFFECT_LEDGER_SESSION_SECONDS": wrong})


@pytest.mark.usefixtures("https")
def test_i12_3_with_https_on_plain_http_is_redirected(db: Any) -> None:
    # when
    response = Client().get("/login/?next=/audit/")
    # then
    assert response.status_code == 301
    assert response["Location"] == "https://testserver/login/?next=/audit/"


@pytest.mark.usefixtures("https")
def test_i12_3_with_https_on_health_checks_and_scrapes_are_not_redirected(db: Any) -> None:
    client = Client()
    assert client.get("/healthz").status_code == 200
    assert client.get("/metrics").status_code == 200


@pytest.mark.usefixtures("https")
def test_i12_3_with_https_on_secure_responses_carry_hsts_and_secure_cookies(db: Any) -> None:
    client = Client()
    # when: the sign-in page, then the sign-in, over https
    page = client.get("/login/", secure=True)
    response = sign_in(client, secure=True)
    # then: HSTS for a year, this host only; both cookies Secure, SameSite=Lax
    assert page["Strict-Transport-Security"] == "max-age=31536000"
    csrf = page.cookies["csrftoken"]
    assert csrf["secure"] and csrf["samesite"] == "Lax"
    assert response.status_code == 302
    session = response.cookies["sessionid"]
    assert session["secure"] and session["httponly"] and session["samesite"] == "Lax"


def test_i12_3_hsts_covers_subdomains_only_when_asked() -> None:
    on = {"EFFECT_LEDGER_HTTPS": "1"}
    assert security_settings(on)["SECURE_HSTS_INCLUDE_SUBDOMAINS"] is False
    assert security_settings({**on, "EFFECT_LEDGER_HSTS_INCLUDE_SUBDOMAINS": "1"})[
        "SECURE_HSTS_INCLUDE_SUBDOMAINS"
    ]


def test_i12_3_x_forwarded_proto_is_believed_only_when_trusted(settings: Any, db: Any) -> None:
    # given: HTTPS on, the header not trusted: a client claiming https is still redirected
    apply(settings, {"EFFECT_LEDGER_HTTPS": "1"})
    assert Client().get("/login/", HTTP_X_FORWARDED_PROTO="https").status_code == 301
    # when: trusted (a proxy that sets it terminates TLS in front)
    apply(settings, {"EFFECT_LEDGER_HTTPS": "1", "EFFECT_LEDGER_TRUST_X_FORWARDED_PROTO": "1"})
    response = Client().get("/login/", HTTP_X_FORWARDED_PROTO="https")
    # then: the request counts as https
    assert response.status_code == 200
    assert response["Strict-Transport-Security"] == "max-age=31536000"


def test_i12_3_deploy_checks_with_https_on_leave_only_the_subdomain_and_preload_warnings(
    settings: Any,
) -> None:
    # given: production-like settings with HTTPS on
    apply(settings, {"EFFECT_LEDGER_HTTPS": "1"})
    settings.SECRET_KEY = "k" * 20 + "-a-long-random-production-secret-key-0123456789"
    settings.DEBUG = False
    # when: manage.py check --deploy's checks run (the security ones; the others are not this
    # item's: operations.W003, drf_spectacular.W001)
    found = {
        message.id
        for message in checks.run_checks(include_deployment_checks=True)
        if message.id.startswith(("security.", "csp."))
    }
    # then: only HSTS without includeSubDomains (W005) and without preload (W021), both on purpose
    # (console/env.py security_settings)
    assert found == {"security.W005", "security.W021"}


@pytest.mark.usefixtures("https")
def test_i12_3_with_https_on_an_api_post_over_http_is_refused_not_redirected(api: Any) -> None:
    # given: an agent that sends a submit over plain http (a 301 would turn it into a GET)
    from operations.models import Intent

    body = {"action": "email.send", "arguments": {"to": "a@example.test", "subject": "s", "body": "b"}}
    # when
    response = api.post("/api/v1/intents", body, format="json", HTTP_IDEMPOTENCY_KEY="plain-http")
    # then: a problem that says why, and nothing stored
    assert response.status_code == 403
    assert response["Content-Type"].startswith("application/problem+json")
    assert response.json()["code"] == "https-required"
    assert not Intent.objects.exists()
    # and over https the same request is served
    secure = api.post("/api/v1/intents", body, format="json", HTTP_IDEMPOTENCY_KEY="plain-http", secure=True)
    assert secure.status_code == 201


def test_i12_3_a_refused_csrf_token_answers_on_a_page_without_inline_style(db: Any) -> None:
    # given: a form posted without its CSRF token (cookies cleared, or sent from elsewhere)
    client = Client(enforce_csrf_checks=True)
    # when
    response = client.post("/login/", {"username": "vera", "password": "x"})
    # then: 403 on the console's own template, which the policy allows (Django's has <style>)
    assert response.status_code == 403
    assert b"could not be accepted" in response.content
    assert b"<style" not in response.content.lower() and b"style=" not in response.content.lower()
