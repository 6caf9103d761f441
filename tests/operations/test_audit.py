"""The audit log is append-only (PostgreSQL trigger) and hash-chained (verify_audit)."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction

from operations.models import AuditEvent, Intent
from operations.services import intent_cancel, intent_claim
from tests.factories import charge_arguments, submit

pytestmark = pytest.mark.django_db


def verify() -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("verify_audit", stdout=out, stderr=err)
    except SystemExit as exc:
        return int(exc.code or 0), err.getvalue()
    return 0, out.getvalue()


def test_trigger_refuses_update() -> None:
    submit()
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.update(reason="rewritten")


def test_trigger_refuses_delete() -> None:
    submit()
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.all().delete()


def test_i11_1_truncate_of_the_audit_log_is_refused() -> None:
    # given: a log with events (the statement-level trigger must fire even for a plain TRUNCATE,
    # and for one that reaches the table by CASCADE from the intents)
    submit()
    submit()
    before = AuditEvent.objects.count()
    with connection.cursor() as cursor:  # PostgreSQL refuses TRUNCATE while FK checks are pending
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    # when / then
    for statement in ("TRUNCATE operations_auditevent", "TRUNCATE operations_intent CASCADE"):
        with (
            pytest.raises(DatabaseError, match="append-only: TRUNCATE refused"),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute(statement)
    assert AuditEvent.objects.count() == before == 2
    assert verify() == (0, "audit chain intact: 2 events verified\n")


def test_chain_links_each_event_to_the_previous() -> None:
    # given
    intent = submit()
    intent_cancel(intent_id=intent.id, actor="agent:agent-1")
    # then
    first, second = AuditEvent.objects.filter(intent=intent).order_by("seq")
    assert first.prev_hash == "0" * 64
    assert second.prev_hash == first.hash and second.seq == 2
    assert verify() == (0, "audit chain intact: 2 events verified\n")


def test_tampered_event_makes_verify_fail_naming_it() -> None:
    # given: someone with table-owner rights bypasses the trigger and edits a reason
    submit()
    target = submit()
    intent_cancel(intent_id=target.id, actor="agent:agent-1")
    victim = AuditEvent.objects.get(intent=target, seq=2)
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")  # superuser bypass of triggers
        cursor.execute("UPDATE operations_auditevent SET actor = 'user:mallory' WHERE id = %s", [victim.id])
        cursor.execute("SET session_replication_role = origin")
    # when
    code, message = verify()
    # then
    assert code == 1
    assert f"event id {victim.id}" in message


def test_removed_event_makes_verify_fail() -> None:
    # given
    target = submit()
    intent_cancel(intent_id=target.id, actor="agent:agent-1")
    first = AuditEvent.objects.get(intent=target, seq=1)
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")  # superuser bypass of triggers
        cursor.execute("DELETE FROM operations_auditevent WHERE id = %s", [first.id])
        cursor.execute("SET session_replication_role = origin")
    # when
    code, message = verify()
    # then
    assert code == 1 and "seq 2 where 1 was expected" in message


def test_i11_audit_times_come_from_the_database_clock() -> None:
    """A process whose clock runs 60 s fast must not stamp events 60 s in the future."""
    import time_machine
    from django.utils import timezone

    with time_machine.travel(timezone.now() + timedelta(seconds=60), tick=True):
        intent = submit()
        intent_cancel(intent_id=intent.id, actor="agent:agent-1", reason="not needed")
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        (database_now,) = cursor.fetchone()
    events = list(AuditEvent.objects.filter(intent=intent).order_by("seq"))
    assert [e.event for e in events] == ["submitted", "cancelled"]
    for event in events:
        assert abs((database_now - event.created_at).total_seconds()) < 5
    assert events[0].created_at <= events[1].created_at
    assert verify()[0] == 0


def test_i11_2_a_status_changed_behind_the_ledger_is_named() -> None:
    # given: a gated charge whose row a database writer moves to READY (no transition)
    intent = submit(arguments=charge_arguments(25_000))
    assert intent.status == Intent.Status.AWAITING_APPROVAL
    Intent.objects.filter(id=intent.id).update(status=Intent.Status.READY)
    # then: verify_audit names the intent: its row is not where its chain left it
    code, err = verify()
    assert code == 1
    assert (
        f"intent {intent.id} does not match its audit chain: the intent is READY but its audit chain "
        "left it AWAITING_APPROVAL" in err
    )
    # when: a worker claims it anyway, the chain itself shows the jump
    assert intent_claim(intent_id=intent.id, worker="w", lease_seconds=30) is not None
    claimed = AuditEvent.objects.get(intent=intent, event="claimed")
    code, err = verify()
    assert code == 1
    assert (
        f"audit chain broken at event id {claimed.id} (intent {intent.id}): moves from READY but the chain "
        "left the intent AWAITING_APPROVAL" in err
    )


def test_i11_1_an_intent_whose_chain_was_deleted_is_named_without_a_checkpoint() -> None:
    intent = submit()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute("DELETE FROM operations_auditevent WHERE intent_id = %s", [intent.id])
    code, err = verify()
    assert code == 1
    assert (
        f"intent {intent.id} does not match its audit chain: the intent is READY but has no audit events"
        in err
    )
