"""The long lists' rows shaped in Python (``console.views.rows``, issue 37): the approvals
inbox, the UNKNOWN intents of the operators' queue and the intents search print what their
template filters printed and run no filter, tag or query per row; the first two read only the
columns they print.

Speed is the bench's to show (``manage.py bench``, console phase); these tests assert the
structure that makes it: nothing here is timed.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
import time_machine
from django.db import connection
from django.db.models.functions import Now
from django.template.base import NodeList, VariableNode
from django.template.defaultfilters import date as date_filter
from django.template.defaulttags import ForNode, URLNode, WithNode
from django.template.loader import get_template
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from console.templatetags.console import age, amount, duration, remaining, status_class, target
from console.views.rows import LAST_ERROR_CHARS, approval_rows, intent_rows, unknown_rows
from operations.models import Intent
from operations.selectors.duplicate_risk import duplicate_risks
from tests.console.conftest import gated, make_unknown
from tests.factories import charge_arguments, submit

pytestmark = pytest.mark.django_db


def row_loop(template_name: str, rows: str) -> ForNode:
    """The ``{% for … in <rows> %}`` loop of ``template_name`` (through its block and partial)."""
    template = get_template(template_name).template  # type: ignore[attr-defined]
    loops = [node for node in template.nodelist.get_nodes_by_type(ForNode) if node.sequence.var.var == rows]
    assert len(loops) == 1, template_name
    return loops[0]


@pytest.mark.parametrize(
    ("template_name", "rows"),
    [
        ("console/approvals.html", "rows"),
        ("console/unknown.html", "intents"),
        ("console/intents.html", "rows"),
    ],
)
def test_i37_console_long_lists_run_no_filter_or_tag_per_cell(template_name: str, rows: str) -> None:
    # given: the loop over the list's rows (up to 200 of them; 50 a page for the search)
    body = cast(NodeList, row_loop(template_name, rows).nodelist_loop)
    # when: every value it prints
    printed = [node for node in body.get_nodes_by_type(VariableNode) if isinstance(node, VariableNode)]
    # then: plain values, shaped before rendering: no filter (money, target, dates, cuts) and
    # no {% url %} or {% with %} per row (each was a Babel call, an adapter lookup, a
    # reverse() or a lookup per cell)
    assert printed
    assert [str(node.filter_expression) for node in printed if node.filter_expression.filters] == []
    assert body.get_nodes_by_type(URLNode) == [] and body.get_nodes_by_type(WithNode) == []


def select_of(queries: CaptureQueriesContext, marker: str) -> str:
    """The SELECT list (up to FROM) of the one captured query that contains ``marker``."""
    (sql,) = [q["sql"] for q in queries.captured_queries if marker in q["sql"]]
    return sql.split(" FROM ", 1)[0]


def test_i37_console_inbox_and_queue_read_only_the_columns_they_print(viewer_client: Client) -> None:
    # given
    gated(reference="order-1")
    make_unknown(reference="order-2")
    # when
    with CaptureQueriesContext(connection) as inbox:
        assert viewer_client.get(reverse("approvals")).status_code == 200
    with CaptureQueriesContext(connection) as queue:
        assert viewer_client.get(reverse("unknown")).status_code == 200
    # then: neither reads the columns no cell prints (the request, its hashes and keys, the
    # metadata; the inbox reads one number of the policy snapshot, not the snapshot)
    for selected in (
        select_of(inbox, 'AS "risk_tier"'),
        select_of(queue, '"operations_intent"."status" = \'UNKNOWN\''),
    ):
        for column in ("metadata", "request_hash", "idempotency_key", "client_key", "lease_owner"):
            assert f'"operations_intent"."{column}"' not in selected, (column, selected)
    assert '"operations_intent"."policy",' not in select_of(inbox, 'AS "risk_tier"')


def page_queries(client: Client, name: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        assert client.get(reverse(name)).status_code == 200
    return len(queries.captured_queries)


def test_i37_console_inbox_and_queue_queries_do_not_grow_with_their_rows(
    operator_client: Client, operator: Any
) -> None:
    # given: one row in each list, counted
    gated(reference="order-1")
    make_unknown(reference="order-2")
    few = {name: page_queries(operator_client, name) for name in ("approvals", "unknown")}
    # when: more rows, with everything a row can show (a duplicate-risk badge, a ceiling, an
    # operator on it, an escalation, a long error, no reference)
    for n in range(3):
        with_risk = gated(reference=f"inbox-{n}")
        on_its_way(reference=with_risk.reference)
        gated()
        make_unknown(reference=f"queue-{n}")
    Intent.objects.filter(status=Intent.Status.AWAITING_APPROVAL).update(wait_reason="ceiling")
    Intent.objects.filter(status=Intent.Status.UNKNOWN).update(
        escalated_at=Now(), assigned_to=operator.username, assigned_at=Now(), last_error="x" * 200
    )
    many = {name: page_queries(operator_client, name) for name in ("approvals", "unknown")}
    # then: the same queries, whatever the rows (no cell reads a column the list did not)
    assert many == few


def on_its_way(*, reference: str) -> Intent:
    """A READY charge (an effect on its way) for ``reference``, beside an intent awaiting approval
    for it (submitted under another reference: a second open intent for one would be held)."""
    intent = submit(arguments=charge_arguments(4990), reference=f"{reference}-elsewhere")
    Intent.objects.filter(id=intent.id).update(reference=reference)
    return Intent.objects.get(id=intent.id)


@time_machine.travel(datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC), tick=False)
def test_i37_console_rows_print_what_the_filters_printed() -> None:
    # given: an awaiting charge with a risk, one without a reference, and an UNKNOWN one that
    # an operator is on, escalated, with a long error
    risky = gated(reference="order-1")
    earlier = on_its_way(reference="order-1")
    plain = gated(30_000)
    unknown = make_unknown(reference="order-2")
    now = timezone.now()
    Intent.objects.filter(id=unknown.id).update(
        escalated_at=now - timedelta(minutes=3),
        assigned_to="otto",
        assigned_at=now - timedelta(minutes=2),
        last_error="é" * 100,
    )
    inbox = list(Intent.objects.filter(status=Intent.Status.AWAITING_APPROVAL).order_by("created_at"))
    for intent in inbox:  # the annotations of the inbox's queryset
        intent.risk_tier = intent.policy["risk_tier"]  # type: ignore[attr-defined]
        intent.approvals_given = 0  # type: ignore[attr-defined]
        intent.approvals_required = intent.policy["approvals_required"]  # type: ignore[attr-defined]
    # when
    rows = {row.id: row for row in approval_rows(inbox, duplicate_risks(inbox))}
    queued = Intent.objects.filter(id=unknown.id).annotate(age=Now() - Now()).get()
    (queue_row,) = unknown_rows([queued])
    # then: each cell as its filter printed it
    for intent in (risky, plain):
        row = rows[intent.id]
        assert row.url == reverse("approval-detail", args=[intent.id])
        assert row.amount == amount(intent.arguments) and row.target == target(intent)
        assert row.expires_in == remaining(intent.approval_expires_at)
        assert row.expires_iso == intent.approval_expires_at.isoformat()  # type: ignore[union-attr]
        assert row.submitted == age(intent.created_at)
        assert row.approvals == f"0 of {intent.policy['approvals_required']}"
    assert [(o.url, o.id, o.status) for o in rows[risky.id].risks] == [
        (reverse("intent-detail", args=[earlier.id]), earlier.id, earlier.status)
    ]
    assert rows[plain.id].risks == [] and rows[plain.id].reference == "—"
    assert queue_row.url == reverse("unknown-detail", args=[unknown.id])
    assert queue_row.age == duration(0) and queue_row.escalated and queue_row.escalated_ago == "3 min 0 s"
    assert queue_row.owner is not None and queue_row.owner.username == "otto"
    assert (queue_row.owner_since, queue_row.owner_for) == ("11:58", "2 min 0 s")
    assert queue_row.last_error == "é" * (LAST_ERROR_CHARS - 1) + "…"


def test_i37_console_search_rows_print_what_the_filters_printed() -> None:
    # given: a charge with a reference and one without
    with_reference = submit(arguments=charge_arguments(4990), reference="order-1")
    without = gated(30_000)
    # when
    rows = {row.id: row for row in intent_rows(Intent.objects.all())}
    # then
    for intent in (with_reference, without):
        row = rows[intent.id]
        assert row.url == reverse("intent-detail", args=[intent.id])
        assert row.created == date_filter(intent.created_at, "Y-m-d H:i:s")
        assert row.short_id == str(intent.id)[:12] + "…"
        assert (row.status, row.status_class) == (intent.status, status_class(intent.status))
        assert row.amount == amount(intent.arguments) and row.target == target(intent)
    assert (rows[with_reference.id].reference, rows[without.id].reference) == ("order-1", "—")
