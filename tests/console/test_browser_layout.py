"""Browser tests of issue 39 items 2 and 3: approving on a phone (390x844) and tokens that never
wrap (1366x900), with intents of every provider kind (``tests/console/test_every_kind.py``).

Item 2: at 390 px the approvals inbox shows each intent's action, amount, target and time left
first and whole, its filters folded; an approval page shows the preview and the Approve button
within the first screen, the payload below, wrapped inside its box. Item 3: a status or risk
badge, an amount, an action name, an intent id or a time left never spans two lines, in the
intents search, the approvals inbox, the operators' queue and the dashboard.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from operations.models import Intent
from tests.console.browser_support import (
    PHONE,
    assert_no_horizontal_overflow,
    expect,
    pytestmark_browser,
    shot,
    sign_in,
)
from tests.console.test_every_kind import KINDS, build, serve_every_kind
from tests.factories import UserFactory, charge_arguments, submit

pytestmark = pytestmark_browser
S = Intent.Status

#: kind -> a free-text argument its schema accepts, filled with a long unbroken value (a link),
#: so the payload has a line longer than a phone is wide.
LONG_FIELD = {
    "payments.charge": "description",
    "payments.refund": "reason",
    "email.send": "body",
    "reservations.create": "reference",
    "reservations.cancel": "reason",
    "generic-with-lookup": "memo",
    "generic-without-lookup": "text",
    "declared-without-keys": "memo",
    "smtp": "body",
    "stripe": "description",
    "stripe.refund": "reference",
}
LONG_VALUE = "https://support.example.test/t/" + "a1b2c3d4e5" * 15

# How many lines each element matched by a selector spans, as the browser laid it out: the
# client rects of a range over its contents (one per line box fragment), those that overlap
# vertically counted as one line. An element cut with an ellipsis is one line.
LINES_PROBE = """
(selector) => Array.from(document.querySelectorAll(selector)).map((element) => {
  const range = document.createRange();
  range.selectNodeContents(element);
  const rects = Array.from(range.getClientRects()).filter((r) => r.width > 0 && r.height > 0)
    .sort((a, b) => a.top - b.top);
  let lines = 0, bottom = -Infinity;
  for (const r of rects) {
    if (r.top >= bottom - 2) { lines += 1; bottom = r.bottom; } else { bottom = Math.max(bottom, r.bottom); }
  }
  return {text: element.textContent.trim(), lines: lines};
})
"""

# Each inbox row's cells as laid out: box, scroll and client width, by column (1-based: 2 the
# action, 5 the target, 6 the amount, 9 the time left).
INBOX_CELLS_PROBE = """
() => Array.from(document.querySelectorAll("#approval-rows tbody tr")).map((row) =>
  Array.from(row.children).map((cell) => {
    const box = cell.getBoundingClientRect();
    return {top: box.top, bottom: box.bottom, left: box.left, right: box.right,
            scrollWidth: cell.scrollWidth, clientWidth: cell.clientWidth, text: cell.innerText.trim()};
  }))
"""

# An element's box and whether its content fits it (nothing scrolled out of sight or clipped).
BOX_PROBE = """
(element) => {
  const box = element.getBoundingClientRect();
  return {top: box.top, bottom: box.bottom, left: box.left, right: box.right,
          scrollWidth: element.scrollWidth, clientWidth: element.clientWidth};
}
"""

ACTION, TARGET, AMOUNT, TIME_LEFT = 2, 5, 6, 9
FIRST_CELLS = (ACTION, AMOUNT, TARGET, TIME_LEFT)


def awaiting(settings: Any, kind: str, *, long_text: bool = False) -> Intent:
    """An intent of ``kind`` awaiting approval (its action gated by policy); with ``long_text``,
    its ``LONG_FIELD`` argument holds ``LONG_VALUE``."""
    action, arguments = KINDS[kind]
    settings.EFFECT_LEDGER_POLICIES = {
        **settings.EFFECT_LEDGER_POLICIES,
        action: {"approval": "always", "approval_ttl_seconds": 600},
    }
    reference = f"ref-{kind}"
    if long_text:
        arguments = {**arguments, LONG_FIELD[kind]: LONG_VALUE}
    if "reference" in arguments:  # the provider's reference is the business identity: one value
        if not (long_text and LONG_FIELD[kind] == "reference"):
            arguments = {**arguments, "reference": reference}
        reference = arguments["reference"]
    intent = submit(action=action, arguments=arguments, reference=reference)
    assert intent.status == S.AWAITING_APPROVAL, kind
    return intent


@pytest.fixture
def every_kind_gated(settings: Any) -> None:
    """Every kind's action served; none gated until ``awaiting`` or ``build`` gates it."""
    serve_every_kind(settings)
    settings.EFFECT_LEDGER_POLICIES = {action: {"approval": "never"} for action, _ in KINDS.values()}


