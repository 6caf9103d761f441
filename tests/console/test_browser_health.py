"""The health page in a browser (issue 16 item 5): it renders every signal at 1366x900 under
the console's Content-Security-Policy and refreshes itself with htmx."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db.models.functions import Now
from django.utils import timezone

from operations.models import OutboxMessage, WorkerHeartbeat
from operations.services import periodic_job_record, worker_heartbeat_record
from tests.console.browser_support import (
    assert_no_horizontal_overflow,
    expect,
    pytestmark_browser,
    shot,
    sign_in,
)
from tests.console.test_every_kind import KINDS, serve_every_kind
from tests.console.test_health import call
from tests.factories import UserFactory

pytestmark = pytestmark_browser


def test_i16_5_health_page_shows_every_signal_and_refreshes(page: Any, settings: Any) -> None:
    # given: a live worker and one gone, a due outbox row, the relay and reconciler run, and a
    # provider call of every kind
    serve_every_kind(settings)
    settings.EFFECT_LEDGER_POLICIES = {action: {"approval": "never"} for action, _ in KINDS.values()}
    for hostname in ("celery@web-1", "celery@web-2"):
        worker_heartbeat_record(
            hostname=hostname, pid=101, queues=["effect-ledger"], concurrency=4, started_at=timezone.now()
        )
    WorkerHeartbeat.objects.filter(hostname="celery@web-2").update(beat_at=Now() - timedelta(minutes=5))
    OutboxMessage.objects.create(task="operations.execute_intent", body="{}", due_at=timezone.now())
    for name in (
        "operations.relay_outbox",
        "reconciliation.reconcile",
        "operations.deliver_webhooks",
        "operations.send_notifications",
        "reconciliation.reconcile_statements",
        "reconciliation.prune",
        "operations.archive",
    ):
        periodic_job_record(name=name, started_at=timezone.now(), duration_ms=12)
    for kind in KINDS:
        call(kind, "succeeded", 0.3)
    call("email.send", "unknown", 4.0)
    UserFactory(username="olga", groups=["operator"])
    # when: the operator opens Health from the navigation
    sign_in(page, "olga")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Health").click()
    # then: every signal with its level, the workers, the providers of every kind
    expect(page.get_by_role("heading", name="Health", exact=True)).to_be_visible()
    expect(page.locator("#signal-workers")).to_contain_text("1 alive, 0 late, 1 gone")
    expect(page.locator("#signal-workers .level")).to_have_text("amber")
    expect(page.locator("tr.worker-gone")).to_contain_text("celery@web-2")
    expect(page.locator("#outbox-pending")).to_have_text("1")
    expect(page.locator("#signal-jobs .level")).to_have_text("green")
    for action, _ in KINDS.values():
        expect(page.locator(f"#provider-{action.replace('.', '')}")).to_be_visible()
    expect(page.locator("#provider-emailsend")).to_contain_text("unknown 1")
    shot(page, "health.png")
    # and: it refreshes itself (htmx polling), the fragment replacing the region
    with page.expect_response(
        lambda r: r.url.endswith("/health/") and r.request.headers.get("hx-request") == "true", timeout=15_000
    ) as refresh:
        pass
    assert refresh.value.status == 200
    expect(page.locator("#signals")).to_have_count(1)


@pytest.mark.parametrize("width", ["wide", "phone"])
def test_i39_1_a_fresh_installs_health_page_is_green_at_1366_and_390_px(
    width: str, request: Any, settings: Any
) -> None:
    # given: a fresh install: a beat started a minute ago, one worker, the frequent jobs run once
    # and the daily and hourly ones not yet (issue 39 item 1: "never ran" was red)
    from operations.services.beats import beat_heartbeat_record
    from operations.tasks import deliver_webhooks, relay_outbox, send_notifications
    from reconciliation.tasks import reconcile

    browser_page = request.getfixturevalue("page" if width == "wide" else "phone")
    beat_heartbeat_record(
        identity="beat-1", host="host-a", pid=7, started_at=timezone.now() - timedelta(minutes=1)
    )
    worker_heartbeat_record(
        hostname="celery@fresh", pid=101, queues=["effect-ledger"], concurrency=2, started_at=timezone.now()
    )
    for job in (relay_outbox, reconcile, deliver_webhooks, send_notifications):
        job()
    UserFactory(username="olga", groups=["operator"])
    # when: the operator opens the health page
    sign_in(browser_page, "olga")
    browser_page.goto("/health/")
    # then: the periodic jobs are green, the ones not due yet say so, and the page fits the screen
    expect(browser_page.locator("#signal-jobs .level")).to_have_text("green")
    expect(browser_page.locator("#signal-jobs")).to_contain_text("Statement reconciliation: not due yet")
    assert "never ran" not in browser_page.content()
    assert_no_horizontal_overflow(browser_page)
