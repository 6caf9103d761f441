"""Two beats and two worker groups (issue 35, case C27), the parts a unit test can prove: a
periodic job's run is claimed once per period, checkpoints never fork or skip and every host's
file holds the whole series, one scheduled statement run per source and day, and a second beat
is shown on the health page.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from django.core import mail
from django.db import IntegrityError, connection, transaction
from django.test import Client
from django.urls import reverse

from console.lab.cluster import database_url
from operations import tasks
from operations.audit.checkpoint_sync import checkpoint_file_series, checkpoint_file_sync
from operations.audit.checkpoints import SignedCheckpoint
from operations.audit.keys import public_key_load, signing_key_create
from operations.audit.signing import audit_checkpoint_create
from operations.audit.verification import checkpoint_verify
from operations.models import AuditCheckpoint, NotificationDelivery, PeriodicClaim
from operations.restore.check import restore_detection
from operations.selectors.beats import beats_seen, beats_signal
from operations.selectors.health_levels import GREEN, RED
from operations.services.beats import beat_heartbeat_record
from operations.services.periodic_claims import periodic_claim
from reconciliation.models import StatementRun
from reconciliation.statements import run as statement_run
from tests.factories import UserFactory, charge_arguments, submit

BASE_DIR = Path(__file__).resolve().parents[2]
SOURCE = "sandbox-payments"


def concurrently(count: int, work: Any) -> list[Any]:
    """Run ``work()`` in ``count`` threads released together; their results (each thread its
    own database connection, closed at the end)."""
    barrier, results, errors = threading.Barrier(count), [None] * count, []

    def body(n: int) -> None:
        try:
            barrier.wait()
            results[n] = work()
        except Exception as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=body, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    return results


@pytest.mark.django_db(transaction=True)
def test_i35_periodic_claim_one_winner_per_period_among_concurrent_callers() -> None:
    # when: eight callers (two beats' runs, and more) claim the same job's period at once
    won = concurrently(
        8, lambda: periodic_claim(job="operations.status_rollup", period_seconds=3600, claimed_by="t")
    )

    # then: one of them works the period, and the claim is one row
    assert won.count(True) == 1
    assert PeriodicClaim.objects.filter(job="operations.status_rollup").count() == 1
    # and: another job's period is its own
    assert periodic_claim(job="reconciliation.reconcile", period_seconds=3600, claimed_by="t") is True


@pytest.mark.django_db
@pytest.mark.parametrize("job, period", [("", 5.0), ("x" * 101, 5.0), ("job", 0), ("job", float("nan"))])
def test_i35_periodic_claim_refuses_bad_input(job: str, period: float) -> None:
    with pytest.raises(ValueError, match="periodic claim"):
        periodic_claim(job=job, period_seconds=period, claimed_by="t")


@pytest.mark.django_db
def test_i35_beat_run_of_a_job_works_once_per_period() -> None:
    # given: the beat's run of the status rollup (claim_period = its period) ran this period
    first = tasks.status_rollup(claim_period=3600)

    # when: a second beat's run of the same period arrives
    second = tasks.status_rollup(claim_period=3600)

    # then: it does nothing, and a run without a claim (a command, a kick) still works
    assert first != {} and second == {}
    assert tasks.status_rollup() != {}


def checkpointer(env: dict[str, str], rounds: int) -> subprocess.Popen[str]:
    """A process of its own (a host) that signs ``rounds`` checkpoints into its own file."""
    code = (
        "import django; django.setup()\n"
        "from operations.audit.signing import audit_checkpoint_create\n"
        "from tests.factories import submit\n"
        f"for n in range({rounds}):\n"
        "    submit()\n"
        "    audit_checkpoint_create(only_if_changed=True)\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=BASE_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.django_db(transaction=True)
def test_i35_two_concurrent_checkpoint_writers_never_fork_and_each_file_holds_the_series(
    settings: Any, tmp_path: Path
) -> None:
    # given: one signing key, and two hosts, each with its own checkpoint file
    key = tmp_path / "audit-signing-key.pem"
    signing_key_create(key)
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "AUDIT_SIGNING_KEY_FILE": str(key),
        "AUDIT_PUBLIC_KEY_FILE": "",
    }
    files = [tmp_path / "host-a.jsonl", tmp_path / "host-b.jsonl"]
    base = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "console.settings",
        "PYTHONPATH": str(BASE_DIR),
        "EFFECT_LEDGER_AUDIT_SIGNING_KEY_FILE": str(key),
        "LOG_LEVEL": "ERROR",
    }

    # when: both sign checkpoints at once, the log growing meanwhile
    hosts = [checkpointer({**base, "EFFECT_LEDGER_AUDIT_CHECKPOINT_FILE": str(f)}, 12) for f in files]
    outputs = [host.communicate(timeout=180)[0] for host in hosts]
    assert [host.returncode for host in hosts] == [0, 0], outputs

    # then: the series is 1..n, each linked to the one before (no fork, no gap)
    rows = list(AuditCheckpoint.objects.order_by("number"))
    assert [r.number for r in rows] == list(range(1, len(rows) + 1)) and len(rows) >= 12
    for before, after in zip(rows, rows[1:], strict=False):
        assert after.prev_hash == SignedCheckpoint.from_row(before).statement_hash()
    # and: after one more catch-up each (the beat's run when nothing changed), each host's file
    # holds the whole series, in order, and verifies against the database
    for path in files:
        settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "AUDIT_CHECKPOINT_FILE": str(path)}
        assert audit_checkpoint_create(only_if_changed=True) is None
        assert checkpoint_file_series(path) == list(range(1, len(rows) + 1))
        report = checkpoint_verify(public_key=public_key_load(), checkpoint_file=path)
        assert report.ok, report
        # and: the restore check is level on either host
        assert restore_detection().state == "level"


def two_hosts(settings: Any, tmp_path: Path) -> tuple[Path, Path]:
    """A signing key and two hosts' checkpoint files (A's in use; B's not written yet)."""
    key = tmp_path / "k.pem"
    signing_key_create(key)
    host_a, host_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "AUDIT_SIGNING_KEY_FILE": str(key),
        "AUDIT_PUBLIC_KEY_FILE": "",
        "AUDIT_CHECKPOINT_FILE": str(host_a),
    }
    return host_a, host_b


