"""Signed-in answers are never stored (issue 39 item 9): every console page, htmx partial,
download and redirect answered to a signed-in operator carries ``Cache-Control: no-store``
(RFC 9111 section 5.2.2.5), so neither a shared cache nor the browser's back button keeps a page
of payloads and decisions after sign-out."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import URLPattern, URLResolver, reverse

from console.urls import urlpatterns
from tests.console.conftest import gated, make_unknown, signed_in
from tests.factories import UserFactory

HTMX = {"HTTP_HX_REQUEST": "true"}


def no_store(response: Any) -> bool:
    directives = {part.strip().split("=")[0] for part in response.headers.get("Cache-Control", "").split(",")}
    return {"no-store", "private"} <= directives


def console_urls(intent_id: str) -> list[str]:
    """Every console route with no argument or an intent id, by walking the URLconf (so a page
    added later is covered without this list knowing it)."""
    urls = []
    patterns: list[Any] = []
    for pattern in urlpatterns:  # the lab's pages are included at the root
        if isinstance(pattern, URLResolver) and str(pattern.pattern) == "":
            patterns.extend(pattern.url_patterns)
        else:
            patterns.append(pattern)
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            continue
        assert isinstance(pattern, URLPattern)
        name, converters = pattern.name, pattern.pattern.converters
        if name is None or str(pattern.pattern).startswith(("api/", "admin/", "providers/")):
            continue
        if name in {"login", "healthz", "metrics", "api-docs", "schema"}:
            continue
        if not converters:
            urls.append(reverse(name))
        elif list(converters) == ["intent_id"]:
            urls.append(reverse(name, args=[intent_id]))
    return urls


@pytest.mark.parametrize("role", ["viewer", "operator", "approver", "admin"])
def test_i39_9_every_signed_in_page_and_partial_is_no_store(role: str, db: Any, settings: Any) -> None:
    # given: an intent waiting for approval and one UNKNOWN, and a signed-in user of each role
    waiting, unknown = gated(), make_unknown()
    client = signed_in(UserFactory(username=f"u-{role}", groups=[role]))
    urls = console_urls(str(waiting.id)) + console_urls(str(unknown.id))
    assert {reverse("dashboard"), reverse("drills"), reverse("approval-detail", args=[waiting.id])} <= set(
        urls
    )
    # when / then: every page and its htmx partial, whatever its status (200, 403, 405, 302)
    for url in urls:
        for headers in ({}, HTMX):
            response = client.get(url, **headers)  # type: ignore[arg-type]
            assert response.status_code < 500, (url, response.status_code)
            assert no_store(response), (url, response.status_code, response.headers.get("Cache-Control"))
    # and a download and a decision's answer
    assert no_store(client.get(reverse("audit-export")))
    assert no_store(client.post(reverse("approval-reject", args=[waiting.id]), {"reason": "no"}))
