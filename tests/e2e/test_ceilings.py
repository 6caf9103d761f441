"""Issue 18, item 1 and case C19 with real worker processes, the real broker, the real sandbox
provider and PostgreSQL: four executions at once against a provider slow enough that they
overlap never take the provider past a ceiling, and a worker SIGKILLed after reserving neither
leaks its reservation nor lets it be spent twice."""

from __future__ import annotations

import os
import signal
from collections import Counter
from typing import Any

import pytest

from operations.models import Intent, Reservation, SpendWindow
from tests.factories import charge_arguments, submit
from tests.support.workers import Cluster, requires_real_broker, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SETTLED = {"SUCCEEDED", "AWAITING_APPROVAL"}


def c19_policy(settings: Any) -> None:
    """The case's ceilings: 10,000 EUR and 3 charges a day, no approval."""
    settings.EFFECT_LEDGER_POLICIES = {
        **settings.EFFECT_LEDGER_POLICIES,
        "payments.charge": {
            "approval": "never",
            "ceilings": {"spend_per_day_minor": {"EUR": 10_000}, "effects_per_day": 3},
        },
    }


def charges(count: int, prefix: str) -> list[Intent]:
    return [
        submit(arguments=charge_arguments(3_000, reference=f"{prefix}-{n}"), reference=f"{prefix}-{n}")
        for n in range(count)
    ]


def settled(ids: list[Any]) -> bool:
    return not Intent.objects.filter(id__in=ids).exclude(status__in=SETTLED).exists()


def assert_within_the_ceiling(sandbox: Any, ids: list[Any]) -> None:
    effects = sandbox.ledger("payments")
    assert len(effects) == 3 and sum(e["amount"] for e in effects) == 9_000, effects
    assert max(Counter(e["idempotency_key"] for e in effects).values()) == 1
    statuses = Counter(Intent.objects.filter(id__in=ids).values_list("status", flat=True))
    assert statuses == {"SUCCEEDED": 3, "AWAITING_APPROVAL": 5}
    window = SpendWindow.objects.get(tenant="acme", action="payments.charge", currency="EUR")
    effects_row = SpendWindow.objects.get(tenant="acme", action="payments.charge", currency="")
    assert (window.spent_minor, effects_row.effects) == (9_000, 3)
    # every succeeded charge holds exactly one open share of each window, nobody else holds any
    open_shares = Counter(
        Reservation.objects.filter(released_at__isnull=True).values_list("intent__status", flat=True)
    )
    assert open_shares == {"SUCCEEDED": 6}


def test_c19_four_executions_at_once_never_pass_the_ceiling(
    cluster: Cluster, sandbox: Any, settings: Any
) -> None:
    # given: two workers with two processes each, a provider that takes 1 s per charge
    c19_policy(settings)
    sandbox.inject("delay_after_effect", product="payments", times=8, delay_seconds=1.0)
    cluster.worker("w1", concurrency=2)
    cluster.worker("w2", concurrency=2)
    cluster.beat()
    # when: eight charges of 3,000 EUR at once
    ids = [i.id for i in charges(8, "c19")]
    wait_for(lambda: settled(ids), 90, "the eight charges to succeed or wait for an approver")
    # then: the provider's ledger never passed the ceiling; the rest wait for a person
    assert_within_the_ceiling(sandbox, ids)


@requires_real_broker
def test_c19_a_worker_killed_after_reserving_neither_leaks_nor_spends_twice(
    cluster: Cluster, sandbox: Any, settings: Any
) -> None:
    # given: the provider applies the first charge, then holds the connection open; its
    # worker (deadline 4 s, lease 8 s) is SIGKILLed while it holds the reservation
    c19_policy(settings)
    cluster.set_timing(lease_seconds=8, provider_timeout_seconds=4.0)
    sandbox.inject("hold_after_effect", product="payments", reference="kill-0", delay_seconds=30)
    cluster.worker("w1", concurrency=2)
    cluster.worker("w2", concurrency=2)
    cluster.beat()
    victim = charges(1, "kill")[0]
    wait_for(lambda: bool(sandbox.ledger("payments", reference="kill-0")), 30, "the victim's effect")
    victim.refresh_from_db()
    assert victim.status == "RUNNING"
    os.kill(int(victim.lease_owner.rsplit(":", 1)[1]), signal.SIGKILL)
    # when: seven more charges while the victim's lease runs out and it is taken over
    others = charges(7, "after")
    ids = [victim.id, *[i.id for i in others]]
    wait_for(lambda: settled(ids), 120, "every charge to succeed or wait after the kill")
    # then: the victim kept its one reservation through the takeover (its effect exists, the
    # provider replayed it under the same key) and the window still ends at the ceiling
    victim.refresh_from_db()
    assert victim.status == "SUCCEEDED" and victim.attempt_count >= 2
    assert Reservation.objects.filter(intent=victim, released_at__isnull=True).count() == 2
    assert_within_the_ceiling(sandbox, ids)
