"""Signed audit checkpoints (issue 11 item 1): deleted tails, deleted chains, recomputed chains
and truncation are found against the latest checkpoint, by name, and ``verify_audit`` exits 1.

Faults are made the way an attacker with superuser rights would: ``session_replication_role =
replica`` turns the append-only triggers off for the statements in between.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import zlib
from pathlib import Path
from typing import Any

import pytest
import time_machine
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction
from django.test import Client
from django.urls import reverse

from console.celery import app as celery_app
from operations import metrics, tasks
from operations.audit.chain_checks import audit_verify
from operations.audit.checkpoint_file import checkpoint_from_file
from operations.audit.checkpoints import SignedCheckpoint, leaf_input
from operations.audit.keys import public_key_load, public_key_pem, signing_key_create
from operations.audit.merkle import leaf_hash, merkle_root, node_hash
from operations.audit.signing import CheckpointRefusedError, audit_checkpoint_create
from operations.audit.trail import GENESIS, audit_append, event_hash
from operations.checks import audit_signing_key_check
from operations.models import AuditCheckpoint, AuditEvent, Intent
from operations.services import intent_cancel, intent_record_refusal
from tests.factories import UserFactory, submit

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def checkpoint_files(settings: Any, tmp_path: Path) -> dict[str, Path]:
    """A signing key created on first use and a checkpoint file, both under ``tmp_path``."""
    paths = {"key": tmp_path / "keys" / "audit-signing-key.pem", "file": tmp_path / "audit-checkpoints.jsonl"}
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "AUDIT_SIGNING_KEY_FILE": str(paths["key"]),
        "AUDIT_SIGNING_KEY_CREATE": True,
        "AUDIT_PUBLIC_KEY_FILE": "",
        "AUDIT_CHECKPOINT_FILE": str(paths["file"]),
    }
    return paths


def behind_the_triggers(*statements: tuple[str, list[Any]]) -> None:
    """Run SQL with the append-only triggers off, as a superuser can."""
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        for sql, params in statements:
            cursor.execute(sql, params)
        cursor.execute("SET session_replication_role = origin")


def verify(*args: str, configured_file: bool = False) -> tuple[int, str, str]:
    """``verify_audit`` against the stored checkpoints (``--database-only``), unless the test
    names a file or asks for the configured one (``configured_file``: the command's default)."""
    if not configured_file and "--checkpoint-file" not in args:
        args = ("--database-only", *args)
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("verify_audit", *args, stdout=out, stderr=err)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


def chain(intent: Intent) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(intent=intent).order_by("seq"))


def cancelled() -> Intent:
    """An intent with a two-event chain (submitted, cancelled)."""
    intent = submit()
    intent_cancel(intent_id=intent.id, actor="agent:agent-1")
    return intent


def with_quiet_tail(intent: Intent) -> int:
    """Append an event that moves nothing (a refused decision) to ``intent``'s chain and return
    its seq: deleting it leaves a valid chain whose last transition still matches the row."""
    event = intent_record_refusal(
        intent_id=intent.id, actor="user:mallory", decision="approve", reason="not awaiting approval"
    )
    assert event is not None
    return event.seq


def forge_checkpoint_over_a_deleted_tail(victim: Intent) -> None:
    """Delete ``victim``'s tail (seq 2) and rewrite the checkpoint's heads, root and count to
    match, past the triggers: only the signature can tell."""
    heads, root = forged_heads(victim, 1)
    behind_the_triggers(
        ("DELETE FROM operations_auditevent WHERE intent_id = %s AND seq = 2", [victim.id]),
        ("UPDATE operations_auditcheckpoint SET heads = %s, root = %s, events = 1", [heads, root]),
    )


def forged_heads(intent: Intent, seq: int) -> tuple[bytes, str]:
    """Compressed heads and their Merkle root claiming ``intent``'s chain ends at ``seq``."""
    leaf = leaf_input(str(intent.id), seq, chain(intent)[seq - 1].hash)
    return zlib.compress(f"[{leaf}]".encode()), merkle_root([leaf.encode()])


# --- the checkpoint itself ------------------------------------------------------------------


def test_i11_1_merkle_root_is_the_rfc9162_tree_hash() -> None:
    # given: RFC 9162 §2.1.1 written as its recursion
    def mth(items: list[bytes]) -> bytes:
        if not items:
            return hashlib.sha256(b"").digest()
        if len(items) == 1:
            return leaf_hash(items[0])
        k = 1
        while k * 2 < len(items):
            k *= 2
        return node_hash(mth(items[:k]), mth(items[k:]))

    # then: the one-pass accumulator agrees for every size, complete trees or not
    for size in range(0, 40):
        items = [f"leaf {i}".encode() for i in range(size)]
        assert merkle_root(items) == mth(items).hex(), size
    assert merkle_root([]) == hashlib.sha256(b"").hexdigest()


