"""The archiver (issue 36, ``operations.archive``): what it writes, what it deletes, what it
never touches, and how an archived key replays. Real PostgreSQL and the sandbox provider; the
archive in a temporary directory."""

from __future__ import annotations

import io
import json
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.core.management import CommandError, call_command
from django.db import connection, connections
from django.utils import timezone
from rest_framework.test import APIClient

from operations.archive import files
from operations.archive.records import INTENT_TABLES, NESTED_TABLES, STATEMENT_LINES
from operations.archive.services import ArchiveBusyError, archive_run
from operations.audit.checkpoints import leaf_input
from operations.audit.keys import public_key_load, signature_valid
from operations.audit.merkle import merkle_root
from operations.engine.protocol import execute_intent
from operations.idempotency import canonical_json
from operations.models import ArchivedIntent, ArchiveSegment, AuditEvent, Intent
from operations.services.leases import lease_release, lease_try_acquire
from tests.factories import charge_arguments, submit

# Transactional: the archiver's own transactions (its REPEATABLE READ snapshot, each delete batch)
# commit as they do in production.
pytestmark = pytest.mark.django_db(transaction=True)

EMAIL = {"to": "ada@example.test", "subject": "Your receipt", "body": "Thanks"}


@pytest.fixture(autouse=True)
def archive_dir(settings: Any, tmp_path: Path) -> Path:
    """The archive and a signing key (created on first use) under ``tmp_path``."""
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "ARCHIVE_DIR": str(tmp_path / "archive"),
        "AUDIT_SIGNING_KEY_FILE": str(tmp_path / "keys" / "audit.pem"),
        "AUDIT_SIGNING_KEY_CREATE": True,
        "AUDIT_PUBLIC_KEY_FILE": "",
        "AUDIT_CHECKPOINT_FILE": str(tmp_path / "checkpoints.jsonl"),
    }
    return tmp_path / "archive"


def aged(*intents: Intent, days: float = 100) -> None:
    """Make the intents look settled ``days`` ago (past the default 90 days' retention)."""
    Intent.objects.filter(id__in=[intent.id for intent in intents]).update(
        updated_at=timezone.now() - timedelta(days=days)
    )


def executed(intent: Intent) -> Intent:
    execute_intent(intent.id)
    intent.refresh_from_db()
    return intent


def rows_about(intent_id: uuid.UUID) -> dict[str, int]:
    """How many rows of each table still name the intent (0 everywhere once archived)."""
    counts = {}
    with connection.cursor() as cursor:
        for table in (*INTENT_TABLES, "operations_auditevent", "operations_intentwaiter"):
            column = "intent_id"
            cursor.execute(f"SELECT count(*) FROM {table} WHERE {column} = %s", [intent_id])
            counts[table] = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM operations_intent WHERE id = %s", [intent_id])
        counts["operations_intent"] = cursor.fetchone()[0]
    return {table: n for table, n in counts.items() if n}


def records_in(archive: Path) -> dict[str, list[str]]:
    """``{intent_id: [segment file, ...]}`` over every segment file in the archive."""
    found: dict[str, list[str]] = {}
    for segment in ArchiveSegment.objects.order_by("number"):
        for record in files.records_read_file(segment.file_name):
            found.setdefault(record["intent"]["id"], []).append(segment.file_name)
    return found


def run(**options: Any) -> Any:
    return archive_run(before=timezone.now(), **options)


