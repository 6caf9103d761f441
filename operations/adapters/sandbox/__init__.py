"""Adapters for the built-in sandbox provider (``manage.py sandbox_provider``).

Each class speaks to one sandbox product over HTTP and mirrors a real provider contract:

* payments (``payments.charge``, ``payments.refund``): honours idempotency keys and fences;
  lookup by key is authoritative (Stripe-style).
* email (``email.send``): no key support; our key travels as the Message-ID; lookup by
  Message-ID is eventually consistent.
* reservations (``reservations.create``, ``reservations.cancel``): no keys, no lookup by key;
  list by our reference only; compensation is ``reservations.cancel``.

The base URL is ``settings.SANDBOX_PROVIDER_URL``; every request is bounded by the call's
``deadline_seconds``. How transport failures and error answers map to ``RetryableError`` /
``TerminalError`` / ``AmbiguousOutcome`` is the table in ``http_classifier``.
"""

from __future__ import annotations

from operations.adapters.events import message_id_for
from operations.adapters.sandbox.common import (
    call_reference,
    format_minor,
    sandbox_url,
)
from operations.adapters.sandbox.email import SandboxEmailAdapter
from operations.adapters.sandbox.payments import SandboxPaymentsAdapter
from operations.adapters.sandbox.reservations import SandboxReservationsAdapter

__all__ = [
    "SandboxEmailAdapter",
    "SandboxPaymentsAdapter",
    "SandboxReservationsAdapter",
    "call_reference",
    "format_minor",
    "message_id_for",
    "sandbox_url",
]
