"""The configuration of the SMTP adapter (``settings.EFFECT_LEDGER_SMTP``, described in the
package docstring) and the arguments' schema, checked with the action and the field named."""

from __future__ import annotations

import re
from email.utils import parseaddr
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from operations.adapters import secrets

#: An address we can put in an SMTP command: a dot-atom local part and a host name (ASCII;
#: an internationalized address would need SMTPUTF8, RFC 6531, which is not offered here).
ADDRESS = r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@[A-Za-z0-9](?:[A-Za-z0-9.-]{0,253}[A-Za-z0-9])?"
#: What a header field we write from the arguments may hold (header injection): no "=?", the
#: opener of an RFC 2047 encoded word (Python before 3.11.10 / 3.12.5 folds an encoded word
#: that decodes to CR LF into real line breaks: CVE-2024-6923), and no control character but
#: TAB: CR, LF, NUL, and every other line break ``str.splitlines`` knows (VT, FF, FS, GS, RS,
#: NEL, LS, PS), which the email package refuses with a ValueError or writes as a new line
#: (RFC 5322 §2.2: a field body is printable characters and white space).
SAFE_HEADER = r"(?!.*=\?)[^\x00-\x08\x0a-\x1f\x7f\x85\u2028\u2029]*"
SAFE_HEADER_PATTERN = f"^{SAFE_HEADER}$"
ADDRESS_PATTERN = f"^(?!.*=\\?){ADDRESS}$"

EMAIL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "to": {"type": "string", "pattern": ADDRESS_PATTERN, "maxLength": 320},
        "subject": {"type": "string", "minLength": 1, "maxLength": 500, "pattern": SAFE_HEADER_PATTERN},
        "body": {"type": "string", "maxLength": 20000},
        "reference": {"type": "string", "minLength": 1, "maxLength": 200},
    },
    "required": ["to", "subject", "body"],
    "additionalProperties": False,
}

#: The fields an action's configuration may hold.
FIELDS = ("host", "port", "from", "starttls", "ssl", "username", "password", "timeout_seconds", "test_mode")


def smtp_config() -> dict[str, dict[str, Any]]:
    """Return ``settings.EFFECT_LEDGER_SMTP`` (``{}`` when unset), checked.

    Raises:
        ImproperlyConfigured: naming the action and the field: not a mapping; an unknown field;
            ``host`` missing or not a host name; ``port`` not an integer in 1-65535; ``from``
            not one address; ``starttls`` / ``ssl`` / ``test_mode`` not booleans, or both TLS
            modes; ``username`` / ``password`` not both given or not secret references
            (``secrets.check_reference``: a literal password is refused); ``timeout_seconds``
            not a positive number; the action also configured in ``EFFECT_LEDGER_GENERIC_HTTP``.
    """
    config = getattr(settings, "EFFECT_LEDGER_SMTP", None) or {}
    if not isinstance(config, dict):
        raise ImproperlyConfigured("EFFECT_LEDGER_SMTP must be a dict of action -> config")
    generic = getattr(settings, "EFFECT_LEDGER_GENERIC_HTTP", None) or {}
    for action, entry in config.items():
        _check_entry(action, entry)
        if isinstance(generic, dict) and action in generic:
            raise ImproperlyConfigured(
                f"EFFECT_LEDGER_SMTP[{action!r}]: the action is also in EFFECT_LEDGER_GENERIC_HTTP; "
                "an action has one provider"
            )
    return config


def _check_entry(action: str, entry: Any) -> None:
    where = f"EFFECT_LEDGER_SMTP[{action!r}]"
    if not isinstance(entry, dict):
        raise ImproperlyConfigured(f"{where} must be a dict with 'host', 'port' and 'from'")
    unknown = sorted(set(entry) - set(FIELDS))
    if unknown:
        raise ImproperlyConfigured(f"{where} has unknown fields {unknown}; allowed: {', '.join(FIELDS)}")
    for name in ("host", "port", "from"):
        if name not in entry:
            raise ImproperlyConfigured(f"{where} needs a {name!r}")
    host = entry["host"]
    if not isinstance(host, str) or not host or any(c.isspace() for c in host) or not host.isascii():
        raise ImproperlyConfigured(f"{where}['host'] must be a host name or address")
    port = entry["port"]
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise ImproperlyConfigured(f"{where}['port'] must be an integer from 1 to 65535, not {port!r}")
    sender = entry["from"]
    if not isinstance(sender, str) or "\r" in sender or "\n" in sender or not envelope_sender(sender):
        raise ImproperlyConfigured(f"{where}['from'] must be one address, e.g. 'Ledger <ledger@example.com>'")
    for name in ("starttls", "ssl", "test_mode"):
        if not isinstance(entry.get(name, False), bool):
            raise ImproperlyConfigured(f"{where}[{name!r}] must be true or false")
    if entry.get("starttls") and entry.get("ssl"):
        raise ImproperlyConfigured(f"{where}: 'starttls' and 'ssl' are two ways to use TLS; choose one")
    if ("username" in entry) != ("password" in entry):
        raise ImproperlyConfigured(f"{where} needs both 'username' and 'password', or neither")
    for name in ("username", "password"):
        if name in entry:
            secrets.check_reference(entry[name], where=f"{where}[{name!r}]")
    timeout = entry.get("timeout_seconds")
    if timeout is not None and (
        not isinstance(timeout, int | float) or isinstance(timeout, bool) or not timeout > 0
    ):
        raise ImproperlyConfigured(f"{where}['timeout_seconds'] must be a positive number of seconds")


def unsafe_header(value: str) -> bool:
    """Whether ``value`` may not go into a header field (``SAFE_HEADER``: "=?", a line break or
    another control character)."""
    return re.fullmatch(SAFE_HEADER, value) is None


def envelope_sender(from_header: str) -> str:
    """The bare address of a From header (``"Ledger <a@b.c>"`` -> ``"a@b.c"``), "" when it is
    not one address we can send (``ADDRESS_PATTERN``)."""
    address = parseaddr(from_header)[1]
    return address if re.fullmatch(ADDRESS, address) else ""