def test_i36_a_settled_intent_is_written_whole_then_its_live_rows_are_deleted(
    sandbox: Any, archive_dir: Path
) -> None:
    # given: a charge that succeeded, one declined (FAILED), an email sent: each of the provider kinds here
    charged = executed(submit(reference="order-1"))
    declined = executed(submit(arguments=charge_arguments(customer="cus_declined")))
    mailed = executed(submit(action="email.send", arguments=EMAIL))
    assert [charged.status, declined.status, mailed.status] == ["SUCCEEDED", "FAILED", "SUCCEEDED"]
    chains = {
        str(intent.id): list(
            AuditEvent.objects.filter(intent=intent).order_by("seq").values_list("hash", flat=True)
        )
        for intent in (charged, declined, mailed)
    }
    aged(charged, declined, mailed)
    # when
    report = run()
    # then: one segment, every intent in it once, and nothing of them left live
    assert (report.segments, report.intents_archived, report.superseded) == (1, 3, 0)
    (segment,) = ArchiveSegment.objects.all()
    assert segment.state == ArchiveSegment.State.COMPLETE and segment.intents == 3
    assert {intent_id: len(names) for intent_id, names in records_in(archive_dir).items()} == dict.fromkeys(
        chains, 1
    )
    for intent in (charged, declined, mailed):
        assert rows_about(intent.id) == {}
        assert ArchivedIntent.objects.get(intent_id=intent.id).state == ArchivedIntent.State.ARCHIVED
    # the records hold the chains exactly, and the attempts and outcomes
    records = {record["intent"]["id"]: record for record in files.records_read_file(segment.file_name)}
    for intent_id, hashes in chains.items():
        assert [event["hash"] for event in records[intent_id]["audit_events"]] == hashes
    assert len(records[str(charged.id)]["rows"]["operations_outcome"]) == 1
    assert len(records[str(declined.id)]["rows"]["operations_attempt"]) == 1
    assert records[str(charged.id)]["intent"]["status"] == "SUCCEEDED"
    # the manifest is signed with the audit key, and its root is the heads' Merkle root
    manifest = files.manifest_read(segment.file_name.removesuffix(files.DATA_SUFFIX) + files.MANIFEST_SUFFIX)
    assert manifest["statement"] == segment.manifest
    assert signature_valid(public_key_load(), manifest["signature"], canonical_json(manifest["statement"]))
    assert manifest["statement"]["file_sha256"] == files.file_sha256(segment.file_name)
    assert manifest["statement"]["root"] == merkle_root(
        leaf_input(*head).encode() for head in manifest["heads"]
    )


def test_i36_nothing_open_and_nothing_young_is_archived(sandbox: Any, settings: Any) -> None:
    # given: intents in every open state, a settled one within retention, and a settled one an open
    # intent is held behind
    ready = submit()
    awaiting = submit(arguments=charge_arguments(amount=900_000))
    unknown = submit(action="email.send", arguments=EMAIL)
    sandbox.inject("crash_after_effect", product="email")
    executed(unknown)
    young = executed(submit())
    aged(ready, awaiting, unknown, days=400)
    assert {ready.status, awaiting.status, unknown.status} == {"READY", "AWAITING_APPROVAL", "UNKNOWN"}
    # when
    report = run()
    # then
    assert report.intents_archived == 0 and not ArchivedIntent.objects.exists()
    for intent in (ready, awaiting, unknown, young):
        assert Intent.objects.filter(id=intent.id).exists()


def test_i36_retention_per_tenant_and_before_both_hold(sandbox: Any, settings: Any) -> None:
    # given: acme keeps intents live 365 days, everyone else the default 90
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "TENANT_RETENTION_DAYS": {"acme": 365.0}}
    acme = executed(submit(tenant="acme"))
    globex = executed(submit(tenant="globex", principal="agent:agent-g"))
    aged(acme, globex, days=100)
    # when: --before a week ago
    archive_run(before=timezone.now() - timedelta(days=120))
    # then: nothing settled after --before
    assert not ArchivedIntent.objects.exists()
    # when: --before now
    run()
    # then: globex's (100 days > 90) only
    assert set(ArchivedIntent.objects.values_list("intent_id", flat=True)) == {globex.id}


