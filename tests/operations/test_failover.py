"""The ledger's database goes back in time, the world does not (issue 22): detection against
the outward checkpoint file, the execution pause, ``recover``, the fence epoch and the restore
guard, against the real sandbox provider process and real PostgreSQL.

"The forgotten timeline" below is what a restore leaves behind: the provider applied an effect
(through the very adapter call a worker makes) that the ledger's database no longer records.
"""

from __future__ import annotations

import io
import json
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from operations import tasks
from operations.adapters.registry import get_adapter
from operations.audit.signing import audit_checkpoint_create
from operations.engine.calls import provider_call
from operations.engine.protocol import execute_intent
from operations.models import (
    FENCE_EPOCH_STRIDE,
    AuditCheckpoint,
    ExecutionControl,
    Intent,
    OutboxMessage,
    RecoveryRun,
)
from operations.restore.check import database_behind
from operations.restore.recovery import pause_if_behind, recover_with_rebaseline
from operations.selectors.leases import lease_held
from operations.services.failover import RECOVERY_LEASE, RecoveryPlan, RecoveryRunning, execution_control
from operations.services.leases import lease_release, lease_try_acquire
from tests.factories import charge_arguments, make_agent, submit
from tests.operations.test_restore_keys import lose

pytestmark = pytest.mark.django_db

EMAIL = {"to": "ada@example.test", "subject": "Your receipt", "body": "Thanks"}
RESERVATION = {"resource": "room-1", "start": "2026-01-01T10:00:00Z", "seats": 2}
PRODUCT = {"email.send": "email", "reservations.create": "reservations", "payments.charge": "payments"}
UNKEYED = [("email.send", EMAIL), ("reservations.create", RESERVATION)]


@pytest.fixture(autouse=True)
def signing(settings: Any, tmp_path: Path) -> Path:
    """A signing key created on first use, under ``tmp_path``; returns the checkpoint file."""
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "AUDIT_SIGNING_KEY_FILE": str(tmp_path / "keys" / "audit-signing-key.pem"),
        "AUDIT_SIGNING_KEY_CREATE": True,
        "AUDIT_PUBLIC_KEY_FILE": "",
    }
    return Path(settings.EFFECT_LEDGER["AUDIT_CHECKPOINT_FILE"])


def forgotten_send(intent: Intent, *, fence: int = 1) -> None:
    """The effect a timeline the database forgot made: the worker's own adapter call."""
    call = provider_call(intent, fence=fence, attempt_no=1, deadline_seconds=5.0)
    get_adapter(intent.action).execute(call)


def with_reference(action: str, arguments: dict[str, Any], reference: str) -> dict[str, Any]:
    """Reservations carry their reference in the arguments too (the provider lists by it)."""
    return {**arguments, "reference": reference} if action.startswith("reservations.") else arguments


def effects(sandbox: Any, action: str, reference: str) -> list[dict[str, Any]]:
    return [e for e in sandbox.ledger(PRODUCT[action], reference=reference) if e.get("kind") != "refund"]


def recover_now(since_minutes: int = 5) -> RecoveryRun:
    return recover_with_rebaseline(
        RecoveryPlan(
            since=timezone.now() - timedelta(minutes=since_minutes),
            margin_seconds=60,
            actor="user:ops",
            trigger="operator",
            reason="test",
        )
    )


def past_the_settle_point() -> None:
    """Move the recovery's start back beyond every window (test setup; the guard stays on)."""
    ExecutionControl.objects.filter(id=1).update(guard_started_at=timezone.now() - timedelta(days=1))
    Intent.objects.filter(status=Intent.Status.READY).update(not_before=None)


def go_back_in_time(*intents: Intent) -> None:
    """What a restore to just after checkpoint #1 does: checkpoint #2 (which saw ``intents``)
    is in the file only, and ``intents`` are gone from the database."""
    for intent in intents:
        lose(intent)
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        cursor.execute("DELETE FROM operations_auditcheckpoint WHERE number > 1")
        cursor.execute("SET session_replication_role = origin")


def a_restore_that_lost(reference: str) -> Intent:
    """Checkpoint #1, a charge only checkpoint #2 saw, then the database back to #1."""
    audit_checkpoint_create()
    lost = submit(arguments=charge_arguments(), reference=reference)
    audit_checkpoint_create()
    go_back_in_time(lost)
    return lost


