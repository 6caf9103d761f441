"""Issue 36: the bench's growth and archive phases, at tiny sizes, and the synthetic intents
they load (``console.lab.bench.bulk``): shaped like a real intent, with audit chains that
``verify_audit`` finds intact.

Benchmarks are not timed tests: nothing here asserts a speed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from rest_framework.test import APIClient

from console.lab.bench import bulk
from console.lab.bench.growth import _archiver
from console.lab.bench.shapes import EVENTS_BY_STATE, rows_per_table
from console.lab.sandbox_provider.database import dsn_from_settings_dict
from operations.audit.chain_checks import audit_verify
from operations.audit.request_integrity import stored_request_problem
from operations.engine.protocol import execute_intent
from operations.models import Attempt, AuditEvent, Intent, OutboxMessage, Outcome
from tests.factories import make_agent
from tests.support.processes import sandbox, sandbox_provider  # noqa: F401

BASE_DIR = Path(__file__).resolve().parents[3]
#: The tables a generated SUCCEEDED intent writes, as the growth table names them.
GROWN_TABLES = [table for table, _, _ in bulk.TABLES]


def _bench(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Run ``manage.py bench ARGS`` on a scratch database of this test run's own; its output
    and its ``--json`` results."""
    scratch = os.environ.get("EFFECT_LEDGER_TEST_DATABASE", "test_effect_ledger") + "_bench_growth"
    out = tmp_path / "bench.json"
    completed = subprocess.run(
        [sys.executable, "manage.py", "bench", *args, "--database", scratch, "--json", str(out)],
        cwd=BASE_DIR, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return completed, json.loads(out.read_text())


def _growth_rows(markdown: str) -> dict[str, int]:
    """Table name -> bytes per intent, from the growth table of the report (and ``total``)."""
    rows = {}
    for line in markdown.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 6 and (
            cells[0] == "total" or re.fullmatch(r"(operations|reconciliation)_\w+", cells[0])
        ):
            rows[cells[0]] = int(cells[3].replace(",", ""))
    return rows


def test_i36_the_growth_phase_names_every_table_an_intent_writes_with_its_bytes_per_intent(
    tmp_path: Path,
) -> None:
    # when
    completed, results = _bench(tmp_path, "--growth", "--growth-intents", "200")

    # then: every table a SUCCEEDED intent writes, with a positive size per intent, and a total
    printed = _growth_rows(completed.stdout)
    for table in GROWN_TABLES:
        assert printed.get(table, 0) > 0, (table, completed.stdout)
    assert printed["total"] == sum(size for table, size in printed.items() if table != "total")
    assert printed["total"] >= sum(printed[table] for table in GROWN_TABLES)
    # and the rows per intent of the shape, counted in the database
    tables = {table["table"]: table for table in results["growth"]["tables"]}
    assert tables["operations_intent"]["rows"] == 200
    assert tables["operations_auditevent"]["rows_per_intent"] == 3.0
    assert "Not generated, though the real path writes them" in completed.stdout


@pytest.mark.django_db(transaction=True)
def test_i36_the_generated_chains_of_every_state_verify_as_verify_audit_checks_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # given: a few intents in each state the generator knows, loaded by COPY
    dsn = dsn_from_settings_dict(connection.settings_dict)
    for state in EVENTS_BY_STATE:
        bulk.load_intents(dsn, count=3, status=state, tag=f"chain-{state.lower()}")
    expected_events = sum(3 * rows_per_table(state)["events"] for state in EVENTS_BY_STATE)

    # when: the chains are walked as manage.py verify_audit walks them
    breaks = list(audit_verify())
    call_command("verify_audit", "--database-only")

    # then: no break (hashes, links, seqs, and each intent where its chain left it)
    assert breaks == []
    assert AuditEvent.objects.count() == expected_events
    assert f"audit chain intact: {expected_events} events verified" in capsys.readouterr().out
    assert set(Intent.objects.values_list("status", flat=True)) == set(EVENTS_BY_STATE)


def _shape(intent_id: uuid.UUID) -> dict[str, Any]:
    """What one intent's rows look like, without their values: rows per table, the chain's
    moves and data keys, the attempt's and outcome's kinds and detail keys, the outbox message,
    the intent's empty columns and its key's form."""
    intent = Intent.objects.get(id=intent_id)
    outbox = list(OutboxMessage.objects.filter(intent_id=intent_id))
    return {
        "events": [
            (e.event, e.from_status, e.to_status, e.actor.split(":")[0], sorted(e.data))
            for e in AuditEvent.objects.filter(intent_id=intent_id).order_by("seq")
        ],
        "attempts": [
            (a.attempt_no, a.fence, a.result, a.finished_at is not None, sorted(a.detail))
            for a in Attempt.objects.filter(intent_id=intent_id)
        ],
        "outcomes": [
            (
                o.source,
                o.attempt_id is not None,
                bool(o.provider_reference),
                len(o.response_digest),
                sorted(o.detail),
            )
            for o in Outcome.objects.filter(intent_id=intent_id)
        ],
        "outbox": [
            (
                m.task,
                sorted(json.loads(m.body)),
                m.sent_at is not None,
                m.acked_at is not None,
                m.publish_count,
            )
            for m in outbox
        ],
        "empty_columns": sorted(
            f.attname for f in Intent._meta.concrete_fields if getattr(intent, f.attname) in (None, "", {})
        ),
        "status": intent.status,
        "fence": intent.fence,
        "attempt_count": intent.attempt_count,
        "key_length": len(intent.idempotency_key),
        "key_prefix": intent.idempotency_key[:3],
    }


@pytest.mark.django_db(transaction=True)
def test_i36_a_generated_succeeded_intent_has_the_rows_of_one_the_real_path_ran(
    sandbox: Any,  # noqa: F811
) -> None:
    # given: an intent submitted through the API and executed by the engine against the sandbox
    _, token = make_agent()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    response = client.post(
        "/api/v1/intents",
        {"action": "payments.charge", "arguments": {"amount": 1200, "currency": "EUR", "customer": "c"},
         "reference": "growth-real"},
        format="json",
        HTTP_IDEMPOTENCY_KEY="growth-real",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    real = uuid.UUID(response.json()["intent_id"])
    assert execute_intent(real) == "succeeded"
    # and one the bench generated
    loaded = bulk.load_intents(
        dsn_from_settings_dict(connection.settings_dict), count=1, status="SUCCEEDED", tag="growth"
    )

    # when
    real_shape, generated_shape = _shape(real), _shape(loaded["ids_sample"][0])

    # then: the same rows, moves and keys
    assert generated_shape == real_shape
    assert len(real_shape["events"]) == rows_per_table("SUCCEEDED")["events"]
    # and its stored request proves itself as a real one does (request_hash, policy and key seal)
    assert stored_request_problem(Intent.objects.get(id=loaded["ids_sample"][0])) is None


def test_i36_the_archive_phase_times_the_console_and_the_api_before_and_after_archiving(
    tmp_path: Path,
) -> None:
    # when: 2,000 intents (--skip-console-scale), 90 % of them settled before the cutoff
    completed, results = _bench(tmp_path, "--archive-growth", "--skip-console-scale")

    # then: every console page and the API's list and detail timed before archiving
    archive = results["archive"]
    pages = archive["before"]["pages"]
    assert {"dashboard", "intent detail", "API list", "API detail"} <= pages.keys()
    for page in pages.values():
        assert isinstance(page["p95_ms"], int | float), page
    assert archive["before"]["intent_rows"] == 2000
    assert archive["before"]["database_bytes"] > 0
    if _archiver() is None:
        # and, until the archiver is built, the report says so
        assert archive["after"] is None
        assert "The archiver is not available" in completed.stdout
    else:
        # and after archiving: the same pages, the settled 90 % gone from the live tables
        assert archive["archive"]["intents_archived"] == archive["load"]["archivable"]
        assert archive["after"]["intent_rows"] == 2000 - archive["load"]["archivable"]
        assert archive["after"]["pages"].keys() == pages.keys()
        assert archive["archive"]["bytes_on_disk"] > 0
