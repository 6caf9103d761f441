"""Browser checks of issue 39 items 4 and 5 at a laptop's 1366x900 and a phone's 390x844: the
UNKNOWN page's decision on the first screen, its grouped lookups and the whole page following a
decision without a reload; the dashboard's waiting list, only what waits, or "Nothing waits for
you". They also take the docs' screenshots of both pages (``shot``)."""

from __future__ import annotations

from typing import Any

import pytest

from operations.adapters.base import LookupResult, LookupStatus
from operations.models import Intent
from operations.services import intent_escalate
from reconciliation.lookups import record_lookup
from tests.console.browser_support import (
    assert_no_horizontal_overflow,
    expect,
    pytestmark_browser,
    shot,
    sign_in,
)
from tests.console.conftest import gated, make_unknown
from tests.factories import UserFactory

pytestmark = pytestmark_browser

SCREENS = {"laptop": {"width": 1366, "height": 900}, "phone": {"width": 390, "height": 844}}
EMAIL = {"to": "ana@example.test", "subject": "Receipt", "body": "Thanks"}
#: A marker set on the page's window: still there after an action means no reload happened.
MARK = "() => { window.i39NotReloaded = true; }"
MARKED = "() => window.i39NotReloaded === true"


def on_first_screen(page: Any, target: Any) -> None:
    """``target`` (a selector or a locator) is laid out entirely within the viewport, the page
    scrolled to its top."""
    locator = page.locator(target) if isinstance(target, str) else target
    box = locator.bounding_box()
    height = page.viewport_size["height"]
    assert box is not None and box["y"] >= 0 and box["y"] + box["height"] <= height, (target, box, height)


def button(page: Any, name: str) -> Any:
    return page.get_by_role("button", name=name, exact=True)


def five_lookups(intent: Intent) -> None:
    for _ in range(5):
        record_lookup(intent.id, LookupResult(status=LookupStatus.NOT_FOUND_YET, detail={"answer": "lag"}))


@pytest.mark.parametrize("screen", list(SCREENS))
@pytest.mark.parametrize("verb", ["confirmed", "absent"])
def test_i39_4_decide_from_the_first_screen_and_the_whole_page_follows(
    verb: str, screen: str, page: Any
) -> None:
    # given: an UNKNOWN charge the reconciler looked up five times, and an operator on it
    UserFactory(username="otto", groups=["operator"])
    intent = make_unknown(reference="order-3003")
    five_lookups(intent)
    page.set_viewport_size(SCREENS[screen])
    sign_in(page, "otto")
    page.goto(f"/unknown/{intent.id}/")
    page.get_by_role("button", name="I'm on it").click()
    expect(page.locator("#assigned-to")).to_contain_text("that is you")
    # then: the decision's buttons are on the first screen, and the page fits its width
    page.evaluate("() => window.scrollTo(0, 0)")
    for name in ("Resolve as confirmed", "Resolve as absent", "Resolve by compensating"):
        on_first_screen(page, button(page, name))
    assert_no_horizontal_overflow(page)
    expect(page.locator("#intent-status")).to_have_text("UNKNOWN")
    # and the five lookups are one line with their count, which opens on each
    group = page.locator("details.lookup-group")
    expect(group).to_have_count(1)
    expect(group.locator("summary")).to_contain_text("5 lookups, not found yet,")
    expect(page.locator("#summary-lookups")).to_contain_text("5: not found yet ×5")
    group.locator("summary").click()
    expect(group.locator("ol.lookup-rows > li")).to_have_count(5)
    expect(group.locator("ol.lookup-rows > li").first).to_contain_text('"answer": "lag"')
    if verb == "confirmed":
        shot(page, "unknown-detail.png" if screen == "laptop" else "unknown-detail-phone.png")
    # when: the operator decides
    page.evaluate(MARK)
    page.locator("#resolve-reason").fill("the provider's dashboard says so")
    if verb == "confirmed":
        page.locator("#resolve-ref").fill("ch_3003")
        page.locator("#confirmed-unverified").check()
    page.locator(f"#resolve-{verb}").click()
    # then: the header, the title and the rest of the page follow, without a reload
    expected = "SUCCEEDED" if verb == "confirmed" else "READY"
    expect(page.locator("#intent-status")).to_have_text(expected)
    expect(page.locator("h1")).not_to_contain_text("UNKNOWN")
    expect(page).to_have_title(f"{expected} payments.charge · Effect Ledger")
    expect(page.locator("#resolution .success")).to_contain_text(f"The intent is {expected}")
    expect(page.locator("#resolve-confirmed")).to_have_count(0)
    assert page.evaluate(MARKED), "the page was reloaded"
    assert Intent.objects.get(id=intent.id).status == expected
    assert_no_horizontal_overflow(page)


@pytest.mark.parametrize("screen", list(SCREENS))
def test_i39_4_an_email_offers_no_compensate_and_says_why(screen: str, page: Any) -> None:
    # given: an UNKNOWN email (no compensation: a sent email cannot be undone)
    UserFactory(username="otto", groups=["operator"])
    intent = make_unknown(action="email.send", arguments=EMAIL)
    page.set_viewport_size(SCREENS[screen])
    sign_in(page, "otto")
    # when
    page.goto(f"/unknown/{intent.id}/")
    # then: confirmed and absent on the first screen; compensate not offered, and why
    on_first_screen(page, button(page, "Resolve as confirmed"))
    on_first_screen(page, button(page, "Resolve as absent"))
    expect(page.get_by_role("button", name="Resolve by compensating")).to_have_count(0)
    expect(page.locator("#compensate-not-offered")).to_contain_text("email.send has no compensation")
    assert_no_horizontal_overflow(page)


@pytest.mark.parametrize("screen", list(SCREENS))
def test_i39_5_the_dashboard_shows_only_what_waits(screen: str, page: Any) -> None:
    # given: a quiet ledger and an operator
    UserFactory(username="otto", groups=["operator"])
    page.set_viewport_size(SCREENS[screen])
    sign_in(page, "otto")
    # then: one sentence, no rows of zeros
    card = page.locator("#waiting-card")
    expect(card.get_by_text("Nothing waits for you.")).to_be_visible()
    expect(card.locator("td.num")).to_have_count(0)
    on_first_screen(page, "#waiting-card h2")
    assert_no_horizontal_overflow(page)
    # when: an approval with ten minutes left and an UNKNOWN intent escalated to operators
    gated(reference="hurry-1")
    escalated = make_unknown(reference="escalated-1")
    assert intent_escalate(intent_id=escalated.id, reason="patience exhausted")
    page.reload()
    # then: those two rows, the UNKNOWN first, on the first screen
    rows = card.locator("tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text("UNKNOWN intents escalated to operators")
    expect(rows.nth(1)).to_contain_text("Approval requests expiring within 15 minutes")
    expect(card.get_by_text("Nothing waits for you.")).to_have_count(0)
    on_first_screen(page, "#waiting-card tr:last-child")
    assert_no_horizontal_overflow(page)
    if screen == "laptop":
        shot(page, "dashboard.png")
