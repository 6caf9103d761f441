"""Verification across the live tables and the archive (issue 36, case C30): ``verify_audit``
names an edited archive file, a removed one and a swapped manifest with the file and the intent;
an intact archive verifies, and the checkpoints signed before it still do; chains archived on
purpose are never taken for deleted ones (by ``verify_audit``, the checkpoint signer, or the
restore check's recovery).

Intents are made by the real services, archived by the real ``archive_run`` into a ``tmp_path``
archive directory; faults are made on the files as someone with write access to them would.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from operations import tasks
from operations.archive.services import archive_run
from operations.audit.keys import key_id
from operations.audit.signing import audit_checkpoint_create
from operations.audit.trail import event_hash
from operations.idempotency import canonical_json
from operations.models import ArchivedIntent, ArchiveSegment, AuditCheckpoint, Intent
from operations.restore.check import restore_detection
from operations.services import intent_cancel, intent_record_refusal
from tests.factories import submit

# The archiver runs its own transactions (a REPEATABLE READ snapshot, then delete batches).
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def archive_dir(settings: Any, tmp_path: Path) -> Path:
    """A signing key created on first use, a checkpoint file and an archive directory, all
    under ``tmp_path``; intents are due one day after they settled."""
    directory = tmp_path / "archive"
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "AUDIT_SIGNING_KEY_FILE": str(tmp_path / "keys" / "audit-signing-key.pem"),
        "AUDIT_SIGNING_KEY_CREATE": True,
        "AUDIT_PUBLIC_KEY_FILE": "",
        "AUDIT_CHECKPOINT_FILE": str(tmp_path / "audit-checkpoints.jsonl"),
        "ARCHIVE_DIR": str(directory),
        "INTENT_RETENTION_DAYS": 1.0,
        "TENANT_RETENTION_DAYS": {},
    }
    return directory


def verify(*args: str) -> tuple[int, str, str]:
    """``verify_audit`` (with the configured checkpoint file, its default): exit code, stdout,
    stderr."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("verify_audit", *args, stdout=out, stderr=err)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


def cancelled(count: int) -> list[Intent]:
    """``count`` intents submitted and cancelled by their agent (settled, two events each)."""
    intents = [submit(reference=f"order-{i}") for i in range(count)]
    for intent in intents:
        intent_cancel(intent_id=intent.id, actor="agent:agent-1")
    return intents


def settled_on(intents: list[Intent], days_ago: int) -> None:
    """Date the intents' submission and settlement ``days_ago`` days back, at noon UTC (a segment
    holds one day of submissions)."""
    noon = (timezone.now() - timedelta(days=days_ago)).replace(hour=12, minute=0, second=0, microsecond=0)
    Intent.objects.filter(id__in=[i.id for i in intents]).update(created_at=noon, updated_at=noon)


def archive() -> None:
    """Archive everything due, as ``manage.py archive --before now`` does."""
    archive_run(before=timezone.now())


def archived(archive_dir: Path, *intents: Intent) -> None:
    """Settle ``intents`` three days back and archive them; each is then in the archive only."""
    settled_on(list(intents), 3)
    archive()
    assert ArchivedIntent.objects.filter(state="archived").count() >= len(intents)
    assert not Intent.objects.filter(id__in=[i.id for i in intents]).exists()


def segment_files(archive_dir: Path, number: int = 1) -> tuple[str, Path, Path]:
    """A segment's file name (relative), data file and manifest."""
    name = ArchiveSegment.objects.get(number=number).file_name
    data = archive_dir / name
    return name, data, data.with_name(data.name.removesuffix(".jsonl.gz") + ".manifest.json")


def rewrite_records(path: Path, change: Any) -> None:
    """Rewrite a segment file's records through ``change(record)`` (in place, as an editor would)."""
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    for record in records:
        change(record)
    os.chmod(path, 0o644)
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, separators=(",", ":")) + "\n")


def rehash(events: list[dict[str, Any]]) -> None:
    """Recompute every event's ``prev_hash`` and ``hash``: a chain edited and made consistent again."""
    previous = "0" * 64
    for event in events:
        event["prev_hash"] = previous
        fields = {name: event[name] for name in event if name not in ("id", "hash")}
        event["hash"] = previous = event_hash(**fields)


# --- an intact archive ---------------------------------------------------------------------