def test_c29_a_replay_of_an_archived_key_returns_the_archived_answer_and_reaches_no_provider(
    sandbox: Any, api: APIClient
) -> None:
    # given: a charge submitted through the API, executed, archived
    body = {"action": "payments.charge", "arguments": charge_arguments(), "reference": "order-77"}
    first = api.post(
        "/api/v1/intents", data=json.dumps(body), content_type="application/json", HTTP_IDEMPOTENCY_KEY="k-77"
    )
    assert first.status_code == 201
    intent = executed(Intent.objects.get(id=first.json()["intent_id"]))
    answer_then = api.get(f"/api/v1/intents/{intent.id}").json()
    aged(intent)
    run()
    assert not Intent.objects.filter(id=intent.id).exists()
    charges = len(sandbox.ledger("payments"))
    # when: the agent retries the same request under the same key
    again = api.post(
        "/api/v1/intents", data=json.dumps(body), content_type="application/json", HTTP_IDEMPOTENCY_KEY="k-77"
    )
    # then: the archived answer, replayed; no new intent, no new charge
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again["Effect-Ledger-Archived"].endswith(".jsonl.gz")
    replayed = again.json()
    assert replayed["intent_id"] == str(intent.id) and replayed["status"] == "SUCCEEDED"
    assert replayed["outcome"] == answer_then["outcome"] and replayed["links"]["self"].startswith("http")
    assert not Intent.objects.exists() and len(sandbox.ledger("payments")) == charges
    # and reading it by id answers from the archive too
    read = api.get(f"/api/v1/intents/{intent.id}")
    assert read.status_code == 200 and read.json()["status"] == "SUCCEEDED" and read["Effect-Ledger-Archived"]
    # when: the same key with another amount
    other = dict(body, arguments=charge_arguments(amount=1))
    refused = api.post(
        "/api/v1/intents",
        data=json.dumps(other),
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="k-77",
    )
    # then: refused as for a live key, nothing stored
    assert refused.status_code == 422 and refused.json()["code"] == "idempotency-key-reused"
    assert not Intent.objects.exists()


def test_i36_after_the_keys_retention_a_submit_makes_a_new_intent(sandbox: Any, api: APIClient) -> None:
    body = {"action": "payments.charge", "arguments": charge_arguments(), "reference": "order-78"}
    first = api.post(
        "/api/v1/intents", data=json.dumps(body), content_type="application/json", HTTP_IDEMPOTENCY_KEY="k-78"
    )
    intent = executed(Intent.objects.get(id=first.json()["intent_id"]))
    aged(intent)
    run()
    ArchivedIntent.objects.filter(intent_id=intent.id).update(
        key_expires_at=timezone.now() - timedelta(seconds=1)
    )
    again = api.post(
        "/api/v1/intents", data=json.dumps(body), content_type="application/json", HTTP_IDEMPOTENCY_KEY="k-78"
    )
    assert again.status_code == 201 and "Idempotent-Replayed" not in again
    assert again.json()["intent_id"] != str(intent.id)


def test_i36_an_intent_that_changed_after_it_was_written_is_kept(sandbox: Any, monkeypatch: Any) -> None:
    # given: two settled intents; one gets a new row between the write and the delete
    kept, gone = executed(submit()), executed(submit())
    aged(kept, gone)
    from operations.archive import services

    write = services._write_segment

    def write_then_change(*args: Any, **kwargs: Any) -> Any:
        segment = write(*args, **kwargs)
        # as a transition would: a new row about it, and its updated_at moves to now
        Intent.objects.filter(id=kept.id).update(
            last_error="touched after it was written", updated_at=timezone.now()
        )
        return segment

    monkeypatch.setattr(services, "_write_segment", write_then_change)
    # when
    report = run()
    # then: the changed one stays live (superseded), the other is archived
    assert (report.intents_archived, report.superseded) == (1, 1)
    assert Intent.objects.filter(id=kept.id).exists() and not Intent.objects.filter(id=gone.id).exists()
    assert ArchivedIntent.objects.get(intent_id=kept.id).state == ArchivedIntent.State.SUPERSEDED
    assert rows_about(kept.id)["operations_auditevent"] >= 3  # its rows, chain included, all live


