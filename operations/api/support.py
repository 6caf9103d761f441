"""HTTP plumbing of the API: a strict JSON parser and RFC 9457 problem details for every error."""

from __future__ import annotations

import logging
import math
from typing import Any

from django.conf import settings
from django.http import Http404, HttpRequest, JsonResponse
from rest_framework import exceptions, status
from rest_framework.parsers import BaseParser
from rest_framework.response import Response

from operations.exceptions import LedgerError
from operations.strict_json import DuplicateMemberName, loads_strict
from operations.workers.delivery import DATABASE_RETRY_AFTER_SECONDS, database_unavailable

logger = logging.getLogger(__name__)

PROBLEM_CONTENT_TYPE = "application/problem+json"


class PayloadTooLarge(exceptions.APIException):
    """The request body exceeds ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (64 KiB)."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "the request body is larger than 64 KiB"
    default_code = "payload-too-large"


class StrictJSONParser(BaseParser):
    """Parse ``application/json`` strictly: UTF-8 only, no NaN/Infinity, no member name twice in
    one object, a size limit, and any malformed input answered with 400 (never 500)
    (``operations.strict_json.loads_strict``)."""

    media_type = "application/json"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        request = (parser_context or {}).get("request")
        declared = request.META.get("CONTENT_LENGTH") if request is not None else None
        if declared and declared.isdigit() and int(declared) > limit:
            raise PayloadTooLarge()
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise PayloadTooLarge()
        try:
            return loads_strict(raw)
        except UnicodeDecodeError as exc:
            raise exceptions.ParseError(f"the body is not valid UTF-8 (byte {exc.start})") from exc
        except RecursionError as exc:
            raise exceptions.ParseError("the JSON is nested too deeply") from exc
        except DuplicateMemberName as exc:
            raise exceptions.ParseError(f"not I-JSON: {exc}") from exc
        except ValueError as exc:
            raise exceptions.ParseError(f"malformed JSON: {exc}") from exc


def problem(status_code: int, title: str, detail: str, code: str, **extra: Any) -> dict[str, Any]:
    """An RFC 9457 problem object. ``type`` is a tag URI (RFC 9457 section 3.1.1 allows
    non-resolvable identifiers); ``code`` repeats its last segment for clients."""
    return {
        "type": f"tag:effect-ledger,2026:problems/{code}",
        "title": title,
        "status": status_code,
        "detail": detail,
        "code": code,
        **extra,
    }


def _flatten(errors: Any, prefix: str = "") -> list[dict[str, str]]:
    if isinstance(errors, dict):
        items: list[dict[str, str]] = []
        for key, value in errors.items():
            field = f"{prefix}.{key}" if prefix else str(key)
            items.extend(_flatten(value, field))
        return items
    if isinstance(errors, list):
        if all(isinstance(e, str) for e in errors):
            return [{"field": prefix or "body", "message": str(e)} for e in errors]
        items = []
        for index, value in enumerate(errors):
            items.extend(_flatten(value, f"{prefix}.{index}" if prefix else str(index)))
        return items
    return [{"field": prefix or "body", "message": str(errors)}]


def problem_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF exception handler: every error becomes ``application/problem+json``.

    An unreachable database (also from authentication, which DRF runs inside the view) is a
    503 with ``Retry-After``, not a 500: the request can be sent again unchanged.
    """
    headers: dict[str, str] = {}
    if isinstance(exc, LedgerError):
        body = problem(exc.status, exc.title, exc.detail, exc.code, **exc.extra)
        code = exc.status
    elif isinstance(exc, exceptions.ValidationError):
        errors = _flatten(exc.detail)
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        body = problem(422, "Invalid request", detail, "validation-failed", errors=errors)
        code = 422
    elif isinstance(exc, exceptions.Throttled):
        # RFC 6585 section 4; Retry-After in whole seconds, at least 1 (RFC 9110 section 10.2.3).
        wait = max(1, math.ceil(getattr(exc, "wait", None) or 1))  # DRF sets it; the stubs omit it
        code = 429
        body = problem(
            429,
            "Too many requests",
            f"over the API's rate limit for this agent or its tenant; retry in {wait} s",
            "rate-limited",
        )
        headers["Retry-After"] = str(wait)
    elif isinstance(exc, exceptions.APIException):
        code = exc.status_code
        slug = str(getattr(exc, "default_code", "error")).replace("_", "-")
        body = problem(code, slug.replace("-", " ").capitalize(), str(exc.detail), slug)
        if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
            headers["WWW-Authenticate"] = 'Bearer realm="effect-ledger"'
            code = body["status"] = 401
    elif isinstance(exc, Http404):
        code = 404
        body = problem(404, "Not found", "no such resource in your tenant", "not-found")
    elif database_unavailable(exc):
        code = 503
        body = database_unavailable_problem()
        headers["Retry-After"] = str(DATABASE_RETRY_AFTER_SECONDS)
    else:
        return None
    return Response(body, status=code, headers=headers, content_type=PROBLEM_CONTENT_TYPE)


def database_unavailable_problem() -> dict[str, Any]:
    """The 503 problem answered while the database is unreachable (RFC 9457; RFC 9110
    section 15.6.4: the condition is temporary, and ``Retry-After`` says when to try again)."""
    return problem(
        503,
        "Service unavailable",
        f"the database is unreachable; nothing was stored; retry in {DATABASE_RETRY_AFTER_SECONDS} s",
        "database-unavailable",
    )


def api_database_unavailable(request: HttpRequest) -> JsonResponse:
    """503 problem details with ``Retry-After`` (seconds), for errors raised outside DRF's views."""
    response = JsonResponse(database_unavailable_problem(), status=503, content_type=PROBLEM_CONTENT_TYPE)
    response["Retry-After"] = str(DATABASE_RETRY_AFTER_SECONDS)
    return response


def api_not_found(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    """404 for unknown ``/api/`` URLs, as problem details."""
    return JsonResponse(
        problem(404, "Not found", f"no such endpoint: {request.path}", "not-found"),
        status=404,
        content_type=PROBLEM_CONTENT_TYPE,
    )


def api_server_error(request: HttpRequest) -> JsonResponse:
    """500 as problem details (the error itself is logged, never shown)."""
    return JsonResponse(
        problem(500, "Internal error", "an unexpected error occurred; it has been logged", "internal-error"),
        status=500,
        content_type=PROBLEM_CONTENT_TYPE,
    )
