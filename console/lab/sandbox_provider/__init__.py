"""The sandbox provider: a separate HTTP process that behaves like real provider APIs.

The server side of the lab. The ledger talks to it only over HTTP, through its product adapter
``operations.adapters.sandbox`` (the client), which is product code and does not import this.

It is for demos, drills and tests, the way stripe-mock is: ``manage.py sandbox_provider`` runs
it, and its ledger (``GET /ledger``) is the ground truth a test counts effects in. It keeps its
state in PostgreSQL, outside the ledger's database (by default ``<ledger database>_sandbox`` on
the same server, see ``database``), in its own schema ``sandbox``, and never touches Django's tables.

Products (see ``routes.py`` for every route):

* payments — Stripe-like: ``Idempotency-Key`` required and honoured, ``X-Fencing-Token``
  enforced per key, authoritative lookup by key (``payments.py``).
* email — no key support, every POST sends a new email; lookup by Message-ID is eventually
  consistent (``messaging.py``).
* reservations — no keys and no lookup by key; list by our reference only (``reservations.py``).

Faults are injected through the control plane under ``/_sandbox/`` (``faults.py``).

Every effect also sends signed events (Standard Webhooks) to the ledger when an events URL is set,
durably and at least once, with fault modes of their own (``events.py``), and each product
publishes a daily statement of its effects (``statements.py``).
"""

from __future__ import annotations