@pytest.mark.django_db
def test_i35_a_host_file_that_lags_catches_up_and_a_fork_is_refused(settings: Any, tmp_path: Path) -> None:
    # given: three checkpoints signed with host A's file; host B's file was started empty
    host_a, host_b = two_hosts(settings, tmp_path)
    for _ in range(3):
        submit()
        audit_checkpoint_create()

    # when: host B catches up twice (the second finds nothing to append)
    first, again = checkpoint_file_sync(host_b), checkpoint_file_sync(host_b)

    # then
    assert (first, again) == ([1, 2, 3], [])
    assert checkpoint_file_series(host_b) == [1, 2, 3]
    # and: the restore check reads host B's file as level (before, it had no file: blind)
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "AUDIT_CHECKPOINT_FILE": str(host_b)}
    assert restore_detection().state == "level"
    # and: a file whose newest line the database's next checkpoint does not follow is not written
    forked = tmp_path / "forked.jsonl"
    lines = host_a.read_text().splitlines()
    checkpoint = SignedCheckpoint.from_line(lines[0])
    other = dict(checkpoint.statement, root="0" * 64)  # another #1 than the database's
    forked.write_text(SignedCheckpoint(other, checkpoint.signature, checkpoint.heads).to_line() + "\n")
    with pytest.raises(Exception, match="does not follow"):
        checkpoint_file_sync(forked)