def test_c29_a_run_killed_between_writing_and_committing_loses_nothing_and_archives_once(
    sandbox: Any, monkeypatch: Any, archive_dir: Path
) -> None:
    # given: a run that dies after writing its files, before its segment row commits
    intents = [executed(submit()) for _ in range(3)]
    aged(*intents)

    def killed(*args: Any, **kwargs: Any) -> Any:
        raise SystemExit("killed")

    monkeypatch.setattr(ArchiveSegment.objects, "create", killed)
    with pytest.raises(SystemExit):
        run()
    assert all(Intent.objects.filter(id=intent.id).exists() for intent in intents)
    assert list(archive_dir.glob("*/intents-*.jsonl.gz"))  # the files were written
    monkeypatch.undo()
    # when: run again
    report = run()
    # then: the uncommitted files set aside, every intent archived in exactly one segment file
    assert len(report.set_aside) == 2 and report.intents_archived == 3
    assert {intent_id: len(names) for intent_id, names in records_in(archive_dir).items()} == {
        str(intent.id): 1 for intent in intents
    }
    assert len(list(archive_dir.glob("*/intents-*.jsonl.gz"))) == 1


def test_i36_one_archiver_at_a_time() -> None:
    lease = lease_try_acquire(name="archive", ttl_seconds=30)
    assert lease is not None
    try:
        with pytest.raises(ArchiveBusyError):
            run()
        with pytest.raises(CommandError, match="another archiver holds the archive lease") as refused:
            call_command("archive")
        assert refused.value.returncode == 2
    finally:
        lease_release(lease)


@pytest.mark.parametrize(
    ("argument", "message"),
    [
        ("yesterday", "not an ISO 8601 date-time"),
        ("2026-13-01", "is not a valid date"),
        ("2026-09-01T12:00:00", "no UTC offset"),
        ("1999-01-01", "before 2000"),
    ],
)
def test_i36_bad_before_is_refused_and_changes_nothing(sandbox: Any, argument: str, message: str) -> None:
    intent = executed(submit())
    aged(intent)
    with pytest.raises(CommandError, match=message) as refused:
        call_command("archive", "--before", argument)
    assert refused.value.returncode == 2
    assert Intent.objects.filter(id=intent.id).exists() and not ArchiveSegment.objects.exists()


def test_i36_the_archive_command_reports_progress_and_totals(sandbox: Any) -> None:
    intents = [executed(submit()) for _ in range(2)]
    aged(*intents)
    out = io.StringIO()
    call_command("archive", stdout=out)
    text = out.getvalue()
    assert "segment 1: wrote 2 intents" in text and "archived 2 intents in 1 new segments" in text


def test_i36_every_foreign_key_to_an_intent_is_archived_or_ruled_out() -> None:
    """A new table pointing at intents must be written and deleted with them, or be one the
    eligibility rules (operations.archive.services.SETTLED_AND_FREE) keep from being archived."""
    handled = set(INTENT_TABLES) | {table for table, _, _ in NESTED_TABLES} | {STATEMENT_LINES}
    ruled_out = {
        ("operations_intent", "held_behind"),
        ("operations_intent", "compensates"),
        ("reconciliation_duplicatefinding", "compensation"),
        ("reconciliation_providerfinding", "compensation"),
        ("operations_auditevent", "intent"),
    }
    for model in apps.get_models():
        for field in model._meta.concrete_fields:
            if field.is_relation and field.related_model is Intent:
                table = model._meta.db_table
                assert table in handled or (table, field.name) in ruled_out, (table, field.name)


