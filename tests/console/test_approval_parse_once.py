"""Issue 34 item 4: one approval decision reads its intent's policy snapshot once.

Following ``console/views/approvals.py`` ``_decide`` through the code, the snapshot was parsed
by ``Policy.from_snapshot`` four times for one request and ``approval_validity`` entered four
times. The view parses it once and every step of the decision is handed that value.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

import console.views.approvals  # noqa: F401  (loaded before any counting starts)
import operations.services.approvals  # noqa: F401
from operations.models import Intent
from operations.policies import approval_validity as validity_module
from operations.policies.rules import Policy
from tests.console.conftest import gated

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Counts ``Policy.from_snapshot`` and ``approval_validity`` wherever they are called from:
    the function is replaced in every loaded module that imported it by name (the modules of
    the decision are imported above, so none binds the counting copy at import time)."""
    counted: Counter[str] = Counter()
    parse = Policy.from_snapshot.__func__  # type: ignore[attr-defined]

    def counting_parse(cls: type[Policy], snapshot: Any) -> Policy:
        counted["from_snapshot"] += 1
        return parse(cls, snapshot)

    monkeypatch.setattr(Policy, "from_snapshot", classmethod(counting_parse))
    original = validity_module.approval_validity

    def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
        def counting(*args: Any, **kwargs: Any) -> Any:
            counted["approval_validity"] += 1
            return function(*args, **kwargs)

        return counting

    counting_validity = wrap(original)
    for module in list(sys.modules.values()):
        if module is not validity_module and getattr(module, "approval_validity", None) is original:
            monkeypatch.setattr(module, "approval_validity", counting_validity)
    yield counted


@pytest.mark.parametrize("htmx", [False, True], ids=["form", "htmx"])
def test_i34_4_an_approval_parses_the_policy_snapshot_once(
    approver_client: Client, calls: Counter[str], htmx: bool
) -> None:
    intent = gated(25_000)
    calls.clear()
    response = approver_client.post(
        reverse("approval-approve", args=[intent.id]),
        {"request_hash": intent.request_hash, "reason": "checked the invoice"},
        **(HTMX if htmx else {}),
    )
    assert response.status_code in (200, 302)
    intent.refresh_from_db()
    assert intent.status == Intent.Status.READY
    assert calls["from_snapshot"] == 1
    # The decider may decide (under the lock), the approvals on record let it run, and the page
    # that answers says why this approver has nothing left to decide.
    assert calls["approval_validity"] == (3 if htmx else 2)


def test_i34_4_a_rejection_parses_the_policy_snapshot_once(
    approver_client: Client, calls: Counter[str]
) -> None:
    intent = gated(25_000)
    calls.clear()
    response = approver_client.post(
        reverse("approval-reject", args=[intent.id]),
        {"request_hash": intent.request_hash, "reason": "not this customer"},
        **HTMX,
    )
    assert response.status_code == 200
    intent.refresh_from_db()
    assert intent.status == Intent.Status.REJECTED
    assert calls["from_snapshot"] == 1


def test_i34_4_a_refused_approval_parses_the_policy_snapshot_once(
    approver_client: Client, calls: Counter[str]
) -> None:
    intent = gated(25_000)
    calls.clear()
    response = approver_client.post(
        reverse("approval-approve", args=[intent.id]),
        {"request_hash": "0" * 64, "reason": "checked the invoice"},
        **HTMX,
    )
    assert response.status_code == 403 and "review it again" in response.content.decode()
    intent.refresh_from_db()
    assert intent.status == Intent.Status.AWAITING_APPROVAL
    assert calls["from_snapshot"] == 1
