"""Intents by state without reading the whole table (issue 13): the open states counted exactly
over a partial index, SUCCEEDED and the terminal states from the status rollup with its age."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.test import Client
from django.test.utils import CaptureQueriesContext

from console.celery import app as celery_app
from operations import tasks
from operations.adapters.base import ExecutionResult
from operations.models import (
    OPEN_STATUS_VALUES,
    OPEN_STATUSES,
    SETTLED_STATUS_VALUES,
    STATUS_VALUES,
    TERMINAL_STATUSES,
    Intent,
    StatusRollup,
)
from operations.selectors import intent_status_counts
from operations.selectors import status_counts as status_counts_module
from operations.services import (
    intent_cancel,
    intent_claim,
    intent_mark_unknown,
    intent_record_failure,
    intent_record_success,
    status_rollup_refresh,
)
from tests.factories import charge_arguments, submit

pytestmark = pytest.mark.django_db

S = Intent.Status


def running() -> Intent:
    intent = submit()
    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None
    return claim.intent


def succeeded(tenant: str = "acme") -> Intent:
    intent = submit(tenant=tenant)
    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None
    assert intent_record_success(
        claim=claim, result=ExecutionResult(provider_reference="ch", response_digest="d")
    )
    return intent


def failed() -> Intent:
    intent = submit()
    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None and intent_record_failure(claim=claim, error="card declined")
    return intent


def cancelled() -> Intent:
    return intent_cancel(intent_id=submit().id, actor="agent:agent-1", reason="changed my mind")


def unknown() -> Intent:
    intent = submit()
    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None and intent_mark_unknown(claim=claim, error="lost", cause="ambiguous")
    return intent


def exact_counts() -> dict[str, int]:
    """The whole-table GROUP BY the dashboard no longer runs: the reference answer."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT status, count(*) FROM operations_intent GROUP BY status")
        return dict(cursor.fetchall())


def rollup_aged(seconds: int) -> None:
    """Make the stored rollup ``seconds`` old (database clock)."""
    StatusRollup.objects.update(computed_at=Now() - timedelta(seconds=seconds))


def test_every_state_is_either_open_and_exact_or_settled_and_rolled_up() -> None:
    # then: one partition of the states, the open ones those a business action waits behind
    assert set(OPEN_STATUS_VALUES) | set(SETTLED_STATUS_VALUES) == set(STATUS_VALUES) == set(S.values)
    assert not set(OPEN_STATUS_VALUES) & set(SETTLED_STATUS_VALUES)
    assert {S.AWAITING_APPROVAL, S.READY, S.RUNNING, S.UNKNOWN, S.COMPENSATING, S.HELD} == OPEN_STATUSES
    assert not OPEN_STATUSES & TERMINAL_STATUSES
    assert set(SETTLED_STATUS_VALUES) == {
        "SUCCEEDED",
        "FAILED",
        "COMPENSATED",
        "REJECTED",
        "EXPIRED",
        "CANCELLED",
    }


def test_open_states_are_counted_exactly_whatever_the_rollup_says() -> None:
    # given: intents in open states, and a rollup taken before most of them existed
    succeeded()
    status_rollup_refresh()
    submit()
    submit()
    submit(arguments=charge_arguments(25_000))  # AWAITING_APPROVAL
    running()
    unknown()
    cancelled()
    # when
    counts = intent_status_counts()
    # then: every open state is exact and marked so
    exact = exact_counts()
    assert {row.status: row.count for row in counts.open} == {s: exact.get(s, 0) for s in OPEN_STATUS_VALUES}
    assert {row.status: row.count for row in counts.open}[S.READY] == 2
    assert all(row.exact for row in counts.open)
    assert [row.status for row in counts.open] == OPEN_STATUS_VALUES


def test_settled_states_come_from_the_rollup_with_its_age() -> None:
    # given: a rollup of one SUCCEEDED and one FAILED, 42 s old, and a SUCCEEDED since
    succeeded()
    failed()
    status_rollup_refresh()
    rollup_aged(42)
    succeeded()
    # when
    counts = intent_status_counts()
    # then: the rollup's numbers, not the table's, and how old they are
    assert counts.source == "rollup"
    settled = {row.status: row.count for row in counts.settled}
    assert settled == {
        "SUCCEEDED": 1,
        "FAILED": 1,
        "COMPENSATED": 0,
        "REJECTED": 0,
        "EXPIRED": 0,
        "CANCELLED": 0,
    }
    assert not any(row.exact for row in counts.settled)
    assert counts.rollup_age_seconds is not None and 42 <= counts.rollup_age_seconds < 52
    assert counts.rollup_computed_at is not None and not counts.rollup_stale
    assert counts.by_status["SUCCEEDED"] == 1 and list(counts.by_status) == STATUS_VALUES


