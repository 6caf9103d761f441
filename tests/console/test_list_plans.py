"""The console lists' filters and sorts stay on an index at 100,000 intents (issue 16 item 3).

100,000 intents are loaded with one ``INSERT ... SELECT FROM generate_series`` into the test
database (the lab's bulk loader, ``console.lab.bench.bulk``, COPYs over its own connection and
commits, which a test's transaction cannot roll back), the table is ANALYZEd, and the plan of
each selector's own queryset is read with ``.explain()``: it must name the index the filter or
sort is meant to use, and hold no ``Seq Scan on operations_intent``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from operations import selectors
from operations.access.tenants import EVERY_TENANT
from operations.selectors import ListFilters
from reconciliation import selectors as queue

pytestmark = pytest.mark.django_db

ROWS = 100_000

#: 2% AWAITING_APPROVAL, 1% UNKNOWN, the rest SUCCEEDED; two tenants; one second apart.
LOAD = f"""
INSERT INTO operations_intent (
    id, tenant, principal, action, action_version, arguments, request_hash, forgotten_changes,
    fingerprint_version, client_key, idempotency_key, reference, metadata, policy, risk_rank,
    status, fence, lease_owner, attempt_count, approval_expires_at, lookup_count, next_lookup_at,
    last_error, business_key, hold_reason, wait_reason, ceiling_override, approval_round,
    created_at, updated_at
)
SELECT
    gen_random_uuid(),
    CASE WHEN i % 4 = 0 THEN 'globex' ELSE 'acme' END,
    'agent:bench', 'payments.charge', 1,
    jsonb_build_object('amount', 1000 + i % 9000, 'currency', 'EUR', 'customer', 'cus_' || (i % 9973)),
    md5(i::text) || md5(i::text), false, 2, 'bulk-' || i, 'el:bulk:' || i, 'Bulk-Order-' || i,
    '{{}}'::jsonb, '{{"risk_tier": "high", "approvals_required": 1}}'::jsonb, 1 + i % 4,
    CASE WHEN i % 100 < 2 THEN 'AWAITING_APPROVAL' WHEN i % 100 = 2 THEN 'UNKNOWN' ELSE 'SUCCEEDED' END,
    1, '', 1,
    CASE WHEN i % 100 < 2 THEN now() + (i % 600) * interval '1 minute' END,
    0,
    CASE WHEN i % 100 = 2 THEN now() END,
    '', '', '', '', false, 0,
    now() - i * interval '1 second', now() - i * interval '1 second' + interval '5 seconds'
FROM generate_series(1, {ROWS}) AS i
"""


#: One ``submitted`` event per intent; one in 1,000 by a person (``user:otto``), the rest by agents.
AUDIT_LOAD = """
INSERT INTO operations_auditevent (intent_id, seq, event, from_status, to_status, actor, reason, data,
    created_at, prev_hash, hash)
SELECT id, 1, 'submitted', '', status,
    CASE WHEN row_number() OVER (ORDER BY created_at) % 1000 = 0 THEN 'user:otto' ELSE 'agent:bench' END,
    '', '{}'::jsonb, created_at, repeat('0', 64), md5(id::text) || md5(id::text)
