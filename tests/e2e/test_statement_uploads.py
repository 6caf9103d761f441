"""Issue 39 item 10 with real worker processes and the real broker: an uploaded statement is
imported by a worker after the upload committed, survives the broker being down at upload time
and a worker SIGKILLed mid-file, and no line is stored twice."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from console.celery import app
from operations.models import OutboxMessage
from operations.workers.outbox import outbox_relay
from reconciliation.models import StatementLine, StatementRun, StatementUpload
from reconciliation.statement_csv import save_mapping
from reconciliation.statement_uploads import statement_upload_accept
from tests.support.workers import Cluster, requires_real_broker, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SOURCE = "sandbox-payments"


def accept(lines: int) -> StatementUpload:
    save_mapping(source=SOURCE, columns={"provider_reference": "Charge ID", "amount": "Amount", "currency": "Currency"}, actor="user:otto")  # fmt: skip
    data = b"Charge ID,Amount,Currency\n" + b"".join(b"ch_%d,49.90,EUR\n" % n for n in range(lines))
    return statement_upload_accept(
        source=SOURCE, day=dt.date(2026, 3, 10), data=data, filename="big.csv", actor="user:otto"
    )


def progress(upload: StatementUpload) -> StatementUpload:
    return StatementUpload.objects.defer("data").get(id=upload.id)


def assert_imported_once(upload: StatementUpload, lines: int) -> None:
    stored = StatementLine.objects.filter(run_id=upload.run_id)
    assert stored.count() == lines
    assert sorted(stored.values_list("line_no", flat=True)) == list(range(1, lines + 1))
    run = StatementRun.objects.get(id=upload.run_id)
    assert (run.lines, run.extra_at_provider, run.error) == (lines, lines, "")
    assert run.finished_at is not None


@requires_real_broker
def test_i39_10_a_worker_killed_mid_import_leaves_the_rest_to_the_next_and_no_line_twice(
    cluster: Cluster, sandbox: Any
) -> None:
    # given: a worker importing a statement of 20,000 lines
    worker = cluster.worker("w1")
    upload = accept(20_000)
    wait_for(lambda: progress(upload).lines_done >= 2000, 60, "two batches imported")
    # when: every process of the worker is SIGKILLed mid-file, and another worker starts
    worker.kill_group()
    killed_at = progress(upload).lines_done
    cluster.worker("w2")
    cluster.beat()  # the outbox relay, should the broker not give the message back
    wait_for(lambda: progress(upload).status == "done", 120, "the import to finish")
    # then: it went on from the last committed batch, every line once
    assert killed_at < 20_000, "the kill came mid-file"
    assert_imported_once(upload, 20_000)


@requires_real_broker
def test_i39_10_an_upload_made_while_the_broker_is_down_is_imported_once_it_is_back(
    cluster: Cluster, sandbox: Any
) -> None:
    # given: the broker is unreachable when the upload commits
    real_broker = app.conf.broker_write_url or app.conf.broker_url
    app.conf.broker_write_url = "amqp://guest:guest@127.0.0.1:1//"  # nothing listens on port 1
    app.amqp._producer_pool = None
    app._pool = None
    try:
        upload = accept(3000)
        # then: the upload is stored, its message waits in the outbox
        message = OutboxMessage.objects.get(id=upload.message_id)
        assert message.sent_at is None and message.last_error
    finally:
        app.conf.broker_write_url = real_broker
        app.amqp._producer_pool = None
        app._pool = None
    # when: the broker is back, a worker runs and the relay publishes
    cluster.worker("w1")
    outbox_relay()
    wait_for(lambda: progress(upload).status == "done", 60, "the import to finish")
    # then
    assert_imported_once(upload, 3000)
