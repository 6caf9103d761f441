"""Issue 10's matrix: every provider kind x every ending of an uncertain outcome, against the
real sandbox provider process. Each cell asserts the end state, the provider's ledger, and that
the console pages an operator opens for that intent render (200).

Provider kinds: payments (keys, authoritative lookup); email (no keys, lagging lookup);
reservations (no keys, list by reference); a generic HTTP action with ``lookup_url`` and one
without (both pointed at the sandbox's keyed charges endpoint).

The execution and reconciliation steps run in this process (``execute_intent``,
``reconcile_pass``) so every cell is deterministic; ``test_unknown_endings_through_real_workers``
drives one cell per kind through real worker and beat processes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.db.models.functions import Now
from django.test import Client

from operations import services
from operations.adapters.registry import get_adapter
from operations.engine.calls import lookup_call
from operations.engine.protocol import execute_intent
from operations.exceptions import ResolutionRefused
from operations.models import Intent
from operations.services import intent_claim, intent_mark_unknown
from reconciliation.models import DuplicateFinding
from reconciliation.resolution import (
    resolve_absent,
    resolve_compensate,
    resolve_confirmed,
)
from reconciliation.services import reconcile_pass
from tests.factories import UserFactory, charge_arguments, settled, submit
from tests.support.workers import requires_real_broker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@dataclass(frozen=True)
class Kind:
    """One provider kind of the matrix."""

    name: str
    action: str
    product: str  # the sandbox ledger's product where its effects land
    arguments: Callable[[str], dict[str, Any]]


def _email(ref: str) -> dict[str, Any]:
    return {"to": "ann@example.test", "subject": "Receipt", "body": "Thanks", "reference": ref}


def _reservation(ref: str) -> dict[str, Any]:
    return {"resource": "room-7", "start": "2026-12-24T18:00:00Z", "seats": 2, "reference": ref}


def _charge(ref: str) -> dict[str, Any]:
    return charge_arguments(reference=ref)


KINDS = {
    "payments": Kind("payments", "payments.charge", "payments", _charge),
    "email": Kind("email", "email.send", "email", _email),
    "reservations": Kind("reservations", "reservations.create", "reservations", _reservation),
    "generic_lookup": Kind("generic_lookup", "acme.transfer", "payments", _charge),
    "generic_blind": Kind("generic_blind", "acme.notify", "payments", _charge),
}

#: (kind, ending) cells that exist: an ending a kind cannot reach is not a cell.
CELLS = [
    ("payments", "found"),
    ("payments", "absent"),
    ("payments", "confirmed"),
    ("payments", "operator_absent"),
    ("payments", "compensate"),
    ("payments", "compensation_fails"),
    ("email", "found"),
    ("email", "escalated"),
    ("email", "duplicate_late"),
    ("email", "confirmed"),
    ("email", "operator_absent"),
    ("email", "compensate"),
    ("reservations", "found"),
    ("reservations", "escalated"),
    ("reservations", "duplicate_late"),
    ("reservations", "confirmed"),
    ("reservations", "operator_absent"),
    ("reservations", "compensate"),
    ("reservations", "compensation_fails"),
    ("generic_lookup", "found"),
    ("generic_lookup", "absent"),
    ("generic_lookup", "confirmed"),
    ("generic_blind", "escalated"),
    ("generic_blind", "confirmed"),
    ("generic_blind", "operator_absent"),
    ("generic_blind", "compensate"),
]


@pytest.fixture
def matrix(sandbox: Any, settings: Any, tmp_path: Path) -> Any:
    """Generic HTTP actions on the sandbox, short windows, and the people who decide."""
    charges = f"{sandbox.url}/v1/charges"
    settings.EFFECT_LEDGER_GENERIC_HTTP = {
        "acme.transfer": {"url": charges, "lookup_url": charges + "?idempotency_key={idempotency_key}"},
        "acme.notify": {"url": charges},
    }
    settings.SANDBOX_EMAIL_CONSISTENCY_WINDOW_SECONDS = 30
    settings.EFFECT_LEDGER_POLICIES = {
        **settings.EFFECT_LEDGER_POLICIES,
        "acme.transfer": {"approval": "never"},
        "acme.notify": {"approval": "never"},
    }
    (tmp_path / "generic.json").write_text(json.dumps(settings.EFFECT_LEDGER_GENERIC_HTTP))
    return {
        "operator": UserFactory(username="olga", groups=["operator"]),
        "approver": UserFactory(username="alice", groups=["approver"]),
        "viewer": UserFactory(username="vera", groups=["viewer"]),
        "generic_file": tmp_path / "generic.json",
    }


def unknown_intent(kind: Kind, ref: str, *, with_effect: bool) -> tuple[Intent, str]:
    """An intent whose attempt ended ambiguous; ``with_effect``: the provider did apply it.
    Returns (intent, the provider's reference or "")."""
    intent = submit(action=kind.action, arguments=kind.arguments(ref), reference=ref)
    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None
    reference = ""
    if with_effect:
        reference = get_adapter(kind.action).execute(lookup_call(claim.intent)).provider_reference
    assert intent_mark_unknown(claim=claim, error="the answer was lost", cause="ambiguous")
    return Intent.objects.get(id=intent.id), reference


def passes(n: int = 1) -> None:
    """Run ``n`` reconcile passes with every lookup and duplicate check due."""
    for _ in range(n):
        Intent.objects.filter(status="UNKNOWN").update(next_lookup_at=Now())
        Intent.objects.filter(next_duplicate_check_at__isnull=False).update(next_duplicate_check_at=Now())
        reconcile_pass()


def effects(sandbox: Any, kind: Kind, ref: str) -> list[dict[str, Any]]:
    return sandbox.ledger(kind.product, reference=ref)


def assert_pages_render(viewer: Any, intent: Intent) -> None:
    client = Client()
    client.force_login(viewer)
    for url in ("/", "/unknown/", f"/unknown/{intent.id}/", "/intents/", f"/intents/{intent.id}/"):
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
    assert str(intent.id) in client.get(f"/intents/{intent.id}/").content.decode()


@pytest.mark.parametrize(("kind_name", "ending"), CELLS, ids=[f"{k}-{e}" for k, e in CELLS])
def test_every_kind_every_ending(sandbox: Any, matrix: Any, kind_name: str, ending: str) -> None:
    kind = KINDS[kind_name]
    ref = f"{kind_name}-{ending}"
    operator, approver = matrix["operator"], matrix["approver"]
    keyed = get_adapter(kind.action).capabilities_for(kind.action).idempotency_keys

    if ending == "found":
        # given: the provider applied it, the answer was lost
        intent, reference = unknown_intent(kind, ref, with_effect=True)
        passes()
        intent.refresh_from_db()
        assert intent.status == "SUCCEEDED"
        assert intent.outcomes.get().provider_reference == reference
        assert len(effects(sandbox, kind, ref)) == 1

    elif ending == "absent":
        # given: the request never reached the provider; its lookup is authoritative
        intent, _ = unknown_intent(kind, ref, with_effect=False)
        passes()
        assert Intent.objects.get(id=intent.id).status == "READY"
        assert execute_intent(intent.id) == "succeeded"
        intent.refresh_from_db()
        assert intent.status == "SUCCEEDED" and len(effects(sandbox, kind, ref)) == 1

    elif ending == "escalated":
        # given: the lookup can never tell (lagging, empty list, or none at all)
        if kind_name == "email":
            sandbox.configure(email_lookup_lag_seconds=3600)
        intent, _ = unknown_intent(kind, ref, with_effect=kind_name == "email")
        passes(intent.policy["unknown_patience"]["lookups"])
        intent.refresh_from_db()
        assert intent.status == "UNKNOWN" and intent.escalated_at is not None
        assert len(effects(sandbox, kind, ref)) == (1 if kind_name == "email" else 0)

    elif ending == "duplicate_late":
        # given: a first effect the duplicate check cannot see at first (email: the lookup
        # lags; reservations: the first request lands after the retry succeeded), and an
        # operator who accepted the duplicate risk
        if kind_name == "email":
            sandbox.configure(email_lookup_lag_seconds=3600)
        intent, _ = unknown_intent(kind, ref, with_effect=kind_name == "email")
        settled(
            resolve_absent(intent_id=intent.id, user=operator, reason="not seen", accept_duplicate_risk=True)
        )
        assert execute_intent(intent.id) == "succeeded"
        passes()
        assert not DuplicateFinding.objects.filter(intent=intent).exists()
        # when: the read path catches up / the late request lands
        if kind_name == "email":
            sandbox.configure(email_lookup_lag_seconds=0)
        else:
            sandbox.client.post("/v1/reservations", json=kind.arguments(ref)).raise_for_status()
        passes()
        # then: email (no compensation) is flagged; the reservation is cancelled by its own intent
        (finding,) = DuplicateFinding.objects.filter(intent=intent)
        assert len(effects(sandbox, kind, ref)) == 2
        if kind_name == "email":
            assert finding.state == "open"
        else:
            assert finding.state == "compensating" and finding.compensation is not None
            assert execute_intent(finding.compensation.id) == "succeeded"
            passes()
            assert DuplicateFinding.objects.get(id=finding.id).state == "resolved"
            assert [e["status"] for e in effects(sandbox, kind, ref)].count("confirmed") == 1
        intent.refresh_from_db()
        assert intent.status == "SUCCEEDED"

    elif ending == "confirmed":
        intent, reference = unknown_intent(kind, ref, with_effect=True)
        resolved = resolve_confirmed(
            intent_id=intent.id,
            user=operator,
            provider_reference=reference,
            reason="seen in the provider's dashboard",
            accept_unverified=True,
        )
        assert resolved.status == "SUCCEEDED"
        verified = resolved.outcomes.get().detail["verified"]
        assert verified is (kind_name != "generic_blind")  # the others find it by lookup
        assert len(effects(sandbox, kind, ref)) == 1
        intent = resolved

    elif ending == "operator_absent":
        intent, _ = unknown_intent(kind, ref, with_effect=False)
        resolve_absent(
            intent_id=intent.id,
            user=operator,
            reason="provider support: never received",
            accept_duplicate_risk=not keyed,
        )
        settled(intent)
        assert execute_intent(intent.id) == "succeeded"
        intent.refresh_from_db()
        assert intent.status == "SUCCEEDED" and len(effects(sandbox, kind, ref)) == 1

    elif ending == "compensate":
        intent, reference = unknown_intent(kind, ref, with_effect=True)
        if kind_name in {"email", "generic_blind"}:
            with pytest.raises(ResolutionRefused, match="no compensation"):
                resolve_compensate(
                    intent_id=intent.id, user=operator, reason="undo", provider_reference=reference
                )
            assert Intent.objects.get(id=intent.id).status == "UNKNOWN"
        else:
            resolve_compensate(
                intent_id=intent.id, user=operator, reason="undo", provider_reference=reference
            )
            (compensation,) = Intent.objects.filter(compensates=intent)
            if compensation.status == "AWAITING_APPROVAL":
                services.intent_approve(
                    intent_id=compensation.id, user=approver, request_hash=compensation.request_hash
                )
            assert execute_intent(compensation.id) == "succeeded"
            assert Intent.objects.get(id=intent.id).status == "COMPENSATED"

    elif ending == "compensation_fails":
        intent, reference = unknown_intent(kind, ref, with_effect=True)
        resolve_compensate(intent_id=intent.id, user=operator, reason="undo", provider_reference=reference)
        (compensation,) = Intent.objects.filter(compensates=intent)
        if compensation.status == "AWAITING_APPROVAL":
            services.intent_reject(
                intent_id=compensation.id, user=approver, request_hash=compensation.request_hash, reason="no"
            )
        else:
            sandbox.withdraw(kind.product, reference)
            assert execute_intent(compensation.id) == "failed"
        passes()
        intent.refresh_from_db()
        assert intent.status == "COMPENSATING" and intent.escalated_at is not None
        assert len(effects(sandbox, kind, ref)) == 1

    else:  # pragma: no cover - a cell without an ending is a typo in CELLS
        pytest.fail(f"unknown ending {ending}")

    assert_pages_render(matrix["viewer"], Intent.objects.get(id=intent.id))


@requires_real_broker
@pytest.mark.integration
def test_unknown_endings_through_real_workers(sandbox: Any, matrix: Any, cluster: Any) -> None:
    """One ambiguous outcome per kind (the provider applies the effect, then drops the
    connection), executed by real worker processes and reconciled by real beat: keyed kinds
    retry with the same key, the others are found by the reconciler; one effect each."""
    # given: workers that know the generic actions, and a crash after every first effect
    cluster.env["EFFECT_LEDGER_GENERIC_HTTP_FILE"] = str(matrix["generic_file"])
    cluster.worker("w1", concurrency=2)
    cluster.beat()
    names = ["payments", "email", "reservations", "generic_lookup"]
    intents = {}
    for name in names:
        kind, ref = KINDS[name], f"workers-{name}"
        sandbox.inject("crash_after_effect", product=kind.product, reference=ref)
        intents[name] = submit(action=kind.action, arguments=kind.arguments(ref), reference=ref)
    # when
    wait_for(
        lambda: (
            Intent.objects.filter(id__in=[i.id for i in intents.values()], status="SUCCEEDED").count()
            == len(names)
        ),
        60,
        "every kind to end SUCCEEDED",
    )
    # then: one effect each, and the pages render
    for name, intent in intents.items():
        assert len(effects(sandbox, KINDS[name], f"workers-{name}")) == 1, name
        assert_pages_render(matrix["viewer"], intent)
