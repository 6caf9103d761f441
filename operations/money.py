"""Money for people and for the API: integer minor units of an ISO 4217 currency, converted by
that currency's exponent and formatted by Babel (CLDR), never by a table of our own.

Every amount an intent moves is ``arguments["amount"]`` (an integer in minor units) with
``arguments["currency"]`` (an upper-case ISO 4217 code). The exponent of the code (ISO 4217's
"minor unit": 0 for JPY, 2 for EUR, 3 for KWD) says how many minor units make one major unit,
so ``125000 JPY`` is 125,000 yen while ``4990 EUR`` is 49.90 euros and ``1234 KWD`` 1.234 dinars.

Three renderings, one rule:

* ``decimal_string``: the exact decimal, for the API (``"125000"``, ``"49.90"``, ``"1.234"``).
* ``format_plain``: a locale-free sentence form, stored in previews and audit reasons
  (``"125,000 JPY"``, ``"49.90 EUR"``, ``"1.234 KWD"``): the same text whoever reads it.
* ``format_money``: the same shape in the operator's locale (``"49.90 EUR"`` in en_US,
  ``"49,90 EUR"`` in de_DE, ``"125.000 JPY"``), for the console. The locale is ``current_locale()``: what ``use_locale`` set for this request
  (the console negotiates it from the request's ``Accept-Language`` against
  ``settings.EFFECT_LEDGER_MONEY_LOCALES``; ``negotiate_locale``), else ``DEFAULT_LOCALE``.

A currency Babel does not know (``"XYZ"``, lower-case ``"eur"``) is refused at submission and
preview (``currency_problem``, called by the arguments' validation), so nothing stored needs a
guess; the formatting functions still render such a stored value without raising (the code and
the raw minor units), since a page must never fail on old data.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from babel import Locale, UnknownLocaleError
from babel.core import get_global
from babel.numbers import (
    NumberPattern,
    format_currency,
    get_currency_precision,
    get_territory_currencies,
    list_currencies,
    parse_pattern,
)

#: The locale money is shown in when the request names none we offer.
DEFAULT_LOCALE = "en_US"

_locale: contextvars.ContextVar[str] = contextvars.ContextVar("money_locale", default=DEFAULT_LOCALE)


@functools.cache
def iso_4217_codes() -> frozenset[str]:
    """The ISO 4217 currency codes Babel (CLDR) knows, upper case (e.g. ``EUR``, ``JPY``, ``KWD``)."""
    return frozenset(list_currencies())


def is_currency(code: Any) -> bool:
    """Whether ``code`` is an ISO 4217 code Babel knows, exactly as written (``"eur"`` is not)."""
    return isinstance(code, str) and code in iso_4217_codes()


@functools.cache
def tender_codes() -> frozenset[str]:
    """The currencies legal tender somewhere today, by CLDR's territory data in Babel
    (``get_territory_currencies(..., tender=True)``): EUR, JPY, KWD, XAF… but not the codes ISO
    4217 gives no minor unit (XAU gold, XDR, XTS for tests, XXX for "no currency"), funds codes
    (CLF) or withdrawn currencies (DEM, VEF, HRK), for which Babel would guess 2 decimals. Read
    once per process (a currency withdrawn while a process runs stays accepted until restart)."""
    today = datetime.now(UTC).date()
    codes: set[str] = set()
    for territory in get_global("territory_currencies"):
        codes.update(get_territory_currencies(territory, today, tender=True))
    return frozenset(codes)


def is_accepted_currency(code: Any) -> bool:
    """Whether an intent may move money in ``code``: upper case and legal tender today
    (``tender_codes``). Stored intents in other codes still render (``is_currency``)."""
    return isinstance(code, str) and code in tender_codes()


@dataclass(frozen=True)
class Money:
    """An amount in integer minor units of an ISO 4217 currency (``arguments["amount"]`` and
    ``arguments["currency"]``, the shape every money-moving action here uses)."""

    amount_minor: int
    currency: str

    @classmethod
    def of(cls, arguments: Any) -> Money | None:
        """The money an intent's arguments move, or None when they name no integer amount and
        currency (an email, a reservation)."""
        if not isinstance(arguments, Mapping):
            return None
        amount, currency = arguments.get("amount"), arguments.get("currency")
        if isinstance(amount, bool) or not isinstance(amount, int) or not isinstance(currency, str):
            return None
        return cls(amount, currency)


def currency_problem(arguments: Any) -> tuple[str, str] | None:
    """Why the money in ``arguments`` cannot be accepted, as ``(field, message)``, or None when it
    can (or moves no money).

    The one rule for every action (sandbox adapters and generic HTTP actions alike): arguments
    with both an ``amount`` and a ``currency`` move money; the amount must be an integer (minor
    units, not a bool) and the currency upper case and legal tender today
    (``is_accepted_currency``), because its ISO 4217 exponent decides what the amount means.
    """
    if not isinstance(arguments, Mapping) or "amount" not in arguments or "currency" not in arguments:
        return None
    money = Money.of(arguments)
    if money is None:
        # A currency beside an amount that is not integer minor units (a string, a float, a
        # bool, an object), or a currency that is not a string: refused, not read as "no money"
        # (the reviewer's generic-action bypass).
        if isinstance(arguments["currency"], str):
            return "amount", "with a currency, the amount must be an integer number of minor units (cents)"
        return "currency", "with an amount, the currency must be an ISO 4217 code such as EUR"
    if is_accepted_currency(money.currency):
        return None
    if is_currency(money.currency):
        return "currency", (
            f"{money.currency!r} is not a currency in use (a withdrawn currency, a metal, a fund or "
            "test code has no minor unit to read the amount by)"
        )
    return "currency", f"{money.currency!r} is not an ISO 4217 currency code (upper case, e.g. EUR, JPY, KWD)"


def exponent(currency: str) -> int:
    """The ISO 4217 exponent of ``currency`` (digits after the decimal point: JPY 0, EUR 2, KWD 3).

    Raises:
        ValueError: ``currency`` is not a code Babel knows (Babel itself would answer 2).
    """
    if not is_currency(currency):
        raise ValueError(f"{currency!r} is not an ISO 4217 currency code")
    return int(get_currency_precision(currency))


def to_decimal(amount_minor: int, currency: str) -> Decimal:
    """``(125000, "JPY") -> Decimal("125000")``, ``(4990, "EUR") -> Decimal("49.90")``: exact.

    Raises:
        ValueError: unknown currency (``exponent``).
    """
    return Decimal(amount_minor).scaleb(-exponent(currency))


def decimal_string(amount_minor: int, currency: str) -> str:
    """The amount as a plain decimal string with the currency's digits: ``"125000"``, ``"49.90"``,
    ``"1.234"``, ``"-0.01"`` (no grouping, ``.`` as the separator; for machines).

    Raises:
        ValueError: unknown currency (``exponent``).
    """
    digits = exponent(currency)
    return f"{to_decimal(amount_minor, currency):.{digits}f}"


def money_json(amount_minor: Any, currency: Any) -> dict[str, Any] | None:
    """The API's ``money`` object: ``(125000, "JPY") -> {"amount_minor": 125000, "currency": "JPY",
    "exponent": 0, "decimal": "125000"}``; None when there is no integer amount and currency (an
    action that moves no money) or the currency is one nobody can convert (submission and
    preview refuse it)."""
    money = Money.of({"amount": amount_minor, "currency": currency})
    if money is None or not is_currency(money.currency):
        return None
    return {
        "amount_minor": money.amount_minor,
        "currency": money.currency,
        "exponent": exponent(money.currency),
        "decimal": decimal_string(money.amount_minor, money.currency),
    }


def format_plain(amount_minor: int, currency: str) -> str:
    """Locale-free text for stored sentences: ``"125,000 JPY"``, ``"49.90 EUR"``, ``"1.234 KWD"``
    (``format_money`` in ``DEFAULT_LOCALE``, whatever the request's locale).

    An unknown currency (never accepted, but possibly stored long ago) gives ``"1234 minor units
    of XYZ"`` rather than a guess."""
    return format_money(amount_minor, currency, DEFAULT_LOCALE)


def format_money(amount_minor: int, currency: str, locale: str | None = None) -> str:
    """The amount for the operator: the number in ``locale``'s decimal pattern (its separators and
    grouping, CLDR) with exactly the currency's ISO 4217 digits, then the ISO code:
    en_US ``"125,000 JPY"``, ``"49.90 EUR"``, ``"1.234 KWD"``; de_DE ``"49,90 EUR"``,
    ``"125.000 JPY"``. ``locale`` defaults to ``current_locale()``.

    The code rather than the locale's symbol, on purpose: an approver must not wonder whether
    ``$`` is USD or CAD, or ``¥`` JPY or CNY, and the console reads the same as the stored
    previews and the API. An unknown currency gives ``"1234 minor units of XYZ"``.
    """
    if not is_currency(currency):
        return f"{amount_minor} minor units of {currency}"
    where, pattern = _money_pattern(locale or current_locale())
    return str(
        format_currency(
            to_decimal(amount_minor, currency), currency, format=pattern, locale=where, currency_digits=True
        )
    )


@functools.lru_cache(maxsize=64)
def _money_pattern(locale: str) -> tuple[Locale, NumberPattern]:
    """``locale`` parsed and its decimal pattern followed by the ISO code (``#,##0.### ¤¤`` in
    en_US), parsed once per locale: parsing both took more than half of each ``format_money``
    call, and a console list formats hundreds (issue 37). A locale Babel does not know (a
    misconfigured ``EFFECT_LEDGER_MONEY_LOCALES`` entry) gives ``DEFAULT_LOCALE``'s."""
    try:
        where = Locale.parse(locale)
    except (UnknownLocaleError, ValueError):
        where = Locale.parse(DEFAULT_LOCALE)
    return where, parse_pattern(f"{where.decimal_formats[None].pattern} ¤¤")


def current_locale() -> str:
    """The locale money is shown in now (``use_locale``), else ``DEFAULT_LOCALE``."""
    return _locale.get()


@contextmanager
def use_locale(locale: str) -> Iterator[None]:
    """Show money in ``locale`` (a Babel identifier, e.g. ``de_DE``) inside the ``with`` block."""
    token = _locale.set(locale)
    try:
        yield
    finally:
        _locale.reset(token)


def negotiate_locale(accept_language: str, offered: Sequence[str]) -> str:
    """The first of ``offered`` (Babel identifiers, e.g. ``["en_US", "de_DE"]``) that the
    ``Accept-Language`` header (RFC 9110, section 12.5.4) prefers, else ``offered[0]``, else
    ``DEFAULT_LOCALE``.

    Tags are tried by their ``q`` weight, each followed by its bare language (``fr-CH`` then
    ``fr``); Babel matches them (``Locale.negotiate``, case-insensitive, ``de`` -> ``de_DE``).
    A malformed header counts as none.
    """
    fallback = offered[0] if offered else DEFAULT_LOCALE
    preferred: list[str] = []
    weighted: list[tuple[float, int, str]] = []
    for position, part in enumerate(accept_language.split(",")[:20]):
        tag, _, params = part.strip().partition(";")
        weight = 1.0
        if params.strip().startswith("q="):
            try:
                weight = float(params.strip()[2:])
            except ValueError:
                continue
        if tag and tag != "*" and weight > 0:
            weighted.append((-weight, position, tag.strip().replace("-", "_")))
    for _, _, tag in sorted(weighted):
        preferred += [tag, tag.split("_")[0]]
    try:
        found = Locale.negotiate(preferred, list(offered)) if preferred else None
    except (UnknownLocaleError, ValueError):
        found = None
    return str(found) if found is not None else fallback