@pytest.mark.django_db(transaction=True)
def test_i35_one_scheduled_statement_run_per_source_and_day_even_when_triggered_at_once() -> None:
    day = dt.date(2026, 12, 1)

    # when: two beats' runs reconcile the same source and day at once
    runs = concurrently(
        2,
        lambda: statement_run(
            source=SOURCE, day=day, entries=[], origin=StatementRun.Origin.API, scheduled=True
        ),
    )

    # then: one run is stored, and both callers get it
    assert StatementRun.objects.filter(source=SOURCE, statement_date=day).count() == 1
    assert runs[0].id == runs[1].id and runs[0].error == ""
    # and: the rule is the database's, not only the code's
    with pytest.raises(IntegrityError), transaction.atomic():
        StatementRun.objects.create(source=SOURCE, statement_date=day, origin="api", scheduled=True)
    # and: an operator may still run the day again (not scheduled)
    statement_run(source=SOURCE, day=day, entries=[], origin=StatementRun.Origin.API)
    assert StatementRun.objects.filter(source=SOURCE, statement_date=day).count() == 2


@pytest.mark.django_db
def test_i35_health_page_names_two_beats_red_and_one_beat_green(client: Client) -> None:
    # given: one beat
    started = dt.datetime(2026, 12, 6, 1, 0, tzinfo=dt.UTC)
    beat_heartbeat_record(identity="host-a:101:1.0", host="host-a", pid=101, started_at=started)
    assert beats_signal(beats_seen()).level == GREEN

    # when: a second beat on another host records its heartbeat
    beat_heartbeat_record(identity="host-b:202:2.0", host="host-b", pid=202, started_at=started)

    # then: red, naming both, on the health page too
    signal = beats_signal(beats_seen())
    assert signal.level == RED and "host-a pid 101" in signal.summary and "host-b pid 202" in signal.summary
    client.force_login(UserFactory(username="root", groups=["admin"]))
    body = client.get(reverse("health")).content.decode()
    assert 'id="signal-beats"' in body and "host-b pid 202" in body and "exactly one" in body


@pytest.mark.django_db(transaction=True)
def test_i35_two_notification_senders_at_once_send_each_notice_once(settings: Any) -> None:
    # given: two approvers and ten intents waiting for approval, each with its notice
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "SLACK_WEBHOOK_URL": "",
        "NOTIFY_INTERVAL_SECONDS": 300.0,
    }
    mail.outbox = []
    for name in ("alice", "bob"):
        UserFactory(username=name, groups=["approver"])
    references = [f"order-{n}" for n in range(10)]
    for reference in references:
        submit(arguments=charge_arguments(25_000), reference=reference)

    # when: two beats' sender runs (no period claim: the rows' own claims are what is proven)
    # and two more run at once
    concurrently(4, tasks.send_notifications)

    # then: no approver got a notice twice; each notice was mailed once and marked sent, or
    # waits, pending, for that approver's next digest (a sender that found the approver rate
    # limited by another sender's message leaves it for the next one: deferred, never lost)
    for address in ("alice@example.test", "bob@example.test"):
        bodies = "".join(m.body for m in mail.outbox if m.to == [address])
        counts = [bodies.count(f'Reference: "{r}"\n') for r in references]
        deliveries = NotificationDelivery.objects.filter(
            recipient__address=address, notification__kind="approval_requested"
        )
        assert set(counts) <= {0, 1}, counts
        assert deliveries.filter(status="sent").count() == sum(counts) >= 1
        assert deliveries.filter(status="pending").count() == 10 - sum(counts)


@pytest.mark.django_db(transaction=True)
def test_i35_a_host_whose_run_lost_the_period_still_catches_its_file_up(
    settings: Any, tmp_path: Path
) -> None:
    # given: host A's run signed this period's checkpoint into A's file; host B's file is empty
    host_a, host_b = two_hosts(settings, tmp_path)
    submit()
    assert tasks.audit_checkpoint(claim_period=3600) == 1
    # when: host B's worker runs the other beat's message of the same period (it loses the claim)
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "AUDIT_CHECKPOINT_FILE": str(host_b)}
    assert tasks.audit_checkpoint(claim_period=3600) is None
    # then: nothing new was signed, and B's file holds the series (before: only once B won a claim)
    assert AuditCheckpoint.objects.count() == 1
    assert checkpoint_file_series(host_b) == [1]