FROM operations_intent
"""


@pytest.fixture
def hundred_thousand_intents(db: Any) -> None:
    """Load ``ROWS`` intents in the test's transaction (rolled back after it). As the lab's
    loader does (``console.lab.bench.bulk._drop_secondary_indexes``), the secondary indexes are
    dropped before the load and built again after it: one sorted build each is several times
    faster than 100,000 insertions into each (DDL is transactional: the rollback restores them)."""
    began = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes"
            " WHERE tablename IN ('operations_intent', 'operations_auditevent')"
            " AND indexname NOT IN (SELECT conname FROM pg_constraint)"
            # its statistics target (migration 0023) is not part of its definition: kept
            " AND indexname <> 'intent_reference_upper'"
        )
        indexes = cursor.fetchall()
        for name, _ in indexes:
            cursor.execute(f'DROP INDEX "{name}"')
        # Skip the per-row foreign-key checks (the rows are consistent by construction), as
        # the lab's loader does (``_skip_row_triggers``); the test database's user is a superuser.
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute(LOAD)
        cursor.execute(AUDIT_LOAD)
        cursor.execute("SET LOCAL session_replication_role = origin")
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # run the deferred FK checks before DDL
        for _, definition in indexes:
            cursor.execute(definition)
        cursor.execute("ANALYZE operations_intent")
        cursor.execute("ANALYZE operations_auditevent")
        cursor.execute("SELECT count(*) FROM operations_intent")
        assert cursor.fetchone() == (ROWS,)
    print(f"loaded {ROWS} intents and their audit events in {time.perf_counter() - began:.1f} s")


def assert_uses(plan: str, *indexes: str) -> None:
    assert any(index in plan for index in indexes), plan
    assert "Seq Scan on operations_intent" not in plan, plan


def some_intent_id() -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM operations_intent WHERE status = 'SUCCEEDED' ORDER BY created_at LIMIT 1"
        )
        row = cursor.fetchone()
    assert row is not None
    return str(row[0])


def test_i16_3_list_filters_and_sorts_use_their_indexes_at_100k_intents(
    hundred_thousand_intents: None,
) -> None:
    # given: 100,000 intents, analyzed; the first 8 hex digits of one of them
    intent_id = some_intent_id()
    search = selectors.intent_search_queryset

    def intents_plan(**filters: Any) -> str:
        return search(selectors.IntentFilters(**filters), scope=EVERY_TENANT)[:51].explain()

    # when / then: an id prefix, with or without dashes, is a range of the primary key
    assert_uses(intents_plan(intent_id=intent_id[:8]), "operations_intent_pkey")
    assert_uses(intents_plan(intent_id=intent_id[:13].upper()), "operations_intent_pkey")
    quick = intents_plan(q=intent_id[:8])  # an id's start or a reference: both indexes, OR-ed
    assert_uses(quick, "operations_intent_pkey")
    assert_uses(quick, "intent_reference_upper")
    # a reference in any case, whole or by its start, is a range of intent_reference_upper
    assert_uses(intents_plan(reference="bulk-order-4242"), "intent_reference_upper")
    prefix_plan = intents_plan(reference="BULK-ORDER-4242*")
    assert_uses(prefix_plan, "intent_reference_upper")
    assert "~>=~" in prefix_plan  # the prefix is an index range (text_pattern_ops), not a filter
    assert_uses(intents_plan(q="bulk-ORDER-4242"), "intent_reference_upper")
    # each sort of each list reads its index in order
    for key, sort in selectors.INTENT_SORTS.items():
        assert_uses(intents_plan(sort=key), *sort.indexes)
    for key, sort in selectors.APPROVAL_SORTS.items():
        plan = selectors.approvals_inbox(scope=EVERY_TENANT, filters=ListFilters(sort=key))[:200].explain()
        assert_uses(plan, *sort.indexes)
    for key, sort in selectors.UNKNOWN_SORTS.items():
        plan = queue.unknown_queue(scope=EVERY_TENANT, filters=ListFilters(sort=key))[:200].explain()
        assert_uses(plan, *sort.indexes)
    # the next page of the oldest-first search starts from its cursor on the same index
    first = selectors.intent_search(selectors.IntentFilters(sort="created"), scope=EVERY_TENANT)
    plan = search(selectors.IntentFilters(sort="created"), scope=EVERY_TENANT, cursor=first.next_cursor)[
        :51
    ].explain()
    assert_uses(plan, "intent_created")
    # the audit log by an actor's plain name reads that actor's events from audit_actor
    audit = selectors.audit_queryset(selectors.AuditFilters(actor="otto"), scope=EVERY_TENANT)[:51]
    plan = audit.explain()
    assert "audit_actor" in plan and "Seq Scan on operations_auditevent" not in plan, plan
    assert {event.actor for event in audit} == {"user:otto"} and len(list(audit)) == 51


#: One provider outcome per SUCCEEDED intent; 20 operator confirmations of the last days, half
#: of them unverified (``detail.verified`` false), as ``resolve_confirmed`` records them.
OUTCOME_LOAD = """
INSERT INTO operations_outcome (intent_id, source, provider_reference, response_digest, detail, created_at)
SELECT id,
    CASE WHEN row_number() OVER (ORDER BY created_at DESC) <= 20 THEN 'operator' ELSE 'provider' END,
    'ch_' || left(id::text, 8), '',
    CASE WHEN row_number() OVER (ORDER BY created_at DESC) <= 10 THEN '{"verified": false}'::jsonb
         ELSE '{}'::jsonb END,
    created_at
FROM operations_intent WHERE status = 'SUCCEEDED'
"""


def test_i37_console_unverified_confirmations_and_throughput_use_their_indexes_at_100k_intents(
    hundred_thousand_intents: None,
) -> None:
    # given: 100,000 intents with their outcomes (20 by an operator) and a finished audit
    # event each (the last hour holds 3,600 of them), analyzed
    with connection.cursor() as cursor:
        cursor.execute(OUTCOME_LOAD)
        cursor.execute("ANALYZE operations_outcome")
    # when: the operators' queue's "confirmed without provider verification" section, and the
    # dashboard's last hour of throughput
    unverified = queue.recently_unverified(scope=EVERY_TENANT)[:201]
    with CaptureQueriesContext(connection) as captured:
        minutes = selectors.throughput_last_hour(scope=EVERY_TENANT)
    (throughput_sql,) = [q["sql"] for q in captured.captured_queries]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + throughput_sql)
        throughput_plan = "\n".join(row[0] for row in cursor.fetchall())
    # then: the operator outcomes' partial index, not a scan of one outcome per intent ever run
    plan = unverified.explain()
    assert "outcome_operator_recent" in plan and "Seq Scan on operations_outcome" not in plan, plan
    assert len(list(unverified)) == 10
    # and the finished events of the hour from their own index, not every event of the hour
    assert "audit_finished" in throughput_plan, throughput_plan
    assert "Seq Scan on operations_auditevent" not in throughput_plan, throughput_plan
    assert 3300 <= sum(m["succeeded"] for m in minutes) <= 3600  # 97 % of an hour of seconds
