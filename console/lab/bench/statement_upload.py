"""A CSV statement upload at the documented caps, timed (issue 39 item 10): the upload request
through the real console view, then the import task's slices run in this process, on a
scratch database (``manage.py bench_statement_upload``).

Two statements of ``lines`` lines: ``matched``, every line an intent's effect (SUCCEEDED
intents bulk-loaded with their outcomes, ``console.lab.bench.bulk``), the usual day; and
``extra``, no line any intent's (each an ``extra_at_provider`` finding), the most writes a line
can cost. Figures, never a pass or fail: the machine decides them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import time
import uuid
from typing import Any

from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.urls import reverse
from kombu import Queue

from console.accounts import console_user_create
from console.celery import app
from console.lab.bench import bulk, database
from operations.models import Intent
from reconciliation.models import StatementRun, StatementUpload
from reconciliation.statement_csv import save_mapping
from reconciliation.statement_uploads import statement_upload_import

SOURCE = "sandbox-payments"
COLUMNS = {"provider_reference": "Charge ID", "amount": "Amount", "currency": "Currency"}


def _log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _matched_csv() -> bytes:
    """One line per SUCCEEDED intent: its outcome's provider reference and its amount (matched
    by the provider's reference, as a provider's export without our key is)."""
    rows = (
        Intent.objects.filter(status=Intent.Status.SUCCEEDED, outcomes__isnull=False)
        .values_list("outcomes__provider_reference", "arguments__amount")
        .order_by("created_at")
    )
    body = "".join(f"{ref},{amount / 100:.2f},EUR\n" for ref, amount in rows.iterator())
    return f"Charge ID,Amount,Currency\n{body}".encode()


def _extra_csv(lines: int) -> bytes:
    body = "".join(f"ch_nobody_{n},49.90,EUR\n" for n in range(lines))
    return f"Charge ID,Amount,Currency\n{body}".encode()


def _measure(client: Client, name: str, data: bytes, day: dt.date) -> dict[str, Any]:
    """Upload ``data`` through the console and import it slice by slice, timed."""
    began = time.perf_counter()
    answer = client.post(
        reverse("statement-upload"),
        {"source": SOURCE, "date": day.isoformat(), "file": SimpleUploadedFile(f"{name}.csv", data)},
    )
    request_seconds = time.perf_counter() - began
    if answer.status_code != 302:
        refused = re.search(r'<p class="error" role="alert">([^<]*)</p>', answer.content.decode())
        raise RuntimeError(f"the upload was refused: {refused.group(1) if refused else answer.status_code}")
    upload = StatementUpload.objects.defer("data").order_by("-id").first()
    assert upload is not None and upload.status == "queued"
    slices = []
    began = time.perf_counter()
    status = upload.status
    while status not in ("done", "failed"):
        start = time.perf_counter()
        current = StatementUpload.objects.defer("data").get(id=upload.id)
        status = statement_upload_import(upload_id=upload.id, message_id=current.message_id)
        slices.append(round(time.perf_counter() - start, 2))
    import_seconds = time.perf_counter() - began
    run = StatementRun.objects.get(id=upload.run_id)
    return {
        "statement": name,
        "lines": upload.total_lines,
        "bytes": len(data),
        "upload_request_seconds": round(request_seconds, 2),
        "import_seconds": round(import_seconds, 1),
        "slices": slices,
        "lines_per_second": round(upload.total_lines / import_seconds) if import_seconds else None,
        "status": str(status),
        "run": {
            "matched": run.matched,
            "extra": run.extra_at_provider,
            "missing": run.missing_at_provider,
            "mismatches": run.amount_mismatches,
            "error": run.error,
        },  # fmt: skip
    }


def run_bench(*, lines: int, scratch: str, keep: bool) -> list[dict[str, Any]]:
    """Create ``scratch``, load ``lines`` SUCCEEDED intents, time both statements (module
    docstring), and drop ``scratch`` unless ``keep``. Returns one result per statement."""
    user_db = str(connection.settings_dict["NAME"])
    database.recreate_database(scratch, admin_db=user_db)
    database.use_database(scratch)
    # The hand-off after commit publishes to a queue of the bench's own, deleted at the end:
    # no worker of a quick start on this broker sees the messages.
    queue = f"bench-statements-{uuid.uuid4().hex[:8]}"
    app.conf.task_default_queue = queue
    try:
        call_command("migrate", verbosity=0)
        day = dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1)
        ends_at = dt.datetime.combine(day, dt.time(23, 0), tzinfo=dt.UTC)
        _log(f"loading {lines} SUCCEEDED intents")
        bulk.load_intents(
            database.server_dsn(scratch), count=lines, status="SUCCEEDED", span_days=0.9, ends_at=ends_at
        )
        with connection.cursor() as cursor:  # statistics, as autovacuum keeps them on a live ledger
            cursor.execute("ANALYZE")
        user, _ = console_user_create(username="bench-operator", roles=["operator"], all_tenants=True)
        save_mapping(source=SOURCE, columns=COLUMNS, actor="user:bench-operator")
        client = Client()
        client.force_login(user)
        results = []
        for name, data in (("matched", _matched_csv()), ("extra", _extra_csv(lines))):
            _log(f"uploading and importing the {name} statement ({len(data)} bytes)")
            results.append(_measure(client, name, data, day))
            _log(str(results[-1]))
        return results
    finally:
        with contextlib.suppress(Exception), app.connection_for_write() as conn:
            Queue(queue, channel=conn.default_channel).delete()
        database.use_database(user_db)
        if not keep:
            database.drop_database(scratch, admin_db=user_db)
