"""Browser tests of the lists' filters and sorts (issue 16 item 3): filter and sort the
approvals inbox and the UNKNOWN section, open the URL in a fresh page (another session) and
see the same rows, with no horizontal overflow at 1366x900."""

from __future__ import annotations

import re
from typing import Any

from tests.console.browser_support import (
    VIEWPORT,
    assert_no_horizontal_overflow,
    expect,
    pytestmark_browser,
    shot,
    sign_in,
)
from tests.console.conftest import gated, make_unknown
from tests.factories import UserFactory, charge_arguments

pytestmark = pytestmark_browser


def row_ids(page: Any, table: str) -> list[str]:
    """The intent ids (monospace under each action) of ``table``'s rows, in order."""
    return [
        text.strip() for text in page.locator(f"{table} tbody tr td:nth-child(2) .mono").all_inner_texts()
    ]


def fresh_page(browser: Any, live_server: Any, username: str) -> Any:
    context = browser.new_context(viewport=VIEWPORT, base_url=live_server.url)
    tab = context.new_page()
    sign_in(tab, username)
    return tab


def test_i16_3_filter_and_sort_the_approvals_inbox_and_share_its_url(
    page: Any, browser: Any, live_server: Any
) -> None:
    # given: three charges awaiting approval, two for orders of one customer's batch
    UserFactory(username="alice", groups=["approver"])
    first = gated(25_000, reference="Batch-7-order-1")
    second = gated(31_000, reference="batch-7-order-2")
    gated(27_000, reference="other-order")
    sign_in(page, "alice")
    page.goto("/approvals/")
    # when: she filters by the batch's reference prefix in lower case and sorts oldest first
    page.get_by_label("Reference", exact=True).fill("batch-7*")
    page.get_by_label("Sort", exact=True).select_option("created")
    page.get_by_role("button", name="Filter").click()
    # then: the two batch intents, oldest first, with their reference, customer and amount
    expect(page).to_have_url(re.compile(r"reference=batch-7\*|reference=batch-7%2A"))
    expect(page.locator("#approval-rows tbody tr")).to_have_count(2)
    assert row_ids(page, "#approval-rows") == [str(first.id), str(second.id)]
    expect(page.locator("#approval-rows")).to_contain_text("cus_42")
    expect(page.locator("#approval-rows")).to_contain_text("Batch-7-order-1")
    shot(page, "approvals.png")
    # and the URL, opened in a fresh session, shows the same rows in the same order
    shared = fresh_page(browser, live_server, "alice")
    shared.goto(page.url)
    expect(shared.locator("#approval-rows tbody tr")).to_have_count(2)
    assert row_ids(shared, "#approval-rows") == [str(first.id), str(second.id)]
    expect(shared.get_by_label("Sort", exact=True)).to_have_value("created")
    shared.context.close()
    # and the intents search, with its new columns, fits the screen too
    page.goto("/intents/?reference=batch-7*&sort=created")
    expect(page.locator("#results tbody tr")).to_have_count(2)
    expect(page.locator("#results")).to_contain_text("cus_42")
    assert_no_horizontal_overflow(page)


def test_i16_3_filter_and_sort_the_unknown_queue_and_share_its_url(
    page: Any, browser: Any, live_server: Any
) -> None:
    # given: three UNKNOWN intents, two of them charges of acme
    UserFactory(username="otto", groups=["operator"])
    first = make_unknown(arguments=charge_arguments(1_250), reference="order-1")
    second = make_unknown(arguments=charge_arguments(2_500), reference="order-2")
    make_unknown(tenant="globex", reference="order-3")
    sign_in(page, "otto")
    page.goto("/unknown/")
    # when: he keeps acme only and sorts by submission, newest first
    page.get_by_label("Tenant", exact=True).fill("acme")
    page.get_by_label("Sort", exact=True).select_option("-created")
    page.get_by_role("button", name="Filter").click()
    # then
    expect(page).to_have_url(re.compile(r"tenant=acme"))
    section = page.locator("section[aria-labelledby=unknown-h]")
    expect(section.locator("tbody tr")).to_have_count(2)
    assert row_ids(page, "section[aria-labelledby=unknown-h]") == [str(second.id), str(first.id)]
    expect(section).to_contain_text("cus_42")
    shot(page, "unknown-queue.png")
    # and the URL, opened in a fresh session, shows the same rows in the same order
    shared = fresh_page(browser, live_server, "otto")
    shared.goto(page.url)
    shared_section = shared.locator("section[aria-labelledby=unknown-h]")
    expect(shared_section.locator("tbody tr")).to_have_count(2)
    assert row_ids(shared, "section[aria-labelledby=unknown-h]") == [str(second.id), str(first.id)]
    shared.context.close()