def test_i11_1_checkpoint_records_every_head_signs_and_writes_outward(
    checkpoint_files: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    # given
    first, second = cancelled(), submit()
    # when
    with caplog.at_level(logging.INFO, logger="operations.audit.checkpoints"):
        row = audit_checkpoint_create()
    # then: the heads, in intent order, with their Merkle root and the events they cover
    assert row is not None and row.number == 1 and row.prev_hash == GENESIS
    expected = sorted((str(i.id), e.seq, e.hash) for i in (first, second) for e in chain(i)[-1:])
    stored = SignedCheckpoint.from_row(row)
    assert stored.head_rows() == expected
    assert row.root == merkle_root(leaf_input(*head).encode() for head in expected)
    assert (row.chains, row.events) == (2, 3)
    # the key file was created private to its owner
    assert checkpoint_files["key"].stat().st_mode & 0o777 == 0o600
    # written outward: the file's last line is the same signed checkpoint; one log record
    assert checkpoint_from_file(checkpoint_files["file"]) == stored
    [record] = [r for r in caplog.records if r.getMessage() == "audit checkpoint signed"]
    assert record.audit_checkpoint["root"] == row.root  # type: ignore[attr-defined]
    assert record.signature == row.signature  # type: ignore[attr-defined]
    # the next checkpoint links to this one
    later = audit_checkpoint_create()
    assert later is not None and later.number == 2 and later.prev_hash == stored.statement_hash()
    assert len(checkpoint_files["file"].read_text().splitlines()) == 2


def test_i11_1_checkpoint_rows_are_append_only() -> None:
    # given
    submit()
    audit_checkpoint_create()
    with connection.cursor() as cursor:  # PostgreSQL refuses TRUNCATE while FK checks are pending
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    # when / then
    with pytest.raises(DatabaseError, match="append-only: UPDATE refused"), transaction.atomic():
        AuditCheckpoint.objects.update(events=0)
    with pytest.raises(DatabaseError, match="append-only: DELETE refused"), transaction.atomic():
        AuditCheckpoint.objects.all().delete()
    with (
        pytest.raises(DatabaseError, match="append-only: TRUNCATE refused"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("TRUNCATE operations_auditcheckpoint")
    assert AuditCheckpoint.objects.count() == 1


def test_i11_1_beat_checkpoints_only_when_the_log_changed() -> None:
    # given
    intent = submit()
    # when / then
    assert celery_app.conf.beat_schedule["audit-checkpoint"]["task"] == "operations.audit_checkpoint"
    assert tasks.audit_checkpoint() == 1
    assert tasks.audit_checkpoint() is None  # nothing new: no second checkpoint
    intent_cancel(intent_id=intent.id, actor="agent:agent-1")
    assert tasks.audit_checkpoint() == 2


# --- what verification finds ----------------------------------------------------------------


def test_i11_1_events_appended_after_a_checkpoint_are_no_fault() -> None:
    # given
    growing = submit()
    submit()
    audit_checkpoint_create()
    # when: the chains grow and new ones start
    intent_cancel(intent_id=growing.id, actor="agent:agent-1")
    submit()
    # then
    code, out, err = verify()
    assert (code, err) == (0, "")
    assert out.startswith("audit chain intact: 4 events verified\n")
    assert "audit checkpoint #1 (database" in out
    assert "2 chains and 2 events all present, 2 events written since" in out


def test_i11_1_deleted_tail_is_detected_against_the_checkpoint() -> None:
    # given
    victim = cancelled()
    tail = with_quiet_tail(victim)
    submit()
    audit_checkpoint_create()
    # when: the newest event of one chain is deleted (what is left is still a valid chain, and
    # its last transition still matches the intent's row)
    behind_the_triggers(
        ("DELETE FROM operations_auditevent WHERE intent_id = %s AND seq = %s", [victim.id, tail])
    )
    assert list(audit_verify()) == []
    # then
    code, _, err = verify()
    assert code == 1
    assert (
        f"audit checkpoint #1: deleted tail: intent {victim.id} has seq 2 but checkpoint #1 saw seq 3" in err
    )


def test_i11_1_deleted_chain_is_detected_against_the_checkpoint() -> None:
    # given
    victim, survivor = cancelled(), submit()
    audit_checkpoint_create()
    # when: every event of one intent is deleted
    behind_the_triggers(("DELETE FROM operations_auditevent WHERE intent_id = %s", [victim.id]))
    # (the chain walk sees an intent without a chain, but not what the chain held)
    assert [(b.intent_id, b.problem) for b in audit_verify()] == [
        (str(victim.id), "the intent is CANCELLED but has no audit events: its chain was deleted")
    ]
    # then: that chain is named, the other is fine, and it is not called a truncation
    code, _, err = verify()
    assert code == 1
    assert f"deleted chain: intent {victim.id} has no events but checkpoint #1 saw seq 2" in err
    assert str(survivor.id) not in err and "truncation" not in err


def test_i11_1_recomputed_chain_is_detected_against_the_checkpoint() -> None:
    # given
    victim = cancelled()
    audit_checkpoint_create()
    # when: the first event is edited and the chain re-hashed from there, so every link holds
    prev_hash = GENESIS
    for event in chain(victim):
        actor = "user:mallory" if event.seq == 1 else event.actor
        new_hash = event_hash(
            intent_id=victim.id,
            seq=event.seq,
            event=event.event,
            from_status=event.from_status,
            to_status=event.to_status,
            actor=actor,
            reason=event.reason,
            data=event.data,
            created_at=event.created_at.isoformat(),
            prev_hash=prev_hash,
        )
        behind_the_triggers(
            (
                "UPDATE operations_auditevent SET actor = %s, prev_hash = %s, hash = %s WHERE id = %s",
                [actor, prev_hash, new_hash, event.id],
            )
        )
        prev_hash = new_hash
    assert list(audit_verify()) == []
    # then
    code, _, err = verify()
    assert code == 1
    assert f"audit checkpoint #1: recomputed chain: intent {victim.id}'s event seq 2 hashes to" in err


def test_i11_1_truncation_is_detected_against_the_checkpoint() -> None:
    # given
    cancelled()
    submit()
    audit_checkpoint_create()
    with connection.cursor() as cursor:  # PostgreSQL refuses TRUNCATE while FK checks are pending
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    # when: the whole log is emptied past the trigger
    behind_the_triggers(("TRUNCATE operations_auditevent", []))
    # then: one checkpoint finding, not one per chain (the chain walk names each intent
    # left without a chain)
    code, out, err = verify()
    assert (code, out) == (1, "")
    assert err.count("has no audit events: its chain was deleted") == 2
    assert err.endswith(
        "audit checkpoint #1: truncation: the audit log holds 0 events; "
        "none of the 2 chains (3 events) checkpoint #1 saw remains\n"
    )


def test_i11_1_edited_event_without_recomputing_is_still_named() -> None:
    # given
    victim = cancelled()
    audit_checkpoint_create()
    first = chain(victim)[0]
    # when
    behind_the_triggers(("UPDATE operations_auditevent SET reason = 'edited' WHERE id = %s", [first.id]))
    # then: the chain walk names the event (the checkpointed head, seq 2, is unchanged)
    code, _, err = verify()
    assert code == 1
    assert f"audit chain broken at event id {first.id} (intent {victim.id}): hash does not match" in err


def test_i11_1_tampered_checkpoint_row_is_detected() -> None:
    # given
    victim = cancelled()
    audit_checkpoint_create()
    # when: the tail is deleted and the checkpoint's heads, root and count rewritten to match
    forge_checkpoint_over_a_deleted_tail(victim)
    # then: the signature no longer matches; the forged heads are not trusted
    code, _, err = verify()
    assert code == 1
    assert "audit checkpoint #1: bad signature: checkpoint #1 as stored does not match its signature" in err
    assert "checkpoint #1 cannot be trusted: its heads were not compared" in err


def test_i11_1_edited_heads_under_a_valid_signature_are_detected() -> None:
    # given
    victim = cancelled()
    audit_checkpoint_create()
    # when: only the compressed heads are swapped (the signed root stays)
    heads, _ = forged_heads(victim, 1)
    behind_the_triggers(("UPDATE operations_auditcheckpoint SET heads = %s", [heads]))
    # then
    code, _, err = verify()
    assert code == 1 and "altered checkpoint: checkpoint #1's heads do not match its signed root" in err


def test_i11_1_deleted_checkpoints_are_detected_with_the_file_copy(checkpoint_files: dict[str, Path]) -> None:
    # given: the checkpoint file is also kept elsewhere (an auditor's copy)
    victim = cancelled()
    tail = with_quiet_tail(victim)
    audit_checkpoint_create()
    auditor_copy = checkpoint_files["file"].parent / "auditor-copy.jsonl"
    auditor_copy.write_text(checkpoint_files["file"].read_text())
    # when: the tail and every checkpoint row are deleted past the triggers
    behind_the_triggers(
        ("DELETE FROM operations_auditevent WHERE intent_id = %s AND seq = %s", [victim.id, tail]),
        ("DELETE FROM operations_auditcheckpoint", []),
    )
    # then: the database alone can no longer tell (it only warns that there is no checkpoint)
    code, _, err = verify()
    assert code == 0 and "no audit checkpoint exists" in err
    assert verify("--require-checkpoint")[0] == 1
    # the outside copy shows both deletions
    code, _, err = verify("--checkpoint-file", str(auditor_copy))
    assert code == 1
    assert "deleted checkpoint: the file's checkpoint #1 is not in the database (its newest is none)" in err
    assert f"deleted tail: intent {victim.id} has seq 2 but checkpoint #1 saw seq 3" in err


def test_i11_1_a_gap_in_the_checkpoint_series_is_detected() -> None:
    # given
    intent = submit()
    audit_checkpoint_create()
    intent_cancel(intent_id=intent.id, actor="agent:agent-1")
    audit_checkpoint_create()
    audit_checkpoint_create()
    # when
    behind_the_triggers(("DELETE FROM operations_auditcheckpoint WHERE number = 2", []))
    # then
    code, _, err = verify()
    assert code == 1 and "deleted checkpoint: checkpoint #3 follows #1: 1 checkpoint(s) are missing" in err


def test_i11_1_file_copy_that_differs_from_the_database_is_reported(
    checkpoint_files: dict[str, Path],
) -> None:
    # given
    submit()
    audit_checkpoint_create()
    line = json.loads(checkpoint_files["file"].read_text())
    line["checkpoint"]["events"] = 7  # an edited copy: the signature no longer matches it
    forged = checkpoint_files["file"].parent / "forged.jsonl"
    forged.write_text(json.dumps(line) + "\n")
    # when
    code, _, err = verify("--checkpoint-file", str(forged))
    # then: the file's copy is blamed, not the database's
    assert code == 1
    assert "bad signature: the file's checkpoint #1 (line 1) does not match its signature" in err
    assert "in the database" not in err


def test_i11_1_an_auditor_verifies_with_the_public_key_alone(
    settings: Any, checkpoint_files: dict[str, Path]
) -> None:
    # given: only the public key, no private key where the auditor runs
    submit()
    audit_checkpoint_create()
    public = checkpoint_files["key"].parent / "audit-public-key.pem"
    public.write_text(public_key_pem(public_key_load()))
    checkpoint_files["key"].unlink()
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "AUDIT_SIGNING_KEY_CREATE": False,
        "AUDIT_PUBLIC_KEY_FILE": str(public),
    }
    # when / then
    code, out, _ = verify("--checkpoint-file", str(checkpoint_files["file"]))
    assert code == 0 and "audit checkpoint #1 (file" in out


# --- refusals -------------------------------------------------------------------------------


def test_i11_1_missing_signing_key_is_a_clear_error(settings: Any, tmp_path: Path) -> None:
    # given: a key file that does not exist and may not be created (production)
    submit()
    missing = tmp_path / "nowhere" / "key.pem"
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "AUDIT_SIGNING_KEY_FILE": str(missing),
        "AUDIT_SIGNING_KEY_CREATE": False,
    }
    # when / then: the command refuses with the path and the setting, nothing is stored
    with pytest.raises(
        CommandError, match="no audit signing key at .*: set EFFECT_LEDGER_AUDIT_SIGNING_KEY_FILE"
    ):
        call_command("audit_checkpoint", stdout=io.StringIO())
    assert not AuditCheckpoint.objects.exists() and not missing.exists()
    # the beat logs it and carries on
    assert tasks.audit_checkpoint() is None
    # manage.py check warns
    [warning] = audit_signing_key_check()
    assert warning.id == "operations.W003" and "cannot be signed" in warning.msg


def test_i11_1_verify_without_a_key_exits_2_not_a_traceback(
    settings: Any, checkpoint_files: dict[str, Path]
) -> None:
    # given: a checkpoint exists, then the key is gone
    submit()
    audit_checkpoint_create()
    checkpoint_files["key"].unlink()
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "AUDIT_SIGNING_KEY_CREATE": False}
    # when / then
    with pytest.raises(
        CommandError, match="cannot verify against a checkpoint: no audit signing key"
    ) as raised:
        verify()
    assert raised.value.returncode == 2


