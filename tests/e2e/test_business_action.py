"""Case C23 against the real sandbox provider process: an agent re-plans and submits the same
business action (same reference) under a new client key while the first one is in flight,
UNKNOWN, or about to succeed or fail. The second is HELD behind the first; when the first ends,
the rule decides it (``reconciliation.held.decide_held``), and the provider's ledger has exactly
the effects the rule allows.

Provider kinds: keyed payments; email with a lagging lookup; reservations listed by reference;
a generic HTTP action on the sandbox's keyed charges endpoint. Execution runs in this process
(``execute_intent``) so every cell is deterministic; ``test_c23_sigkill_while_the_earlier_runs``
drives real worker and beat processes.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from operations.engine.protocol import execute_intent
from operations.models import Attempt, AuditEvent, Intent
from reconciliation.held import decide_held
from reconciliation.resolution import reject_held
from tests.e2e.test_unhappy_matrix import Kind, passes, unknown_intent
from tests.factories import UserFactory, charge_arguments, submit
from tests.support.workers import Cluster, requires_real_broker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

#: Nothing listens here: a request to it is refused before it is sent (RetryableError).
UNREACHABLE = "http://127.0.0.1:1"


def _charge(ref: str, changed: bool) -> dict[str, Any]:
    return charge_arguments(5990 if changed else 4990, reference=ref)


def _email(ref: str, changed: bool) -> dict[str, Any]:
    subject = "Your receipt (corrected)" if changed else "Your receipt"
    return {"to": "ann@example.test", "subject": subject, "body": "Thanks", "reference": ref}


def _reservation(ref: str, changed: bool) -> dict[str, Any]:
    return {
        "resource": "room-7",
        "start": "2026-12-24T18:00:00Z",
        "seats": 3 if changed else 2,
        "reference": ref,
    }


@dataclass(frozen=True)
class C23Kind:
    """A provider kind, its arguments for the first and the re-planned submission, and the
    field of a provider effect that tells the two apart."""

    name: str
    action: str
    product: str
    arguments: Callable[[str, bool], dict[str, Any]]
    field: str  # in arguments and in the provider's ledger entry

    def as_matrix_kind(self) -> Kind:
        return Kind(self.name, self.action, self.product, lambda ref: self.arguments(ref, False))


KINDS = {
    "payments": C23Kind("payments", "payments.charge", "payments", _charge, "amount"),
    "email": C23Kind("email", "email.send", "email", _email, "subject"),
    "reservations": C23Kind("reservations", "reservations.create", "reservations", _reservation, "seats"),
    "generic": C23Kind("generic", "acme.transfer", "payments", _charge, "amount"),
}
EARLIER = ["in_flight", "unknown", "succeeded", "failed"]
CELLS = [(k, e, v) for k in KINDS for e in EARLIER for v in ("same", "changed")]


@pytest.fixture
def c23(sandbox: Any, settings: Any) -> dict[str, Any]:
    """The generic HTTP action on the sandbox's keyed charges, a one-attempt retry budget (so an
    unreachable provider ends an intent FAILED before sending), the email lookup lagging by an
    hour, and a viewer."""
    charges = f"{sandbox.url}/v1/charges"
    settings.EFFECT_LEDGER_GENERIC_HTTP = {
        "acme.transfer": {"url": charges, "lookup_url": charges + "?idempotency_key={idempotency_key}"},
    }
    one_attempt = {"retry": {"max_attempts": 1}}
    policies = settings.EFFECT_LEDGER_POLICIES
    settings.EFFECT_LEDGER_POLICIES = {
        **policies,
        **{kind.action: {**policies.get(kind.action, {}), **one_attempt} for kind in KINDS.values()},
        "acme.transfer": {"approval": "never", **one_attempt},
    }
    sandbox.configure(email_lookup_lag_seconds=3600)
    return {"viewer": UserFactory(username="vera", groups=["viewer"])}


def effects(sandbox: Any, kind: C23Kind, ref: str) -> list[dict[str, Any]]:
    return sandbox.ledger(kind.product, reference=ref)


def provider_unreachable(settings: Any) -> None:
    settings.SANDBOX_PROVIDER_URL = UNREACHABLE
    settings.EFFECT_LEDGER_GENERIC_HTTP = {"acme.transfer": {"url": f"{UNREACHABLE}/v1/charges"}}


def assert_pages_render(viewer: Any, held: Intent) -> None:
    client = Client()
    client.force_login(viewer)
    for url in ("/", "/unknown/", "/intents/", f"/intents/{held.id}/"):
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
    assert str(held.id) in client.get(f"/intents/{held.id}/").content.decode()


def run_in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``fn`` in a thread with its own database connection; its result lands in the list."""
    out: list[Any] = []

    def target() -> None:
        try:
            out.append(fn())
        except Exception as exc:  # surfaced to the test
            out.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    return thread, out


