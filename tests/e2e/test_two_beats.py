"""Case C27: two beats and two worker groups against one database (issue 35, "Runs where
production runs"). Each "host" is a beat and a worker group with its own checkpoint file and
mail folder; the mixed load (charges, some needing approval, emails, reservations, crashes after
the effect, a pool child killed) runs for ``EFFECT_LEDGER_C27_SECONDS`` (default 60 s; the case
asks for five minutes: ``EFFECT_LEDGER_C27_SECONDS=300``), with every period a few seconds so
each job runs many periods. The workers and beats reach PostgreSQL through a real PgBouncer in
transaction mode, as in production (every claim and heartbeat holds no session state).
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from operations.audit.checkpoint_sync import checkpoint_file_series
from operations.audit.checkpoints import SignedCheckpoint
from operations.audit.keys import public_key_load, signing_key_create
from operations.audit.verification import checkpoint_verify
from operations.models import AuditCheckpoint, Intent, NotificationDelivery, PeriodicClaim
from operations.services.approvals import intent_approve
from reconciliation.models import StatementRun
from reconciliation.statement_sources import api_sources
from tests.factories import UserFactory, charge_arguments, submit
from tests.support.pgbouncer import PgBouncer
from tests.support.workers import Cluster, requires_real_broker, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SECONDS = float(os.environ.get("EFFECT_LEDGER_C27_SECONDS", "60"))
PERIODS = {
    "EFFECT_LEDGER_AUDIT_CHECKPOINT_PERIOD_SECONDS": "2",
    "EFFECT_LEDGER_STATUS_ROLLUP_PERIOD_SECONDS": "2",
    "EFFECT_LEDGER_NOTIFY_PERIOD_SECONDS": "1",
    "EFFECT_LEDGER_NOTIFY_INTERVAL_SECONDS": "1",
    "EFFECT_LEDGER_WEBHOOK_PERIOD_SECONDS": "1",
    "EFFECT_LEDGER_STATEMENT_PERIOD_SECONDS": "3",
    "EFFECT_LEDGER_RESTORE_CHECK_PERIOD_SECONDS": "3",
    "EFFECT_LEDGER_BEAT_HEARTBEAT_SECONDS": "1",
    "EFFECT_LEDGER_HEALTH_BEAT_WINDOW_SECONDS": "5",
    "EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend",
}
TERMINAL = {"SUCCEEDED", "FAILED", "COMPENSATED", "REJECTED", "EXPIRED", "CANCELLED"}


def load(cluster: Cluster, sandbox: Any, approvers: list[Any], seconds: float) -> list[Intent]:
    """Submit a mixed load for ``seconds``; approve what needs it a little later; inject a crash
    after the effect into every seventh charge; SIGKILL one pool child of host A halfway."""
    intents: list[Intent] = []
    waiting: list[tuple[float, Intent]] = []
    started, n, killed = time.monotonic(), 0, False
    while time.monotonic() - started < seconds:
        reference = f"c27-{n:04d}"
        kind = n % 5
        if kind in (0, 1):
            if n % 7 == 0:
                sandbox.inject("crash_after_effect", product="payments", reference=reference)
            intent = submit(arguments=charge_arguments(100 + n, reference=reference), reference=reference)
        elif kind == 2:
            intent = submit(arguments=charge_arguments(20_000 + n, reference=reference), reference=reference)
            waiting.append((time.monotonic(), intent))
        elif kind == 3:
            arguments = {"to": f"user{n}@example.test", "subject": "Receipt", "body": "Thanks"}
            intent = submit(action="email.send", arguments=arguments, reference=reference)
        else:
            arguments = {
                "resource": f"room-{n}",
                "start": "2026-12-24T18:00:00Z",
                "seats": 2,
                "reference": reference,
            }
            intent = submit(action="reservations.create", arguments=arguments, reference=reference)
        intents.append(intent)
        n += 1
        for asked, pending in [w for w in waiting if time.monotonic() - w[0] > 5]:
            intent_approve(intent_id=pending.id, user=approvers[0], request_hash=pending.request_hash)
            waiting.remove((asked, pending))
        if not killed and time.monotonic() - started > seconds / 2:
            children = psutil.Process(cluster.processes[-4].popen.pid).children()
            if children:
                os.kill(children[0].pid, signal.SIGKILL)
                killed = True
        time.sleep(0.25)
    for _, pending in waiting:
        intent_approve(intent_id=pending.id, user=approvers[0], request_hash=pending.request_hash)
    return intents


def mail_text(folder: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in folder.glob("*") if p.is_file())


@requires_real_broker
def test_c27_two_beats_two_worker_groups_each_periodic_effect_once(
    cluster: Cluster, sandbox: Any, settings: Any, tmp_path: Path, client: Client, pgbouncer: PgBouncer
) -> None:
    # given: one signing key; two hosts, each a beat and a worker group with its own
    # checkpoint file and mail folder; approvers who get notices
    key = tmp_path / "audit-signing-key.pem"
    signing_key_create(key)
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "AUDIT_SIGNING_KEY_FILE": str(key),
        "AUDIT_PUBLIC_KEY_FILE": "",
    }
    cluster.env.update(
        PERIODS, EFFECT_LEDGER_AUDIT_SIGNING_KEY_FILE=str(key), DATABASE_POOL_MODE="transaction"
    )
    cluster.use_database_url(pgbouncer.url(str(connection.settings_dict["NAME"])))
    hosts = {}
    for name in ("a", "b"):
        (tmp_path / f"mail-{name}").mkdir()
        hosts[name] = {
            "EFFECT_LEDGER_AUDIT_CHECKPOINT_FILE": str(tmp_path / f"host-{name}.jsonl"),
            "EMAIL_FILE_PATH": str(tmp_path / f"mail-{name}"),
        }
    approvers = [UserFactory(username=f"approver{n}", groups=["approver"]) for n in range(2)]
    cluster.start_worker("worker-a", concurrency=2, env=hosts["a"])
    cluster.start_worker("worker-b", concurrency=2, env=hosts["b"])
    cluster.start_beat(name="beat-a", env=hosts["a"])
    cluster.start_beat(name="beat-b", env=hosts["b"])
    started = time.monotonic()

    # when: the mixed load runs, both beats scheduling every job
    intents = load(cluster, sandbox, approvers, SECONDS)
    ids = [i.id for i in intents]
    try:
        wait_for(
            lambda: not Intent.objects.filter(id__in=ids).exclude(status__in=TERMINAL).exists(),
            180,
            "every intent to end",
            interval=1,
        )
    except Exception:
        stuck = Intent.objects.filter(id__in=ids).exclude(status__in=TERMINAL)
        pytest.fail(f"not ended: {list(stuck.values_list('reference', 'status', 'action'))[:20]}")
    wait_for(
        lambda: not NotificationDelivery.objects.filter(status=NotificationDelivery.Status.PENDING).exists(),
        60,
        "every notice to be sent",
        interval=1,
    )
    newest = lambda: AuditCheckpoint.objects.count()  # noqa: E731
    files = [Path(h["EFFECT_LEDGER_AUDIT_CHECKPOINT_FILE"]) for h in hosts.values()]

    def files_complete() -> bool:
        count = newest()
        return all(f.exists() and checkpoint_file_series(f)[-1:] == [count] for f in files)

    wait_for(files_complete, 90, "both hosts' checkpoint files to hold the whole series", interval=1)
    elapsed = time.monotonic() - started

    # then: one provider effect per intent, every intent ended with its effect
    statuses = Counter(Intent.objects.filter(id__in=ids).values_list("status", flat=True))
    assert statuses == {"SUCCEEDED": len(ids)}, statuses
    per_action = Counter(i.action for i in intents)
    for product, action in (
        ("payments", "payments.charge"),
        ("email", "email.send"),
        ("reservations", "reservations.create"),
    ):
        effects = sandbox.ledger(product)
        assert len(effects) == per_action[action], (
            f"{product}: {len(effects)} effects for {per_action[action]} intents"
        )
        keys = Counter(e["idempotency_key"] for e in effects if e.get("idempotency_key"))
        assert not keys or max(keys.values()) == 1, f"{product}: a key with two effects"
    # and: checkpoints 1..n, each following the one before; each host's file holds the series
    # and verifies
    rows = list(AuditCheckpoint.objects.order_by("number"))
    assert [r.number for r in rows] == list(range(1, len(rows) + 1)) and len(rows) >= 5
    for before, after in zip(rows, rows[1:], strict=False):
        assert after.prev_hash == SignedCheckpoint.from_row(before).statement_hash()
    for path in files:
        assert checkpoint_file_series(path) == list(range(1, len(rows) + 1)), path
        report = checkpoint_verify(public_key=public_key_load(), checkpoint_file=path)
        assert report.ok, report
    # and: one scheduled statement run per source and day, though the job ran many periods
    for source in api_sources():
        runs = StatementRun.objects.filter(source=source, scheduled=True, error="")
        assert runs.count() == 1, (source, list(runs.values("statement_date", "actor")))
    # and: each periodic job claimed once per period (the unique rule), over many periods
    claims = Counter(PeriodicClaim.objects.values_list("job", flat=True))
    assert claims["reconciliation.reconcile_statements"] >= elapsed / 3 / 3, claims
    assert claims["operations.audit_checkpoint"] >= elapsed / 2 / 3, claims
    # and: each notice went to each recipient once, in one host's mail or the other's
    text = mail_text(tmp_path / "mail-a") + mail_text(tmp_path / "mail-b")
    approval = [i for i in intents if i.action == "payments.charge" and i.arguments["amount"] >= 20_000]
    total = 0
    for intent in approval:
        sent = NotificationDelivery.objects.filter(
            notification__intent_id=intent.id, status=NotificationDelivery.Status.SENT
        ).count()
        assert text.count(f'Reference: "{intent.reference}"\n') == sent, intent.reference
        total += sent
    # (a notice whose intent was approved before it was fanned out is dropped, not sent)
    assert total >= len(approval) * len(approvers) / 2, (total, len(approval))
    # and: the health page shows both beats, red
    client.force_login(UserFactory(username="root", groups=["admin"]))
    body = client.get(reverse("health")).content.decode()
    assert "2 beats running" in body, body[:2000]
    for beat in cluster.processes[-2:]:
        assert f"pid {beat.popen.pid}" in body