def command(name: str, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command(name, *args, stdout=out, stderr=err)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


# -- item 1: READY at providers without keys --------------------------------------------


@pytest.mark.parametrize(("action", "arguments"), UNKEYED)
def test_i22_1_a_ready_intent_the_forgotten_timeline_sent_is_found_not_sent_again(
    sandbox: Any, action: str, arguments: dict[str, Any]
) -> None:
    # given: READY in the restored database, sent by the timeline it forgot
    intent = submit(
        action=action, arguments=with_reference(action, arguments, "order-1"), reference="order-1"
    )
    forgotten_send(intent)
    assert len(effects(sandbox, action, "order-1")) == 1
    # when: recovery ran, and a worker takes the intent
    recover_now()
    assert execute_intent(intent.id) == "succeeded"
    # then: found, not sent again; the receipt is the effect the forgotten timeline made
    assert len(effects(sandbox, action, "order-1")) == 1
    intent.refresh_from_db()
    assert intent.status == Intent.Status.SUCCEEDED
    (outcome,) = intent.outcomes.all()
    assert outcome.source == "reconciler"
    assert outcome.provider_reference == effects(sandbox, action, "order-1")[0]["id"]
    assert intent.attempts.get().result == "skipped"
    assert intent.audit_events.filter(event="outcome_found", data__sent=False).exists()


@pytest.mark.parametrize(("action", "arguments"), UNKEYED)
def test_i22_1_a_ready_intent_never_sent_waits_out_the_window_then_is_sent_once(
    sandbox: Any, action: str, arguments: dict[str, Any]
) -> None:
    intent = submit(
        action=action, arguments=with_reference(action, arguments, "order-2"), reference="order-2"
    )
    recover_now()
    # inside the provider's window an empty answer proves nothing: deferred, nothing sent
    assert execute_intent(intent.id) == "deferred"
    intent.refresh_from_db()
    assert intent.status == Intent.Status.READY
    assert intent.not_before is not None and intent.not_before > timezone.now()
    assert effects(sandbox, action, "order-2") == []
    assert OutboxMessage.objects.filter(intent=intent, sent_at__isnull=True).exists()
    # after it, nothing found means nothing was sent: sent once
    past_the_settle_point()
    assert execute_intent(intent.id) == "succeeded"
    assert len(effects(sandbox, action, "order-2")) == 1


def test_i22_1_a_keyed_provider_is_not_looked_up_first(sandbox: Any) -> None:
    intent = submit(arguments=charge_arguments(), reference="order-3")
    recover_now()
    assert execute_intent(intent.id) == "succeeded"
    assert intent.attempts.get().result == "succeeded"
    assert len(effects(sandbox, "payments.charge", "order-3")) == 1


def test_i22_1_without_a_recovery_there_is_no_look_up_before_sending(sandbox: Any) -> None:
    intent = submit(action="email.send", arguments=EMAIL, reference="order-4")
    assert execute_intent(intent.id) == "succeeded"
    assert intent.attempts.get().result == "succeeded"


def test_i22_1_an_inconclusive_look_up_under_the_guard_ends_unknown(sandbox: Any) -> None:
    intent = submit(action="email.send", arguments=EMAIL, reference="order-5")
    recover_now()
    with pytest.MonkeyPatch.context() as patch:
        from operations.adapters.base import LookupResult, LookupStatus

        patch.setattr(
            "operations.engine.restore_guard.provider_lookup",
            lambda intent: LookupResult(status=LookupStatus.INCONCLUSIVE, detail={"error": "timeout"}),
        )
        assert execute_intent(intent.id) == "unknown"
    intent.refresh_from_db()
    assert intent.status == Intent.Status.UNKNOWN
    assert effects(sandbox, "email.send", "order-5") == []


# -- item 2: fences after a restore ------------------------------------------------------


def test_i22_2_after_recovery_a_claim_is_above_every_fence_the_provider_saw(sandbox: Any) -> None:
    # given: the forgotten timeline charged under fence 7; the restored row says fence 0
    intent = submit(arguments=charge_arguments(), reference="order-6")
    forgotten_send(intent, fence=7)
    # when
    run = recover_now()
    assert execute_intent(intent.id) == "succeeded"
    # then: the provider replayed its charge (no stale_fence, no UNKNOWN, one charge)
    intent.refresh_from_db()
    assert intent.fence == run.fence_epoch_after * FENCE_EPOCH_STRIDE + 1
    assert intent.fence > 7 and intent.fence < 2**53
    assert intent.outcomes.get().detail["replayed"] is True
    assert len(effects(sandbox, "payments.charge", "order-6")) == 1


def test_i22_2_the_epoch_never_goes_down(sandbox: Any) -> None:
    first = recover_now()
    second = recover_now()
    assert second.fence_epoch_before == first.fence_epoch_after
    assert second.fence_epoch_after > first.fence_epoch_after


# -- item 3: lost intents re-submitted -----------------------------------------------------


@pytest.mark.parametrize(("action", "arguments"), [*UNKEYED, ("payments.charge", charge_arguments())])
def test_i22_3_a_lost_intent_resubmitted_after_recovery_has_one_effect(
    sandbox: Any, action: str, arguments: dict[str, Any]
) -> None:
    # given: an intent executed, then lost by a restore
    first = submit(
        action=action,
        arguments=with_reference(action, arguments, "order-7"),
        reference="order-7",
        client_key="call-7",
    )
    assert execute_intent(first.id) == "succeeded"
    lose(first)
    recover_now()
    # when: the agent re-submits with the same Idempotency-Key
    again = submit(
        action=action,
        arguments=with_reference(action, arguments, "order-7"),
        reference="order-7",
        client_key="call-7",
    )
    assert execute_intent(again.id) == "succeeded"
    # then: one effect at the provider, and it is the intent's receipt
    (effect,) = effects(sandbox, action, "order-7")
    assert again.outcomes.get().provider_reference == effect["id"]


# -- detection, pause and recovery ---------------------------------------------------------


def test_i22_detection_pauses_execution_and_submissions_go_on(sandbox: Any, signing: Path) -> None:
    # given: checkpoint #1; a charge submitted, checkpoint #2; then the database goes back
    # to #1 (the charge with it) and an email READY from before it remains
    email = submit(action="email.send", arguments=EMAIL, reference="order-8")
    a_restore_that_lost("order-9")
    # when: a worker starts (its check)
    behind = pause_if_behind(actor="detector:test")
    # then: behind, paused, nothing claimed or sent
    assert behind is not None and behind.file_number == 2 and behind.database_newest == 1
    assert "went back in time" in behind.reason
    assert execute_intent(email.id) == "paused"
    assert effects(sandbox, "email.send", "order-8") == []
    # submissions are still accepted and stored
    _, token = make_agent("agent-9")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    response = api.post(
        "/api/v1/intents",
        data=json.dumps({"action": "email.send", "arguments": EMAIL, "reference": "order-10"}),
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="call-10",
    )
    assert response.status_code == 201, response.content
    # and the beat signs no checkpoint over the older state
    assert tasks.audit_checkpoint() is None
    assert AuditCheckpoint.objects.count() == 1


def test_i22_the_beat_check_recovers_by_itself(sandbox: Any, settings: Any) -> None:
    email = submit(action="email.send", arguments=EMAIL, reference="order-11")
    a_restore_that_lost("order-12")
    assert tasks.restore_check() == "recovered"
    control = execution_control()
    assert control.paused_at is None and control.fence_epoch > 0
    run = RecoveryRun.objects.get()
    assert run.trigger == "detector" and run.finished_at is not None and run.checkpoint_number == 3
    assert run.counts["ready_redispatched"] == 1
    assert database_behind() is None
    assert tasks.restore_check() == "level"
    # the email goes through the guard: deferred (nothing found yet), not sent
    assert execute_intent(email.id) == "deferred"


def test_i22_without_automatic_recovery_execution_stays_paused(sandbox: Any, settings: Any) -> None:
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "RECOVER_AUTOMATICALLY": False}
    a_restore_that_lost("order-13")
    assert tasks.restore_check() == "paused"
    assert execution_control().paused_at is not None
    assert not RecoveryRun.objects.exists()
    # the operator runs recover
    code, out, err = command("recover", "--since", (timezone.now() - timedelta(minutes=10)).isoformat())
    assert (code, err) == (0, "")
    assert "execution resumed" in out and "audit checkpoint #3 re-baselined" in out
    assert execution_control().paused_at is None


