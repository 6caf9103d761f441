"""Credentials named, never written: ``env:NAME`` and ``file:PATH`` references (issue 33).

A provider's configuration (``EFFECT_LEDGER_GENERIC_HTTP``, ``EFFECT_LEDGER_SMTP``) names where
a secret lives instead of holding it, so the file can be committed, reviewed and shown::

    "auth": {"scheme": "bearer", "secret": "env:STRIPE_SECRET_KEY"}
    "password": "file:/run/secrets/smtp_password"

The value is read when it is used (a rotated file or a restarted process with a new variable
takes effect without a new configuration) and never logged, stored or shown: errors name the
reference, never the value.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

#: The sandbox provider's event secret, published in this repository (the sandbox is a test
#: double): never a secret. ``console/settings_ledger.py`` defaults ``SANDBOX_EVENTS_SECRET`` to it.
PUBLISHED_SANDBOX_EVENTS_SECRET = "whsec_ZWZmZWN0LWxlZGdlci1zYW5kYm94LWV2ZW50cy1zZWNyZXQ="
#: Secrets anyone can read in this repository or its documentation: refused for every real
#: provider's source (issue 33 item 6), as a published ``SECRET_KEY`` is refused.
PUBLISHED_SECRETS = frozenset({PUBLISHED_SANDBOX_EVENTS_SECRET})

#: The schemes a reference may use.
SCHEMES = ("env:", "file:")


class SecretUnavailable(Exception):
    """A named secret cannot be read now (the variable is unset or empty, the file is missing,
    unreadable or empty). ``str()`` names the reference, never a value."""


def check_reference(value: object, *, where: str) -> str:
    """Refuse a configuration value that is not a secret reference; return it.

    Args:
        value: what the configuration holds.
        where: the configuration path shown in the error (``EFFECT_LEDGER_GENERIC_HTTP['x']['auth']``).

    Raises:
        ImproperlyConfigured: not ``env:NAME`` (a non-empty variable name) or ``file:PATH`` (an
            absolute path); a literal secret is refused so that it never sits in the file.
    """
    if isinstance(value, str):
        if value.startswith("env:") and value[4:].strip() and "=" not in value[4:]:
            return value
        if value.startswith("file:") and Path(value[5:]).is_absolute():
            return value
    raise ImproperlyConfigured(
        f"{where} must name a secret, 'env:VARIABLE' or 'file:/absolute/path', not hold one"
    )


def resolve(reference: str) -> str:
    """The secret ``reference`` names, stripped of surrounding whitespace (a file's final newline).

    Raises:
        SecretUnavailable: the variable is unset or empty, or the file cannot be read or is empty.
        ImproperlyConfigured: ``reference`` is not a secret reference (``check_reference``).
    """
    check_reference(reference, where="a secret reference")
    if reference.startswith("env:"):
        name = reference[4:]
        value = os.environ.get(name, "").strip()
        if not value:
            raise SecretUnavailable(f"the secret {reference} is not set (environment variable {name})")
        return value
    path = Path(reference[5:])
    try:
        value = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise SecretUnavailable(f"the secret {reference} cannot be read ({type(exc).__name__})") from exc
    if not value:
        raise SecretUnavailable(f"the secret {reference} is empty")
    return value
