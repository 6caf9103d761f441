"""The restore drill's agent: the references it submits per provider kind and batch, the bodies
it posts through the HTTP API (each reference doubles as the ``Idempotency-Key``), its
re-submission of what a restore lost, and the ledger's view of its intents.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.test import Client

from console.lab.cluster import HarnessError
from console.lab.crashlab.config import ACTIONS, arguments_for
from operations.models import Intent

KINDS = ("payments", "email", "reservations")
TENANT = "restore-drill"


class RestoreAgent:
    """The agent of one restore drill, submitting as a real agent does (the test client on the
    HTTP API, a bearer token).

    Args:
        intents: intents per provider kind in each of the two batches.

    Attributes:
        prefix: what every reference of the drill starts with (``rst-<8 hex>-``).
        first, second: the references of the first and second batch, per kind
            (``<prefix><kind[:3]>-a000``, ``…-b000``).
        ids: the intent id the ledger last answered for each reference.
        token: the agent's bearer token; set it once the agent exists in the ledger.
    """

    def __init__(self, *, intents: int) -> None:
        self.prefix = f"rst-{uuid.uuid4().hex[:8]}-"
        self.first = {k: [f"{self.prefix}{k[:3]}-a{n:03d}" for n in range(intents)] for k in KINDS}
        self.second = {k: [f"{self.prefix}{k[:3]}-b{n:03d}" for n in range(intents)] for k in KINDS}
        self.bodies: dict[str, dict[str, Any]] = {}
        self.ids: dict[str, str] = {}
        self.token = ""
        self.api = Client()

    def kind_of(self, ref: str) -> str:
        """The provider kind of reference ``ref``."""
        return next(k for k in KINDS if ref.startswith(f"{self.prefix}{k[:3]}-"))

    def references(self, kind: str) -> list[str]:
        """Every reference of ``kind``, both batches, in order."""
        return [*self.first[kind], *self.second[kind]]

    def every_reference(self) -> list[str]:
        """Every reference of the drill, kind by kind, both batches."""
        return [r for k in KINDS for r in (*self.first[k], *self.second[k])]

    def submit_all(self, refs: dict[str, list[str]]) -> None:
        """Submit the intent of every reference in ``refs`` (per kind), kind by kind.

        Raises:
            HarnessError: the API refused a submission.
        """
        for kind in KINDS:
            for ref in refs.get(kind, []):
                self.ids[ref] = self._post(ref)

    def resubmit(self, lost: list[str]) -> list[str]:
        """The agent asks for each intent it submitted; those the ledger no longer knows (404)
        are submitted again, byte for byte.

        Returns:
            a note for each reference the ledger still knew (any answer but 404).

        Raises:
            HarnessError: the API refused a submission.
        """
        notes = []
        quiet = logging.getLogger("django.request")
        level = quiet.level
        quiet.setLevel(logging.ERROR)  # the expected 404s are not warnings
        try:
            for ref in lost:
                response = self.api.get(
                    f"/api/v1/intents/{self.ids[ref]}", HTTP_AUTHORIZATION=f"Bearer {self.token}"
                )
                if response.status_code == 404:
                    self.ids[ref] = self._post(ref)
                else:
                    notes.append(f"{ref}: expected 404 after the restore, got {response.status_code}")
        finally:
            quiet.setLevel(level)
        return notes

    def states_by_reference(self) -> dict[str, str]:
        """The status of the ledger's intent of each reference it knows (the intent submitted
        under that reference as its client key)."""
        rows = Intent.objects.filter(tenant=TENANT, reference__startswith=self.prefix).values_list(
            "reference", "client_key", "status"
        )
        return {ref: status for ref, key, status in rows if key == ref}

    def _body(self, kind: str, ref: str) -> dict[str, Any]:
        n = int(ref[-3:]) + (500 if "-b" in ref[len(self.prefix) :] else 0)
        return {"action": ACTIONS[kind], "arguments": arguments_for(kind, ref, n), "reference": ref}

    def _post(self, ref: str) -> str:
        """POST the intent of ``ref`` as the agent does (the reference is its Idempotency-Key)."""
        body = self.bodies.setdefault(ref, self._body(self.kind_of(ref), ref))
        response = self.api.post(
            "/api/v1/intents",
            data=body,
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {self.token}",
            HTTP_IDEMPOTENCY_KEY=ref,
        )
        if response.status_code != 201:
            raise HarnessError(f"submission refused: {response.status_code} {response.content[:300]!r}")
        return str(response.json()["intent_id"])
