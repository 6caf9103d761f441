"""What a sandbox route returns, its error shape, and small body validators.

Errors carry both Stripe's shape (``{"error": {"code", "message"}}``, what clients branch on)
and RFC 9457 problem fields (``type``, ``title``, ``status``, ``detail``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any


@dataclass
class Reply:
    """An HTTP answer: status code, JSON body, extra headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def error_body(status: int, code: str, message: str, **extra: Any) -> dict[str, Any]:
    """Return the error JSON, e.g. ``{"error": {"code": "card_declined", ...}, "status": 402, ...}``."""
    return {
        "type": f"https://sandbox.effect-ledger.local/errors/{code}",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": message,
        "error": {"code": code, "message": message, **extra},
    }


def error_reply(status: int, code: str, message: str, **extra: Any) -> Reply:
    """Return an error ``Reply`` (see ``error_body``)."""
    return Reply(status, error_body(status, code, message, **extra))


class BadRequest(Exception):
    """The request is malformed (bad JSON, a missing or mistyped field, a missing header): 400."""

    def __init__(self, message: str, *, param: str | None = None, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def reply(self) -> Reply:
        """The 400 answer for this error."""
        extra = {"param": self.param} if self.param else {}
        return error_reply(400, self.code, self.message, **extra)


@dataclass
class RequestContext:
    """What a product route gets besides its body.

    Attributes:
        headers: the request headers, names lower-cased.
        before_apply: called right before the effect is applied (after key checks); the
            ``delay_after_effect`` fault sleeps here.
        emit: ``emit(conn, [(type, data), ...])`` records the effect's events on ``conn``, inside
            the transaction that applies the effect (``events.record``; a no-op by default).
    """

    headers: dict[str, str]
    before_apply: Callable[[], None] = lambda: None
    emit: Callable[[Any, list[tuple[str, dict[str, Any]]]], None] = lambda conn, emitted: None


def _type_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "integer", str: "string", dict: "object", float: "number", bool: "boolean"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def field_of(body: dict[str, Any], name: str, kind: type, *, required: bool = True) -> Any:
    """Return ``body[name]`` checked against ``kind`` (``bool`` is never an ``int`` here).

    Raises:
        BadRequest: the field is missing (when required) or of another type.
    """
    if name not in body or body[name] is None:
        if required:
            raise BadRequest(f"missing required field {name!r}", param=name)
        return None
    value = body[name]
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise BadRequest(f"field {name!r} must be a {_type_name(kind)}", param=name)
    return value


def positive_int(body: dict[str, Any], name: str) -> int:
    """Return ``body[name]`` as a positive integer (minor units for money).

    Raises:
        BadRequest: missing, not an integer, or not above zero.
    """
    value: int = field_of(body, name, int)
    if value <= 0:
        raise BadRequest(f"field {name!r} must be above zero", param=name)
    return value


def only_fields(body: dict[str, Any], allowed: set[str]) -> None:
    """Refuse unknown fields, like Stripe does.

    Raises:
        BadRequest: naming the first unknown field.
    """
    for name in sorted(body):
        if name not in allowed:
            raise BadRequest(f"unknown field {name!r}", param=name, code="parameter_unknown")