def test_i11_1_unreadable_checkpoint_file_is_a_clear_error(tmp_path: Path) -> None:
    # given: a key to verify with (a missing key is exit 2 too, and is checked first)
    submit()
    audit_checkpoint_create()
    empty, garbage = tmp_path / "empty.jsonl", tmp_path / "garbage.jsonl"
    empty.write_text("")
    garbage.write_text("{not json\n")
    # when / then
    for path, reason in (
        (empty, "holds no checkpoint"),
        (garbage, "not an audit checkpoint line"),
        (tmp_path / "absent.jsonl", "cannot read the checkpoint file"),
    ):
        with pytest.raises(CommandError, match=reason) as raised:
            verify("--checkpoint-file", str(path))
        assert raised.value.returncode == 2


def test_i11_1_audit_checkpoint_command_reports_the_checkpoint(checkpoint_files: dict[str, Path]) -> None:
    # given
    submit()
    out = io.StringIO()
    # when
    call_command("audit_checkpoint", stdout=out)
    call_command("audit_checkpoint", "--if-changed", stdout=out)
    # then
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("audit checkpoint #1: 1 chains, 1 events, root ")
    assert lines[0].endswith(f"appended to {checkpoint_files['file']}")
    assert lines[1] == "no audit checkpoint made: nothing changed since the latest one"


