"""Console fixtures: one signed-in client per role, and intents built through the services."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client

from operations.adapters.base import ExecutionResult
from operations.adapters.registry import get_adapter
from operations.engine.calls import lookup_call
from operations.models import Intent
from operations.selectors import last_audit_seq
from operations.services import Claim, intent_claim, intent_mark_unknown
from tests.console.browser_support import browser, csp_violations, page, phone  # noqa: F401 (the browser tests' fixtures)
from tests.factories import UserFactory, charge_arguments, submit


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    """The audit verification cache starts empty in every test (sign-in locks live in the
    database, which every test rolls back)."""
    cache.clear()


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def viewer(db: Any) -> Any:
    return UserFactory(username="vera", groups=["viewer"])


@pytest.fixture
def operator(db: Any) -> Any:
    return UserFactory(username="otto", groups=["operator"])


@pytest.fixture
def viewer_client(viewer: Any) -> Client:
    return signed_in(viewer)


@pytest.fixture
def operator_client(operator: Any) -> Client:
    return signed_in(operator)


@pytest.fixture
def approver_client(approver: Any) -> Client:
    return signed_in(approver)


def gated(amount: int = 25_000, **kwargs: Any) -> Intent:
    """A payments.charge above the threshold: AWAITING_APPROVAL."""
    intent = submit(arguments=charge_arguments(amount), **kwargs)
    assert intent.status == Intent.Status.AWAITING_APPROVAL
    return intent


def claimed(intent: Intent) -> Claim:
    claim = intent_claim(intent_id=intent.id, worker="test-worker", lease_seconds=30)
    assert claim is not None
    return claim


def make_unknown(
    *, action: str = "payments.charge", arguments: dict[str, Any] | None = None, **kwargs: Any
) -> Intent:
    """An intent made UNKNOWN through the services: claimed, then an ambiguous answer."""
    intent = submit(action=action, arguments=arguments or charge_arguments(), **kwargs)
    claim = claimed(intent)
    assert intent_mark_unknown(claim=claim, error="timeout after the request was sent", cause="ambiguous")
    return Intent.objects.get(id=intent.id)


def unknown_with_effect(**kwargs: Any) -> tuple[Intent, str]:
    """An UNKNOWN payments.charge whose charge DID reach the sandbox provider (the answer was
    lost): the adapter is called for real, then the attempt is recorded as ambiguous.
    Returns (intent, the provider's charge id). Needs the ``sandbox`` fixture."""
    intent = submit(arguments=charge_arguments(), **kwargs)
    claim = claimed(intent)
    result: ExecutionResult = get_adapter(intent.action).execute(lookup_call(claim.intent))
    assert intent_mark_unknown(
        claim=claim, error="response lost after the charge was sent", cause="ambiguous"
    )
    return Intent.objects.get(id=intent.id), result.provider_reference


def seen(intent: Intent) -> str:
    """The ``seen_seq`` a console page loaded now would carry for ``intent`` (its last audit event)."""
    return str(last_audit_seq(intent.id))


def status_count(body: str, status: str) -> int:
    """The dashboard's count for ``status`` (its row in "Intents by state")."""
    found = re.search(rf'\?status={status}">{status}</a></td><td class="num">(\d+)<', body)
    assert found, f"no {status} row on the dashboard"
    return int(found.group(1))
