"""Intents search and detail, the audit log, and the dashboard."""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.test import Client
from django.urls import reverse

from operations import selectors
from operations.access.tenants import EVERY_TENANT
from operations.idempotency import key_digest
from operations.models import AuditEvent, Intent, StatusRollup
from operations.selectors import status_counts
from operations.services import intent_approve, intent_cancel, status_rollup_refresh
from tests.console.conftest import claimed, gated, make_unknown, status_count
from tests.factories import charge_arguments, submit

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


# --- intents --------------------------------------------------------------------------------


def test_search_by_each_field(viewer_client: Client) -> None:
    # given
    a = submit(reference="order-1")
    b = submit(
        tenant="globex", action="email.send", arguments={"to": "x@example.test", "subject": "hi", "body": "b"}
    )
    c = gated(principal="user:carol")
    url = reverse("intents")

    def found(**params: str) -> set[str]:
        body = viewer_client.get(url, params).content.decode()
        return {str(i.id)[:12] for i in (a, b, c) if str(i.id)[:12] in body}

    # then
    assert found(q=str(a.id)) == {str(a.id)[:12]}
    assert found(q="order-1") == {str(a.id)[:12]}
    assert found(tenant="globex") == {str(b.id)[:12]}
    assert found(action="email.send") == {str(b.id)[:12]}
    assert found(status="AWAITING_APPROVAL") == {str(c.id)[:12]}
    assert found(principal="user:carol") == {str(c.id)[:12]}
    assert found(created_after="2000-01-01T00:00") == {str(i.id)[:12] for i in (a, b, c)}
    assert found(created_before="2000-01-01T00:00") == set()


def test_invalid_filter_is_a_visible_422(viewer_client: Client) -> None:
    response = viewer_client.get(reverse("intents"), {"status": "NOPE"})
    assert response.status_code == 422 and b"status" in response.content


def test_keyset_pagination_walks_every_row_once() -> None:
    # given: seven intents, three with the same created_at (ties broken by id)
    intents = [submit() for _ in range(7)]
    Intent.objects.filter(id__in=[i.id for i in intents[:3]]).update(created_at=intents[0].created_at)
    # when
    seen: list[Any] = []
    cursor = None
    while True:
        page = selectors.intent_search(selectors.IntentFilters(), scope=EVERY_TENANT, cursor=cursor, limit=3)
        seen.extend(row.id for row in page.rows)
        if not page.next_cursor:
            break
        cursor = page.next_cursor
    # then
    assert sorted(seen) == sorted(i.id for i in intents) and len(seen) == 7


def test_keyset_query_is_served_by_the_created_index() -> None:
    # given
    submit()
    page_cursor = selectors.encode_cursor(Intent.objects.get().created_at, Intent.objects.get().id)
    from django.db.models import Q

    position = selectors.decode_cursor(page_cursor)
    assert position is not None
    created_at, row_id = position
    queryset = (
        Intent.objects.filter(created_at__lte=created_at)
        .filter(Q(created_at__lt=created_at) | Q(id__gt=row_id))
        .order_by("-created_at", "id")[:51]
    )
    # when: with sequential scans priced out, as on a large table
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        plan = queryset.explain()
    # then
    assert "intent_created" in plan


def test_next_page_link_keeps_the_filters(viewer_client: Client, monkeypatch: Any) -> None:
    monkeypatch.setattr(selectors, "PAGE_SIZE", 2)
    for _ in range(3):
        submit(tenant="acme")
    body = viewer_client.get(reverse("intents"), {"tenant": "acme"}).content.decode()
    assert "tenant=acme&amp;cursor=" in body


