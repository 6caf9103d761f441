"""Two-way statement reconciliation against the real sandbox provider process and real workers
(issue 19, case C21): an effect nobody asked for, an intent's effect left out of the statement
and an amount the statement shows differently are exactly three findings, and running the day
again adds none."""

from __future__ import annotations

import uuid

import pytest
from django.core.management import call_command
from django.utils import timezone

from operations.models import Intent
from reconciliation.models import ProviderFinding, StatementRun
from tests.factories import charge_arguments, submit
from tests.support.workers import Cluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SOURCE = "sandbox-payments"


def test_c21_statement_run_finds_one_extra_one_missing_one_mismatch(
    cluster: Cluster, sandbox: object
) -> None:
    # given: three charges made through the ledger by a real worker
    cluster.worker("w1")
    intents = [
        submit(arguments=charge_arguments(1000 + n, reference=f"c21-{n}"), reference=f"c21-{n}")
        for n in range(3)
    ]
    ids = [i.id for i in intents]
    wait_for(
        lambda: Intent.objects.filter(id__in=ids, status=Intent.Status.SUCCEEDED).count() == 3,
        60,
        "three charges to succeed",
    )
    kept, omitted, changed = (Intent.objects.get(id=i) for i in ids)
    reference_of = {i.id: i.outcomes.get().provider_reference for i in (kept, omitted, changed)}
    client = sandbox.client
    # and: a charge made directly at the provider, outside the ledger, with a reference no intent has
    direct = client.post(
        "/v1/charges",
        json={"amount": 777, "currency": "EUR", "customer": "cus_x", "reference": "nobody-ordered-this"},
        headers={"Idempotency-Key": f"outside-{uuid.uuid4()}"},
    )
    assert direct.status_code in (200, 201), direct.text
    direct_id = direct.json()["id"]
    # and: the statement leaves one intent's effect out and shows another amount for one
    sandbox.omit_from_statement("payments", reference_of[omitted.id])
    sandbox.statement_amount("payments", reference_of[changed.id], 1)
    day = timezone.now().date().isoformat()

    # when: today's statement is reconciled
    call_command("reconcile_statement", "--adapter", SOURCE, "--date", day)

    # then: exactly one finding of each kind, and nothing else
    run = StatementRun.objects.get()
    assert run.error == ""
    assert (
        run.lines,
        run.matched,
        run.missing_at_provider,
        run.extra_at_provider,
        run.amount_mismatches,
    ) == (
        3,
        1,
        1,
        1,
        1,
    )
    findings = {f.kind: f for f in ProviderFinding.objects.all()}
    assert sorted(findings) == ["amount_mismatch", "extra_at_provider", "missing_at_provider"]
    assert ProviderFinding.objects.count() == 3
    assert findings["extra_at_provider"].provider_reference == direct_id
    assert findings["extra_at_provider"].intent_id is None
    assert findings["missing_at_provider"].intent_id == omitted.id
    assert findings["amount_mismatch"].intent_id == changed.id
    assert (findings["amount_mismatch"].amount, findings["amount_mismatch"].expected_amount) == (1, 1002)

    # when: the same day is reconciled again
    call_command("reconcile_statement", "--adapter", SOURCE, "--date", day)
    # then: a second run, and no second finding
    assert StatementRun.objects.count() == 2 and ProviderFinding.objects.count() == 3