def test_i36_an_intact_archive_verifies_and_the_checkpoint_signed_before_it_still_verifies(
    archive_dir: Path,
) -> None:
    # given: a checkpoint over five intents, three settled days ago (two of them only after the
    # checkpoint, so their chains grew past it) and two still live
    early = cancelled(1)
    late = [submit(reference="order-late-1"), submit(reference="order-late-2")]
    live = cancelled(2)
    audit_checkpoint_create()
    for intent in late:
        intent_cancel(intent_id=intent.id, actor="agent:agent-1")
    # when: the three are archived
    archived(archive_dir, *early, *late)
    # then: the checkpoint signed before the archive verifies (its archived chains accounted
    # for), the file against its signed manifest, and every chain's proof against checkpoint #1
    code, out, err = verify()
    assert (code, err) == (0, ""), err
    assert "audit checkpoint #1" in out and "3 of the chains in the archive" in out
    assert "audit archive verified: 1 segment(s) signed and linked, 3 intents and 6 events" in out
    assert "3 inclusion proof(s)" in out
    # and the stored checkpoint alone too, and the live ones are still checked
    assert verify("--database-only")[0] == 0
    assert Intent.objects.filter(id__in=[i.id for i in live]).count() == 2


def test_i36_a_checkpoint_can_be_signed_after_archiving_and_the_restore_check_stays_level(
    archive_dir: Path,
) -> None:
    # given: checkpoint #1 over intents then archived
    intents = cancelled(3)
    audit_checkpoint_create()
    archived(archive_dir, *intents)
    # when: the next checkpoint is signed (the beat's, every period)
    row = audit_checkpoint_create()
    # then: no refusal over the chains that left on purpose; nothing accepted, nothing behind
    assert row is not None and row.number == 2 and row.accepted is None
    assert row.chains == 0
    assert restore_detection().state == "level"
    assert tasks.restore_check() == "level"
    assert verify()[0] == 0


def test_i36_a_recovery_after_a_restore_does_not_take_archived_chains_for_damage(archive_dir: Path) -> None:
    # given: checkpoint #1 over intents that were then archived, and checkpoint #2 after it
    intents = cancelled(2)
    audit_checkpoint_create()
    archived(archive_dir, *intents)
    audit_checkpoint_create()
    # when: the database goes back to before checkpoint #2 (it is in the checkpoint file only)
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        cursor.execute("DELETE FROM operations_auditcheckpoint WHERE number > 1")
        cursor.execute("SET session_replication_role = origin")
    assert restore_detection().state == "behind"
    # then: the recovery's own check against checkpoint #1 finds the archived chains in the
    # archive, not missing: it re-baselines by itself instead of refusing
    assert tasks.restore_check() == "recovered"
    assert AuditCheckpoint.objects.order_by("-number").first().number == 3  # type: ignore[union-attr]
    assert verify()[0] == 0


# --- C30: an edited file, a removed file, a swapped manifest --------------------------------


@pytest.mark.parametrize("rehashed", [False, True], ids=["edited", "edited-and-rehashed"])
def test_c30_an_edited_archived_event_is_named_with_file_and_intent(
    archive_dir: Path, rehashed: bool
) -> None:
    # given: three intents archived
    intents = cancelled(3)
    audit_checkpoint_create()
    archived(archive_dir, *intents)
    name, data, _ = segment_files(archive_dir)
    victim = str(intents[1].id)

    # when: one archived event's reason is edited in the file (and, the second time, every hash
    # after it recomputed so the chain is consistent again)
    def edit(record: dict[str, Any]) -> None:
        if record["intent"]["id"] == victim:
            record["audit_events"][-1]["reason"] = "cancelled by the customer"
            if rehashed:
                rehash(record["audit_events"])

    rewrite_records(data, edit)
    # then: the file is named altered, and the intent with it
    code, _, err = verify()
    assert code == 1
    assert f"altered archive file: archive file {name} (segment 1) has sha256" in err
    named = [line for line in err.splitlines() if victim in line]
    assert named and all(name in line for line in named), err
    if rehashed:
        assert f"altered head: archive file {name} (segment 1), intent {victim}" in err
        assert f"altered heads: the heads of the chains in archive file {name}" in err
    else:
        assert f"broken archived chain: archive file {name} (segment 1), intent {victim}: event id " in err
        assert "hash does not match the event's content" in err
    assert not [line for line in err.splitlines() if str(intents[0].id) in line]