def test_c32_intent_detail_says_how_many_in_progress_answers_were_waited_out(viewer_client: Client) -> None:
    # given: six attempts, five of them answered "in progress" (waited out, not counted)
    intent = submit()
    Intent.objects.filter(id=intent.id).update(attempt_count=6, in_progress_waits=5)
    # when
    body = viewer_client.get(reverse("intent-detail", args=[intent.id])).content.decode()
    # then
    assert "6 attempts" in body
    assert (
        "(5 answered &ldquo;in progress&rdquo; and waited out, not counted against the attempt budget)"
        in body
    )
    # and an intent without such answers says nothing of them
    other = submit()
    assert (
        'id="in-progress-waits"'
        not in viewer_client.get(reverse("intent-detail", args=[other.id])).content.decode()
    )


def test_intent_detail_timeline_digest_policy_and_poll(viewer_client: Client, approver: Any) -> None:
    # given: approved and claimed
    intent = gated()
    intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash, reason="ok by me")
    claimed(Intent.objects.get(id=intent.id))
    # when
    body = viewer_client.get(reverse("intent-detail", args=[intent.id])).content.decode()
    # then
    for text in ("submitted", "approved by alice", "attempt 1 started, fence 1", "claimed", "ok by me"):
        assert text in body
    assert key_digest(intent.idempotency_key) in body and intent.idempotency_key not in body
    assert "approval_ttl_seconds" in body  # policy snapshot
    assert 'hx-trigger="every 2s"' in body  # RUNNING: the status refreshes
    poll = viewer_client.get(reverse("intent-detail", args=[intent.id]), **HTMX).content.decode()
    assert 'id="intent-status"' in poll and "RUNNING" in poll and "<html" not in poll


def test_terminal_intent_stops_polling(viewer_client: Client, approver: Any) -> None:
    intent = gated()
    from operations.services import intent_reject

    intent_reject(intent_id=intent.id, user=approver, request_hash=intent.request_hash, reason="no")
    body = viewer_client.get(reverse("intent-detail", args=[intent.id]), **HTMX).content.decode()
    assert "REJECTED" in body and "hx-trigger" not in body


def test_unknown_intent_links_to_its_evidence(viewer_client: Client) -> None:
    intent = make_unknown()
    body = viewer_client.get(reverse("intent-detail", args=[intent.id])).content.decode()
    assert reverse("unknown-detail", args=[intent.id]) in body


# --- audit ----------------------------------------------------------------------------------


def test_audit_log_filters_by_intent(viewer_client: Client) -> None:
    a, b = submit(), submit()
    body = viewer_client.get(reverse("audit"), {"intent_id": str(a.id)}).content.decode()
    assert str(a.id)[:12] in body and str(b.id)[:12] not in body


def test_audit_keyset_pagination() -> None:
    for _ in range(5):
        submit()
    seen, cursor = [], None
    while True:
        page = selectors.audit_search(selectors.AuditFilters(), scope=EVERY_TENANT, cursor=cursor, limit=2)
        seen.extend(row.id for row in page.rows)
        cursor = page.next_cursor
        if not cursor:
            break
    assert sorted(seen) == sorted(AuditEvent.objects.values_list("id", flat=True))


def test_audit_csv_export(viewer_client: Client) -> None:
    a, _ = submit(), submit()
    response = viewer_client.get(reverse("audit-export"), {"intent_id": str(a.id)})
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))  # type: ignore[attr-defined]
    assert [row["event"] for row in rows] == ["submitted"]
    assert rows[0]["intent_id"] == str(a.id) and len(rows[0]["hash"]) == 64


def test_audit_verification_ok_then_a_break(viewer_client: Client) -> None:
    # given
    submit()
    ok = viewer_client.get(reverse("audit-verify"), **HTMX).content.decode()
    assert "All chains verify" in ok
    # when: someone with owner rights edits an event behind the trigger's back
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        cursor.execute("UPDATE operations_auditevent SET reason = 'edited'")
        cursor.execute("SET session_replication_role = DEFAULT")
    # then (refresh bypasses the one-minute cache)
    broken = viewer_client.get(reverse("audit-verify"), {"refresh": "1"}).content.decode()
    assert "1 break found" in broken and "hash does not match" in broken


# --- dashboard ------------------------------------------------------------------------------


