"""JSON Schema validation of intent arguments, with field-level errors."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from typing import Any

from jsonschema import Draft202012Validator, ValidationError, validators
from jsonschema.protocols import Validator

from operations.adapters.errors import ArgumentsInvalid
from operations.money import currency_problem


def ecma_pattern(pattern: str) -> str:
    """``pattern`` with each ``$`` anchor (outside a character class, unescaped) written as
    ``\\Z``: JSON Schema patterns are ECMA-262 regular expressions (JSON Schema 2020-12
    validation, section 6.3.3), where ``$`` matches only at the end of the input, whereas
    Python's ``$`` also matches before a final newline (so ``^[A-Z]{3}$`` let ``"EUR\\n"`` through)."""
    out: list[str] = []
    escaped = in_class = False
    for char in pattern:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "[" and not in_class:
            in_class = True
        elif char == "]" and in_class:
            in_class = False
        elif char == "$" and not in_class:
            out.append("\\Z")
            continue
        out.append(char)
    return "".join(out)


def _pattern(validator: Validator, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not re.search(ecma_pattern(pattern), instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _is_integer(checker: Any, instance: Any) -> bool:
    # JSON Schema counts 2.0 as an integer; a provider reading the JSON does not: only ints.
    return isinstance(instance, int) and not isinstance(instance, bool)


#: Draft 2020-12 with ECMA-262 anchors, integers that are integers, and formats checked
#: (``date-time`` by RFC 3339, through the ``rfc3339-validator`` package).
StrictValidator = validators.extend(
    Draft202012Validator,
    validators={"pattern": _pattern},
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


@cache
def _validator(schema_text: str) -> Validator:
    """A compiled validator per schema (building one per request is wasted work)."""
    return StrictValidator(json.loads(schema_text), format_checker=Draft202012Validator.FORMAT_CHECKER)


def validate_arguments(schema: dict[str, Any], arguments: Any, *, money_fields: tuple[str, ...] = ()) -> None:
    """Validate ``arguments`` against ``schema`` (JSON Schema draft 2020-12, strictly:
    ``StrictValidator``).

    Money fields must be integers in minor units: a float there is refused even when it is
    integral (``4990.0``), because binary floats cannot carry money exactly. Arguments with an
    ``amount`` and a ``currency`` must give integer minor units in a currency legal tender today
    (``operations.money.currency_problem``: its exponent says what the amount means), for every
    action, whatever its schema says.

    Raises:
        ArgumentsInvalid: with one ``{"field", "message"}`` per failure, sorted by field.
    """
    errors: list[dict[str, str]] = []
    if isinstance(arguments, dict):
        for name in money_fields:
            if isinstance(arguments.get(name), float):
                errors.append({"field": name, "message": "money must be an integer in minor units (cents)"})
        problem = currency_problem(arguments)
        if problem and not any(e["field"] == problem[0] for e in errors):
            errors.append({"field": problem[0], "message": problem[1]})
    validator = _validator(json.dumps(schema, sort_keys=True))
    for error in validator.iter_errors(arguments):
        path = ".".join(str(p) for p in error.absolute_path) or "arguments"
        if any(e["field"] == path for e in errors):
            continue
        errors.append({"field": path, "message": error.message[:300]})
    if errors:
        raise ArgumentsInvalid(sorted(errors, key=lambda e: e["field"]))