def test_a_rollup_older_than_three_periods_is_flagged_stale(settings: Any) -> None:
    # given: a 60 s period and a rollup 10 minutes old (the beat stopped)
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "STATUS_ROLLUP_PERIOD_SECONDS": 60.0}
    status_rollup_refresh()
    rollup_aged(600)
    # when / then
    assert intent_status_counts().rollup_stale


def test_the_refresh_counts_every_settled_state_zeros_included() -> None:
    # given: intents in several states
    succeeded()
    succeeded()
    failed()
    cancelled()
    submit()
    unknown()
    # when
    written = status_rollup_refresh()
    # then: one row per settled state, equal to the exact count at that moment
    exact = exact_counts()
    assert written == {status: exact.get(status, 0) for status in SETTLED_STATUS_VALUES}
    assert written["SUCCEEDED"] == 2 and written["FAILED"] == 1 and written["CANCELLED"] == 1
    rows = {row.status: row for row in StatusRollup.objects.filter(tenant="*")}
    assert {status: row.count for status, row in rows.items()} == written
    assert len({row.computed_at for row in rows.values()}) == 1  # one statement, one moment


def test_a_later_refresh_replaces_the_counts() -> None:
    # given
    succeeded()
    status_rollup_refresh()
    rollup_aged(120)
    before = StatusRollup.objects.get(tenant="*", status="SUCCEEDED").computed_at
    succeeded()
    # when
    written = status_rollup_refresh()
    # then
    row = StatusRollup.objects.get(tenant="*", status="SUCCEEDED")
    assert written["SUCCEEDED"] == 2 and row.count == 2 and row.computed_at > before


def test_a_refresh_never_overwrites_a_newer_one() -> None:
    # given: a rollup stamped later than this refresh's statement (an overlapping refresh that
    # counted after it and committed first)
    succeeded()
    status_rollup_refresh()
    StatusRollup.objects.update(computed_at=Now() + timedelta(hours=1), count=7)
    # when
    written = status_rollup_refresh()
    # then: nothing written, the newer counts stay
    assert written == {}
    assert set(StatusRollup.objects.values_list("count", flat=True)) == {7}


def test_without_a_rollup_few_settled_intents_are_counted_exactly() -> None:
    # given: no rollup yet (a new installation), a few settled intents
    succeeded()
    cancelled()
    # when
    counts = intent_status_counts()
    # then
    assert counts.source == "exact" and counts.rollup_age_seconds is None
    assert {row.status: row.count for row in counts.settled}["SUCCEEDED"] == 1
    assert all(row.exact for row in counts.settled)


def test_without_a_rollup_many_settled_intents_are_not_computed_yet(monkeypatch: Any) -> None:
    # given: no rollup yet, and more settled intents than the exact fallback counts
    monkeypatch.setattr(status_counts_module, "EXACT_FALLBACK_LIMIT", 2)
    succeeded()
    succeeded()
    failed()
    submit()
    # when
    counts = intent_status_counts()
    # then: unknown, not a wrong number; the open states are still exact
    assert counts.source == "missing"
    assert all(row.count is None for row in counts.settled)
    assert counts.by_status["READY"] == 1 and counts.by_status["SUCCEEDED"] is None