def test_c30_a_removed_archive_file_is_named(archive_dir: Path) -> None:
    # given: two segments (two days of settlement)
    first, second = cancelled(2), cancelled(1)
    audit_checkpoint_create()
    settled_on(first, 4)
    settled_on(second, 3)
    archive()
    assert ArchiveSegment.objects.count() == 2
    name, data, _ = segment_files(archive_dir, 1)
    # when: the first file is removed
    data.unlink()
    # then: named with its segment and intents; the other segment still verifies
    code, _, err = verify()
    assert code == 1
    assert f"missing archive file: archive file {name} is missing (segment 1, 2 intents: " in err
    assert all(str(intent.id) in err for intent in first)
    assert str(second[0].id) not in err
    assert ArchiveSegment.objects.get(number=2).file_name not in err
    # and --live-only does not read the archive files
    assert verify("--live-only")[0] == 0


def test_c30_a_swapped_manifest_is_named(archive_dir: Path) -> None:
    # given: two segments
    first, second = cancelled(2), cancelled(1)
    audit_checkpoint_create()
    settled_on(first, 4)
    settled_on(second, 3)
    archive()
    name_1, _, manifest_1 = segment_files(archive_dir, 1)
    name_2, _, manifest_2 = segment_files(archive_dir, 2)
    # when: their signed manifests are swapped
    text_1, text_2 = manifest_1.read_text(), manifest_2.read_text()
    manifest_1.write_text(text_2)
    manifest_2.write_text(text_1)
    # then: each is named, saying whose manifest it is
    code, _, err = verify()
    assert code == 1
    assert (
        f"swapped manifest: archive manifest {manifest_1.relative_to(archive_dir)} is segment 2's "
        f"(it names {name_2}), not the manifest of {name_1} (segment 1): swapped"
    ) in err
    assert f"not the manifest of {name_2} (segment 2): swapped" in err


def test_c30_a_file_edited_and_its_manifest_re_signed_with_another_key_is_named(archive_dir: Path) -> None:
    # given: three intents archived
    intents = cancelled(3)
    audit_checkpoint_create()
    archived(archive_dir, *intents)
    name, data, manifest_path = segment_files(archive_dir)
    victim = str(intents[0].id)

    # when: an event is edited, the chain re-hashed, and a manifest that matches the new file
    # is signed with another key
    def edit(record: dict[str, Any]) -> None:
        if record["intent"]["id"] == victim:
            record["audit_events"][-1]["actor"] = "user:somebody-else"
            rehash(record["audit_events"])

    rewrite_records(data, edit)
    forger = Ed25519PrivateKey.generate()
    manifest = json.loads(manifest_path.read_text())
    statement = {
        **manifest["statement"],
        "file_sha256": hashlib.sha256(data.read_bytes()).hexdigest(),
        "bytes": data.stat().st_size,
        "key_id": key_id(forger.public_key()),
    }
    manifest["statement"], manifest["signature"] = statement, forger.sign(canonical_json(statement)).hex()
    manifest_path.write_text(json.dumps(manifest))
    # then: the manifest is named as another key's, the file as altered, the intent's head too
    code, _, err = verify()
    assert code == 1
    assert (
        f"swapped manifest: archive manifest {manifest_path.relative_to(archive_dir)} (segment 1) was signed by another key"
        in err
    )
    assert f"altered archive file: archive file {name} (segment 1)" in err
    assert f"intent {victim}" in err


# --- inclusion proofs -------------------------------------------------------------------------


@pytest.mark.parametrize("tampered", ["path", "leaf"])
def test_i36_a_tampered_inclusion_proof_is_named(archive_dir: Path, tampered: str) -> None:
    # given: three intents a checkpoint covered, archived with their proofs
    intents = cancelled(3)
    audit_checkpoint_create()
    archived(archive_dir, *intents)
    name, _, manifest_path = segment_files(archive_dir)
    manifest = json.loads(manifest_path.read_text())
    assert len(manifest["proofs"]) == 3
    proof = manifest["proofs"][0]
    victim = proof["intent_id"]
    # when: a proof (outside the signed statement) is tampered with
    if tampered == "path":
        step = proof["path"][0]
        proof["path"][0] = ("0" if step[0] != "0" else "1") + step[1:]
    else:
        proof["leaf"][2] = "f" * 64
    manifest_path.write_text(json.dumps(manifest))
    # then: named with the file and the intent
    code, _, err = verify()
    assert code == 1
    expected = (
        "its inclusion proof does not lead to checkpoint #1's signed root"
        if tampered == "path"
        else "the chain lacks seq 2 (ffffffffffff…), which checkpoint #1 signed"
    )
    assert f"bad inclusion proof: archive file {name} (segment 1), intent {victim}: {expected}" in err


# --- the index against the live tables --------------------------------------------------------