# --- the console page -----------------------------------------------------------------------


def test_i11_1_console_shows_the_checkpoint_and_its_findings(client: Client) -> None:
    # given
    client.force_login(UserFactory(username="vera", groups=["viewer"]))
    victim = cancelled()
    tail = with_quiet_tail(victim)
    page = client.get(reverse("audit-verify"), {"refresh": "1"}).content.decode()
    assert "No signed checkpoint yet" in page
    audit_checkpoint_create()
    assert "Checkpoint #1 of" in client.get(reverse("audit-verify"), {"refresh": "1"}).content.decode()
    # when
    behind_the_triggers(
        ("DELETE FROM operations_auditevent WHERE intent_id = %s AND seq = %s", [victim.id, tail])
    )
    # then
    page = client.get(reverse("audit-verify"), {"refresh": "1"}).content.decode()
    assert "All chains verify" in page and "deleted tail" in page and str(victim.id) in page


# --- review of the checkpoints (issue 11, review items 1-4) ---------------------------------


def checkpoint_series(victim: Intent) -> None:
    """Checkpoints #1-#3 while ``victim``'s chain grows to seq 3 (submitted, cancelled, then a
    third event appended through the chain's own function)."""
    intent_cancel(intent_id=victim.id, actor="agent:agent-1")
    audit_checkpoint_create()
    audit_checkpoint_create()
    with transaction.atomic():
        audit_append(intent_id=victim.id, event="note", actor="user:vera", reason="third event")
    audit_checkpoint_create()
    assert AuditCheckpoint.objects.count() == 3 and len(chain(victim)) == 3