def test_open_state_counts_use_the_partial_index_not_a_seq_scan() -> None:
    # given: 60,000 intents, nearly all settled, and fresh statistics (as autovacuum keeps them)
    template = submit()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO operations_intent (id, tenant, principal, action, action_version, arguments, request_hash,
                client_key, idempotency_key, reference, metadata, policy, risk_rank, status, fence, lease_owner,
                attempt_count, last_error, lookup_count, created_at, updated_at)
            SELECT gen_random_uuid(), tenant, principal, action, action_version, arguments, request_hash,
                'bulk-' || g, 'el_bulk_' || g, reference, metadata, policy, risk_rank,
                CASE WHEN g %% 1000 = 0 THEN 'READY' WHEN g %% 10 = 0 THEN 'FAILED' ELSE 'SUCCEEDED' END,
                1, '', 1, '', 0, now(), now()
            FROM operations_intent, generate_series(1, 60000) AS g WHERE id = %s
            """,
            [template.id],
        )
        cursor.execute("ANALYZE operations_intent")
    # when: the dashboard's open-state count, as it runs
    with CaptureQueriesContext(connection) as captured:
        counts = intent_status_counts()
    (sql,) = [q["sql"] for q in captured.captured_queries if "'AWAITING_APPROVAL'" in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    # then: an index bounded by the open rows (the partial one, or the status index's open
    # range, whichever the planner prices lower), never a scan of the table
    assert "intent_open_status" in plan or "Index Only Scan using intent_status_created" in plan, plan
    assert "Seq Scan on operations_intent" not in plan, plan
    assert counts.by_status["READY"] == 61  # the template and every thousandth row


def test_the_beat_refreshes_the_rollup_every_period() -> None:
    # given
    succeeded()
    entry = celery_app.conf.beat_schedule["status-rollup"]
    # when
    written = tasks.status_rollup()
    # then
    assert entry["task"] == tasks.status_rollup.name == "operations.status_rollup"
    assert entry["schedule"] == 60.0  # settings.EFFECT_LEDGER["STATUS_ROLLUP_PERIOD_SECONDS"] by default
    assert written["SUCCEEDED"] == 1 and StatusRollup.objects.get(tenant="*", status="SUCCEEDED").count == 1


def test_metrics_serve_the_same_counts_and_the_rollup_age() -> None:
    # given: a rollup of one SUCCEEDED, 42 s old, a second SUCCEEDED since, and a READY intent
    succeeded()
    status_rollup_refresh()
    rollup_aged(42)
    succeeded()
    submit()
    # when
    text = Client().get("/metrics").content.decode()
    # then: the dashboard's rule, one place
    assert 'effect_ledger_intents{status="SUCCEEDED"} 1.0' in text
    assert 'effect_ledger_intents{status="READY"} 1.0' in text
    assert "effect_ledger_intents_rollup_age_seconds 4" in text  # 42.x


def test_metrics_leave_out_settled_states_not_computed_yet(monkeypatch: Any) -> None:
    # given: no rollup and more settled intents than the exact fallback counts
    monkeypatch.setattr(status_counts_module, "EXACT_FALLBACK_LIMIT", 0)
    succeeded()
    # when
    text = Client().get("/metrics").content.decode()
    # then: absent rather than a wrong 0
    assert 'effect_ledger_intents{status="SUCCEEDED"}' not in text
    assert 'effect_ledger_intents{status="READY"} 0.0' in text
    assert "effect_ledger_intents_rollup_age_seconds" not in text


def test_i18_5_the_rollup_counts_each_tenant_and_a_scope_sums_its_own() -> None:
    # given: settled intents in two tenants, rolled up
    from operations.access.tenants import TenantScope

    succeeded("acme")
    succeeded("globex")
    succeeded("globex")
    status_rollup_refresh()
    # when
    acme = intent_status_counts(scope=TenantScope(every=False, names=frozenset({"acme"})))
    both = intent_status_counts()
    # then: the reader of acme sees acme's count from the rollup, every tenant the sum
    assert acme.source == both.source == "rollup"
    assert acme.by_status["SUCCEEDED"] == 1 and acme.by_status["FAILED"] == 0
    assert both.by_status["SUCCEEDED"] == 3
    assert acme.rollup_age_seconds is not None


def test_i18_5_a_tenant_whose_intents_left_a_state_is_rewritten_to_zero() -> None:
    # given: a rollup that counted one globex SUCCEEDED, and that row's intent gone from it
    # (rewritten by hand: the refresh must not leave a tenant's old count behind)
    succeeded("globex")
    status_rollup_refresh()
    StatusRollup.objects.filter(tenant="globex").update(computed_at=Now() - timedelta(hours=1))
    Intent.objects.filter(tenant="globex").update(tenant="initech")
    # when
    status_rollup_refresh()
    # then
    assert StatusRollup.objects.get(tenant="globex", status="SUCCEEDED").count == 0
    assert StatusRollup.objects.get(tenant="initech", status="SUCCEEDED").count == 1
