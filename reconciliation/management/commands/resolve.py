"""``manage.py resolve INTENT_ID --as VERB --reason TEXT``.

UNKNOWN intents: ``confirmed`` (``--provider-reference``; ``--unverified`` when the provider
cannot verify it), ``absent`` (``--accept-duplicate-risk`` at a provider without keys),
``compensate``. COMPENSATING intents whose compensation failed: ``reopen`` (a new compensation),
``compensated`` (undone outside the ledger), ``kept`` (the effect stands). HELD intents (a
second intent for the same business action): ``release`` (``--accept-duplicate-risk``), ``reject``.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from operations.exceptions import LedgerError
from reconciliation.resolution import (
    reject_held,
    release_held,
    resolve_absent,
    resolve_compensate,
    resolve_confirmed,
    resolve_failed_compensation,
)

FAILED_COMPENSATION_VERBS = ("reopen", "compensated", "kept")
HELD_VERBS = ("release", "reject")


class Command(BaseCommand):
    help = (
        "Resolve an UNKNOWN intent as an operator (confirmed, absent or compensate), a "
        "COMPENSATING intent whose compensation failed (reopen, compensated or kept), or a HELD "
        "intent (release or reject)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("intent_id", type=uuid.UUID)
        parser.add_argument(
            "--as",
            dest="verb",
            required=True,
            choices=["confirmed", "absent", "compensate", *FAILED_COMPENSATION_VERBS, *HELD_VERBS],
        )
        parser.add_argument("--reason", required=True)
        parser.add_argument("--provider-reference", default="", help="required for confirmed")
        parser.add_argument(
            "--unverified",
            action="store_true",
            help="confirmed although the provider cannot verify the reference (recorded as unverified)",
        )
        parser.add_argument(
            "--accept-duplicate-risk",
            action="store_true",
            help="absent at a provider without keys, or release of a held intent",
        )
        parser.add_argument(
            "--user", default="operator", help="the operator account deciding (default: operator)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["user"]).first()
        if user is None:
            raise CommandError(f"no user {options['user']!r}; pass --user USERNAME")
        try:
            if options["verb"] == "confirmed":
                intent = resolve_confirmed(
                    intent_id=options["intent_id"],
                    user=user,
                    provider_reference=options["provider_reference"],
                    reason=options["reason"],
                    accept_unverified=options["unverified"],
                )
            elif options["verb"] in FAILED_COMPENSATION_VERBS:
                intent = resolve_failed_compensation(
                    intent_id=options["intent_id"], user=user, verb=options["verb"], reason=options["reason"]
                )
            elif options["verb"] == "release":
                intent = release_held(
                    intent_id=options["intent_id"],
                    user=user,
                    reason=options["reason"],
                    accept_duplicate_risk=options["accept_duplicate_risk"],
                )
            elif options["verb"] == "reject":
                intent = reject_held(intent_id=options["intent_id"], user=user, reason=options["reason"])
            elif options["verb"] == "absent":
                intent = resolve_absent(
                    intent_id=options["intent_id"],
                    user=user,
                    reason=options["reason"],
                    accept_duplicate_risk=options["accept_duplicate_risk"],
                )
            else:
                intent = resolve_compensate(
                    intent_id=options["intent_id"],
                    user=user,
                    reason=options["reason"],
                    provider_reference=options["provider_reference"],
                )
        except LedgerError as exc:
            raise CommandError(exc.detail) from exc
        self.stdout.write(f"intent {intent.id} is now {intent.status}")
