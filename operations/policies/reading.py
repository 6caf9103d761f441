"""Reading one configured policy: the strict reader of ``EFFECT_LEDGER_POLICIES[action]``
and of a stored snapshot (``operations.policies.rules``), and the error that names the action
and the field when a value is wrong.

Every field is checked for its type and range here, once, so ``Policy`` and its sections
build from values already known good.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from operations.idempotency import MAX_SAFE_NUMBER
from operations.money import iso_4217_codes

#: In a policy snapshot written before issue 18, an amount rule without a currency: it applied
#: to the amount whatever its currency (never accepted in configuration).
ANY_CURRENCY = "*"

#: The longest time any policy field may name, in seconds (ten years of 366 days): every one of
#: them becomes a PostgreSQL interval or a ``timedelta`` added to the database clock, and a
#: value near ``MAX_SAFE_NUMBER`` overflows both (a submission answered 500 instead of a
#: refusal at start).
MAX_POLICY_SECONDS = 10 * 366 * 86_400


class PolicyError(ValueError):
    """A policy is malformed; ``action`` and ``field`` (dotted, e.g. ``retry.max_attempts``) name it."""

    def __init__(self, *, action: str, field: str, problem: str) -> None:
        super().__init__(f"policy for {action}: {field} {problem}")
        self.action = action
        self.field = field


class PolicyReader:
    """Reads one section of a policy mapping, checking each value's type and range.

    ``strict`` (configuration) refuses keys the policy does not have; a snapshot (not strict)
    ignores them, and a key missing from either keeps the field's default.
    """

    def __init__(self, values: Any, *, action: str, prefix: str, strict: bool) -> None:
        if not isinstance(values, Mapping):
            raise PolicyError(
                action=action, field=prefix.rstrip(".") or "policy", problem="must be a mapping"
            )
        self.values = values
        self.action = action
        self.prefix = prefix
        self.strict = strict

    def error(self, name: str, problem: str) -> PolicyError:
        return PolicyError(action=self.action, field=self.prefix + name, problem=problem)

    def check_keys(self, known: Any) -> None:
        names = {f.name for f in dataclasses.fields(known)}
        unknown = sorted(str(key) for key in self.values if key not in names)
        if self.strict and unknown:
            raise self.error(unknown[0], f"is not a policy field (known: {', '.join(sorted(names))})")

    def section(self, name: str) -> PolicyReader:
        return PolicyReader(
            self.values.get(name, {}), action=self.action, prefix=f"{self.prefix}{name}.", strict=self.strict
        )

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.values.get(name, default)
        if value not in choices:
            raise self.error(name, f"must be one of {', '.join(choices)} (got {value!r})")
        return str(value)

    def text(self, name: str, default: str) -> str:
        value = self.values.get(name, default)
        if not isinstance(value, str) or not value:
            raise self.error(name, f"must be a non-empty string (got {value!r})")
        return value

    def names(self, name: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = self.values.get(name, default)
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v for v in value):
            raise self.error(name, f"must be a list of argument names (got {value!r})")
        return tuple(value)

    def flag(self, name: str, default: bool) -> bool:
        value = self.values.get(name, default)
        if not isinstance(value, bool):
            raise self.error(name, f"must be true or false (got {value!r})")
        return value

    def integer(self, name: str, default: int, *, minimum: int = 0, maximum: int = MAX_SAFE_NUMBER) -> int:
        return self._integer(name, self.values.get(name, default), minimum=minimum, maximum=maximum)

    def optional_integer(
        self, name: str, default: int | None, *, maximum: int = MAX_SAFE_NUMBER
    ) -> int | None:
        value = self.values.get(name, default)
        return None if value is None else self._integer(name, value, minimum=0, maximum=maximum)

    def seconds(self, name: str, default: float) -> float:
        return self._seconds(name, self.values.get(name, default))

    def amounts_by_currency(self, name: str) -> dict[str, int] | None:
        """A mapping of ISO 4217 codes (Babel's list) to amounts in that currency's minor units.

        A bare number is refused in configuration: 10,000 minor units is 100 EUR, 10,000 JPY
        (about 60 EUR) or 10 KWD (about 28 EUR), so an amount means nothing without its currency.
        In a snapshot written before currencies were named, a bare number is kept under
        ``ANY_CURRENCY`` (the rule those intents were submitted under).
        """
        value = self.values.get(name)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            if not self.strict and not isinstance(value, bool) and isinstance(value, int):
                return {ANY_CURRENCY: self._integer(name, value, minimum=0)}
            raise self.error(
                name,
                f'must map ISO 4217 currency codes to minor units, e.g. {{"EUR": 10000}} (got {value!r})',
            )
        amounts: dict[str, int] = {}
        for code, amount in value.items():
            if not (
                isinstance(code, str)
                and (code in iso_4217_codes() or (code == ANY_CURRENCY and not self.strict))
            ):
                raise self.error(f"{name}.{code}", "is not an ISO 4217 currency code")
            amounts[code] = self._integer(f"{name}.{code}", amount, minimum=0)
        return amounts

    def optional_seconds(self, name: str, default: float | None) -> float | None:
        value = self.values.get(name, default)
        return None if value is None else self._seconds(name, value)

    # Every number of a policy is at most 2^53 - 1 (and finite): the snapshot stored with each
    # intent goes through PostgreSQL jsonb and is sealed in RFC 8785 canonical JSON, which has
    # no exact form for larger numbers (RFC 7493 §2.2; ``idempotency.number_problem``).

    def _integer(self, name: str, value: Any, *, minimum: int, maximum: int = MAX_SAFE_NUMBER) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
            raise self.error(name, f"must be an integer from {minimum} to {maximum} (got {value!r})")
        return int(value)

    def _seconds(self, name: str, value: Any) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not 0 <= value <= MAX_POLICY_SECONDS
        ):
            raise self.error(
                name, f"must be a number of seconds from 0 to {MAX_POLICY_SECONDS} (got {value!r})"
            )
        return float(value)
