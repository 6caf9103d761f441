"""JSON Schema validation of intent arguments, with field-level errors."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from jsonschema import Draft202012Validator

from operations.adapters.base import ArgumentsInvalid


@cache
def _validator(schema_text: str) -> Draft202012Validator:
    """A compiled validator per schema (building one per request is wasted work)."""
    return Draft202012Validator(json.loads(schema_text))


def validate_arguments(schema: dict[str, Any], arguments: Any, *, money_fields: tuple[str, ...] = ()) -> None:
    """Validate ``arguments`` against ``schema`` (JSON Schema draft 2020-12).

    Money fields must be integers in minor units: a float there is refused even when it is
    integral (``4990.0``), because binary floats cannot carry money exactly.

    Raises:
        ArgumentsInvalid: with one ``{"field", "message"}`` per failure, sorted by field.
    """
    errors: list[dict[str, str]] = []
    if isinstance(arguments, dict):
        for name in money_fields:
            if isinstance(arguments.get(name), float):
                errors.append({"field": name, "message": "money must be an integer in minor units (cents)"})
    validator = _validator(json.dumps(schema, sort_keys=True))
    for error in validator.iter_errors(arguments):
        path = ".".join(str(p) for p in error.absolute_path) or "arguments"
        if any(e["field"] == path for e in errors):
            continue
        errors.append({"field": path, "message": error.message[:300]})
    if errors:
        raise ArgumentsInvalid(sorted(errors, key=lambda e: e["field"]))
