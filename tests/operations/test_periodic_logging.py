"""An idle ledger's log stays quiet (issue 39, item 7): each periodic task logs at DEBUG when
it did nothing and at INFO when it did something; Celery's own lines about each run of a
beat-scheduled task are DEBUG; the default email backend prints a notice as plain text on the
process's terminal, not through Celery's stdout logger."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.mail import EmailMessage, get_connection

from console import settings as settings_module
from console.celery import app as celery_app
from console.log_filters import PeriodicTaskRunsAtDebug
from operations import tasks
from reconciliation import tasks as reconciliation_tasks
from tests.factories import UserFactory, charge_arguments, submit

pytestmark = pytest.mark.django_db

#: Every task of the beat schedule (called without a claim period, as a kick: each run works).
PERIODIC: dict[str, Callable[..., Any]] = {
    "operations.relay_outbox": tasks.relay_outbox,
    "reconciliation.reconcile": reconciliation_tasks.reconcile,
    "operations.audit_checkpoint": tasks.audit_checkpoint,
    "operations.archive": tasks.archive,
    "operations.restore.check": tasks.restore_check,
    "operations.send_notifications": tasks.send_notifications,
    "operations.status_rollup": tasks.status_rollup,
    "operations.deliver_webhooks": tasks.deliver_webhooks,
    "reconciliation.prune": reconciliation_tasks.prune,
    "reconciliation.reconcile_statements": reconciliation_tasks.reconcile_statements,
}


@pytest.fixture(autouse=True)
def _quiet_ledger(settings: Any, tmp_path: Path) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "AUDIT_SIGNING_KEY_FILE": str(tmp_path / "audit-signing-key.pem"),
        "AUDIT_SIGNING_KEY_CREATE": True,
        "AUDIT_PUBLIC_KEY_FILE": "",
        "ARCHIVE_DIR": str(tmp_path / "archive"),
    }


#: Daily, and each run fetches the statements from the provider (work, logged at INFO): not idle.
STATEMENTS = "reconciliation.reconcile_statements"


def run_every_periodic_task() -> None:
    """Every job of the beat schedule but the daily statement fetch, once."""
    names = {entry["task"] for entry in celery_app.conf.beat_schedule.values()}
    assert names == set(PERIODIC)
    for name in sorted(names - {STATEMENTS}):
        PERIODIC[name]()


def ledger_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name.startswith(("operations", "reconciliation")) and r.levelno >= level
    ]


def test_i39_7_every_periodic_task_logs_at_debug_when_it_did_nothing_and_at_info_when_it_did(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # given: a ledger with nothing to do, and one run of every job done (the first audit
    # checkpoint of an empty log is signed: work)
    caplog.set_level(logging.DEBUG)
    run_every_periodic_task()
    caplog.clear()
    # when: every job runs again, idle
    run_every_periodic_task()
    # then: nothing at INFO or above; each job said at DEBUG what it did (nothing)
    assert [(r.levelname, r.getMessage()) for r in ledger_records(caplog, logging.INFO)] == []
    assert {getattr(r, "job", None) for r in ledger_records(caplog, logging.DEBUG)} >= set(PERIODIC) - {
        STATEMENTS
    }
    # when: there is something to send
    UserFactory(username="alice", groups=["approver"])
    submit(arguments=charge_arguments(25_000))
    caplog.clear()
    run_every_periodic_task()
    # then: the sender says so at INFO, and the audit checkpoint (the log grew); the others
    # stay at DEBUG
    assert sorted(r.getMessage() for r in ledger_records(caplog, logging.INFO)) == [
        "audit checkpoint signed",
        "periodic job operations.send_notifications: 1",
    ]


def celery_record(logger: str, message: str, args: Any = None, data: Any = None) -> logging.LogRecord:
    record = logging.getLogger(logger).makeRecord(logger, logging.INFO, __file__, 1, message, args, None)
    if data is not None:
        record.data = data
    return record


def test_i39_7_celerys_lines_about_a_periodic_run_are_debug_and_others_pass(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # given: the filter of the console handler (console/settings.py LOGGING)
    handler = django_settings.LOGGING["handlers"]["console"]
    assert handler["filters"] == ["periodic_task_runs"]
    assert django_settings.LOGGING["filters"]["periodic_task_runs"]["()"].endswith("PeriodicTaskRunsAtDebug")
    quiet = PeriodicTaskRunsAtDebug()
    beat = celery_record(
        "celery.beat", "Scheduler: Sending due task %s (%s)", ("relay-outbox", "operations.relay_outbox")
    )
    received = celery_record(
        "celery.worker.strategy", "Task %(name)s[%(id)s] received", data={"name": "reconciliation.prune"}
    )
    succeeded = celery_record(
        "celery.app.trace", "Task %(name)s succeeded", data={"name": "operations.send_notifications"}
    )
    executed = celery_record(
        "celery.app.trace", "Task %(name)s succeeded", data={"name": "operations.execute_intent"}
    )
    # when / then: at INFO, the periodic runs' lines are dropped; an intent's execution is kept
    assert [quiet.filter(r) for r in (beat, received, succeeded, executed)] == [False, False, False, True]
    assert executed.levelname == "INFO" and beat.levelname == "DEBUG"
    # and with LOG_LEVEL=DEBUG they are written, as DEBUG
    logging.getLogger("celery.beat").setLevel(logging.DEBUG)
    try:
        again = celery_record(
            "celery.beat", "Scheduler: Sending due task %s (%s)", ("prune", "reconciliation.prune")
        )
        assert quiet.filter(again) and again.levelno == logging.DEBUG
    finally:
        logging.getLogger("celery.beat").setLevel(logging.NOTSET)


def test_i39_7_the_default_email_backend_prints_a_notice_as_plain_text_on_the_terminal(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: the default backend, in a Celery worker whose sys.stdout is its logging proxy
    # (pytest-django swaps in locmem: the module's own value is the default)
    assert settings_module.EMAIL_BACKEND == "console.email_backend.TerminalEmailBackend"
    proxy = io.StringIO()
    monkeypatch.setattr(sys, "stdout", proxy)
    body = 'Approval requested: http://127.0.0.1:8000/approvals/1/\n  Reference: "ord-77"\n'
    # when
    EmailMessage(
        subject="[Effect Ledger] Approval requested: payments.charge v1",
        body=body,
        from_email="Effect Ledger <effect-ledger@localhost>",
        to=["operator@localhost"],
        connection=get_connection(settings_module.EMAIL_BACKEND),
    ).send()
    # then: the terminal shows who it is to, the subject and the text with its link, as is
    printed = capfd.readouterr().out
    assert proxy.getvalue() == ""
    assert printed.splitlines() == [
        "----- email to operator@localhost " + "-" * 45,
        "From: Effect Ledger <effect-ledger@localhost>",
        "Subject: [Effect Ledger] Approval requested: payments.charge v1",
        "",
        "Approval requested: http://127.0.0.1:8000/approvals/1/",
        '  Reference: "ord-77"',
        "-" * 79,
    ]
