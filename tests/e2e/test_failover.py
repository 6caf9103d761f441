"""A restore seen by real worker processes (issue 22): a worker started on a database that went
back in time pauses before it runs anything, queues the recovery, and the email the forgotten
timeline sent is found, not sent again — real Celery workers, broker, sandbox process and
PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from operations.audit.signing import audit_checkpoint_create
from operations.models import ExecutionControl, Intent, RecoveryRun
from tests.factories import charge_arguments, submit
from tests.operations.test_failover import EMAIL, effects, forgotten_send
from tests.operations.test_restore_keys import lose
from tests.support.workers import Cluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_i22_a_worker_started_on_a_restored_database_recovers_before_it_sends(
    cluster: Cluster, sandbox: Any, settings: Any, tmp_path: Path
) -> None:
    # given: one key and one checkpoint file for this process and the workers
    key, checkpoints = tmp_path / "audit-signing-key.pem", tmp_path / "audit-checkpoints.jsonl"
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "AUDIT_SIGNING_KEY_FILE": str(key),
        "AUDIT_SIGNING_KEY_CREATE": True,
        "AUDIT_PUBLIC_KEY_FILE": "",
        "AUDIT_CHECKPOINT_FILE": str(checkpoints),
    }
    cluster.env["EFFECT_LEDGER_AUDIT_SIGNING_KEY_FILE"] = str(key)
    cluster.env["EFFECT_LEDGER_AUDIT_CHECKPOINT_FILE"] = str(checkpoints)
    # an email READY at checkpoint #1 that the forgotten timeline sent; a charge that only #2 saw
    email = submit(action="email.send", arguments=EMAIL, reference="order-w1")
    audit_checkpoint_create()
    forgotten_send(email)
    lost = submit(arguments=charge_arguments(), reference="order-w2")
    audit_checkpoint_create()
    # when: the database goes back to #1 (the charge, checkpoint #2 and the email's message gone)
    lose(lost)
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        cursor.execute("DELETE FROM operations_auditcheckpoint WHERE number > 1")
        cursor.execute("SET session_replication_role = origin")
    cluster.worker("w1", concurrency=2)
    # then: the worker's check recovered (no beat runs here), and the email was found, not resent
    wait_for(lambda: RecoveryRun.objects.filter(finished_at__isnull=False).exists(), 30, "the recovery")
    run = RecoveryRun.objects.get()
    assert run.trigger == "detector" and run.actor.startswith("detector:") and run.checkpoint_number == 3
    wait_for(
        lambda: Intent.objects.filter(id=email.id, status=Intent.Status.SUCCEEDED).exists(), 30, "the email"
    )
    assert len(effects(sandbox, "email.send", "order-w1")) == 1
    assert email.attempts.get().result == "skipped"
    assert ExecutionControl.objects.get(id=1).paused_at is None
