"""Project middleware: an unreachable database is a 503, never a 500; the API is https-only when
HTTPS is on."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.cache import add_never_cache_headers

from operations.api.support import PROBLEM_CONTENT_TYPE, api_database_unavailable, problem
from operations.money import negotiate_locale, use_locale
from operations.workers.delivery import DATABASE_RETRY_AFTER_SECONDS, database_unavailable

logger = logging.getLogger(__name__)

_PAGE = (
    "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>Service unavailable</title></head>"
    "<body><h1>Service unavailable</h1><p>The database cannot be reached. Nothing was changed. "
    "Try again in {seconds} seconds.</p></body></html>"
)


def database_unavailable_response(request: HttpRequest) -> HttpResponse:
    """503 with ``Retry-After`` (seconds): problem details under ``/api/``, a plain page elsewhere."""
    logger.warning("database unreachable; answered 503", extra={"path": request.path})
    if request.path.startswith("/api/"):
        return api_database_unavailable(request)
    response = HttpResponse(_PAGE.format(seconds=DATABASE_RETRY_AFTER_SECONDS), status=503)
    response["Retry-After"] = str(DATABASE_RETRY_AFTER_SECONDS)
    return response


class DatabaseUnavailableMiddleware:
    """Turn a view's ``OperationalError`` / ``InterfaceError`` for an unreachable database
    (``operations.workers.delivery.database_unavailable``) into a 503 with ``Retry-After``.

    Errors raised in other middleware (a session saved on the way out) never reach
    ``process_exception``; ``console.urls.handler500`` answers those the same way.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if database_unavailable(exception):
            return database_unavailable_response(request)
        return None


class HttpsRequiredForApi:
    """With ``EFFECT_LEDGER_HTTPS`` on (``SECURE_SSL_REDIRECT``), a plain-http request to
    ``/api/`` is answered 403 ``https-required`` (problem details), not redirected: a 301 or 302
    turns a client's POST into a GET to the new URL and drops its body, so an agent would see a
    success page for a submit that never happened. (The token has crossed the network in clear
    by then either way: rotate it.)"""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if settings.SECURE_SSL_REDIRECT and request.path.startswith("/api/") and not request.is_secure():
            return JsonResponse(
                problem(
                    403,
                    "HTTPS required",
                    f"this server takes API requests over https only: use https://{request.get_host()}"
                    f"{request.get_full_path()}; nothing was done",
                    "https-required",
                ),
                status=403,
                content_type=PROBLEM_CONTENT_TYPE,
            )
        return self.get_response(request)


class SignedInPagesNotStored:
    """Every answer to a signed-in operator (a page, an htmx partial, a download, a redirect)
    carries ``Cache-Control: max-age=0, no-cache, no-store, must-revalidate, private``
    (``django.utils.cache.add_never_cache_headers``): pages show payloads, hashes and decisions,
    and ``no-store`` (RFC 9111 section 5.2.2.5) keeps them out of a shared cache and out of the
    browser's back-button history after sign-out. API answers are not touched here: they are
    requested with an ``Authorization`` header, which a shared cache must not answer from
    (RFC 9111 section 3.5). Answers to anonymous visitors (the sign-in page, static files) keep
    their own caching."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            add_never_cache_headers(response)
        return response


class MoneyLocaleMiddleware:
    """Show money in the operator's locale for the whole request (its page or partial): the
    request's ``Accept-Language`` negotiated by Babel against ``settings.EFFECT_LEDGER_MONEY_LOCALES``
    (the first one when none matches; ``operations.money.negotiate_locale``). Only money
    follows it: the console's words stay English, Django's LocaleMiddleware is not used."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        offered = list(getattr(settings, "EFFECT_LEDGER_MONEY_LOCALES", []) or [])
        with use_locale(negotiate_locale(request.headers.get("Accept-Language", ""), offered)):
            return self.get_response(request)
