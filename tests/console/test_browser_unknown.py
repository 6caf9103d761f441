"""Browser journeys through the operators' queue (issue 16 items 4, 6 and 9), at 1366x900.

"I'm on it" then each resolution of an UNKNOWN intent, a second operator taking an item over, a
failed compensation back in the queue and reopened, the grouped timeline, and every page filled
with long values (a 200-character provider answer, long references, many lookups) laid out
without sideways scrolling.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from operations.adapters.base import LookupResult, LookupStatus
from operations.models import Intent
from operations.services import intent_assign, intent_cancel
from reconciliation import resolution
from reconciliation.duplicates import record_duplicates, sweep_compensations
from reconciliation.lookups import record_lookup
from reconciliation.models import DuplicateFinding
from tests.console.browser_support import (
    assert_no_horizontal_overflow,
    expect,
    pytestmark_browser,
    shot,
    sign_in,
)
from tests.console.conftest import make_unknown
from tests.factories import UserFactory, charge_arguments, submit, user_named

pytestmark = pytestmark_browser

S = Intent.Status
LONG_ANSWER = "provider said: " + "x" * 185  # 200 characters, one word
LONG_REFERENCE = "order-" + "7" * 190


def _looked_up(intent: Intent, times: int = 4, answer: str = "the provider's read path lags") -> None:
    """``times`` inconclusive lookups on record (the reconciler's), one run on the timeline."""
    for _ in range(times):
        record_lookup(intent.id, LookupResult(status=LookupStatus.INCONCLUSIVE, detail={"answer": answer}))


def _open_from_queue(page: Any, intent: Intent) -> None:
    page.get_by_role("navigation", name="Main").get_by_role("link", name="UNKNOWN").click()
    page.locator(f"a[href='/unknown/{intent.id}/']").first.click()
    expect(page.get_by_role("heading", name="Who is on it")).to_be_visible()


@pytest.mark.parametrize("verb", ["confirmed", "absent", "compensate"])
def test_i16_4_im_on_it_then_resolve(verb: str, page: Any) -> None:
    # given: an UNKNOWN charge the reconciler looked up four times, and an operator
    UserFactory(username="otto", groups=["operator"])
    intent = make_unknown(reference="order-3003")
    _looked_up(intent)
    sign_in(page, "otto")
    _open_from_queue(page, intent)
    # when: he says he is on it
    page.get_by_role("button", name="I'm on it").click()
    # then: the page (and the queue) say so
    expect(page.locator("#assigned-to")).to_contain_text("otto is on it since")
    expect(page.locator("#assigned-to")).to_contain_text("that is you")
    if verb == "confirmed":
        # the timeline shows the four lookups as one line that opens on each
        run = page.locator("details.lookup-run")
        expect(run.locator("> summary")).to_contain_text("4 lookups, inconclusive,")
        run.locator("> summary").click()
        expect(run.locator("> ol > li.kind-evidence")).to_have_count(4)
        shot(page, "unknown-timeline.png")  # the docs' unknown-detail.png: test_browser_i39.py
    # when: he resolves it
    if verb == "confirmed":
        page.locator("#resolve-ref").fill("ch_3003")
        page.locator("#resolve-reason").fill("the provider's dashboard shows ch_3003")
        page.locator("#confirmed-unverified").check()
        page.get_by_role("button", name="Resolve as confirmed").click()
        expected = "SUCCEEDED"
    elif verb == "absent":
        page.locator("#resolve-reason").fill("nothing at the provider")
        if page.locator("#absent-ack").count():
            page.locator("#absent-ack").check()
        page.get_by_role("button", name="Resolve as absent").click()
        expected = "READY"
    else:
        page.locator("#resolve-ref").fill("ch_3003")
        page.locator("#resolve-reason").fill("the customer cancelled")
        page.get_by_role("button", name="Resolve by compensating").click()
        expected = "COMPENSATING"
    # then: resolved, and nobody is on it any more
    expect(page.locator("#resolution .success")).to_contain_text(f"The intent is {expected}")
    resolved = Intent.objects.get(id=intent.id)
    assert resolved.status == expected and resolved.assigned_to == ""
    assert_no_horizontal_overflow(page)


def test_i16_4_a_second_operator_is_refused_then_takes_over(page: Any) -> None:
    # given: otto is on an UNKNOWN charge; anna opens it
    otto = UserFactory(username="otto", groups=["operator"])
    UserFactory(username="anna", groups=["operator"])
    intent = make_unknown(reference="order-4004")
    intent_assign(intent_id=intent.id, user=otto)
    sign_in(page, "anna")
    _open_from_queue(page, intent)
    expect(page.locator("#assigned-to")).to_contain_text("otto is on it since")
    expect(page.get_by_role("button", name="I'm on it")).to_have_count(0)
    # when: she resolves it anyway
    page.locator("#resolve-reason").fill("nothing at the provider")
    if page.locator("#absent-ack").count():
        page.locator("#absent-ack").check()
    page.get_by_role("button", name="Resolve as absent").click()
    # then: refused in place, nothing changed
    expect(page.locator("#resolution .error")).to_contain_text("otto is on it since")
    expect(page.locator("#resolution .error")).to_contain_text("take it over first")
    assert Intent.objects.get(id=intent.id).status == S.UNKNOWN
    # when: she takes it over, confirming
    page.locator("#confirm-take-over").check()
    page.locator("#take-over-reason").fill("otto went home")
    page.get_by_role("button", name="Take over from otto").click()
    # then: hers; and her resolution goes through
    expect(page.locator(".messages")).to_contain_text("You took it over from otto")
    expect(page.locator("#assigned-to")).to_contain_text("anna is on it since")
    shot(page, "unknown-taken-over.png")
    page.locator("#resolve-reason").fill("nothing at the provider")
    if page.locator("#absent-ack").count():
        page.locator("#absent-ack").check()
    page.get_by_role("button", name="Resolve as absent").click()
    expect(page.locator("#resolution .success")).to_contain_text("The intent is READY")
    assert Intent.objects.get(id=intent.id).assigned_to == ""


def test_i16_4_a_failed_compensation_lands_in_the_queue_then_is_reopened(page: Any) -> None:
    # given: an UNKNOWN charge resolved by compensating, whose refund was then cancelled
    anna = UserFactory(username="anna", groups=["operator"])
    UserFactory(username="otto", groups=["operator"])
    intent = make_unknown(reference="order-5005")
    resolution.resolve_compensate(intent_id=intent.id, user=anna, reason="undo", provider_reference="ch_5005")
    intent_cancel(intent_id=Intent.objects.get(compensates=intent).id, actor="user:vera", reason="not now")
    sweep_compensations()
    sign_in(page, "otto")
    # when: otto opens the queue
    page.get_by_role("navigation", name="Main").get_by_role("link", name="UNKNOWN").click()
    section = page.locator("#compensations")
    expect(section.locator(f"a[href='/unknown/{intent.id}/']")).to_be_visible()
    shot(page, "unknown-queue-compensation.png")
    section.locator(f"a[href='/unknown/{intent.id}/']").click()
    page.get_by_role("button", name="I'm on it").click()
    expect(page.locator("#assigned-to")).to_contain_text("otto is on it since")
    # and reopens the compensation
    page.locator("#reopen-reason").fill("the refund was cancelled by mistake")
    page.get_by_role("button", name="Reopen the compensation").click()
    # then: a new compensation runs; the item left the queue and nobody is on it
    expect(page.locator("#resolution .success")).to_contain_text("Resolved as reopen")
    reopened = Intent.objects.get(id=intent.id)
    assert reopened.status == S.COMPENSATING and reopened.escalated_at is None and reopened.assigned_to == ""
    assert Intent.objects.filter(compensates=intent).count() == 2
    assert_no_horizontal_overflow(page)


def test_i16_9_every_page_fits_1366_with_long_values(page: Any) -> None:
    # given: an UNKNOWN charge with a long reference and customer, twelve lookups that answered
    # a 200-character word, an operator on it; a HELD intent with a long reference behind a
    # SUCCEEDED one; a duplicate finding with long references
    UserFactory(username="otto", groups=["operator", "viewer"])
    unknown = make_unknown(reference=LONG_REFERENCE, arguments=charge_arguments(customer="cus_" + "9" * 120))
    for index in range(12):
        record_lookup(
            unknown.id,
            LookupResult(
                status=LookupStatus.INCONCLUSIVE if index % 5 else LookupStatus.NOT_FOUND_YET,
                provider_references=(),
                detail={"answer": LONG_ANSWER, "raw": LONG_ANSWER},
            ),
        )
    intent_assign(intent_id=unknown.id, user=UserFactory(username="o" * 40, groups=["operator"]))
    earlier = submit(reference="held-" + "8" * 150)
    held = submit(reference="held-" + "8" * 150)
    assert held.status == S.HELD and earlier.id != held.id
    duplicated = make_unknown(reference="dup-" + "6" * 150)
    with transaction.atomic():
        resolution.resolve_confirmed(
            intent_id=duplicated.id, user=UserFactory(username="vera", groups=["operator"]),
            provider_reference="ch_" + "5" * 190, reason=LONG_ANSWER, accept_unverified=True,
        )  # fmt: skip
        record_duplicates(
            intent=Intent.objects.get(id=duplicated.id),
            references=["ch_" + "5" * 190, "ch_" + "4" * 190],
            keep="ch_" + "5" * 190,
        )
    finding = DuplicateFinding.objects.filter(intent=duplicated).first()
    sign_in(page, "otto")
    pages = {
        "unknown-detail": f"/unknown/{unknown.id}/",
        "intent-detail": f"/intents/{unknown.id}/",
        "held-detail": f"/held/{held.id}/",
        "duplicate-intent": f"/intents/{duplicated.id}/",
        "audit": "/audit/",
        "dashboard": "/",
        "queue": "/unknown/",
        "intents": "/intents/",
    }
    if finding is not None:
        pages["duplicate-detail"] = f"/duplicates/{finding.id}/"
    for name, url in pages.items():
        # when: each page is opened, every <details> open
        page.goto(url)
        page.evaluate("() => document.querySelectorAll('details').forEach((d) => { d.open = true; })")
        # then: nothing makes it scroll sideways
        assert_no_horizontal_overflow(page)
        if name == "unknown-detail":
            shot(page, "unknown-detail-long-values.png")


def test_i16_9_a_150_character_username_wraps_instead_of_widening_the_pages(page: Any) -> None:
    # given: an operator whose name is as long as Django allows (150 characters, no space) is on
    # an UNKNOWN charge and a held one (the reviewer's case), and a colleague
    long_name = "o" * 150
    UserFactory(username=long_name, groups=["operator"])
    UserFactory(username="otto", groups=["operator"])
    unknown = make_unknown(reference="order-4004")
    earlier = submit(arguments=charge_arguments(), reference="order-4005")
    held = submit(arguments=charge_arguments(5_990), reference="order-4005")
    assert held.status == S.HELD and earlier.status == S.READY
    for intent in (unknown, held):
        intent_assign(intent_id=intent.id, user=user_named(long_name))
    # when / then: the queue and both pages (with the take-over form naming them) fit 1366 px,
    # for the colleague and for the long-named operator (whose name is in the header)
    for who in ("otto", long_name):
        page.context.clear_cookies()
        sign_in(page, who)
        for path in ("/unknown/", f"/unknown/{unknown.id}/", f"/held/{held.id}/"):
            page.goto(path)
            expect(page.get_by_text(long_name).first).to_be_visible()
            assert_no_horizontal_overflow(page)