def test_c29_a_retry_racing_the_deletion_of_its_archived_intent_replays_and_never_makes_a_second(
    sandbox: Any,
) -> None:
    """The submission's insert waits on the unique key for the archiver's deleting transaction;
    once that commits, the row it collided with is gone, and only the trigger of migration 0035
    (which sees that commit) keeps the insert from making a second intent."""
    import threading

    from operations.archive import services
    from operations.archive.services import _DELETES
    from operations.services import intent_submit

    # (no reference: a business identity would make the retry a likely duplicate held behind the
    # archived intent, and its foreign key alone would refuse it)
    intent = executed(submit(client_key="k-race"))
    aged(intent)
    services._write_segment(timezone.now().date() - timedelta(days=100), [intent.id])
    deleted, release = threading.Event(), threading.Event()

    def archiver() -> None:  # the delete batch, held open until released, on its own connection
        own = connections.create_connection("default")  # the test database, however it is reached
        try:
            own.set_autocommit(False)
            with own.cursor() as cursor:
                cursor.execute("SELECT 1 FROM operations_intent WHERE id = %s FOR UPDATE", [intent.id])
                for statement in _DELETES:
                    cursor.execute(statement, {"ids": [intent.id]})
                cursor.execute(
                    "UPDATE operations_archivedintent SET state = 'archived' WHERE intent_id = %s",
                    [intent.id],
                )
            deleted.set()
            release.wait(10)
            own.commit()
        finally:
            own.close()

    results: list[Any] = []

    def agent() -> None:  # the retry, under the same key and request
        try:
            results.append(
                intent_submit(
                    tenant="acme",
                    principal="agent:agent-1",
                    client_key="k-race",
                    action="payments.charge",
                    arguments=charge_arguments(),
                )
            )
        finally:
            connection.close()

    deleting = threading.Thread(target=archiver)
    deleting.start()
    assert deleted.wait(10)
    retrying = threading.Thread(target=agent)
    retrying.start()
    retrying.join(1.0)
    assert retrying.is_alive()  # waiting on the unique key for the deleting transaction
    release.set()
    deleting.join(10)
    retrying.join(10)
    (result,) = results
    assert result.created is False and result.archived is not None
    assert str(result.intent.id) == str(intent.id) and not Intent.objects.exists()


def test_i36_a_run_whose_lease_was_taken_over_stops_at_its_next_step(sandbox: Any, monkeypatch: Any) -> None:
    """The lease is renewed by a thread while the run lasts; one that lapsed and was taken over
    (this run stalled longer than the lease) stops the run before it deletes anything more."""
    from operations.archive import lease as lease_module
    from operations.archive import services
    from operations.archive.lease import ArchiveLeaseLostError

    intents = [executed(submit()) for _ in range(2)]
    aged(*intents)
    monkeypatch.setattr(lease_module, "LEASE_SECONDS", 0.6)
    write = services._write_segment

    def stalled(*args: Any, **kwargs: Any) -> Any:
        segment = write(*args, **kwargs)
        with connection.cursor() as cursor:  # another archiver took the lapsed lease over
            cursor.execute("UPDATE operations_lease SET holder = 'another' WHERE name = 'archive'")
        time.sleep(0.5)  # the keeper's next renewal finds it gone
        return segment

    monkeypatch.setattr(services, "_write_segment", stalled)
    with pytest.raises(ArchiveLeaseLostError):
        run()
    # the segment was committed; none of its intents was deleted by the run that lost the lease
    assert ArchivedIntent.objects.filter(state=ArchivedIntent.State.PENDING).count() == 2
    assert all(Intent.objects.filter(id=intent.id).exists() for intent in intents)