def test_dashboard_counts_waiting_unknown_outbox_and_chart(viewer_client: Client, approver: Any) -> None:
    # given
    gated()
    make_unknown()
    done = submit(arguments=charge_arguments(100))
    claim = claimed(done)
    from operations.adapters.base import ExecutionResult
    from operations.services import intent_record_success

    intent_record_success(claim=claim, result=ExecutionResult(provider_reference="ch_1", response_digest="d"))
    # when
    body = viewer_client.get(reverse("dashboard")).content.decode()
    # then
    assert "AWAITING_APPROVAL" in body and 'id="approvals-expiring">1<' in body
    assert "UNKNOWN by age" in body and "under 1 minute" in body
    assert "Duplicate deliveries absorbed" in body and "Stale fences rejected" in body
    assert "Prometheus counters" in body  # the page says where the numbers come from
    assert "<svg" in body and "1 succeeded, 0 failed" in body
    poll = viewer_client.get(reverse("dashboard"), **HTMX).content.decode()
    assert 'id="stats"' in poll and "<html" not in poll


def test_i37_console_throughput_counts_each_finished_intent_in_its_utc_minute() -> None:
    # given: finished events at the edges of the chart's minutes (read through date_bin from
    # the chart's first minute since issue 37, through date_trunc in UTC before), and others
    now = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)
    at = [
        (now.replace(minute=0, second=0) - timedelta(minutes=59, seconds=1), "SUCCEEDED"),  # before the hour
        (now.replace(minute=0, second=0) - timedelta(minutes=59), "SUCCEEDED"),  # its first minute
        (now.replace(second=0) - timedelta(microseconds=1), "FAILED"),  # 11:59:59.999999
        (now.replace(second=0), "SUCCEEDED"),  # 12:00:00, the last minute
        (now.replace(second=29), "FAILED"),
        (now.replace(second=0) + timedelta(minutes=1), "SUCCEEDED"),  # after the chart
        (now.replace(second=1), "RUNNING"),  # not a finish
    ]
    for seq, (created_at, to_status) in enumerate(at, start=1):
        AuditEvent.objects.create(seq=seq, event="test", to_status=to_status, actor="test",
                                  created_at=created_at, prev_hash="0" * 64, hash=f"{seq:064d}")  # fmt: skip
    # when
    minutes = selectors.throughput_last_hour(scope=EVERY_TENANT, now=now)
    # then: sixty minutes, each event in its own
    counted = {
        m["minute"].strftime("%H:%M"): (m["succeeded"], m["failed"])
        for m in minutes
        if m["succeeded"] or m["failed"]
    }
    assert len(minutes) == 60 and minutes[0]["minute"] == datetime(2026, 3, 1, 11, 1, tzinfo=UTC)
    assert counted == {"11:01": (1, 0), "11:59": (0, 1), "12:00": (1, 1)}


def settled_header(body: str) -> str:
    """The header of the dashboard's settled states: where their counts come from."""
    found = re.search(r'<th scope="rowgroup" colspan="2" class="small" id="rollup-age">(.*?)</th>', body)
    assert found, "no settled-states header on the dashboard"
    return found.group(1)


def test_dashboard_renders_before_any_rollup_with_exact_counts(viewer_client: Client) -> None:
    # given: no rollup has run (a new installation), one intent cancelled, one READY
    intent_cancel(intent_id=submit().id, actor="agent:agent-1", reason="changed my mind")
    submit()
    # when
    body = viewer_client.get(reverse("dashboard")).content.decode()
    # then: few settled intents, so counted exactly, and the page says so
    assert "exact (no rollup has run yet)" in settled_header(body)
    assert status_count(body, "CANCELLED") == 1 and status_count(body, "READY") == 1


