"""What a request must pass before it is hashed, whether it is submitted
(``operations.services.submission``) or only previewed (``operations.services.preview``): the
action, version and arguments are served and valid, every value can be stored faithfully, and
the reference the intent will carry.
"""

from __future__ import annotations

from typing import Any

from operations.adapters.errors import ArgumentsInvalid
from operations.adapters.registry import ActionUnavailable, UnknownAction, get_adapter
from operations.exceptions import ValidationFailed
from operations.idempotency import storage_problems
from operations.models import Intent

REFERENCE_MAX_LENGTH = Intent._meta.get_field("reference").max_length or 200


def check_storable(**values: Any) -> None:
    """Refuse what cannot be stored; the arguments must also come back from ``jsonb`` with the
    same canonical form (``storage_problems(hashed=True)``: numbers within ±(2^53−1)).

    Raises:
        ValidationFailed: a value cannot be stored faithfully (``errors`` lists each problem).
    """
    problems = [
        p
        for name, value in values.items()
        for p in storage_problems(value, field=name, hashed=name == "arguments")
    ]
    if problems:
        detail = "; ".join(f"{p['field']}: {p['message']}" for p in problems)
        raise ValidationFailed(f"the request cannot be stored: {detail}", errors=problems)


def business_reference(reference: str, arguments: Any) -> str:
    """The reference stored on the intent: the request's, else the one in its arguments (so an
    intent whose reference travels only in its arguments can still be searched).

    Raises:
        ValidationFailed: ``arguments["reference"]`` is longer than the stored reference can be.
    """
    in_arguments = arguments.get("reference") if isinstance(arguments, dict) else None
    if not isinstance(in_arguments, str) or not in_arguments:
        return reference
    if len(in_arguments) > REFERENCE_MAX_LENGTH:
        raise ValidationFailed(
            f"arguments.reference is longer than {REFERENCE_MAX_LENGTH} characters",
            errors=[
                {"field": "arguments.reference", "message": f"at most {REFERENCE_MAX_LENGTH} characters"}
            ],
        )
    return reference or in_arguments


def validate_request(action: str, action_version: int, arguments: Any) -> None:
    """Check the request against what is served: the action exists and is available here, the
    version is one its adapter serves, and the arguments are a JSON object its schema accepts.

    Raises:
        ValidationFailed: unknown or unavailable action, unsupported version, or arguments
            failing the schema (``errors`` lists the fields, as the adapter reports them).
    """
    try:
        adapter = get_adapter(action)
    except UnknownAction as exc:
        raise ValidationFailed(str(exc), known_actions=exc.known) from exc
    except ActionUnavailable as exc:
        raise ValidationFailed(str(exc)) from exc
    # The versions served come from the adapter (issue 21, item 7), not from a constant.
    served = adapter.versions_for(action)
    if action_version not in served:
        raise ValidationFailed(
            f"{action} has no version {action_version}; supported: {list(served)}",
            errors=[{"field": "action_version", "message": "unsupported version"}],
        )
    if not isinstance(arguments, dict):
        raise ValidationFailed(
            "arguments must be a JSON object", errors=[{"field": "arguments", "message": "not an object"}]
        )
    try:
        adapter.validate(action, arguments, version=action_version)
    except ArgumentsInvalid as exc:
        raise ValidationFailed(
            f"arguments do not match the {action} schema: {exc}", errors=exc.errors
        ) from exc