def refused_count() -> float:
    return float(metrics.AUDIT_CHECKPOINTS_REFUSED._value.get())


def test_i11_1_beat_refuses_to_sign_over_a_deleted_tail(
    caplog: pytest.LogCaptureFixture, checkpoint_files: dict[str, Path]
) -> None:
    # given: checkpoint #3 saw seq 3, then seq 3 is deleted past the triggers
    victim = submit()
    submit()
    checkpoint_series(victim)
    behind_the_triggers(("DELETE FROM operations_auditevent WHERE intent_id = %s AND seq = 3", [victim.id]))
    before = refused_count()
    # when
    with caplog.at_level(logging.ERROR, logger="operations.tasks"):
        assert tasks.audit_checkpoint() is None
    # then: nothing signed, the refusal logged with the fault and counted
    assert AuditCheckpoint.objects.count() == 3
    assert refused_count() == before + 1
    [record] = [r for r in caplog.records if "audit checkpoint refused" in r.getMessage()]
    assert f"deleted tail: intent {victim.id} has seq 2 but checkpoint #3 saw seq 3" in record.getMessage()
    # the tampering stays visible, from the database and from the file
    assert verify()[0] == 1
    assert verify("--checkpoint-file", str(checkpoint_files["file"]))[0] == 1


def test_i11_1_checkpoint_command_refuses_a_tampered_log() -> None:
    # given
    victim = submit()
    checkpoint_series(victim)
    behind_the_triggers(("DELETE FROM operations_auditevent WHERE intent_id = %s AND seq = 3", [victim.id]))
    # when / then: plain and --if-changed both refuse, exit 1, name the fault, sign nothing
    for args in ((), ("--if-changed",)):
        err = io.StringIO()
        with pytest.raises(
            CommandError, match="no audit checkpoint made: the audit log no longer holds"
        ) as raised:
            call_command("audit_checkpoint", *args, stdout=io.StringIO(), stderr=err)
        assert raised.value.returncode == 1
        assert f"audit checkpoint #3: deleted tail: intent {victim.id} has seq 2" in err.getvalue()
    assert AuditCheckpoint.objects.count() == 3 and verify()[0] == 1


def test_i11_1_refusal_names_each_fault_like_verification() -> None:
    # given: five chains checkpointed, then each altered in another way; two of them grew since
    gone, shrunk, grown_recomputed, grown_gap, same_seq_recomputed = (cancelled() for _ in range(5))
    audit_checkpoint_create()
    for intent in (grown_recomputed, grown_gap):
        with transaction.atomic():
            audit_append(intent_id=intent.id, event="note", actor="user:vera")
    submit()  # a new chain: no fault
    behind_the_triggers(
        ("DELETE FROM operations_auditevent WHERE intent_id = %s", [gone.id]),
        ("DELETE FROM operations_auditevent WHERE intent_id = %s AND seq = 2", [shrunk.id]),
        (
            "UPDATE operations_auditevent SET hash = %s WHERE intent_id = %s AND seq = 2",
            ["f" * 64, grown_recomputed.id],
        ),
        ("DELETE FROM operations_auditevent WHERE intent_id = %s AND seq = 2", [grown_gap.id]),
        (
            "UPDATE operations_auditevent SET hash = %s WHERE intent_id = %s AND seq = 2",
            ["e" * 64, same_seq_recomputed.id],
        ),
    )
    # when
    with pytest.raises(CheckpointRefusedError) as raised:
        audit_checkpoint_create()
    # then
    faults = "\n".join(raised.value.faults)
    assert f"deleted chain: intent {gone.id} has no events" in faults
    assert f"deleted tail: intent {shrunk.id} has seq 1 but checkpoint #1 saw seq 2" in faults
    assert f"recomputed chain: intent {grown_recomputed.id}'s event seq 2 hashes to ffffffffffff" in faults
    assert f"deleted event: intent {grown_gap.id} lacks seq 2" in faults
    assert f"recomputed chain: intent {same_seq_recomputed.id}'s event seq 2 hashes to eeeeeeeeeeee" in faults
    assert len(raised.value.faults) == 5 and AuditCheckpoint.objects.count() == 1