def lines_of(page: Any, selector: str) -> list[dict[str, Any]]:
    """Each element ``selector`` matches: its text and the number of lines it spans."""
    found: list[dict[str, Any]] = page.evaluate(LINES_PROBE, selector)
    return found


def assert_one_line(page: Any, selectors: dict[str, str]) -> None:
    """Every element each selector matches spans one line, and each matches at least one."""
    for what, selector in selectors.items():
        found = lines_of(page, selector)
        assert found, f"{page.url}: no {what} ({selector})"
        split = [item for item in found if item["lines"] != 1]
        assert not split, f"{page.url}: {what} split across lines: {split}"


def assert_fits(page: Any, element: Any, what: str) -> None:
    """``element`` is inside the viewport's width and shows all of its content."""
    width = page.viewport_size["width"]
    box = element.evaluate(BOX_PROBE)
    assert box["scrollWidth"] <= box["clientWidth"], f"{what} is clipped: {box}"
    assert box["left"] >= 0 and box["right"] <= width, f"{what} is outside the {width} px screen: {box}"


def test_i39_2_the_inbox_at_390_px_shows_action_amount_target_and_time_left_first(
    phone: Any, settings: Any, every_kind_gated: None
) -> None:
    # given: one intent of every kind awaiting approval, and a 125,000,000 JPY charge
    UserFactory(username="alice", groups=["approver"])
    for kind in KINDS:
        awaiting(settings, kind)
    big = submit(arguments=charge_arguments(125_000_000, currency="JPY"), reference="order-jp-big")
    assert big.status == S.AWAITING_APPROVAL
    sign_in(phone, "alice")
    # when: she opens the inbox on her phone
    phone.get_by_role("navigation", name="Main").get_by_role("link", name="Approvals").click()
    expect(phone.locator("#approval-rows tbody tr")).to_have_count(len(KINDS) + 1)
    # then: the page does not scroll sideways
    assert phone.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    assert_no_horizontal_overflow(phone)
    # and the filters are folded: the first row's action, amount, target and time left are on
    # the first screen
    expect(phone.get_by_label("Reference", exact=True)).to_be_hidden()
    rows = phone.evaluate(INBOX_CELLS_PROBE)
    assert all(rows[0][column - 1]["bottom"] <= PHONE["height"] for column in FIRST_CELLS), rows[0]
    for cells in rows:
        first = [cells[column - 1] for column in FIRST_CELLS]
        rest = [cell for column, cell in enumerate(cells, start=1) if column not in FIRST_CELLS]
        # each row shows those four before its other cells ...
        assert max(cell["bottom"] for cell in first) <= min(cell["top"] for cell in rest) + 1, cells
        # ... and whole: inside the screen's width, nothing cut or scrolled out of sight
        for cell in first:
            assert cell["scrollWidth"] <= cell["clientWidth"], cell
            assert cell["left"] >= 0 and cell["right"] <= PHONE["width"], cell
    assert "125,000,000 JPY" in [cells[AMOUNT - 1]["text"] for cells in rows]
    # and no amount, action, badge or time left spans two lines
    assert_one_line(
        phone,
        {
            "amount": "#approval-rows td.num",
            "action name": f"#approval-rows td:nth-child({ACTION}) > a:first-child",
            "risk badge": "#approval-rows .risk",
            "time left": "#approval-rows time",
        },
    )
    shot(phone, "approvals-phone.png", full_page=False)
    # when: she unfolds the filters and narrows the list to the email
    phone.get_by_text("Filter and sort").click()
    phone.get_by_label("Reference", exact=True).fill("ref-email.send")
    phone.get_by_role("button", name="Filter").click()
    # then
    expect(phone).to_have_url(re.compile(r"reference=ref-email.send"))
    expect(phone.locator("#approval-rows tbody tr")).to_have_count(1)
    expect(phone.locator("#approval-rows")).to_contain_text("ana@example.test")


@pytest.mark.parametrize("kind", list(KINDS))
def test_i39_2_an_approval_page_at_390_px_has_the_preview_and_the_decision_on_the_first_screen(
    kind: str, phone: Any, settings: Any, every_kind_gated: None
) -> None:
    # given: an intent of this kind awaiting approval, one of its arguments a long link
    UserFactory(username="alice", groups=["approver"])
    intent = awaiting(settings, kind, long_text=True)
    sign_in(phone, "alice")
    # when: she opens its approval page on her phone (the approval email's link)
    phone.goto(f"/approvals/{intent.id}/")
    preview = phone.locator("section[aria-labelledby=preview-h]")
    approve = phone.get_by_role("button", name="Approve this payload")
    expect(approve).to_be_visible()
    # then: the page does not scroll sideways
    assert phone.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    assert_no_horizontal_overflow(phone)
    # and what would happen, its amount and time left, and the Approve button are on the first
    # screen, before the payload
    assert phone.evaluate("window.scrollY") == 0
    summary = preview.locator("p.big").bounding_box()
    button = approve.bounding_box()
    assert summary["y"] + summary["height"] <= PHONE["height"], summary
    assert button["y"] + button["height"] <= PHONE["height"], f"Approve button {button} below the fold"
    payload = phone.locator("section[aria-labelledby=payload-h]").bounding_box()
    assert payload["y"] >= button["y"] + button["height"], "the payload comes after the decision"
    for what in ("Amount", "Expires in"):
        value = preview.locator("dt", has_text=what).locator("xpath=following-sibling::dd[1]")
        assert value.bounding_box()["y"] + value.bounding_box()["height"] <= PHONE["height"], what
        assert_fits(phone, value, what)
    # and the arguments, long link included, wrap inside their box: nothing clipped
    arguments = phone.locator("section[aria-labelledby=payload-h] pre.json").first
    expect(arguments).to_contain_text(LONG_VALUE[:40])
    assert_fits(phone, arguments, "the arguments")
    if kind == "payments.charge":
        shot(phone, "approval-phone.png", full_page=False)


