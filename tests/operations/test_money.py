"""operations/money.py: minor units converted by the currency's ISO 4217 exponent (Babel)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from operations.adapters.sandbox.payments import SandboxPaymentsAdapter
from operations.money import (
    currency_problem,
    decimal_string,
    exponent,
    format_money,
    format_plain,
    money_json,
    negotiate_locale,
    to_decimal,
)


@pytest.mark.parametrize(
    ("minor", "currency", "digits", "exact", "plain"),
    [
        (125_000, "JPY", 0, "125000", "125,000 JPY"),
        (4990, "EUR", 2, "49.90", "49.90 EUR"),
        (1234, "KWD", 3, "1.234", "1.234 KWD"),
        (5, "BHD", 3, "0.005", "0.005 BHD"),
        (-150, "USD", 2, "-1.50", "-1.50 USD"),
    ],
)
def test_i16_1_minor_units_follow_the_currency_exponent(
    minor: int, currency: str, digits: int, exact: str, plain: str
) -> None:
    assert exponent(currency) == digits
    assert decimal_string(minor, currency) == exact
    assert to_decimal(minor, currency) == Decimal(exact)
    assert format_plain(minor, currency) == plain


def test_i16_1_format_money_uses_the_locale() -> None:
    assert format_money(125_000, "JPY", "en_US") == "125,000 JPY"
    assert format_money(4990, "EUR", "en_US") == "49.90 EUR"
    assert format_money(1234, "KWD", "en_US") == "1.234 KWD"
    assert format_money(4990, "EUR", "de_DE") == "49,90 EUR"
    assert format_money(125_000, "JPY", "de_DE") == "125.000 JPY"
    assert format_money(1234, "KWD", "de_DE") == "1,234 KWD"
    assert format_money(4990, "EUR", "xx_NOPE") == "49.90 EUR"  # a misconfigured locale: the default


def test_i16_1_an_unknown_currency_is_a_problem_and_never_guessed() -> None:
    assert currency_problem({"amount": 1, "currency": "XYZ"})
    assert currency_problem({"amount": 1, "currency": "eur"})  # ISO 4217 codes are upper case
    assert currency_problem({"amount": 1, "currency": "EUR"}) is None
    assert currency_problem({"amount": 3, "channel": "ops"}) is None  # moves no money
    assert currency_problem({"to": "a@b.test"}) is None
    with pytest.raises(ValueError):
        exponent("XYZ")  # Babel alone would answer 2
    # a stored value from before the rule renders, without a guess
    assert format_plain(1234, "XYZ") == "1234 minor units of XYZ"
    assert money_json(1234, "XYZ") is None


def test_i16_1_money_json_carries_the_exponent_and_the_exact_decimal() -> None:
    assert money_json(125_000, "JPY") == {
        "amount_minor": 125_000,
        "currency": "JPY",
        "exponent": 0,
        "decimal": "125000",
    }
    assert money_json(1234, "KWD") == {
        "amount_minor": 1234,
        "currency": "KWD",
        "exponent": 3,
        "decimal": "1.234",
    }
    assert money_json(None, None) is None


@pytest.mark.parametrize(
    ("header", "locale"),
    [
        ("de-DE,de;q=0.9,en;q=0.5", "de_DE"),
        ("de", "de_DE"),
        ("fr-CH, fr;q=0.9", "fr_FR"),
        ("en;q=0.2, de;q=0.8", "de_DE"),
        ("pt-BR", "en_US"),  # not offered: the first offered
        ("", "en_US"),
        ("*", "en_US"),
        ("de;q=abc", "en_US"),  # malformed: ignored
    ],
)
def test_i16_1_accept_language_is_negotiated_against_the_offered_locales(header: str, locale: str) -> None:
    assert negotiate_locale(header, ["en_US", "de_DE", "fr_FR"]) == locale


@pytest.mark.parametrize(
    ("minor", "currency", "summary"),
    [
        (125_000, "JPY", "Charge 125,000 JPY to cus_42"),
        (4990, "EUR", "Charge 49.90 EUR to cus_42"),
        (1234, "KWD", "Charge 1.234 KWD to cus_42"),
    ],
)
def test_i16_1_the_adapter_preview_summary_is_right_for_every_exponent(
    minor: int, currency: str, summary: str
) -> None:
    preview = SandboxPaymentsAdapter().preview(
        "payments.charge", {"amount": minor, "currency": currency, "customer": "cus_42"}
    )
    assert preview.summary == summary
    refund = SandboxPaymentsAdapter().preview(
        "payments.refund", {"amount": minor, "currency": currency, "charge": "ch_1"}
    )
    assert refund.summary == f"Refund {summary.split(' ')[1]} {currency} of charge ch_1"


def test_i37_console_a_list_of_amounts_looks_each_locale_up_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # given: Babel's lookup of a locale by its name, counted (with the pattern parsed from it,
    # it was more than half of each amount's cost; a console list formats hundreds)
    from babel import Locale

    looked_up: list[str] = []
    parse = Locale.parse.__func__  # type: ignore[attr-defined]

    def counting(cls: type[Locale], identifier: object, *args: object, **kwargs: object) -> Locale:
        if isinstance(identifier, str):
            looked_up.append(identifier)
        return parse(cls, identifier, *args, **kwargs)

    monkeypatch.setattr(Locale, "parse", classmethod(counting))
    # when: 200 amounts in two locales (one not cached yet), and one Babel does not know
    texts = [format_money(4990 + n, "EUR", "en_US") for n in range(100)]
    texts += [format_money(4990 + n, "EUR", "sv_SE") for n in range(100)]
    unknown = format_money(4990, "EUR", "xx_YY")
    # then: each locale looked up at most once, the amounts as before
    assert len(looked_up) <= 4, looked_up  # sv_SE, xx_YY and en_US its fallback (en_US may be cached)
    assert texts[0] == "49.90 EUR" and texts[100] == "49,90 EUR" and unknown == "49.90 EUR"
