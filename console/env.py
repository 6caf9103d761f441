"""Typed helpers that read settings from the environment (12-factor style).

Each helper reads ``os.environ`` unless given another mapping (``environ=``), so a function
that computes settings from variables, such as :func:`security_settings`, stays pure and
testable without touching the process environment.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def env_str(name: str, default: str = "", *, environ: Mapping[str, str] | None = None) -> str:
    """Return ``environ[name]`` or ``default`` when unset or empty."""
    return (os.environ if environ is None else environ).get(name) or default


def env_json_file(name: str, *, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The JSON object in the file the variable names (``{}`` when unset).

    Raises:
        ValueError: naming the variable and the file: it cannot be read, is not JSON (with the
            line and column), or is not an object.
    """
    path = (os.environ if environ is None else environ).get(name)
    if not path:
        return {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{name}={path} cannot be read: {exc.__class__.__name__}: {exc}") from exc
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{name}={path} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    if not isinstance(value, dict):
        raise ValueError(f"{name}={path} must hold a JSON object of action -> declaration")
    return value


def env_int(
    name: str, default: int, *, environ: Mapping[str, str] | None = None, minimum: int | None = None
) -> int:
    """Return the variable as an integer; raise ``ValueError`` naming it when malformed or
    below ``minimum``."""
    raw = (os.environ if environ is None else environ).get(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from exc
    if minimum is not None and value < minimum:
        raise ValueError(f"environment variable {name} must be at least {minimum}, got {value}")
    return value


def env_float(
    name: str, default: float, *, environ: Mapping[str, str] | None = None, minimum: float | None = None
) -> float:
    """Return the variable as a finite float; raise ``ValueError`` naming it when malformed, not
    finite (``nan``, ``inf``: no setting means "for ever" by it) or below ``minimum``."""
    raw = (os.environ if environ is None else environ).get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValueError(f"environment variable {name} must be a number, got {raw!r}") from exc
    if not math.isfinite(value):
        raise ValueError(f"environment variable {name} must be a finite number, got {raw!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"environment variable {name} must be at least {minimum:g}, got {value:g}")
    return value


#: The shortest period or heartbeat interval a setting may ask for (seconds): below it a beat
#: floods the broker (a statement period of 0 sent thousands of runs a second) or the database.
PERIOD_MINIMUM_SECONDS = 0.1


def env_period(name: str, default: float, *, environ: Mapping[str, str] | None = None) -> float:
    """A beat period or heartbeat interval in seconds: ``env_float`` with the floor
    ``PERIOD_MINIMUM_SECONDS`` (finite, at least 0.1 s; ``ValueError`` naming the variable)."""
    return env_float(name, default, environ=environ, minimum=PERIOD_MINIMUM_SECONDS)


def env_bool(name: str, default: bool, *, environ: Mapping[str, str] | None = None) -> bool:
    """Return the variable as a boolean (1/true/yes/on, case-insensitive)."""
    raw = (os.environ if environ is None else environ).get(name)
    if not raw:
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: list[str], *, environ: Mapping[str, str] | None = None) -> list[str]:
    """Return a comma-separated variable as a list of stripped, non-empty items."""
    raw = (os.environ if environ is None else environ).get(name)
    if not raw:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


HSTS_SECONDS = (
    365 * 24 * 3600
)  # one year: the max-age Django's deploy check and the HSTS preload list ask for
WORKING_DAY_SECONDS = 8 * 3600


def security_settings(environ: Mapping[str, str]) -> dict[str, Any]:
    """The Django settings for cookies, HTTPS and security headers, from ``environ``.

    ``console/settings.py`` applies the result; tests call it with a plain dict.

    - ``EFFECT_LEDGER_SESSION_SECONDS`` (default 28800, a working day): a console session
      lasts this long from sign-in, then the user signs in again.
    - ``EFFECT_LEDGER_HTTPS=1``: cookies are sent over HTTPS only (``Secure``), plain-http
      requests are redirected to https (except ``/healthz`` and ``/metrics``: load balancers
      and scrapers call the backend directly, often over http on the internal hop, and a
      redirect would only break them; a scrape's bearer token has already been sent by the
      time the redirect answers), and secure responses carry HSTS for a year. HSTS does not
      include subdomains unless ``EFFECT_LEDGER_HSTS_INCLUDE_SUBDOMAINS=1``: the console is
      usually one host of an organisation's domain, and includeSubDomains would force https on
      every sibling host for a year, including ones that do not serve it.
    - ``EFFECT_LEDGER_TRUST_X_FORWARDED_PROTO=1``: ``X-Forwarded-Proto: https`` marks a request
      secure (``SECURE_PROXY_SSL_HEADER``). Only behind a proxy that sets the header itself,
      overwriting the client's, and with the app unreachable except through it: otherwise any
      client can claim https (Django's "SECURE_PROXY_SSL_HEADER" warning).

    Raises ``ValueError`` naming a variable that is malformed or out of range. Header defaults
    (X-Frame-Options, nosniff, Referrer-Policy, COOP) follow Django's "Deployment checklist"
    and are written out here so a change of Django default cannot loosen them.
    """
    https = env_bool("EFFECT_LEDGER_HTTPS", False, environ=environ)
    session_seconds = env_int("EFFECT_LEDGER_SESSION_SECONDS", WORKING_DAY_SECONDS, environ=environ)
    if session_seconds <= 0:
        raise ValueError(
            f"environment variable EFFECT_LEDGER_SESSION_SECONDS must be positive, got {session_seconds}"
        )
    values: dict[str, Any] = {
        "SESSION_COOKIE_AGE": session_seconds,
        "SESSION_COOKIE_HTTPONLY": True,
        "SESSION_COOKIE_SAMESITE": "Lax",
        "CSRF_COOKIE_SAMESITE": "Lax",
        "SESSION_COOKIE_SECURE": https,
        "CSRF_COOKIE_SECURE": https,
        "SECURE_SSL_REDIRECT": https,
        # The API is not redirected: a 301 turns an agent's POST into a GET and loses its body;
        # console.middleware.HttpsRequiredForApi answers it with a 403 problem instead.
        "SECURE_REDIRECT_EXEMPT": [r"^healthz$", r"^metrics$", r"^api/"],
        "SECURE_HSTS_SECONDS": HSTS_SECONDS if https else 0,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": https
        and env_bool("EFFECT_LEDGER_HSTS_INCLUDE_SUBDOMAINS", False, environ=environ),
        "SECURE_PROXY_SSL_HEADER": (
            ("HTTP_X_FORWARDED_PROTO", "https")
            if env_bool("EFFECT_LEDGER_TRUST_X_FORWARDED_PROTO", False, environ=environ)
            else None
        ),
        "X_FRAME_OPTIONS": "DENY",
        "SECURE_CONTENT_TYPE_NOSNIFF": True,
        "SECURE_REFERRER_POLICY": "same-origin",
        "SECURE_CROSS_ORIGIN_OPENER_POLICY": "same-origin",
    }
    return values