def test_dashboard_renders_before_any_rollup_on_a_large_table(
    viewer_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: no rollup, and more settled intents than the exact fallback counts
    monkeypatch.setattr(status_counts, "EXACT_FALLBACK_LIMIT", 0)
    intent_cancel(intent_id=submit().id, actor="agent:agent-1", reason="changed my mind")
    # when
    response = viewer_client.get(reverse("dashboard"))
    # then: the page renders, the settled counts are marked as not computed, never a wrong number
    body = response.content.decode()
    assert response.status_code == 200
    assert "not computed yet" in settled_header(body)
    assert (
        '?status=CANCELLED">CANCELLED</a></td><td class="num"><span class="muted" title="not computed yet">'
        in body
    )
    assert status_count(body, "READY") == 0


def test_dashboard_shows_settled_counts_from_the_rollup_with_its_age(viewer_client: Client) -> None:
    # given: a rollup counting one cancelled intent, 42 s ago; one more cancelled since
    intent_cancel(intent_id=submit().id, actor="agent:agent-1", reason="changed my mind")
    status_rollup_refresh()
    StatusRollup.objects.update(computed_at=Now() - timedelta(seconds=42))
    intent_cancel(intent_id=submit().id, actor="agent:agent-1", reason="changed my mind")
    gated()
    # when
    body = viewer_client.get(reverse("dashboard")).content.decode()
    poll = viewer_client.get(reverse("dashboard"), **HTMX).content.decode()  # type: ignore[arg-type]
    # then: the rollup's count and its age; the open states exact
    for page in (body, poll):
        assert re.search(r"as of <span>4\d s ago</span>", settled_header(page)), settled_header(page)
        assert status_count(page, "CANCELLED") == 1
        assert status_count(page, "AWAITING_APPROVAL") == 1
    assert "beat is running" not in body and "is the beat running?" not in body


def test_dashboard_flags_a_rollup_the_beat_stopped_refreshing(viewer_client: Client) -> None:
    # given: a rollup an hour old (the period is 60 s)
    status_rollup_refresh()
    StatusRollup.objects.update(computed_at=Now() - timedelta(hours=1))
    # when
    body = viewer_client.get(reverse("dashboard")).content.decode()
    # then
    assert "is the beat running?" in settled_header(body)


def test_metrics_endpoint_still_served() -> None:
    response = Client().get("/metrics")
    assert response.status_code == 200 and b"effect_ledger_intents" in response.content


def export_rows(response: Any) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))


def test_i11_7_csv_cells_that_start_a_formula_are_neutralised(viewer_client: Client) -> None:
    # given: cancel reasons an agent chose, each starting a spreadsheet formula (OWASP list)
    formulas = ['=HYPERLINK("http://evil.example/","x")', "+1+1", "-2+3", "@SUM(A1)", "\tx", "\rx"]
    intents = []
    for reason in formulas:
        intent = submit()
        intent_cancel(intent_id=intent.id, actor="agent:agent-1", reason=reason)
        intents.append(intent)
    plain = submit()
    intent_cancel(intent_id=plain.id, actor="agent:agent-1", reason="customer changed their mind")
    # when
    response = viewer_client.get(reverse("audit-export"), {"event": "cancelled"})
    # then: each such cell starts with one quote, so a spreadsheet shows it as text ...
    assert response.status_code == 200
    reasons = {row["intent_id"]: row["reason"] for row in export_rows(response)}
    assert [reasons[str(i.id)] for i in intents] == ["'" + reason for reason in formulas]
    assert reasons[str(plain.id)] == "customer changed their mind"
    # ... while the database keeps the raw value, which the hash chain covers
    stored = AuditEvent.objects.get(intent=intents[0], event="cancelled")
    assert stored.reason == formulas[0]


@pytest.mark.parametrize(
    "bad", [{"intent_id": "not-a-uuid"}, {"created_after": "yesterday"}, {"event": "x" * 51}]
)
def test_i11_7_an_invalid_export_filter_is_400_not_everything(
    viewer_client: Client, bad: dict[str, str]
) -> None:
    # given
    submit()
    submit()
    # when
    response = viewer_client.get(reverse("audit-export"), bad)
    # then: a problem naming the field, and no rows at all
    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["code"] == "invalid_filter" and [e["field"] for e in body["errors"]] == list(bad)
    assert not getattr(response, "streaming", False)
