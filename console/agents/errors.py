"""The errors the agents' API client (``console.agents.client``) raises: an RFC 9457 problem the
API answered (``ProblemError``), or a server that could not be reached (``LedgerUnreachable``).

Like the client, it imports nothing of Django or of the ledger (only httpx).
"""

from __future__ import annotations

from typing import Any

import httpx


class EffectLedgerError(Exception):
    """Base of the errors this client raises."""


class LedgerUnreachable(EffectLedgerError):
    """The API could not be reached or did not answer in time (a transport error). Sending the
    same call again is safe: a submission with the same idempotency key makes no second intent."""


class ProblemError(EffectLedgerError):
    """The API refused the request with an RFC 9457 problem (``application/problem+json``).

    ``status`` (HTTP status), ``type`` (tag URI), ``title``, ``detail`` and ``code`` (the last
    segment of ``type``) are the problem's members (RFC 9457 section 3.1); ``errors`` the failing
    fields of a 422 (``[{"field": "arguments.amount", "message": ...}]``); ``body`` the whole
    problem with its extension members (``allowed_actions``, ``intent_id``, ...).
    """

    def __init__(
        self,
        *,
        status: int,
        type: str,
        title: str,
        detail: str,
        code: str = "",
        errors: list[dict[str, str]] | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{status} {title}: {detail}")
        self.status = status
        self.type = type
        self.title = title
        self.detail = detail
        self.code = code
        self.errors = errors or []
        self.body = body or {}

    @classmethod
    def from_response(cls, response: httpx.Response) -> ProblemError:
        """The problem an error response carries; a body that is not a problem (a proxy's HTML
        page) still gives a ``ProblemError`` with the status and the start of the text."""
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return cls(
                status=response.status_code,
                type="about:blank",
                title=response.reason_phrase or "HTTP error",
                detail=response.text[:500],
            )
        errors = body.get("errors")
        return cls(
            status=int(body.get("status") or response.status_code),
            type=str(body.get("type") or "about:blank"),
            title=str(body.get("title") or response.reason_phrase),
            detail=str(body.get("detail") or ""),
            code=str(body.get("code") or ""),
            errors=errors if isinstance(errors, list) else None,
            body=body,
        )
