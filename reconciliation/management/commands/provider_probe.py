"""``manage.py provider_probe ACTION --arguments JSON [--reference REF] [--event-wait SECONDS]``:
what a provider's test mode does about a repeated key, its lookup and its events, and the
capabilities to declare (``reconciliation.provider_probe``)."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from operations.strict_json import loads_strict
from reconciliation.provider_probe import ProbeRefused, probe_action

HELP = """\
Learn what a provider's test mode actually does, before declaring its contract.

Runs only against an action marked as a test endpoint (a sandbox action, or a declared
action with "test_mode": true); any other is refused and nothing is sent. It never reads or
writes an intent.

What it does, with a fresh key (probe-<uuid>) and the --arguments given:
  1. sends the action's request twice with the same key, as a same-key retry would;
  2. asks the action's lookup once, right after (not when both requests failed);
  3. with --event-wait, watches the ledger's stored provider events (stored only once their
     signature verified) for one about the key, the reference or the provider's ids.

The business reference it sends:
  --reference REF if given; else the "reference" in --arguments; else a fresh probe-<hex>.
  When the action's schema has a "reference" property (a declared action that sends it, as
  the ticket API of docs/how-to/connect-a-provider.md ("An internal HTTP API without idempotency keys") does), the arguments carry that same reference too.
  A --reference that differs from the "reference" in --arguments is refused; nothing is sent.
  The lookup and the event wait look for it as well as for the key.

What it reports:
  key:    "deduplicates <header>" (the second request was answered with the first effect,
          or the lookup lists one effect for the key), "does not deduplicate <header>" (two
          effects), or "cannot tell" (a request failed, or the answers carry no id of the
          provider's own: none, our key, or an id made from it such as an email's Message-ID,
          and no lookup counts the effects); "no key was sent (keys none)" for a declared
          action without keys;
  lookup: found / not found yet / unsupported / inconclusive, right after the effect;
  event:  whether one arrived and verified within the wait, and whether one proves the
          effect (it waits for a proving one until the wait ends);
and prints the "keys" and "lookup" fields to declare in EFFECT_LEDGER_GENERIC_HTTP for a
declared HTTP action; for an adapter whose capabilities are set in code (SMTP, the sandbox's)
it prints the same facts, which no setting declares.

When both requests fail (e.g. a customer the provider does not know), it says that neither
made an effect, prints no capabilities and exits with an error.

The effects it makes stay at the test endpoint (two charges at a provider that ignores keys).
Events about them that reach the ledger are recorded like any other (with no intent: an
orphan finding for operators to close).

Example, with docs/providers/stripe.json copied, "test_mode": true added to stripe.charge
and STRIPE_SECRET_KEY a test-mode key (sk_test_...):
  manage.py provider_probe stripe.charge --event-wait 10 \\
      --arguments '{"amount": 1200, "currency": "EUR", "customer": "cus_123"}'

Example, a ticket API whose schema requires "reference" (docs/how-to/connect-a-provider.md, "An internal HTTP API without idempotency keys"), marked
"test_mode": true; the reference is sent in the body and looked up by:
  manage.py provider_probe crm.create_ticket --reference probe-crm-1 \\
      --arguments '{"title": "Probe", "customer": "cus_123"}'
"""


class Command(BaseCommand):
    help = HELP

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        """Keep the help's layout (lists and the example) as written."""
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        return super().create_parser(prog_name, subcommand, **kwargs)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", help="the action to probe, e.g. stripe.charge")
        parser.add_argument(
            "--arguments",
            required=True,
            metavar="JSON",
            help="the action's arguments as a JSON object (its schema's; money in minor units)",
        )
        parser.add_argument(
            "--reference",
            default="",
            help=(
                "the business reference to send, also as arguments.reference when the action's schema "
                'has one (default: the "reference" in --arguments, else a fresh probe-<hex>)'
            ),
        )
        parser.add_argument(
            "--event-wait",
            type=float,
            default=0.0,
            metavar="SECONDS",
            help="wait up to SECONDS for a verified provider event about the effect (default 0: do not wait)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            arguments = loads_strict(options["arguments"].encode("utf-8"))
        except (ValueError, UnicodeError, RecursionError) as exc:
            raise CommandError(f"--arguments is not JSON: {exc}") from exc
        if not isinstance(arguments, dict):
            raise CommandError("--arguments must be a JSON object")
        if options["event_wait"] < 0:
            raise CommandError("--event-wait must be 0 or more seconds")
        try:
            report = probe_action(
                action=options["action"],
                arguments=arguments,
                reference=options["reference"],
                event_wait_seconds=options["event_wait"],
            )
        except ProbeRefused as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write("\n".join(report.lines()))
        if not report.made_effect:
            raise CommandError(report.failure())