def test_i36_a_long_step_keeps_the_lease_and_a_second_archiver_waits(sandbox: Any, monkeypatch: Any) -> None:
    """A segment write longer than the lease does not let a second archiver in: the keeper thread
    renews it meanwhile (and a run killed outright holds it only ``LEASE_SECONDS``)."""
    import threading

    from operations.archive import lease as lease_module
    from operations.archive import services

    intents = [executed(submit()) for _ in range(2)]
    aged(*intents)
    monkeypatch.setattr(lease_module, "LEASE_SECONDS", 0.6)
    write = services._write_segment
    second: list[Any] = []

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(1.5)  # longer than the lease

        def other_host() -> None:
            try:
                second.append(lease_try_acquire(name="archive", ttl_seconds=30))
            finally:
                connection.close()

        thread = threading.Thread(target=other_host)
        thread.start()
        thread.join()
        return write(*args, **kwargs)

    monkeypatch.setattr(services, "_write_segment", slow)
    report = run()
    assert second == [None] and report.intents_archived == 2


# --- settings, the check, the periodic job ------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"EFFECT_LEDGER_INTENT_RETENTION_DAYS": "0"},
            "EFFECT_LEDGER_INTENT_RETENTION_DAYS must be at least 1",
        ),
        (
            {"EFFECT_LEDGER_INTENT_RETENTION_DAYS": "nan"},
            "EFFECT_LEDGER_INTENT_RETENTION_DAYS must be a finite",
        ),
        ({"EFFECT_LEDGER_KEY_RETENTION_DAYS": "-1"}, "EFFECT_LEDGER_KEY_RETENTION_DAYS must be at least 1"),
        (
            {"EFFECT_LEDGER_TENANT_RETENTION_DAYS": "[1]"},
            "EFFECT_LEDGER_TENANT_RETENTION_DAYS must be a JSON object",
        ),
        (
            {"EFFECT_LEDGER_TENANT_RETENTION_DAYS": "{acme: 3"},
            "EFFECT_LEDGER_TENANT_RETENTION_DAYS must be a JSON",
        ),
        ({"EFFECT_LEDGER_TENANT_RETENTION_DAYS": '{"acme": 0}'}, "tenant 'acme' needs days from 1"),
        ({"EFFECT_LEDGER_TENANT_RETENTION_DAYS": '{"acme": true}'}, "tenant 'acme' needs days from 1"),
        (
            {"EFFECT_LEDGER_ARCHIVE_PERIOD_SECONDS": "0"},
            "EFFECT_LEDGER_ARCHIVE_PERIOD_SECONDS must be at least",
        ),
        (
            {"EFFECT_LEDGER_ARCHIVE_DELETE_BATCH": "0"},
            "EFFECT_LEDGER_ARCHIVE_DELETE_BATCH must be at least 1",
        ),
        (
            {"EFFECT_LEDGER_ARCHIVE_SEGMENT_INTENTS": "x"},
            "EFFECT_LEDGER_ARCHIVE_SEGMENT_INTENTS must be an integer",
        ),
    ],
)
def test_i36_bad_archive_settings_stop_the_process_at_start_up(environ: dict[str, str], message: str) -> None:
    import os
    import subprocess
    import sys

    from django.conf import settings

    child = subprocess.run(  # noqa: S603 - this interpreter, fixed code
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=settings.BASE_DIR,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings", **environ},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.returncode != 0 and message in child.stderr, child.stderr[-500:]


def test_i36_a_key_retention_shorter_than_an_intent_retention_is_refused_by_check(settings: Any) -> None:
    from operations.checks import retention_check

    assert retention_check() == []
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "KEY_RETENTION_DAYS": 100.0,
        "TENANT_RETENTION_DAYS": {"acme": 365.0},
    }
    (error,) = retention_check()
    assert (
        error.id == "operations.E007" and "shorter than the longest intent retention (365 days)" in error.msg
    )


