"""Issue 39 item 10: an uploaded CSV statement is checked when it arrives and imported by a
task a batch per transaction, resumable after a kill, never importing a line twice."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import pytest

from console.celery import app
from console.lab.bench.profile import Tally, tallying
from operations.models import Intent, OutboxMessage, Outcome
from reconciliation import statement_uploads
from reconciliation.models import ProviderFinding, StatementLine, StatementRun, StatementUpload
from reconciliation.statement_csv import save_mapping
from reconciliation.statement_uploads import (
    IMPORT_TASK,
    StatementAlreadyUploaded,
    statement_upload_accept,
    statement_upload_import,
)
from tests.factories import charge_arguments, submit
from tests.support.workers import QUEUE

pytestmark = pytest.mark.django_db(transaction=True)

SOURCE = "sandbox-payments"
DAY = dt.date(2026, 3, 10)
HEADER = "Charge ID,Order,Amount,Currency\n"


@pytest.fixture(autouse=True)
def _session_queue(transactional_db: None) -> Iterator[None]:
    """The hand-off after commit publishes to this session's own queue, never a quick start's;
    the source has a saved mapping."""
    default_queue = app.conf.task_default_queue
    app.conf.task_default_queue = QUEUE
    save_mapping(
        source=SOURCE,
        columns={
            "provider_reference": "Charge ID",
            "reference": "Order",
            "amount": "Amount",
            "currency": "Currency",
        },
        actor="user:otto",
    )
    yield
    app.conf.task_default_queue = default_queue


def statement(lines: int, *, first: int = 0) -> bytes:
    return (HEADER + "".join(f"ch_{n},order-{n},49.90,EUR\n" for n in range(first, first + lines))).encode()


def accept(data: bytes, day: dt.date = DAY) -> StatementUpload:
    return statement_upload_accept(source=SOURCE, day=day, data=data, filename="s.csv", actor="user:otto")


class Killed(BaseException):
    """The worker process dying mid-batch (not an error the import could catch)."""


def kill_on_batch(monkeypatch: pytest.MonkeyPatch, number: int) -> None:
    """The ``number``-th batch of the next import dies before it commits."""
    real = statement_uploads.match_batch
    calls = {"n": 0}

    def dying(**kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == number:
            real(**kwargs)  # its writes are made, then lost with the transaction
            raise Killed
        return real(**kwargs)

    monkeypatch.setattr(statement_uploads, "match_batch", dying)


def test_i39_10_an_upload_is_stored_queued_with_its_message_and_no_line_yet() -> None:
    # when
    upload = accept(statement(2500))
    # then: the file, its hash and its count are stored; nothing is imported yet
    upload.refresh_from_db()
    assert (upload.status, upload.total_lines, upload.lines_done) == ("queued", 2500, 0)
    assert len(upload.sha256) == 64 and bytes(upload.data) == statement(2500)
    assert upload.run.finished_at is None and upload.run.origin == "upload"
    assert not StatementLine.objects.exists()
    # and: the import task's message committed with it (the relay publishes it if the broker did not)
    message = OutboxMessage.objects.get(id=upload.message_id)
    assert message.task == IMPORT_TASK and message.acked_at is None and message.intent_id is None
    assert json.loads(message.body) == {
        "message_id": str(upload.message_id),
        "task": IMPORT_TASK,
        "upload_id": upload.id,
    }


def test_i39_10_the_import_commits_a_batch_per_transaction_with_no_savepoint_per_line() -> None:
    # given
    upload = accept(statement(2500))
    tally = Tally()
    # when
    with tallying(tally):
        status = statement_upload_import(upload_id=upload.id, message_id=upload.message_id)
    # then: three batches (1,000 + 1,000 + 500), then the finish: four write transactions
    # (besides two autocommit reads: the upload, then its file), and no savepoint per line: the
    # one savepoint is the finished run's audit event's (``audit_append_unattached``)
    assert status == "done"
    assert (tally.commits["?"] - tally.autocommit_reads["?"], tally.autocommit_reads["?"]) == (4, 2)
    assert len([sql for _, sql in tally.sql if sql.startswith("SAVEPOINT")]) == 1
    run = StatementRun.objects.get(id=upload.run_id)
    assert (run.lines, run.extra_at_provider, run.error) == (2500, 2500, "")
    assert run.finished_at is not None
    assert StatementLine.objects.filter(run=run).count() == 2500
    assert ProviderFinding.objects.filter(run=run, kind="extra_at_provider").count() == 2500
    upload.refresh_from_db()
    assert (upload.status, upload.lines_done, bytes(upload.data)) == ("done", 2500, b"")
    assert OutboxMessage.objects.get(id=upload.message_id).acked_at is not None


def succeeded(reference: str, provider_reference: str) -> Intent:
    intent = submit(arguments=charge_arguments(4990, reference=reference), reference=reference)
    Intent.objects.filter(id=intent.id).update(status=Intent.Status.SUCCEEDED)
    Outcome.objects.create(
        intent=intent, source=Outcome.Source.PROVIDER, provider_reference=provider_reference
    )
    return intent


def test_i39_10_an_import_killed_after_a_batch_goes_on_from_it_and_stores_no_line_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given: an intent whose effect is line 5, and a second line for it (by its reference) in
    # the second batch: still "a second line for one intent" after the restart
    intent = succeeded("order-5", "ch_5")
    data = statement(2500).replace(b"ch_1500,order-1500,", b"ch_1500,order-5,")
    upload = accept(data)
    # when: the worker dies in the second batch
    with monkeypatch.context() as patch, pytest.raises(Killed):
        kill_on_batch(patch, 2)
        statement_upload_import(upload_id=upload.id, message_id=upload.message_id, batch_lines=1000)
    # then: the first batch stays, the second left nothing, and the message waits for a redelivery
    upload.refresh_from_db()
    assert (upload.status, upload.lines_done) == ("running", 1000)
    assert StatementLine.objects.filter(run_id=upload.run_id).count() == 1000
    assert OutboxMessage.objects.get(id=upload.message_id).acked_at is None

    # when: the message is delivered again, and once more after the end
    assert statement_upload_import(upload_id=upload.id, message_id=upload.message_id) == "done"
    assert statement_upload_import(upload_id=upload.id, message_id=upload.message_id) == "done"

    # then: every line once, counted once
    lines = StatementLine.objects.filter(run_id=upload.run_id)
    assert lines.count() == 2500
    assert sorted(lines.values_list("line_no", flat=True)) == list(range(1, 2501))
    run = StatementRun.objects.get(id=upload.run_id)
    assert (run.lines, run.matched, run.extra_at_provider) == (2500, 1, 2499)
    second = lines.get(provider_reference="ch_1500")
    assert (second.intent_id, second.result) == (intent.id, "extra")
    assert ProviderFinding.objects.get(line=second).detail["why"] == "second line for one intent"
    assert ProviderFinding.objects.filter(run=run).count() == 2499


def test_i39_10_a_slice_hands_the_rest_to_a_new_message_and_the_old_one_changes_nothing() -> None:
    # given
    upload = accept(statement(2500))
    first = upload.message_id
    # when: the slice's time is up after its first batch
    assert statement_upload_import(upload_id=upload.id, message_id=first, seconds=0) == "running"
    # then: the rest belongs to a new message, written in the batch's transaction; the first is acknowledged
    upload.refresh_from_db()
    assert upload.lines_done == 1000 and upload.message_id != first
    assert OutboxMessage.objects.get(id=first).acked_at is not None
    assert OutboxMessage.objects.get(id=upload.message_id).acked_at is None
    # when: the first message is delivered again
    assert statement_upload_import(upload_id=upload.id, message_id=first) == "running"
    # then: nothing moved
    upload.refresh_from_db()
    assert upload.lines_done == 1000
    # and the new one finishes the import
    assert statement_upload_import(upload_id=upload.id, message_id=upload.message_id) == "done"
    assert StatementLine.objects.filter(run_id=upload.run_id).count() == 2500


def test_i39_10_a_slice_that_raises_is_tried_again_then_fails_the_upload_saying_where(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given: every batch after the first raises
    upload = accept(statement(1500))
    real = statement_uploads.match_batch

    def broken(**kwargs: Any) -> Any:
        if kwargs["first_number"] > 1:
            raise RuntimeError("a bug")
        return real(**kwargs)

    monkeypatch.setattr(statement_uploads, "match_batch", broken)
    # when: the first two deliveries
    for _ in range(2):
        assert statement_upload_import(upload_id=upload.id, message_id=upload.message_id) == "running"
    # then: tried again (the message is not acknowledged), the error shown
    upload.refresh_from_db()
    assert (upload.failures, upload.lines_done) == (2, 1000) and "a bug" in upload.error
    assert OutboxMessage.objects.get(id=upload.message_id).acked_at is None
    # when: the third
    assert statement_upload_import(upload_id=upload.id, message_id=upload.message_id) == "failed"
    # then: the upload and its run fail, saying how far the import went
    upload.refresh_from_db()
    run = StatementRun.objects.get(id=upload.run_id)
    assert upload.status == "failed" and run.finished_at is not None
    assert run.error.startswith("the import stopped after 1000 of 1500 lines (those stay imported)")
    assert OutboxMessage.objects.get(id=upload.message_id).acked_at is not None


def test_i39_10_the_same_file_of_the_same_day_is_taken_once_unless_it_failed() -> None:
    # given
    first = accept(statement(3))
    # when / then: the same bytes again are refused, naming the first upload; nothing stored
    with pytest.raises(StatementAlreadyUploaded, match=f"already uploaded .* run {first.run_id}, queued"):
        accept(statement(3))
    assert StatementUpload.objects.count() == 1 and StatementRun.objects.count() == 1
    assert OutboxMessage.objects.filter(task=IMPORT_TASK).count() == 1
    # and: another day's statement with the same bytes, or another file, is a new upload
    accept(statement(3), day=DAY - dt.timedelta(days=1))
    accept(statement(4))
    # and: once the first upload failed, its file may be uploaded again
    StatementUpload.objects.filter(id=first.id).update(status="failed")
    again = accept(statement(3))
    assert again.id != first.id


def test_i39_10_a_header_alone_is_a_run_finished_at_once() -> None:
    upload = accept(HEADER.encode())
    assert statement_upload_import(upload_id=upload.id, message_id=upload.message_id) == "done"
    run = StatementRun.objects.get(id=upload.run_id)
    assert (run.lines, run.error) == (0, "") and run.finished_at is not None


def test_i39_10_the_import_reads_the_file_with_the_mapping_it_was_checked_with() -> None:
    # given: an upload, then the source's mapping changed before a worker took it
    upload = accept(statement(2))
    save_mapping(source=SOURCE, columns={"provider_reference": "Order"}, actor="user:otto")
    # when
    assert statement_upload_import(upload_id=upload.id, message_id=upload.message_id) == "done"
    # then
    assert sorted(StatementLine.objects.values_list("provider_reference", flat=True)) == ["ch_0", "ch_1"]


def test_i39_10_a_run_audits_its_counts_once_finished() -> None:
    from operations.models import AuditEvent

    upload = accept(statement(3))
    assert not AuditEvent.objects.filter(event="statement_reconciled").exists()
    statement_upload_import(upload_id=upload.id, message_id=upload.message_id)
    event = AuditEvent.objects.get(event="statement_reconciled")
    assert (event.actor, event.data["origin"], event.data["lines"], event.data["run"]) == (
        "user:otto",
        "upload",
        3,
        upload.run_id,
    )