def test_i22_4_verify_audit_reports_the_restore_and_then_the_rebaseline(sandbox: Any) -> None:
    a_restore_that_lost("order-14")
    # before recovery: not "intact"
    code, _, err = command("verify_audit")
    assert code == 1
    assert "the file's checkpoint #2 is not in the database (its newest is #1)" in err
    # after: passes, and says what happened on every run
    recover_now()
    code, out, err = command("verify_audit")
    assert (code, err) == (0, "")
    assert (
        "a recovery after the database went back in time: checkpoint(s) #2 only in the checkpoint file" in out
    )
    assert "  accepted: " in out
    assert "reason: recovery #" in out
    assert "all in the database except 1 lost by a restore and re-baselined" in out
    # the series goes on: the beat signs #4 after new events
    submit(arguments=charge_arguments(), reference="order-15")
    assert tasks.audit_checkpoint() == 4
    assert command("verify_audit")[0] == 0
    assert command("verify_audit", "--database-only")[0] == 0


def test_i22_5_recovery_gives_every_ready_intent_a_fresh_message_at_once(sandbox: Any) -> None:
    # given: READY intents whose messages were consumed before the restore
    ready = [submit(action="email.send", arguments=EMAIL, reference=f"order-r{i}") for i in range(3)]
    OutboxMessage.objects.update(sent_at=timezone.now(), acked_at=timezone.now())
    # when
    run = recover_now()
    # then: each has an unconsumed message due now, audited
    assert run.counts["ready_redispatched"] == 3
    for intent in ready:
        assert OutboxMessage.objects.filter(
            intent=intent, acked_at__isnull=True, due_at__lte=timezone.now()
        ).exists()
        assert intent.audit_events.filter(
            event="redispatched", reason__startswith=f"recovery #{run.pk}"
        ).exists()


