"""The console's template filters."""

from __future__ import annotations

from typing import Any

import pytest

from console.templatetags.console import amount


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