def test_i11_1_refusal_on_truncation_is_one_fault() -> None:
    # given
    cancelled()
    submit()
    audit_checkpoint_create()
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    behind_the_triggers(("TRUNCATE operations_auditevent", []))
    submit()  # the log is written to again
    # when / then
    with pytest.raises(CheckpointRefusedError) as raised:
        audit_checkpoint_create()
    assert raised.value.faults == [
        "truncation: the audit log none of the 2 chains (3 events) checkpoint #1 saw remains"
    ]


def test_i11_1_refuses_when_the_previous_checkpoint_was_altered() -> None:
    # given: the tail deleted and the checkpoint's heads, root and count rewritten to match
    victim = cancelled()
    audit_checkpoint_create()
    forge_checkpoint_over_a_deleted_tail(victim)
    submit()
    # when / then
    with pytest.raises(CheckpointRefusedError, match="checkpoint #1 as stored does not match its signature"):
        audit_checkpoint_create()


def test_i11_1_refuses_when_the_previous_checkpoints_heads_were_swapped() -> None:
    # given
    victim = cancelled()
    audit_checkpoint_create()
    heads, _ = forged_heads(victim, 1)
    behind_the_triggers(
        ("DELETE FROM operations_auditevent WHERE intent_id = %s AND seq = 2", [victim.id]),
        ("UPDATE operations_auditcheckpoint SET heads = %s", [heads]),
    )
    # when / then
    with pytest.raises(CheckpointRefusedError, match="checkpoint #1's heads do not match its signed root"):
        audit_checkpoint_create()


def test_i11_1_accept_faults_re_baselines_with_the_faults_in_the_signed_statement(
    checkpoint_files: dict[str, Path],
) -> None:
    # given: a refused checkpoint
    victim = submit()
    checkpoint_series(victim)
    behind_the_triggers(("DELETE FROM operations_auditevent WHERE intent_id = %s AND seq = 3", [victim.id]))
    # when: without a reason it is refused outright; with one it is signed
    with pytest.raises(CommandError, match="--accept-faults needs --reason") as raised:
        call_command("audit_checkpoint", "--accept-faults", stdout=io.StringIO())
    assert raised.value.returncode == 2
    out = io.StringIO()
    call_command(
        "audit_checkpoint", "--accept-faults", "--reason", "INC-42: restored from backup", stdout=out
    )
    # then: the faults and the reason are inside the signed statement, in the database and file
    assert "audit checkpoint #4 signed over 1 acknowledged fault(s)" in out.getvalue()
    row = AuditCheckpoint.objects.get(number=4)
    assert row.accepted == {
        "faults": [f"deleted tail: intent {victim.id} has seq 2 but checkpoint #3 saw seq 3"],
        "omitted": 0,
        "reason": "INC-42: restored from backup",
    }
    assert SignedCheckpoint.from_row(row).statement["accepted"] == row.accepted
    assert checkpoint_from_file(checkpoint_files["file"]).statement["accepted"] == row.accepted
    # verify_audit passes against #4 and names the re-baseline on every run
    code, out_text, _ = verify()
    assert code == 0
    assert (
        "audit checkpoint #4 was signed over 1 acknowledged fault(s) of the checkpoint before it; "
        in out_text
    )
    assert "reason: INC-42: restored from backup" in out_text
    assert verify("--checkpoint-file", str(checkpoint_files["file"]))[0] == 0
    # the beat signs as usual afterwards
    submit()
    assert tasks.audit_checkpoint() == 5


