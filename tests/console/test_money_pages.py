"""Money on the console's pages: minor units converted by the currency's ISO 4217 exponent, in
the operator's locale (issue 16 item 1)."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from operations.models import Intent
from tests.factories import charge_arguments, submit

pytestmark = pytest.mark.django_db


def jpy_charge() -> Intent:
    """A 125,000 yen charge waiting for approval (no default money rule names JPY: fail safe)."""
    intent = submit(arguments=charge_arguments(125_000, currency="JPY"), reference="order-jp-1")
    assert intent.status == Intent.Status.AWAITING_APPROVAL
    return intent


def test_i16_1_jpy_amount_has_no_decimals_on_the_approval_page_inbox_and_intent_page(
    approver_client: Client,
) -> None:
    # given
    intent = jpy_charge()
    # when
    pages = {
        "approval": approver_client.get(reverse("approval-detail", args=[intent.id])),
        "inbox": approver_client.get(reverse("approvals")),
        "intent": approver_client.get(reverse("intent-detail", args=[intent.id])),
    }
    # then: 125,000 yen everywhere, never 1,250.00
    for name, response in pages.items():
        body = response.content.decode()
        assert response.status_code == 200, name
        assert "125,000 JPY" in body, name
        assert "1,250.00" not in body, name
    assert "Charge 125,000 JPY to cus_42" in pages["approval"].content.decode()  # the adapter's preview


def test_i16_1_kwd_shows_three_decimals(approver_client: Client) -> None:
    intent = submit(arguments=charge_arguments(1234, currency="KWD"))
    body = approver_client.get(reverse("approval-detail", args=[intent.id])).content.decode()
    # never read with two decimals ("12.34 KWD"); a timestamp's "12.340717" is not an amount
    assert "Charge 1.234 KWD to cus_42" in body and "12.34 KWD" not in body and "12.34\u00a0KWD" not in body


def test_i16_1_money_follows_the_browser_locale(approver_client: Client) -> None:
    # given: a 49.90 EUR charge and a 125,000 JPY one waiting for approval
    euro = submit(arguments=charge_arguments(4990, currency="EUR"), reference="order-de-1")
    Intent.objects.filter(id=euro.id).update(status=Intent.Status.AWAITING_APPROVAL)
    jpy_charge()
    # when: a German browser reads the inbox and the intent page
    inbox = approver_client.get(reverse("approvals"), HTTP_ACCEPT_LANGUAGE="de-DE,de;q=0.9,en;q=0.5")
    page = approver_client.get(reverse("intent-detail", args=[euro.id]), HTTP_ACCEPT_LANGUAGE="de")
    english = approver_client.get(reverse("intent-detail", args=[euro.id]), HTTP_ACCEPT_LANGUAGE="en-US")
    # then: German separators; English (and the default) as before
    assert "49,90 EUR" in inbox.content.decode() and "125.000 JPY" in inbox.content.decode()
    assert '<dd id="intent-amount">49,90 EUR</dd>' in page.content.decode()
    assert '<dd id="intent-amount">49.90 EUR</dd>' in english.content.decode()


def test_i16_1_the_preview_sentence_and_the_amount_agree_in_every_locale(approver_client: Client) -> None:
    # given: a 1.234 KWD charge waiting for approval (three decimals: read wrongly, 1,000 times off)
    kwd = submit(arguments=charge_arguments(1234, currency="KWD"), reference="order-kw-1")
    Intent.objects.filter(id=kwd.id).update(status=Intent.Status.AWAITING_APPROVAL)
    for language, shown in (("de-DE", "1,234 KWD"), ("en-US", "1.234 KWD")):
        # when: the approver's browser asks for the page in that language
        body = approver_client.get(
            reverse("approval-detail", args=[kwd.id]), HTTP_ACCEPT_LANGUAGE=language
        ).content.decode()
        # then: the adapter's sentence uses the same separators as the amount (the reviewer saw
        # "Charge 1.234 KWD" above "Amount 1,234 KWD" for a German reader)
        assert f"Charge {shown} to" in body, language
        other = "1.234 KWD" if shown == "1,234 KWD" else "1,234 KWD"
        assert other not in body, language
