"""Issue 12, item 4: a crafted or damaged page cursor is a 400 problem (API) or a visible
message over the first page (console), never a 500."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from operations.selectors import encode_cursor
from tests.factories import submit

pytestmark = pytest.mark.django_db


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def ours(payload: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "cursor",
    [
        b64("o=0&r=0&p=not-a-date"),  # the position is not a time (was a 500)
        b64("o=0&r=0&p=2026-01-01 10:00:00"),  # a time without a zone
        "!!!not-base64!!!",  # DRF's 404 "Invalid cursor" before
        b64("o=-5"),
        b64("p=2026-13-01 00:00:00+00:00"),  # month 13 (was a 500)
        b64("p=2026-12-01 99:00:00+00:00"),  # hour 99
        b64("p=2026-12-01 10:00:00+99:00"),  # offset beyond a day
    ],
)
def test_c16_a_crafted_api_cursor_is_a_400_problem(api: APIClient, cursor: str) -> None:
    submit()
    response = api.get("/api/v1/intents", {"cursor": cursor})
    assert response.status_code == 400, response.content
    assert response["Content-Type"].startswith("application/problem+json")
    assert "malformed cursor" in response.json()["detail"]


def test_i12_4_the_api_cursor_it_wrote_still_pages(api: APIClient) -> None:
    for i in range(3):
        submit(reference=f"page-{i}")
    first = api.get("/api/v1/intents", {"page_size": 2}).json()
    second = api.get(first["next"]).json()
    assert len(first["results"]) == 2 and len(second["results"]) == 1


@pytest.mark.parametrize(
    ("path", "cursor"),
    [
        ("/intents/", ours(["2026-01-01T10:00:00+00:00", "not-a-uuid"])),  # was a 500
        ("/intents/", ours(["not-a-date", "00000000-0000-0000-0000-000000000000"])),
        ("/intents/", ours(["2026-01-01T10:00:00", "00000000-0000-0000-0000-000000000000"])),  # no zone
        ("/intents/", "%%%"),
        ("/intents/", ours(["2026-13-01T10:00:00+00:00", "00000000-0000-0000-0000-000000000000"])),
        ("/intents/", base64.urlsafe_b64encode(b"[" * 2500 + b"]" * 5).decode()),  # RecursionError
        ("/audit/", base64.urlsafe_b64encode(b"[" * 2500 + b"]" * 5).decode()),
        ("/audit/", ours(["2026-01-01T10:00:00+00:00", "not-a-number"])),
        ("/audit/", ours({"a": 1})),
    ],
)
def test_c16_a_crafted_console_cursor_shows_the_first_page_with_a_message(
    operator_client: Client, path: str, cursor: str
) -> None:
    intent = submit()
    response = operator_client.get(path, {"cursor": cursor})
    assert response.status_code == 200
    page = response.content.decode()
    assert "That page link is malformed or out of date" in page
    if path == "/intents/":
        assert str(intent.id)[:8] in page


def test_i12_4_a_console_cursor_it_wrote_still_pages(operator_client: Client) -> None:
    intent = submit()
    response = operator_client.get("/intents/", {"cursor": encode_cursor(intent.created_at, intent.id)})
    assert response.status_code == 200 and "malformed" not in response.content.decode()