@pytest.mark.parametrize(("action", "arguments"), UNKEYED)
def test_i22_an_unknown_intent_at_the_restore_is_looked_up_at_once_and_settles_with_one_effect(
    sandbox: Any, action: str, arguments: dict[str, Any]
) -> None:
    from reconciliation.lookups import reconcile_unknown

    # given: UNKNOWN at the restore point (the provider applied it, then answered 500), its
    # next look-up an hour away
    unknown = submit(
        action=action, arguments=with_reference(action, arguments, "order-u"), reference="order-u"
    )
    sandbox.inject("error_500_after_effect")
    assert execute_intent(unknown.id) == "unknown"
    Intent.objects.filter(id=unknown.id).update(next_lookup_at=timezone.now() + timedelta(hours=1))
    # when
    run = recover_now()
    # then: due now, found by the reconciler's next pass, never sent again
    assert run.counts["unknown_looked_up"] == 1
    assert reconcile_unknown().resolved == 1
    unknown.refresh_from_db()
    assert unknown.status == Intent.Status.SUCCEEDED
    assert len(effects(sandbox, action, "order-u")) == 1


def test_i22_recovery_checks_recent_successes_at_providers_without_keys_for_duplicates(sandbox: Any) -> None:
    email = submit(action="email.send", arguments=EMAIL, reference="order-d")
    charge = submit(arguments=charge_arguments(), reference="order-c")
    assert execute_intent(email.id) == "succeeded" and execute_intent(charge.id) == "succeeded"
    run = recover_now()
    assert run.counts["duplicate_checks"] == 1
    email.refresh_from_db()
    charge.refresh_from_db()
    assert email.next_duplicate_check_at is not None and email.duplicate_check_until is not None
    assert charge.next_duplicate_check_at is None  # keyed: no duplicate is possible


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "yesterday"], "not an ISO 8601 date-time"),
        (["--since", "2999-01-01T00:00:00Z"], "is in the future"),
        (["--since", "2026-01-01T00:00:00Z", "--margin", "-1"], "--margin must be from 0"),
        (["--since", "0001-01-01T00:00:00Z"], "is before 2000"),
        (["--since", "2026-12-01T09:00:00"], "has no UTC offset"),
        (["--since", "2026-12-01"], "has no UTC offset"),
        (["--since", "2026-12-01T09:00:00+25:00"], "not a valid date-time"),
        (["--since", "2026-12-01T09:00:00+23:59"], "more than 14 hours from UTC"),
        (["--since", "2026-01-01T00:00:00Z", "--actor", "ops\x1b[2J"], "--actor must be printable"),
        (["--since", "2026-01-01T00:00:00Z", "--accept-audit-faults", " "], "needs a printable reason"),
        (["--since", "2026-01-01T00:00:00Z", "--accept-audit-faults", "x" * 501], "at most 500 characters"),
    ],
)
def test_i22_recover_refuses_bad_input_and_changes_nothing(args: list[str], message: str) -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match=message):
        call_command("recover", *args, stdout=io.StringIO(), stderr=io.StringIO())
    assert not RecoveryRun.objects.exists()
    assert execution_control().fence_epoch == 0


@pytest.mark.django_db(transaction=True)
def test_i22_a_second_recovery_at_once_is_refused() -> None:
    # given: another recovery holds the lease
    held = lease_try_acquire(name=RECOVERY_LEASE, ttl_seconds=60)
    assert held is not None
    try:
        # when / then
        with pytest.raises(RecoveryRunning):
            recover_now()
        assert not RecoveryRun.objects.exists()
    finally:
        lease_release(held)
    # and once it is released, a recovery runs and releases it in turn
    recover_now()
    assert not lease_held(name=RECOVERY_LEASE)