@pytest.mark.parametrize(("kind_name", "earlier_ends", "variant"), CELLS, ids=["-".join(c) for c in CELLS])
def test_c23_second_key_for_the_same_business_action(
    sandbox: Any, c23: Any, settings: Any, kind_name: str, earlier_ends: str, variant: str
) -> None:
    kind = KINDS[kind_name]
    ref = f"c23-{kind_name}-{earlier_ends}-{variant}"
    changed = variant == "changed"
    running: threading.Thread | None = None
    result: list[Any] = []

    # given: the first intent for the business action, in the state of the cell
    if earlier_ends == "unknown":
        # the provider applied it, the answer was lost
        first, _ = unknown_intent(kind.as_matrix_kind(), ref, with_effect=True)
    else:
        first = submit(action=kind.action, arguments=kind.arguments(ref, False), reference=ref)
        if earlier_ends == "in_flight":
            # a slow provider: the first is RUNNING, its effect not yet applied
            sandbox.inject("delay_after_effect", product=kind.product, reference=ref, delay_seconds=1.5)
            running, result = run_in_thread(lambda: execute_intent(first.id))
            wait_for(lambda: Intent.objects.get(id=first.id).status == "RUNNING", 10, "the first to run")

    # when: the agent re-plans: a new client key, the same reference (same or changed arguments)
    second = submit(action=kind.action, arguments=kind.arguments(ref, changed), reference=ref)

    # then: it is held behind the first, and nothing releases it while the first is open
    assert second.status == Intent.Status.HELD and second.held_behind_id == first.id
    assert AuditEvent.objects.get(intent=second, event="submitted").data["held_behind"] == str(first.id)
    assert decide_held().released == 0
    assert execute_intent(second.id) == "duplicate"  # a stray delivery cannot run a held intent
    assert Intent.objects.get(id=second.id).status == Intent.Status.HELD
    assert len(effects(sandbox, kind, ref)) <= 1

    # when: the first ends
    if earlier_ends == "in_flight":
        assert running is not None
        running.join(30)
        assert result == ["succeeded"]
    elif earlier_ends == "succeeded":
        assert execute_intent(first.id) == "succeeded"
    elif earlier_ends == "failed":
        provider_unreachable(settings)  # refused before sending, and no attempt left
        assert execute_intent(first.id) == "failed"
    else:  # unknown: reconcile passes (lookups, duplicate checks and the held rule)
        passes(first.policy["unknown_patience"]["lookups"])
    first.refresh_from_db()
    counts = decide_held()
    second.refresh_from_db()
    assert not counts.errors

    # then: the ledger has exactly the effects the rule allows
    if earlier_ends == "failed":
        # the first left no effect: the held one is released and runs, once
        assert first.status == Intent.Status.FAILED and not effects(sandbox, kind, ref)
        assert second.status == Intent.Status.READY and counts.released == 1
        settings.SANDBOX_PROVIDER_URL = sandbox.url
        settings.EFFECT_LEDGER_GENERIC_HTTP = c23_generic(sandbox)
        assert execute_intent(second.id) == "succeeded"
        (effect,) = effects(sandbox, kind, ref)
        assert effect[kind.field] == kind.arguments(ref, changed)[kind.field]
    elif earlier_ends == "unknown" and kind_name == "email":
        # the lagging lookup cannot tell: the first stays UNKNOWN, the second keeps waiting
        assert first.status == Intent.Status.UNKNOWN
        assert second.status == Intent.Status.HELD and second.escalated_at is None
        assert len(effects(sandbox, kind, ref)) == 1
    else:
        # the first SUCCEEDED: the held one is a likely duplicate, in front of a person, not run
        assert first.status == Intent.Status.SUCCEEDED
        assert second.status == Intent.Status.HELD and second.escalated_at is not None
        event = AuditEvent.objects.get(intent=second, event="likely_duplicate")
        assert str(first.id) in event.reason
        (effect,) = effects(sandbox, kind, ref)
        assert effect[kind.field] == kind.arguments(ref, False)[kind.field]
        assert decide_held().to_a_person == 0  # escalated once
    # and the held one was attempted only where the rule let it run
    assert Attempt.objects.filter(intent=second).count() == (1 if earlier_ends == "failed" else 0)
    assert_pages_render(c23["viewer"], second)


def c23_generic(sandbox: Any) -> dict[str, Any]:
    charges = f"{sandbox.url}/v1/charges"
    return {"acme.transfer": {"url": charges, "lookup_url": charges + "?idempotency_key={idempotency_key}"}}