def test_i36_a_chain_deleted_without_being_archived_is_still_a_deleted_chain(archive_dir: Path) -> None:
    # given: two intents archived, one more checkpointed and live
    intents = cancelled(2)
    kept = cancelled(1)[0]
    audit_checkpoint_create()
    archived(archive_dir, *intents)
    # when: the live one's chain is deleted past the triggers
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        cursor.execute("DELETE FROM operations_auditevent WHERE intent_id = %s", [kept.id])
        cursor.execute("SET session_replication_role = origin")
    # then: only it is a deleted chain; the archived ones are accounted for
    code, _, err = verify("--database-only")
    assert code == 1
    assert f"deleted chain: intent {kept.id} has no events but checkpoint #1 saw seq 2" in err
    assert not [line for line in err.splitlines() if any(str(i.id) in line for i in intents)]


def test_i36_an_archived_intent_with_rows_left_live_is_named(archive_dir: Path) -> None:
    # given: an intent archived
    intents = cancelled(2)
    audit_checkpoint_create()
    archived(archive_dir, *intents)
    name, _, _ = segment_files(archive_dir)
    # when: its index row says archived but a live intent row of that id exists again
    # (an archive that forgot to delete; a restore of the rows)
    victim = intents[0]
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        cursor.execute(
            "INSERT INTO operations_auditevent (intent_id, seq, event, from_status, to_status, actor, reason, "
            "data, created_at, prev_hash, hash) VALUES (%s, 1, 'x', '', '', 'x', '', '{}', %s, %s, %s)",
            [victim.id, datetime.now(tz=timezone.get_current_timezone()), "0" * 64, "0" * 64],
        )
        cursor.execute("SET session_replication_role = origin")
    # then: named with its file
    code, _, err = verify()
    assert code == 1
    assert f"archived yet live: intent {victim.id} is archived in archive file {name} (segment 1)" in err


def test_i36_an_intent_changed_after_it_was_written_verifies_live_then_archived_again(
    archive_dir: Path, monkeypatch: Any
) -> None:
    # given: two settled intents a checkpoint covered; one gets a new audit event between the
    # archiver's write and its delete (it is kept live: superseded)
    kept, gone = cancelled(2)
    audit_checkpoint_create()
    settled_on([kept, gone], 3)
    from operations.archive import services

    write = services._write_segment

    def write_then_change(*args: Any, **kwargs: Any) -> Any:
        segment = write(*args, **kwargs)
        intent_record_refusal(
            intent_id=kept.id, actor="user:mallory", decision="approve", reason="not awaiting approval"
        )
        Intent.objects.filter(id=kept.id).update(updated_at=timezone.now())
        return segment

    monkeypatch.setattr(services, "_write_segment", write_then_change)
    archive()
    monkeypatch.undo()
    assert ArchivedIntent.objects.get(intent_id=kept.id).state == "superseded"
    # then: the archive verifies (the live chain holds the head its earlier record ends at)
    code, out, err = verify()
    assert (code, err) == (0, ""), err
    assert "1 of the chains in the archive" in out
    # when: it settles again and is archived in a later segment
    settled_on([kept], 2)
    archive()
    assert ArchivedIntent.objects.get(intent_id=kept.id).segment.number == 2
    # then: its earlier record in segment 1 is an earlier state of the chain segment 2 holds
    code, out, err = verify()
    assert (code, err) == (0, ""), err
    assert "audit archive verified: 2 segment(s) signed and linked, 3 intents" in out


def test_i36_a_segment_removed_from_the_index_is_named_and_its_chains_are_deleted_ones(
    archive_dir: Path,
) -> None:
    # given: two segments over chains checkpoint #1 covered
    first, second = cancelled(2), cancelled(1)
    audit_checkpoint_create()
    settled_on(first, 4)
    settled_on(second, 3)
    archive()
    name, _, manifest = segment_files(archive_dir, 1)
    # when: segment 1 and its intents are deleted from the index (its files stay)
    ArchivedIntent.objects.filter(segment__number=1).delete()
    ArchiveSegment.objects.filter(number=1).delete()
    # then: the gap is named, its files are unindexed, its chains are deleted ones again
    code, _, err = verify()
    assert code == 1
    assert "deleted segment: segment 1 missing from the archive index before segment 2" in err
    assert f"unindexed: archive file {name} is in the archive directory" in err
    assert f"unindexed: archive file {manifest.relative_to(archive_dir)} is in the archive directory" in err
    for intent in first:
        assert f"deleted chain: intent {intent.id} has no events but checkpoint #1 saw seq 2" in err
    assert str(second[0].id) not in err