def test_i22_the_dashboard_shows_the_pause_and_the_recoveries(sandbox: Any, client: Any) -> None:
    from tests.factories import UserFactory

    a_restore_that_lost("order-16")
    pause_if_behind(actor="detector:test")
    client.force_login(UserFactory(username="viewer-22", groups=["viewer"]))
    page = client.get("/").content.decode()
    assert 'id="execution-paused"' in page and "went back in time" in page
    recover_now()
    page = client.get("/").content.decode()
    assert 'id="execution-paused"' not in page
    assert "checkpoint #3 re-baselined" in page and "ready_redispatched" in page


def test_i22_1_without_keys_or_a_look_up_the_guard_holds_for_a_person_who_may_release(
    sandbox: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from operations.adapters.base import Capabilities, LookupKind
    from operations.services import intent_release_held

    # given: a provider with neither keys nor a look-up (the sandbox's email, declared so)
    blind = Capabilities(idempotency_keys=False, lookup=LookupKind.NONE)
    monkeypatch.setattr("operations.engine.restore_guard.capabilities_for", lambda action: blind)
    intent = submit(action="email.send", arguments=EMAIL, reference="order-17")
    recover_now()
    # when / then: held, nothing sent, the reason says why
    assert execute_intent(intent.id) == "held"
    intent.refresh_from_db()
    assert intent.status == Intent.Status.HELD and intent.hold_reason.startswith("restore guard:")
    assert effects(sandbox, "email.send", "order-17") == []
    # the console says why (not "not served here")
    from django.test import Client

    from tests.factories import UserFactory

    client = Client()
    client.force_login(UserFactory(username="ops-17", groups=["operator"]))
    queue = client.get("/unknown/").content.decode()
    assert "after a restore" in queue and "not served here" not in queue
    detail = client.get(f"/held/{intent.id}/").content.decode()
    assert "Held for a person after a failover or restore" in detail
    # a person who checked with the provider releases it: sent once, not held again
    intent_release_held(intent_id=intent.id, actor="user:ops", reason="checked: never sent")
    Intent.objects.filter(id=intent.id).update(not_before=None)
    assert execute_intent(intent.id) == "succeeded"
    assert len(effects(sandbox, "email.send", "order-17")) == 1


def rewind(intent: Intent, *, to_seq: int, status: str) -> None:
    """What a restore does to an intent a forgotten timeline changed: its chain back to
    ``to_seq`` events, its row back to ``status`` (behind the triggers, as a restore is)."""
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        cursor.execute(
            "DELETE FROM operations_auditevent WHERE intent_id = %s AND seq > %s", [intent.id, to_seq]
        )
        cursor.execute("UPDATE operations_intent SET status = %s WHERE id = %s", [status, intent.id])
        cursor.execute("DELETE FROM operations_auditcheckpoint WHERE number > 1")
        cursor.execute("SET session_replication_role = origin")


@pytest.mark.parametrize(("action", "arguments"), [*UNKEYED, ("payments.charge", charge_arguments())])
def test_i22_a_cancel_the_restore_forgot_is_not_executed(
    sandbox: Any, action: str, arguments: dict[str, Any]
) -> None:
    from operations.services import intent_cancel
    from reconciliation.lookups import reconcile_unknown

    # given: READY at checkpoint #1; the agent cancelled it (200 CANCELLED), checkpoint #2 saw that;
    # then the database went back to #1
    intent = submit(
        action=action, arguments=with_reference(action, arguments, "order-x"), reference="order-x"
    )
    audit_checkpoint_create()
    seq = intent.audit_events.count()
    intent_cancel(intent_id=intent.id, actor="agent:agent-1")
    audit_checkpoint_create()
    rewind(intent, to_seq=seq, status=Intent.Status.READY)
    # when: recovery runs
    assert tasks.restore_check() == "recovered"
    run = RecoveryRun.objects.get()
    assert run.counts["changed_after_restore_point"] == 1
    intent.refresh_from_db()
    # then: UNKNOWN (not re-dispatched), flagged, looked up by the reconciler
    assert intent.forgotten_changes and intent.status == Intent.Status.UNKNOWN
    assert run.counts["ready_redispatched"] == 0
    reconcile_unknown()
    intent.refresh_from_db()
    if action == "payments.charge":
        # the keyed provider's authoritative "absent" sends it back to READY, but the guard
        # looks again and holds it for a person: the lost change may have been a cancel
        assert intent.status == Intent.Status.READY
        past_the_settle_point()
        assert execute_intent(intent.id) == "held"
        intent.refresh_from_db()
        assert "cancelled, rejected or refused" in intent.hold_reason
    else:
        assert intent.status == Intent.Status.UNKNOWN  # nothing found proves nothing: an operator decides
    assert effects(sandbox, action, "order-x") == []


@pytest.mark.parametrize(("action", "arguments"), [*UNKEYED, ("payments.charge", charge_arguments(20_000))])
def test_i22_an_intent_the_forgotten_timeline_approved_and_sent_cannot_be_ended_without_its_effect(
    sandbox: Any, action: str, arguments: dict[str, Any]
) -> None:
    from operations.audit.trail import audit_append
    from operations.exceptions import IntentMoved
    from operations.services import intent_cancel
    from reconciliation.lookups import reconcile_unknown

    # given: waiting at checkpoint #1 (a charge above the approval threshold; the others READY);
    # the forgotten timeline approved and sent it; checkpoint #2 saw that
    intent = submit(
        action=action, arguments=with_reference(action, arguments, "order-a"), reference="order-a"
    )
    before = intent.status
    audit_checkpoint_create()
    seq = intent.audit_events.count()
    forgotten_send(intent)
    audit_append(
        intent_id=intent.id, event="approved", actor="user:alice", from_status=before, to_status=before
    )
    audit_checkpoint_create()
    rewind(intent, to_seq=seq, status=before)
    # when
    assert tasks.restore_check() == "recovered"
    intent.refresh_from_db()
    # then: UNKNOWN, so no reject, expiry or cancel can end it while its effect exists
    assert intent.status == Intent.Status.UNKNOWN
    with pytest.raises(IntentMoved):
        intent_cancel(intent_id=intent.id, actor="agent:agent-1")
    reconcile_unknown()
    intent.refresh_from_db()
    assert intent.status == Intent.Status.SUCCEEDED
    assert len(effects(sandbox, action, "order-a")) == 1


def test_i22_automatic_recovery_refuses_what_a_restore_does_not_do(sandbox: Any) -> None:
    # given: two finished charges that checkpoint #1 saw; later checkpoint #2
    done = [submit(arguments=charge_arguments(), reference=f"order-t{i}") for i in range(2)]
    for intent in done:
        assert execute_intent(intent.id) == "succeeded"
    audit_checkpoint_create()
    submit(arguments=charge_arguments(), reference="order-t2")
    audit_checkpoint_create()
    # when: someone deletes the two charges' rows and checkpoint #2 (to look like a restore)
    go_back_in_time(*done)
    # then: paused, not re-baselined; not retried by itself; a person must accept the faults
    assert tasks.restore_check() == "refused"
    run = RecoveryRun.objects.get()
    assert run.error.startswith("AuditFaultsRefused: the database does not match its own audit log")
    assert run.finished_at is None and run.checkpoint_number is None
    assert execution_control().paused_at is not None
    assert tasks.restore_check() == "refused"
    assert RecoveryRun.objects.count() == 1
    code, _, err = command("recover", "--since", (timezone.now() - timedelta(minutes=10)).isoformat())
    assert code == 1 and "does not match its own audit log and newest checkpoint" in err
    assert execution_control().paused_at is not None
    code, out, err = command(
        "recover",
        "--since",
        (timezone.now() - timedelta(minutes=10)).isoformat(),
        "--accept-audit-faults",
        "INC-7",
    )
    assert (code, err) == (0, ""), err
    assert execution_control().paused_at is None
    code, out, _ = command("verify_audit")
    assert code == 0 and "audit faults accepted by the operator: INC-7" in out


def test_i22_a_missing_checkpoint_file_is_never_silent_and_a_new_file_restores_detection(
    signing: Path, client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from operations.restore.check import restore_detection
    from tests.factories import UserFactory

    audit_checkpoint_create()
    signing.unlink()
    # blind: logged on every check, on the dashboard
    assert restore_detection().state == "blind"
    assert database_behind() is None
    assert "restore check blind: the checkpoint file" in caplog.text
    client.force_login(UserFactory(username="viewer-b", groups=["viewer"]))
    assert '<strong class="warning">blind</strong>' in client.get("/").content.decode()
    # the next checkpoint starts a new file, and the check works again
    lost = submit(arguments=charge_arguments(), reference="order-b")
    audit_checkpoint_create()
    assert restore_detection().state == "level"
    submit(arguments=charge_arguments(), reference="order-b2")
    audit_checkpoint_create()
    go_back_in_time(lost)
    assert restore_detection().state == "behind"


def test_i22_a_database_without_checkpoints_beside_this_ledgers_file_is_behind(signing: Path) -> None:
    from operations.audit.signing import DatabaseBehindError
    from operations.restore.check import restore_detection

    audit_checkpoint_create()
    lines = signing.read_text().splitlines()
    # restored to before its first checkpoint (or created afresh beside the old file)
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        cursor.execute("DELETE FROM operations_auditcheckpoint")
        cursor.execute("SET session_replication_role = origin")
    assert restore_detection().state == "behind"
    with pytest.raises(DatabaseBehindError, match="holds no audit checkpoint"):
        audit_checkpoint_create()
    assert signing.read_text().splitlines() == lines  # no second #1 in the file
    # a restore to before the first checkpoint cannot be told from a wiped database: a person
    # decides, and recovery then continues the file's series
    assert tasks.restore_check() == "refused"
    assert "holds no audit checkpoint" in RecoveryRun.objects.get().error
    since = (timezone.now() - timedelta(minutes=10)).isoformat()
    code, _, err = command(
        "recover", "--since", since, "--accept-audit-faults", "INC-9: restored from backup"
    )
    assert (code, err) == (0, "")
    assert AuditCheckpoint.objects.get().number == 2
    assert restore_detection().state == "level"


def test_i22_a_file_of_another_ledger_is_not_written_into(
    signing: Path, settings: Any, tmp_path: Path
) -> None:
    from operations.audit.signing import DatabaseBehindError
    from operations.restore.check import restore_detection

    audit_checkpoint_create()
    lines = signing.read_text().splitlines()
    # another ledger (its own key, no checkpoint yet) configured with this file
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        cursor.execute("DELETE FROM operations_auditcheckpoint")
        cursor.execute("SET session_replication_role = origin")
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "AUDIT_SIGNING_KEY_FILE": str(tmp_path / "other" / "key.pem"),
    }
    from operations.audit.keys import signing_key_load

    signing_key_load(create=True)
    assert restore_detection().state == "foreign"
    with pytest.raises(DatabaseBehindError, match="another key"):
        audit_checkpoint_create()
    assert signing.read_text().splitlines() == lines


def test_i22_a_torn_last_line_does_not_swallow_the_next_checkpoint(signing: Path) -> None:
    from operations.audit.checkpoint_file import checkpoint_file_read
    from operations.audit.checkpoints import CheckpointError
    from operations.restore.check import restore_detection

    audit_checkpoint_create()
    submit(arguments=charge_arguments())
    audit_checkpoint_create()
    signing.write_bytes(signing.read_bytes()[:-50])  # a crash mid-write
    assert restore_detection().state == "blind"
    submit(arguments=charge_arguments())
    audit_checkpoint_create()
    last = signing.read_bytes().splitlines()[-1]
    assert last.startswith(b'{"checkpoint":{') and last.endswith(b'"}')
    assert restore_detection().state == "level"
    with pytest.raises(CheckpointError, match="line 2"):
        list(checkpoint_file_read(signing))  # verify_audit names the torn line


def test_i22_a_long_rebaseline_statement_keeps_detection_working(signing: Path) -> None:
    from operations.restore.check import restore_detection
    from operations.services import intent_cancel

    # given: 700 READY intents at checkpoint #1, each cancelled before checkpoint #2, then the
    # database back to #1: 700 cut-back chains, listed in the re-baseline's statement
    intents = [submit(arguments=charge_arguments(), reference=f"order-l{i}") for i in range(700)]
    audit_checkpoint_create()
    seq = intents[0].audit_events.count()
    for intent in intents:
        intent_cancel(intent_id=intent.id, actor="agent:agent-1")
    audit_checkpoint_create()
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        cursor.execute(
            "DELETE FROM operations_auditevent WHERE intent_id = ANY(%s) AND seq > %s",
            [[i.id for i in intents], seq],
        )
        cursor.execute(
            "UPDATE operations_intent SET status = 'READY' WHERE id = ANY(%s)", [[i.id for i in intents]]
        )
        cursor.execute("DELETE FROM operations_auditcheckpoint WHERE number > 1")
        cursor.execute("SET session_replication_role = origin")
    # when
    assert tasks.restore_check() == "recovered"
    # then: the statement is longer than the first read, and the check still reads it
    assert len(signing.read_text().splitlines()[-1]) > 64 * 1024
    assert restore_detection().state == "level"


def test_i22_deleting_the_whole_audit_log_is_not_taken_for_a_restore(sandbox: Any) -> None:
    # given: finished charges, a checkpoint; then every audit event and checkpoint deleted
    for i in range(2):
        assert execute_intent(submit(arguments=charge_arguments(), reference=f"order-w{i}").id) == "succeeded"
    audit_checkpoint_create()
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        cursor.execute("DELETE FROM operations_auditevent")
        cursor.execute("DELETE FROM operations_auditcheckpoint")
        cursor.execute("SET session_replication_role = origin")
    # then: refused and paused (a restore never leaves SUCCEEDED intents without their chains)
    assert tasks.restore_check() == "refused"
    error = RecoveryRun.objects.get().error
    assert "has no audit events" in error or "no chain" in error or "its chain was deleted" in error, error
    assert execution_control().paused_at is not None


def test_i22_an_approval_request_the_forgotten_timeline_rejected_is_held_not_failed(sandbox: Any) -> None:
    from operations.services import intent_reject
    from reconciliation.lookups import reconcile_unknown
    from tests.factories import UserFactory

    # given: a charge waiting for approval at checkpoint #1, rejected before checkpoint #2
    intent = submit(arguments=charge_arguments(50_000), reference="order-r")
    assert intent.status == Intent.Status.AWAITING_APPROVAL
    audit_checkpoint_create()
    seq = intent.audit_events.count()
    intent_reject(
        intent_id=intent.id,
        user=UserFactory(username="bob", groups=["approver"]),
        request_hash=intent.request_hash,
        reason="too big",
    )
    audit_checkpoint_create()
    rewind(intent, to_seq=seq, status=Intent.Status.AWAITING_APPROVAL)
    # when: recovery, the reconciler's lookup (absent: back to READY), a worker after the window
    assert tasks.restore_check() == "recovered"
    reconcile_unknown()
    past_the_settle_point()
    assert execute_intent(intent.id) == "held"
    # then: held for a person, not FAILED for its missing approval; nothing charged
    intent.refresh_from_db()
    assert intent.status == Intent.Status.HELD
    assert effects(sandbox, "payments.charge", "order-r") == []


def test_i22_a_restore_guard_shorter_than_its_settle_point_is_warned_about(settings: Any) -> None:
    from operations.checks import restore_guard_check

    assert restore_guard_check() == []
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "RESTORE_GUARD_SECONDS": 20.0}
    (warning,) = restore_guard_check()
    assert (
        warning.id == "operations.W004"
        and "email.send" in warning.msg
        and "payments.charge" not in warning.msg
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("change", ["pause", "epoch"])
def test_i13_a_claim_that_waited_for_the_row_lock_sees_a_pause_committed_meanwhile(change: str) -> None:
    """Issue 13 review: the claim's UPDATE reads the execution control row in the snapshot it
    took before waiting for the intent's row lock; a pause (or a recovery's new fence epoch)
    committed during the wait must still stop the claim."""
    import time

    from django.db import transaction

    from operations.models import Attempt
    from operations.services import intent_claim
    from operations.services.failover import execution_pause, execution_resume

    execution_control()
    intent = submit()
    locked, release = threading.Event(), threading.Event()
    result: dict[str, Any] = {}

    def hold_the_row_lock() -> None:
        try:
            with transaction.atomic():
                Intent.objects.select_for_update().filter(id=intent.id).exists()
                locked.set()
                release.wait(10)
        finally:
            connection.close()

    def claim() -> None:
        try:
            result["claim"] = intent_claim(intent_id=intent.id, worker="w1", lease_seconds=30)
        finally:
            connection.close()

    holder, claimer = threading.Thread(target=hold_the_row_lock), threading.Thread(target=claim)
    holder.start()
    assert locked.wait(10)
    claimer.start()
    time.sleep(0.5)  # the claim's UPDATE now waits for the row lock
    # when: a pause (or a recovery's epoch) commits while the claim waits
    if change == "pause":
        assert execution_pause(reason="database behind", actor="detector:test")
    else:
        ExecutionControl.objects.filter(id=1).update(fence_epoch=3)
    release.set()
    holder.join(10)
    claimer.join(10)
    # then: nothing claimed, no attempt spent, the intent still READY with its fence
    assert result["claim"] is None
    intent.refresh_from_db()
    assert (intent.status, intent.attempt_count, intent.fence) == ("READY", 0, 0)
    assert not Attempt.objects.filter(intent=intent).exists()
    # and once execution may go on, the claim takes a fence above the epoch
    execution_resume(actor="user:op")
    claimed = intent_claim(intent_id=intent.id, worker="w2", lease_seconds=30)
    assert claimed is not None
    epoch = ExecutionControl.objects.get(id=1).fence_epoch
    assert claimed.fence > epoch * FENCE_EPOCH_STRIDE