def test_i36_the_beat_runs_the_archive_once_per_period(sandbox: Any) -> None:
    from console.celery import app
    from operations import tasks
    from operations.models import PeriodicJobRun

    entry = app.conf.beat_schedule["archive"]
    assert entry["task"] == "operations.archive" and entry["kwargs"] == {"claim_period": 3600.0}
    intent = executed(submit())
    aged(intent)
    # the first beat of the period archives; a second beat's run of the same period does nothing
    assert tasks.archive(claim_period=3600)["archived"] == 1
    assert PeriodicJobRun.objects.get(name="operations.archive").last_error == ""
    other = executed(submit())
    aged(other)
    assert tasks.archive(claim_period=3600) == {}
    assert Intent.objects.filter(id=other.id).exists()
    # a run another archiver holds the lease for is not an error
    lease = lease_try_acquire(name="archive", ttl_seconds=30)
    assert lease is not None
    try:
        assert tasks.archive() == {"busy": 1}
    finally:
        lease_release(lease)


def test_i36_once_anything_was_signed_the_archive_never_creates_or_uses_another_key(
    sandbox: Any, settings: Any, tmp_path: Path
) -> None:
    """A key file missing after checkpoints or segments exist was lost or replaced: the archive
    refuses, as ``audit_checkpoint`` does, instead of signing on with a fresh key (found by a
    newcomer: it created one, and every later ``verify_audit`` failed)."""
    from operations.audit.keys import AuditKeyError

    first = executed(submit())
    aged(first)
    run()  # segment 1, signed with the configured key
    second = executed(submit())
    aged(second)
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "AUDIT_SIGNING_KEY_FILE": str(tmp_path / "new" / "key.pem"),
    }
    with pytest.raises(AuditKeyError, match="no audit signing key"):
        run()
    assert not (tmp_path / "new" / "key.pem").exists()
    # and another key that exists is refused too, naming what it did not sign
    from operations.audit.keys import signing_key_create

    signing_key_create(tmp_path / "new" / "key.pem")
    with pytest.raises(AuditKeyError, match="is not the key that signed the newest archive segment"):
        run()
    assert ArchiveSegment.objects.count() == 1 and Intent.objects.filter(id=second.id).exists()


def test_i36_a_corrupt_segment_file_is_a_finding_and_a_named_page_not_a_traceback(
    sandbox: Any, archive_dir: Path, admin_client: Any
) -> None:
    intent = executed(submit(reference="order-corrupt"))
    aged(intent)
    run()
    (segment,) = ArchiveSegment.objects.all()
    path = archive_dir / segment.file_name
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF  # inside the deflate stream: zlib's error, not gzip's
    path.write_bytes(bytes(data))
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("verify_audit", "--database-only", stdout=out, stderr=err)
    assert exited.value.code == 1
    assert (
        f"cannot read archive file {segment.file_name}" in err.getvalue()
        or segment.file_name in err.getvalue()
    )
    page = admin_client.get(f"/archive/intents/{intent.id}/")
    assert page.status_code == 200 and segment.file_name in page.content.decode()


def test_c30_an_argument_edited_in_an_archive_file_is_named_with_its_intent(
    sandbox: Any, archive_dir: Path, admin_client: Any
) -> None:
    """The amount is outside the hash chain, but the request it hashes to is in the chain's
    ``submitted`` event: verify_audit and the console name the intent (found by a newcomer: only
    the file was named, and the console showed the edited amount as genuine)."""
    import gzip

    intent = executed(submit(arguments=charge_arguments(amount=147)))
    aged(intent)
    run()
    (segment,) = ArchiveSegment.objects.all()
    path = archive_dir / segment.file_name
    records = [json.loads(line) for line in gzip.decompress(path.read_bytes()).splitlines()]
    records[0]["intent"]["arguments"]["amount"] = 999999
    path.write_bytes(gzip.compress(b"".join(json.dumps(r).encode() + b"\n" for r in records)))
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(SystemExit):
        call_command("verify_audit", "--database-only", stdout=out, stderr=err)
    assert (
        f"altered record: archive file {segment.file_name}" in err.getvalue()
        and str(intent.id) in err.getvalue()
    )
    assert "no longer hash to the request_hash" in err.getvalue()
    page = admin_client.get(f"/archive/intents/{intent.id}/").content.decode()
    assert "no longer hash to the request_hash" in page
