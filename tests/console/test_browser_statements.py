"""Issue 39 items 6 and 10 in a browser: an operator finds Statements in the navigation, a first
upload refused for want of a mapping opens the mapping of the source uploaded, and once saved the
upload answers at once and the page follows the import to its end without a reload."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from console.celery import app
from reconciliation.models import StatementUpload
from reconciliation.statement_uploads import statement_upload_import
from tests.console.browser_support import (
    assert_no_horizontal_overflow,
    expect,
    pytestmark_browser,
    shot,
    sign_in,
)
from tests.factories import UserFactory
from tests.support.workers import QUEUE

pytestmark = pytestmark_browser


@pytest.fixture(autouse=True)
def _session_queue() -> Iterator[None]:
    """The upload's hand-off after commit publishes to this session's queue, not a quick start's."""
    default_queue = app.conf.task_default_queue
    app.conf.task_default_queue = QUEUE
    yield
    app.conf.task_default_queue = default_queue


def upload(page: Any, csv: Path) -> None:
    page.get_by_label("Source").select_option("sandbox-payments")
    page.get_by_label("Day (UTC)").fill("2026-03-10")
    page.get_by_label("CSV file").set_input_files(str(csv))
    page.get_by_role("button", name="Reconcile").click()


def test_i39_6_10_an_operator_uploads_a_first_statement_and_watches_it_import(
    page: Any, tmp_path: Path
) -> None:
    # given: an operator, no mapping saved, and a provider's export with its own header
    UserFactory(username="olga", groups=["operator"])
    csv = tmp_path / "payments-2026-03-10.csv"
    csv.write_text("Charge ID,Amount,Currency\n" + "".join(f"ch_{n},49.90,EUR\n" for n in range(2500)))
    sign_in(page, "olga")
    # when: she opens Statements from the navigation and uploads it
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Statements").click()
    expect(page.get_by_role("heading", name="Statement runs")).to_be_visible()
    upload(page, csv)
    # then: refused, with the mapping form open on the source she uploaded (not the first one)
    expect(page.get_by_role("alert")).to_contain_text("sandbox-payments has no saved column mapping")
    expect(page.locator("#mapping-source")).to_have_text("sandbox-payments")
    expect(page.get_by_label("Source")).to_have_value("sandbox-payments")
    # when: she saves her file's headers as its mapping, and uploads again
    page.get_by_label("Header of provider_reference (required)").fill("Charge ID")
    page.get_by_label("Header of amount").fill("Amount")
    page.get_by_label("Header of currency").fill("Currency")
    page.get_by_role("button", name="Save the mapping").click()
    expect(page.get_by_role("status").first).to_contain_text("Saved the column mapping of sandbox-payments.")
    upload(page, csv)
    # then: accepted at once, queued
    expect(page.get_by_role("status").first).to_contain_text("2500 lines, imported in the background")
    expect(page.locator(".upload-queued")).to_contain_text("queued")
    # when: a worker imports it (here, in this process: one batch, then the rest)
    queued = StatementUpload.objects.get()
    statement_upload_import(upload_id=queued.id, message_id=queued.message_id, seconds=0)
    # then: the page shows the progress, then the end, without a reload
    expect(page.locator("progress")).to_have_attribute("value", "1000")
    shot(page, "statements-importing.png")
    statement_upload_import(upload_id=queued.id, message_id=StatementUpload.objects.get().message_id)
    expect(page.locator(".upload-done")).to_be_visible()
    expect(page.locator("#statement-activity")).not_to_have_attribute("hx-trigger", "every 2s")
    shot(page, "statements.png")
    # and: on a phone, the page does not scroll sideways (the runs table scrolls in its box)
    page.set_viewport_size({"width": 390, "height": 844})
    assert_no_horizontal_overflow(page)
    expect(page.get_by_role("navigation", name="Main").get_by_role("link", name="Statements")).to_be_visible()
