"""Browser tests: Playwright for Python driving the machine's Chromium against a live server.

They never download a browser: Chromium comes from the Debian package (``/usr/bin/chromium``);
without it every test here is skipped with that reason. Their fixtures and helpers are in
``tests/console/browser_support.py`` (screenshots go to a temporary folder unless asked).
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from operations.engine.protocol import execute_intent
from operations.models import Intent
from operations.services import intent_cancel
from tests.console.browser_support import (
    assert_no_horizontal_overflow,
    expect,
    pytestmark_browser,
    shot,
    sign_in,
)
from tests.console.conftest import gated, make_unknown, unknown_with_effect
from tests.factories import UserFactory, charge_arguments, submit

pytestmark = pytestmark_browser


def test_sign_in_approve_a_high_risk_payment_and_watch_it_succeed(page: Any, sandbox: Any) -> None:
    # given: an agent's 250.00 EUR charge waiting for approval, and an approver
    UserFactory(username="alice", groups=["approver"])
    earlier = submit(arguments=charge_arguments(4_990), reference="order-1001")
    intent_cancel(
        intent_id=earlier.id, actor="agent:agent-1", reason="re-planned"
    )  # an open one would hold the next
    intent = gated(25_000, reference="order-1001")
    sign_in(page, "alice")
    # when: she opens the inbox and the intent
    page.get_by_role("link", name="Approvals").click()
    page.get_by_role("link", name="payments.charge").click()
    expect(page.get_by_text("Charge 250.00 EUR to cus_42")).to_be_visible()
    expect(page.locator("#shown-hash")).to_have_text(intent.request_hash)
    shot(page, "approval-detail.png")
    page.get_by_role("button", name="Approve this payload").click()
    # then: the decision fragment says READY, and the intent page follows it to SUCCEEDED
    expect(page.locator("#decision")).to_contain_text("Approved. The intent is READY")
    page.get_by_role("link", name="Follow the intent").click()
    expect(page.locator("#status-value")).to_have_text(re.compile("READY|RUNNING|SUCCEEDED"))
    assert execute_intent(intent.id) in {"succeeded", "duplicate"}
    expect(page.locator("#status-value")).to_have_text("SUCCEEDED", timeout=15_000)
    assert len(sandbox.ledger("payments")) == 1
    page.get_by_role("link", name="Dashboard").click()
    expect(page.get_by_role("heading", name="Throughput, last hour")).to_be_visible()
    shot(page, "dashboard-after-approval.png")  # the docs' dashboard.png: test_browser_i39.py


def test_approval_whose_payload_changed_after_the_page_loaded_is_refused(page: Any) -> None:
    # given: the approver has the page open
    UserFactory(username="alice", groups=["approver"])
    intent = gated(25_000)
    sign_in(page, "alice")
    page.goto(f"/approvals/{intent.id}/")
    expect(page.locator("#shown-hash")).to_have_text(intent.request_hash)
    # when: the payload changes behind the page, then she clicks Approve
    Intent.objects.filter(id=intent.id).update(arguments=charge_arguments(99_999), request_hash="b" * 64)
    page.get_by_role("button", name="Approve this payload").click()
    # then: refused in place, with the reason and no form carrying the new hash
    expect(page.locator("#decision .error")).to_contain_text("request_hash differs")
    expect(page.get_by_role("link", name="Reload and review the current payload")).to_be_visible()
    expect(page.get_by_role("button", name="Approve this payload")).to_have_count(0)
    assert Intent.objects.get(id=intent.id).status == Intent.Status.AWAITING_APPROVAL


def test_resolve_an_unknown_as_confirmed(page: Any, sandbox: Any) -> None:
    # given: a charge that reached the provider but whose answer was lost
    UserFactory(username="otto", groups=["operator"])
    intent, charge_id = unknown_with_effect(reference="order-2002")
    sign_in(page, "otto")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="UNKNOWN").click()
    page.get_by_role("link", name="payments.charge").click()
    expect(page.get_by_role("heading", name="Attempts and what the provider answered")).to_be_visible()
    assert_no_horizontal_overflow(page)  # its screenshot is test_browser_unknown.py's
    # when
    page.get_by_label("Provider reference").fill(charge_id)
    page.locator("#resolve-reason").fill("charge visible in the provider's dashboard")
    page.get_by_role("button", name="Resolve as confirmed").click()
    # then
    expect(page.locator("#resolution")).to_contain_text("Resolved as confirmed. The intent is SUCCEEDED")
    intent.refresh_from_db()
    assert intent.status == Intent.Status.SUCCEEDED
    assert intent.outcomes.get().provider_reference == charge_id


def test_an_approver_cannot_approve_their_own_request(page: Any) -> None:
    # given: alice, an approver, requested the intent herself
    UserFactory(username="alice", groups=["approver"])
    intent = gated(25_000, principal="user:alice")
    sign_in(page, "alice")
    page.goto(f"/approvals/{intent.id}/")
    # then: the page tells her why, offers no button ...
    expect(page.get_by_text("You requested this intent; someone else must approve it")).to_be_visible()
    expect(page.get_by_role("button", name="Approve this payload")).to_have_count(0)
    # ... and the server refuses a hand-made POST from her session with the page's CSRF token
    result = page.evaluate(
        """async ([url, hash]) => {
            const token = JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRFToken'];
            const response = await fetch(url, {method: 'POST', headers: {'X-CSRFToken': token,
                'HX-Request': 'true', 'Content-Type': 'application/x-www-form-urlencoded'},
                body: 'request_hash=' + hash});
            return [response.status, await response.text()];
        }""",
        [f"/approvals/{intent.id}/approve", intent.request_hash],
    )
    assert result[0] == 403 and "four eyes" in result[1]
    assert Intent.objects.get(id=intent.id).status == Intent.Status.AWAITING_APPROVAL


def fail_next_polls(page: Any, path: str) -> None:
    """Answer every htmx request (``HX-Request: true``) for ``path`` with a bare HTTP 500,
    as a crashing view would; full page loads still reach the server."""

    def answer(route: Any) -> None:
        if route.request.headers.get("hx-request") == "true":
            route.fulfill(status=500, content_type="text/html", body="<h1>Server Error (500)</h1>")
        else:
            route.continue_()

    page.route(lambda url: urlparse(url).path == path, answer)


EMAIL = {"to": "ana@example.test", "subject": "Receipt", "body": "Thanks"}


def test_unknown_queue_never_shows_a_failed_refresh_as_empty(page: Any) -> None:
    # given: a viewer has the UNKNOWN queue open, reached from the dashboard, while it is empty
    UserFactory(username="vera", groups=["viewer"])
    page.clock.install()  # polls run every 15 s: the test moves the page's clock instead of waiting
    sign_in(page, "vera")
    page.get_by_role("link", name="Open the queue").click()
    expect(page).to_have_url(re.compile(r"/unknown/$"))
    rows = page.locator("#unknown-rows")
    expect(rows.get_by_text("No intent is UNKNOWN.")).to_be_visible()
    # when: an email goes UNKNOWN and the next poll answers 500
    email = make_unknown(action="email.send", arguments=EMAIL)
    fail_next_polls(page, "/unknown/")
    page.clock.fast_forward(16_000)
    # then: the list is marked stale, its empty-state text is gone, and the notice says why
    expect(rows.locator(".stale-mark")).to_contain_text("may be out of date")
    expect(rows.get_by_text("No intent is UNKNOWN.")).to_be_hidden()
    expect(page.locator("#notice")).to_contain_text("failed (HTTP 500)")
    # when: the next poll succeeds
    page.unroute_all()
    page.clock.fast_forward(16_000)
    # then: the email is listed, with no stale mark and no notice left
    expect(page.locator("#unknown-rows")).to_contain_text(str(email.id))
    expect(page.locator("#unknown-rows .stale-mark")).to_have_count(0)
    expect(page.locator("#notice")).to_be_hidden()
    # and the dashboard's "Open the queue" link leads to a queue that renders it
    page.goto("/")
    link = page.get_by_role("link", name="Open the queue")
    assert link.get_attribute("href") == "/unknown/"
    with page.expect_navigation() as navigation:
        link.click()
    assert navigation.value.status == 200
    expect(page.get_by_role("link", name="email.send")).to_be_visible()


@pytest.mark.parametrize(
    ("path", "region", "poll_ms", "hidden_when_stale"),
    [
        ("/approvals/", "#approval-rows", 10_000, "Nothing awaits a decision."),
        ("/", "#stats", 15_000, "Nothing waits for you."),
        ("/intents/{id}/", "#intent-status", 2_000, "(refreshing)"),
    ],
    ids=["approvals", "dashboard", "intent-status"],
)
def test_every_polled_region_is_marked_stale_when_its_refresh_fails(
    page: Any, path: str, region: str, poll_ms: int, hidden_when_stale: str
) -> None:
    # given: a polled region on screen (the intent is READY, so its status keeps refreshing)
    UserFactory(username="vera", groups=["viewer"])
    path = path.format(id=submit(action="email.send", arguments=EMAIL).id)
    page.clock.install()
    sign_in(page, "vera")
    page.goto(path)
    polled = page.locator(region)
    expect(polled.get_by_text(hidden_when_stale)).to_be_visible()
    # when: its next refresh answers 500
    fail_next_polls(page, path)
    page.clock.fast_forward(poll_ms + 1_000)
    # then: marked stale where the user looks, what would read as current is hidden
    expect(polled.locator(".stale-mark")).to_contain_text("Not refreshed (HTTP 500)")
    expect(polled.get_by_text(hidden_when_stale)).to_be_hidden()
    expect(page.locator("#notice")).to_contain_text("failed (HTTP 500)")
    # when / then: the next successful refresh clears the mark
    page.unroute_all()
    page.clock.fast_forward(poll_ms + 1_000)
    expect(page.locator(f"{region} .stale-mark")).to_have_count(0)
    expect(page.locator(region).get_by_text(hidden_when_stale)).to_be_visible()


def test_a_poll_that_cannot_reach_the_server_marks_the_queue_stale(page: Any) -> None:
    # given: the empty UNKNOWN queue on screen
    UserFactory(username="vera", groups=["viewer"])
    page.clock.install()
    sign_in(page, "vera")
    page.goto("/unknown/")
    rows = page.locator("#unknown-rows")
    # when: the next poll never reaches the server
    page.route(lambda url: urlparse(url).path == "/unknown/", lambda route: route.abort("connectionrefused"))
    page.clock.fast_forward(16_000)
    # then
    expect(rows.locator(".stale-mark")).to_contain_text("Not refreshed (server unreachable)")
    expect(rows.get_by_text("No intent is UNKNOWN.")).to_be_hidden()
    expect(page.locator("#notice")).to_contain_text("could not be reached")


def test_operator_acknowledges_an_open_duplicate_finding_from_the_queue(page: Any, sandbox: Any) -> None:
    # given: an UNKNOWN email that reached the provider twice; the reconciler keeps one and
    # flags the other (email has no compensation), and an operator is signed in
    import httpx

    from reconciliation.lookups import reconcile_unknown
    from reconciliation.models import DuplicateFinding

    email = make_unknown(action="email.send", arguments=EMAIL)
    for _ in range(2):
        httpx.post(
            f"{sandbox.url}/v1/emails",
            json=EMAIL,
            headers={"Message-ID": f"<{email.idempotency_key}@effect-ledger.local>"},
        ).raise_for_status()
    reconcile_unknown()
    finding = DuplicateFinding.objects.get(intent=email)
    assert finding.state == "open"
    UserFactory(username="otto", groups=["operator"])
    sign_in(page, "otto")
    # when: the operator opens the finding from the dashboard's count and the queue
    page.get_by_role("link", name="Open duplicate findings").click()
    duplicates = page.locator("#duplicates")
    expect(duplicates).to_contain_text(finding.provider_reference)
    duplicates.get_by_role("link", name="email.send").click()
    expect(page.get_by_role("heading", name="Duplicate email.send")).to_be_visible()
    expect(page.get_by_role("button", name="Compensate the extra effect")).to_have_count(0)
    page.locator("#acknowledge-reason").fill("customer told, harmless")
    page.get_by_role("button", name="Acknowledge").click()
    # then: decided in place, and the queue has no open finding left
    expect(page.locator("#decision")).to_contain_text("Decided: acknowledge. The finding is resolved.")
    assert DuplicateFinding.objects.get(id=finding.id).state == "resolved"
    page.goto("/unknown/")
    expect(page.locator("#duplicates").get_by_text("No duplicate finding is open.")).to_be_visible()


def test_operator_releases_a_held_charge_from_the_queue(page: Any) -> None:
    # given: a second charge for order-77 (new client key, changed amount) held behind the first
    UserFactory(username="otto", groups=["operator"])
    earlier = submit(arguments=charge_arguments(4_990), reference="order-77")
    held = submit(arguments=charge_arguments(5_990), reference="order-77")
    assert held.status == Intent.Status.HELD
    sign_in(page, "otto")
    # when: the operator opens it from the queue's Held section
    page.get_by_role("link", name="Held behind an earlier intent for the same business action").click()
    expect(page.locator("#held")).to_contain_text("59.90 EUR")
    page.locator("#held").get_by_role("link", name="payments.charge").first.click()
    expect(page.locator("#earlier-status")).to_have_text("READY")
    expect(page.get_by_text(str(earlier.id)).first).to_be_visible()
    shot(page, "held-detail.png")
    page.locator("#release-reason").fill("customer asked for a second delivery")
    page.get_by_role("button", name="Release (I accept the duplicate risk)").click()
    # then: refused in place without the acknowledgement, released with it
    expect(page.locator("#decision")).to_contain_text("Accept the duplicate risk explicitly")
    page.locator("#release-reason").fill("customer asked for a second delivery")
    page.locator("#release-ack").check()
    page.get_by_role("button", name="Release (I accept the duplicate risk)").click()
    expect(page.locator("#decision")).to_contain_text("Released. The intent is READY")
    assert Intent.objects.get(id=held.id).status == Intent.Status.READY


def _policy(response: Any) -> str:
    """The enforced Content-Security-Policy of a page load (empty when there is none)."""
    return str(response.all_headers().get("content-security-policy", ""))


def test_i12_3_the_console_runs_under_its_content_security_policy(
    page: Any, sandbox: Any, csp_violations: list[str]
) -> None:
    # given: something in every queue (an approval, an UNKNOWN email, a held charge behind an
    # earlier one, a duplicate email finding), and a user who may act on all of it
    import httpx

    from reconciliation.lookups import reconcile_unknown
    from reconciliation.models import DuplicateFinding

    UserFactory(username="ada", groups=["admin"])
    approval = gated(25_000, reference="order-5")
    unknown = make_unknown(action="email.send", arguments=EMAIL)
    submit(arguments=charge_arguments(4_990), reference="order-6")
    held = submit(arguments=charge_arguments(5_990), reference="order-6")
    assert held.status == Intent.Status.HELD
    twice = make_unknown(action="email.send", arguments={**EMAIL, "subject": "Twice"})
    for _ in range(2):
        httpx.post(
            f"{sandbox.url}/v1/emails",
            json={**EMAIL, "subject": "Twice"},
            headers={"Message-ID": f"<{twice.idempotency_key}@effect-ledger.local>"},
        ).raise_for_status()
    reconcile_unknown()
    finding = DuplicateFinding.objects.get(intent=twice)
    page.clock.install()  # polls are driven by moving the page's clock

    # when / then: the sign-in page and every console page load under the strict policy ...
    policy = _policy(page.goto("/login/"))
    for directive in ("script-src 'self'", "style-src 'self'", "frame-ancestors 'none'"):
        assert directive in policy
    sign_in(page, "ada")
    for path in ("/", "/approvals/", "/unknown/", "/intents/", "/audit/", "/drills/"):
        assert "script-src 'self'" in _policy(page.goto(path)), path
        page.clock.fast_forward(16_000)  # each page's poll (dashboard, queues) runs once

    # ... and so do the htmx interactions: filters with pushed URLs, polls, and decisions
    page.goto("/intents/")
    page.get_by_label("intent_id or reference").fill("order-6")
    page.get_by_role("button", name="Search").click()
    expect(page).to_have_url(re.compile(r"q=order-6"))
    page.locator("#results").get_by_role("link").first.click()
    page.clock.fast_forward(3_000)  # the intent's status line refreshes every 2 s
    page.goto("/audit/")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("#verification")).not_to_contain_text("Checking the hash chains")

    page.goto(f"/approvals/{approval.id}/")
    page.get_by_role("button", name="Approve this payload").click()
    expect(page.locator("#decision")).to_contain_text("Approved. The intent is READY")

    page.goto(f"/unknown/{unknown.id}/")
    page.get_by_role("button", name="Look up now").click()
    expect(page.locator("#resolution")).to_be_visible()

    page.goto(f"/held/{held.id}/")
    page.locator("#release-reason").fill("customer asked for a second delivery")
    page.locator("#release-ack").check()
    page.get_by_role("button", name="Release (I accept the duplicate risk)").click()
    expect(page.locator("#decision")).to_contain_text("Released. The intent is READY")

    page.goto(f"/duplicates/{finding.id}/")
    page.locator("#acknowledge-reason").fill("customer told, harmless")
    page.get_by_role("button", name="Acknowledge").click()
    expect(page.locator("#decision")).to_contain_text("Decided: acknowledge")

    # then: the policy blocked nothing on the way
    page.wait_for_timeout(200)  # reports of the last swap arrive
    assert csp_violations == []
    # and the listener does report what it blocks (so the empty list above means something)
    page.evaluate(
        "() => { const s = document.createElement('script');"
        " s.textContent = 'window.ran = 1'; document.body.append(s); }"
    )
    page.wait_for_timeout(200)
    assert any("script-src" in violation for violation in csp_violations), csp_violations
    assert page.evaluate("() => window.ran") is None
    csp_violations.clear()  # the page fixture fails the test on any left


def test_i12_3_the_api_docs_render_under_the_policy(page: Any, csp_violations: list[str]) -> None:
    # when: the Swagger UI page loads (its script and the schema are fetched from the server)
    response = page.goto("/api/docs/")
    # then: it renders the API's operations under the console's policy plus data: images (its
    # icons), and the policy blocked nothing
    directives = {part.split()[0]: part.split()[1:] for part in _policy(response).split(";") if part.strip()}
    assert directives["script-src"] == ["'self'"] and directives["style-src"] == ["'self'"]
    assert directives["img-src"] == ["'self'", "data:"]
    expect(page.get_by_text("/api/v1/intents").first).to_be_visible()
    page.wait_for_timeout(300)
    assert csp_violations == []


def test_i16_journey_reject_a_gated_charge_with_a_reason(page: Any) -> None:
    # given: a charge above the approval threshold and an approver
    UserFactory(username="alice", groups=["approver"])
    intent = gated(31_000, reference="order-2002")
    sign_in(page, "alice")
    # when: she opens it from the inbox and rejects it with a reason
    page.get_by_role("link", name="Approvals").click()
    page.get_by_role("link", name="payments.charge").click()
    page.get_by_label("Reason for rejecting (required)").fill("customer cancelled the order by phone")
    page.get_by_role("button", name="Reject").click()
    # then: the decision says so in place, the intent is REJECTED with her reason, and the inbox is empty
    expect(page.locator("#decision")).to_contain_text("The intent is REJECTED")
    intent.refresh_from_db()
    assert intent.status == Intent.Status.REJECTED
    assert intent.approvals.get().reason == "customer cancelled the order by phone"
    page.get_by_role("link", name="Approvals", exact=True).click()
    expect(page.get_by_role("link", name="payments.charge")).to_have_count(0)
    shot(page, "approvals-empty.png")


def test_i16_journey_export_one_intents_audit_trail_as_csv(page: Any) -> None:
    # given: an approved charge (submitted, approved: audit events on its chain) and a viewer
    UserFactory(username="alice", groups=["approver"])
    UserFactory(username="vera", groups=["viewer"])
    intent = gated(27_500, reference="order-3003")
    other = gated(28_000, reference="order-3004")
    sign_in(page, "alice")
    page.goto(f"/approvals/{intent.id}/")
    page.get_by_role("button", name="Approve this payload").click()
    expect(page.locator("#decision")).to_contain_text("Approved")
    page.context.clear_cookies()
    sign_in(page, "vera")
    # when: she filters the audit log by the intent and exports what she sees
    page.get_by_role("link", name="Audit").click()
    page.get_by_label("intent_id").fill(str(intent.id))
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(f"intent_id={intent.id}"))
    shot(page, "audit.png")
    with page.expect_download() as download:
        page.get_by_role("link", name="Export these events as CSV").click()
    body = Path(download.value.path()).read_text()
    # then: the file holds this intent's submission and approval, and nothing of the other intent
    rows = list(csv.DictReader(io.StringIO(body)))
    assert {row["intent_id"] for row in rows} == {str(intent.id)}
    events = [row["event"] for row in rows]
    assert any("approv" in event for event in events), events
    assert str(other.id) not in body
