"""The console's template filters."""

from __future__ import annotations

from typing import Any

import pytest

from console.templatetags.console import amount
from operations.money import use_locale


@pytest.mark.parametrize(
    ("arguments", "shown"),
    [
        ({"amount": 4990, "currency": "EUR", "customer": "cus_42"}, "49.90 EUR"),
        ({"amount": -150, "currency": "USD"}, "-1.50 USD"),
        ({"to": "ana@example.test", "subject": "Receipt", "body": "Thanks"}, "—"),  # email.send
        ({"resource": "room-101", "seats": 2}, "—"),  # reservations.create
        ({"amount": 3, "channel": "ops"}, "—"),  # an integer but no currency: a count
        ({"amount": 3, "currency": ""}, "—"),
        ({"amount": 3, "currency": None}, "—"),
        ({"amount": "49.90", "currency": "EUR"}, "—"),  # not minor units
        ({"amount": 49.9, "currency": "EUR"}, "—"),
        ({"amount": True, "currency": "EUR"}, "—"),
        ({"currency": "EUR"}, "—"),
        (None, "—"),
        ([4990, "EUR"], "—"),
    ],
)
def test_amount_filter_shows_money_only_for_an_integer_amount_with_a_currency(
    arguments: Any, shown: str
) -> None:
    assert amount(arguments) == shown


@pytest.mark.parametrize(
    ("arguments", "shown"),
    [
        ({"amount": 125000, "currency": "JPY"}, "125,000 JPY"),  # exponent 0: no decimals, not 1,250.00
        ({"amount": 4990, "currency": "EUR"}, "49.90 EUR"),  # exponent 2
        ({"amount": 1234, "currency": "KWD"}, "1.234 KWD"),  # exponent 3: not 12.34
        ({"amount": 500, "currency": "BHD"}, "0.500 BHD"),
    ],
)
def test_i16_1_amount_filter_converts_by_the_currency_exponent(arguments: Any, shown: str) -> None:
    assert amount(arguments) == shown


def test_i16_1_amount_filter_follows_the_operator_locale() -> None:
    # given a request whose money locale is German (the middleware's use_locale)
    with use_locale("de_DE"):
        # when a euro and a yen amount are shown
        euro, yen = amount({"amount": 4990, "currency": "EUR"}), amount({"amount": 125000, "currency": "JPY"})
    # then German separators
    assert euro == "49,90 EUR"
    assert yen == "125.000 JPY"
    # and outside the block, the default (en_US) again
    assert amount({"amount": 4990, "currency": "EUR"}) == "49.90 EUR"