def test_i11_1_every_file_line_is_checked_against_the_database(checkpoint_files: dict[str, Path]) -> None:
    # given: #2 saw an event that #1 did not
    victim = submit()
    audit_checkpoint_create()
    tail = with_quiet_tail(victim)
    audit_checkpoint_create()
    # when: the event and checkpoint #2 are deleted, and a new #2 is signed over the rest
    behind_the_triggers(
        ("DELETE FROM operations_auditevent WHERE intent_id = %s AND seq = %s", [victim.id, tail]),
        ("DELETE FROM operations_auditcheckpoint WHERE number = 2", []),
    )
    submit()
    # then: the beat no longer signs a new #2 over it (issue 22: the database is behind the
    # file, as after a restore), and the database alone cannot tell; the file, line by line, can
    assert tasks.audit_checkpoint() is None
    assert AuditCheckpoint.objects.count() == 1
    assert verify()[0] == 0
    code, _, err = verify("--checkpoint-file", str(checkpoint_files["file"]))
    assert code == 1
    assert "deleted checkpoint: the file's checkpoint #2 is not in the database (its newest is #1)" in err
    # and the configured file is what verify_audit reads by default (issue 22 item 4)
    assert verify(configured_file=True)[:2] == (code, "")


def test_i11_1_older_file_lines_missing_from_the_database_are_found(
    checkpoint_files: dict[str, Path],
) -> None:
    # given: three checkpoints; the file's newest line is intact in the database
    intent = submit()
    audit_checkpoint_create()
    intent_cancel(intent_id=intent.id, actor="agent:agent-1")
    audit_checkpoint_create()
    audit_checkpoint_create()
    # when: #1 and #2 are deleted (the series starts at #3: no gap between rows to see)
    behind_the_triggers(("DELETE FROM operations_auditcheckpoint WHERE number < 3", []))
    # then
    code, _, err = verify("--checkpoint-file", str(checkpoint_files["file"]))
    assert code == 1
    assert "deleted checkpoint: the file's checkpoint #1 is not in the database (its newest is #3)" in err
    assert "deleted checkpoint: the file's checkpoint #2 is not in the database" in err


def test_i11_1_file_signature_edit_blames_the_file_and_row_edit_blames_the_database(
    checkpoint_files: dict[str, Path],
) -> None:
    # given
    submit()
    audit_checkpoint_create()
    good = checkpoint_files["file"].read_text()
    line = json.loads(good)
    line["signature"] = ("0" if line["signature"][0] != "0" else "1") + line["signature"][1:]
    edited = checkpoint_files["file"].parent / "edited.jsonl"
    edited.write_text(json.dumps(line) + "\n")
    # when / then: only the file line's signature was edited
    code, _, err = verify("--checkpoint-file", str(edited))
    assert code == 1
    assert (
        "bad signature: the file's checkpoint #1 (line 1) does not match its signature: the file's copy was altered"
        in err
    )
    assert "database" not in err
    # when / then: the stored row edited, the file intact
    behind_the_triggers(("UPDATE operations_auditcheckpoint SET events = 9", []))
    code, _, err = verify("--checkpoint-file", str(checkpoint_files["file"]))
    assert code == 1
    assert "bad signature: checkpoint #1 as stored does not match its signature" in err
    assert (
        "altered checkpoint: the database's checkpoint #1 was altered: it differs from the file's signed copy"
        in err
    )
    assert "the file's checkpoint #1 (line 1) does not match" not in err


def test_i11_1_unreadable_checkpoint_file_lines_exit_2(
    tmp_path: Path, checkpoint_files: dict[str, Path]
) -> None:
    # given: a good file, and variants of it
    submit()
    audit_checkpoint_create()
    good = checkpoint_files["file"].read_bytes()
    document = json.loads(good)

    def line_with(**changes: Any) -> bytes:
        edited = json.loads(good)
        for name, value in changes.items():
            if name in edited:
                edited[name] = value
            else:
                edited["checkpoint"][name] = value
        return json.dumps(edited).encode() + b"\n"

    variants = {
        "binary": Path("/bin/ls").read_bytes()[:300],
        "latin1": good + b"caf\xe9\n",
        "huge number": line_with(number=10**30),
        "huge events": line_with(events=2**53),
        "text number": line_with(number="1"),
        "bool chains": line_with(chains=True),
        "float events": line_with(events=1.5),
        "nan": good.replace(b'"events":1', b'"events":NaN'),
        "signature number": line_with(signature=5),
        "heads object": line_with(heads_zlib_base64={"a": 1}),
        "nested statement": line_with(checkpoint=[[[[]]]]),
        "deep nesting": b"[" * 100_000 + b"]" * 100_000 + b"\n",
        "extra field": line_with(extra=1),
        "lone surrogate": good.replace(b'"digest":"', b'"digest":"\\ud800'),
        "accepted garbage": line_with(accepted={"faults": [1], "omitted": 0, "reason": ""}),
        "not an object": b"[1,2,3]\n",
    }
    assert document["checkpoint"]["events"] == 1
    for name, content in variants.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_bytes(content)
        # when / then
        with pytest.raises(CommandError, match="unreadable checkpoint file") as raised:
            verify("--checkpoint-file", str(path))
        assert raised.value.returncode == 2, name


