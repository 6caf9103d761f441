"""Browser tests of issue 16 items 1 and 2: a JPY approval shows yen without decimals, and the
duplicate-risk warning journey (badge, warning, confirmation) at 1366x900."""

from __future__ import annotations

from typing import Any

from operations.adapters.base import ExecutionResult
from operations.models import Intent
from operations.services import intent_claim, intent_record_success, intent_release_held
from tests.console.browser_support import expect, pytestmark_browser, shot, sign_in
from tests.factories import UserFactory, charge_arguments, submit

pytestmark = pytestmark_browser


def _succeeded_charge(reference: str) -> Intent:
    intent = submit(arguments=charge_arguments(4_990), reference=reference)
    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None
    assert intent_record_success(
        claim=claim, result=ExecutionResult(provider_reference="ch_first", response_digest="0" * 64)
    )
    return intent


def test_i16_2_duplicate_warning_journey(page: Any) -> None:
    # given: order-2001 was already charged, and a second charge for it awaits approval: held
    # as a likely duplicate (issue 38 item 5), released by an operator who accepted the risk
    UserFactory(username="alice", groups=["approver"])
    earlier = _succeeded_charge("order-2001")
    held = submit(arguments=charge_arguments(25_000), reference="order-2001")
    assert (held.status, held.held_behind_id) == (Intent.Status.HELD, earlier.id)
    intent = intent_release_held(
        intent_id=held.id, actor="user:otto", reason="a second order", duplicate_risk_accepted=True
    )
    assert intent.status == Intent.Status.AWAITING_APPROVAL
    sign_in(page, "alice")
    # when: she opens the inbox
    page.get_by_role("link", name="Approvals").click()
    # then: the row carries the badge and a link to the earlier charge
    row = page.locator("tr", has_text=str(intent.id))
    expect(row.get_by_text("possible duplicate")).to_be_visible()
    expect(row.get_by_role("link", name="SUCCEEDED")).to_have_attribute("href", f"/intents/{earlier.id}/")
    # when: she opens the approval page
    row.get_by_role("link", name="payments.charge").click()
    # then: a prominent warning names the earlier charge
    warning = page.locator("#duplicate-risk")
    expect(warning).to_be_visible()
    expect(warning).to_contain_text("Possible duplicate")
    expect(warning.get_by_role("link", name=str(earlier.id))).to_be_visible()
    shot(page, "approval-duplicate-warning.png")
    # when: she tries to approve without the confirmation, the browser asks for it (required box)
    page.get_by_role("button", name="Approve this payload").click()
    intent.refresh_from_db()
    assert intent.status == Intent.Status.AWAITING_APPROVAL
    # when: she ticks it and approves
    page.get_by_label("I have seen the other intents for this reference and approve a second effect").check()
    page.get_by_role("button", name="Approve this payload").click()
    # then
    expect(page.locator("#decision")).to_contain_text("Approved. The intent is READY")
    intent.refresh_from_db()
    assert intent.status == Intent.Status.READY


def test_i16_1_jpy_approval_shows_yen_without_decimals(page: Any) -> None:
    # given: a 125,000 yen charge waiting for approval (no money rule names JPY: fail safe)
    UserFactory(username="alice", groups=["approver"])
    intent = submit(arguments=charge_arguments(125_000, currency="JPY"), reference="order-jp-2")
    assert intent.status == Intent.Status.AWAITING_APPROVAL
    sign_in(page, "alice")
    # when
    page.get_by_role("link", name="Approvals").click()
    # then: the inbox and the approval page show 125,000 JPY, not 1,250.00
    expect(page.locator("tr", has_text=str(intent.id))).to_contain_text("125,000 JPY")
    page.get_by_role("link", name="payments.charge").click()
    expect(page.get_by_text("Charge 125,000 JPY to cus_42")).to_be_visible()
    expect(page.locator("#preview-h + p + dl")).to_contain_text("125,000 JPY")
    shot(page, "approval-jpy.png")
    assert "1,250.00" not in page.content()
    page.get_by_role("button", name="Approve this payload").click()
    expect(page.locator("#decision")).to_contain_text("Approved. The intent is READY")