def test_c23_a_third_key_while_the_duplicate_waits_for_a_person_is_not_run(
    sandbox: Any, c23: Any, settings: Any
) -> None:
    # given: order-77 charged (K1); the re-plan (K2) in front of a person as a likely duplicate
    operator = UserFactory(username="olga", groups=["operator"])
    first = submit(arguments=_charge("order-77", False), reference="order-77")
    second = submit(arguments=_charge("order-77", True), reference="order-77")
    assert execute_intent(first.id) == "succeeded"
    assert decide_held().to_a_person == 1
    # and: the agent re-plans once more (K3) while the person has not decided yet
    third = submit(arguments=_charge("order-77", True), reference="order-77")
    assert third.status == Intent.Status.HELD
    # when: the person rejects K2 (the order was already charged), and the rule runs
    reject_held(intent_id=second.id, user=operator, reason="order-77 was already charged")
    decide_held()
    # then: K3 is not released on K2's "no effect": the order was charged, a person decides
    third.refresh_from_db()
    assert third.status == Intent.Status.HELD and third.escalated_at is not None
    assert str(first.id) in AuditEvent.objects.get(intent=third, event="likely_duplicate").reason
    assert execute_intent(third.id) == "duplicate"
    assert len(sandbox.ledger("payments", reference="order-77")) == 1
    assert_pages_render(c23["viewer"], third)


def test_c23_after_success_reject_rejects_the_held_one(sandbox: Any, c23: Any, settings: Any) -> None:
    # given: charges whose policy rejects a likely duplicate outright
    settings.EFFECT_LEDGER_POLICIES = {
        **settings.EFFECT_LEDGER_POLICIES,
        "payments.charge": {**settings.EFFECT_LEDGER_POLICIES["payments.charge"], "after_success": "reject"},
    }
    first = submit(arguments=_charge("order-77", False), reference="order-77")
    second = submit(arguments=_charge("order-77", True), reference="order-77")
    assert second.status == Intent.Status.HELD
    # when: the first succeeds and the rule runs
    assert execute_intent(first.id) == "succeeded"
    counts = decide_held()
    # then: rejected with the reason, one charge
    second.refresh_from_db()
    assert counts.rejected == 1 and second.status == Intent.Status.REJECTED
    assert "already done" in AuditEvent.objects.get(intent=second, event="rejected").reason
    assert len(sandbox.ledger("payments", reference="order-77")) == 1
    assert_pages_render(c23["viewer"], second)


@requires_real_broker
@pytest.mark.integration
def test_c23_sigkill_while_the_earlier_runs_the_held_one_still_waits(cluster: Cluster, sandbox: Any) -> None:
    # given: real workers and beat; the provider applies the first charge for order-77, then holds
    # the connection open (the worker waits for its answer: deadline 4 s, lease 8 s)
    cluster.set_timing(lease_seconds=8, provider_timeout_seconds=4.0)
    cluster.worker("w1")
    cluster.beat()
    ref = "order-77"
    sandbox.inject("hold_after_effect", product="payments", reference=ref, delay_seconds=30)
    first = submit(arguments=_charge(ref, False), reference=ref)
    wait_for(lambda: bool(sandbox.ledger("payments", reference=ref)), 30, "the first charge's effect")
    first.refresh_from_db()
    assert first.status == Intent.Status.RUNNING
    # when: the agent re-plans with a new key (and another amount), then the pool process dies
    second = submit(arguments=_charge(ref, True), reference=ref)
    assert second.status == Intent.Status.HELD and second.held_behind_id == first.id
    os.kill(int(first.lease_owner.rsplit(":", 1)[1]), signal.SIGKILL)
    cluster.worker("w2")
    # then: while the first is RUNNING / UNKNOWN / READY again, the held one waits, one effect
    seen: set[str] = set()

    def first_ended() -> bool:
        status = Intent.objects.get(id=first.id).status
        seen.add(status)
        assert Intent.objects.get(id=second.id).status == Intent.Status.HELD
        assert len(sandbox.ledger("payments", reference=ref)) == 1
        return status == Intent.Status.SUCCEEDED

    wait_for(first_ended, 60, "the first charge to end after the lease takeover")
    assert "RUNNING" in seen
    # and when it ended SUCCEEDED (same key, the provider replayed), the held one goes to a person
    wait_for(
        lambda: Intent.objects.get(id=second.id).escalated_at is not None, 30, "the held one to be escalated"
    )
    second.refresh_from_db()
    assert second.status == Intent.Status.HELD and not Attempt.objects.filter(intent=second).exists()
    (effect,) = sandbox.ledger("payments", reference=ref)
    assert effect["amount"] == 4990 and effect["idempotency_key"] == first.idempotency_key
    first.refresh_from_db()
    assert first.attempt_count >= 2 and Attempt.objects.filter(intent=first, result="abandoned").exists()
    assert AuditEvent.objects.filter(intent=second, event="likely_duplicate").count() == 1