def test_i11_1_unsigned_heads_with_garbage_are_a_fault_not_a_traceback(
    tmp_path: Path, checkpoint_files: dict[str, Path]
) -> None:
    # given: the heads (covered by the signature only through the root) replaced in the file
    submit()
    audit_checkpoint_create()
    line = json.loads(checkpoint_files["file"].read_text())
    garbage = [
        zlib.compress('[["é",1,"x"]]'.encode()),
        zlib.compress(b"[[[[[[[[[[" * 10_000),
        zlib.compress(b"\x00" * 10_000_000),  # a small line that would inflate far past the signed size
        b"not zlib",
    ]
    for number, heads in enumerate(garbage):
        line["heads_zlib_base64"] = base64.b64encode(heads).decode()
        path = tmp_path / f"heads-{number}.jsonl"
        path.write_text(json.dumps(line) + "\n")
        # when
        code, _, err = verify("--checkpoint-file", str(path))
        # then: the file's copy is named as the altered one
        assert code == 1, number
        assert "the file's checkpoint #1 (line 1) holds heads that do not match its signed root" in err, (
            number
        )


def test_i11_1_checkpoint_time_is_the_database_clock() -> None:
    # given: this process's clock is a year off
    submit()
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        (database_now,) = cursor.fetchone()
    # when
    with time_machine.travel(database_now.replace(year=database_now.year - 1), tick=True):
        row = audit_checkpoint_create()
    # then
    assert row is not None
    assert abs((row.created_at - database_now).total_seconds()) < 60


def test_i11_1_a_lost_signing_key_is_not_silently_replaced(checkpoint_files: dict[str, Path]) -> None:
    # given: checkpoints signed by the key created on first use
    submit()
    audit_checkpoint_create()
    checkpoint_files["key"].unlink()
    # when: the key file is gone (key creation is still switched on)
    with pytest.raises(CommandError, match="no audit signing key") as raised:
        call_command("audit_checkpoint", stdout=io.StringIO())
    # then: nothing is signed and no new key appears
    assert raised.value.returncode == 2
    assert not checkpoint_files["key"].exists()
    assert AuditCheckpoint.objects.count() == 1


def test_i11_1_a_replaced_signing_key_is_named_not_blamed_on_the_log(
    checkpoint_files: dict[str, Path],
) -> None:
    submit()
    audit_checkpoint_create()
    checkpoint_files["key"].unlink()
    signing_key_create(checkpoint_files["key"])  # someone put another key in its place
    with pytest.raises(CommandError, match="is not the key that signed the newest checkpoint") as raised:
        call_command("audit_checkpoint", stdout=io.StringIO())
    assert raised.value.returncode == 2
    assert AuditCheckpoint.objects.count() == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--accept-faults", "--reason", "INC-1\r\x1b[2Kall fine"], "must be printable text"),
        (["--reason", "INC-1"], "--reason is only for --accept-faults"),
    ],
    ids=["control-characters", "reason-alone"],
)
def test_i11_1_a_re_baseline_reason_is_checked(options: list[str], message: str) -> None:
    submit()
    audit_checkpoint_create()
    with pytest.raises(CommandError, match=message) as raised:
        call_command("audit_checkpoint", *options, stdout=io.StringIO())
    assert raised.value.returncode == 2
    assert AuditCheckpoint.objects.count() == 1


def test_i11_1_re_baselines_are_shown_even_when_something_else_fails(client: Client) -> None:
    # given: a re-baseline, then another fault
    victim = submit()
    checkpoint_series(victim)
    behind_the_triggers(("DELETE FROM operations_auditevent WHERE intent_id = %s AND seq = 3", [victim.id]))
    call_command("audit_checkpoint", "--accept-faults", "--reason", "INC-42: restored", stdout=io.StringIO())
    event = AuditEvent.objects.filter(intent=victim).order_by("seq").first()
    assert event is not None
    behind_the_triggers(("UPDATE operations_auditevent SET reason = 'edited' WHERE id = %s", [event.id]))
    # when
    code, _, err = verify()
    # then: the failure and the re-baseline are both reported
    assert code == 1
    assert f"audit chain broken at event id {event.id}" in err
    assert "audit checkpoint #4 was signed over 1 acknowledged fault(s)" in err and "INC-42: restored" in err
    # and the console's verification page shows the re-baseline too
    client.force_login(UserFactory(username="vera", groups=["viewer"]))
    page = client.get(reverse("audit-verify"), {"refresh": "1"}).content.decode()
    assert (
        'id="rebaselines"' in page
        and "Checkpoint #4: 1 acknowledged fault" in page
        and "INC-42: restored" in page
    )


def test_i11_1_printing_a_reason_escapes_control_characters() -> None:
    from operations.audit.checkpoints import printable

    assert printable("INC-1\r\x1b[2Kfine") == "INC-1\\r\\x1b[2Kfine"
    assert printable("naïve — ok") == "naïve — ok"