#: Per page at 1366 px: the tokens that must never wrap (badges, amounts, action names, ids).
TOKENS_WIDE = {
    "/intents/": {
        "status badge": "#results .status",
        "amount": "#results td.num",
        "action name": "#results tbody td:nth-child(2) > a:first-child",
        "intent id": "#results tbody td:nth-child(2) > .mono",
    },
    "/approvals/": {
        "risk badge": "#approval-rows .risk",
        "amount": "#approval-rows td.num",
        "action name": "#approval-rows td:nth-child(2) > a:first-child",
        "intent id": "#approval-rows td:nth-child(2) > .mono",
        "time left": "#approval-rows time",
    },
    "/unknown/": {
        "amount": "#unknown-rows td.num",
        "action name": "#unknown-rows td:nth-child(2) > a:first-child",
        "intent id": "#unknown-rows td:nth-child(2) > .mono",
        "status badge": "#unknown-rows .status",
    },
    "/": {"status badge": "main .status", "count": "main td.num"},
    # the newcomer's: event names and numbers split ("approval_exp|ired", "1|0")
    "/audit/": {
        "event number": "#audit-rows td.seq",
        "event name": "#audit-rows td.event-name",
        "hash prefix": "#audit-rows td:last-child",
    },
}


def test_i39_3_badges_amounts_action_names_and_ids_never_wrap_at_1366_px(
    page: Any, settings: Any, every_kind_gated: None
) -> None:
    # given: intents of every kind succeeded, failed, UNKNOWN, held behind an earlier one and
    # awaiting approval, and a 125,000,000 JPY charge awaiting approval
    approver = UserFactory(username="alice", groups=["approver"])
    for state in (S.SUCCEEDED, S.FAILED, S.UNKNOWN, S.HELD, S.AWAITING_APPROVAL):
        for kind in KINDS:
            build(kind, state, settings=settings, approver=approver)
    submit(arguments=charge_arguments(125_000_000, currency="JPY"), reference="order-jp-big")
    sign_in(page, "alice")
    for url, tokens in TOKENS_WIDE.items():
        # when
        page.goto(url)
        # then: the page fits 1366 px, and no token spans two lines
        assert_no_horizontal_overflow(page)
        assert_one_line(page, tokens)
        # and an identifier cut with an ellipsis keeps its whole value in its title
        for cell in page.locator("td.ident, #unknown-rows td.mono").all():
            if cell.evaluate("(c) => c.scrollWidth > c.clientWidth"):
                assert cell.get_attribute("title") == cell.inner_text().strip()


def test_i39_2_the_approve_button_stays_on_the_first_screen_with_a_long_target_and_amount(
    phone: Any, settings: Any, every_kind_gated: None
) -> None:
    # given: a charge with the longest amount and a long customer id (the agent chooses both;
    # newcomer: the button's top at 882 px of 844 on main's first layout)
    UserFactory(username="alice", groups=["approver"])
    settings.EFFECT_LEDGER_POLICIES = {
        **settings.EFFECT_LEDGER_POLICIES,
        "payments.charge": {"approval": "always"},
    }
    intent = submit(
        arguments=charge_arguments(999_999_999_999, currency="JPY", customer="cus_" + "x" * 60),
        reference="order-long-target",
    )
    assert intent.status == S.AWAITING_APPROVAL
    sign_in(phone, "alice")
    # when
    phone.goto(f"/approvals/{intent.id}/")
    # then: the Approve button is on the first screen, the page does not scroll sideways, and
    # the whole target is still on the page (the payload below)
    button = phone.get_by_role("button", name="Approve this payload").bounding_box()
    assert button["y"] + button["height"] <= PHONE["height"], f"Approve button {button} below the fold"
    assert_no_horizontal_overflow(phone)
    expect(phone.locator("section[aria-labelledby=payload-h]")).to_contain_text("cus_" + "x" * 60)
    shot(phone, "approval-phone-long-target.png", full_page=False)
