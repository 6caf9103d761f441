"""Case C26: ``manage.py provider_probe`` says what a provider's test mode actually does, against
servers that are really running: localstripe (written by others; it ignores ``Idempotency-Key``)
and the sandbox provider's payments (they deduplicate on it). It refuses any action not marked
as a test endpoint, before anything is sent, and it never creates an intent."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from django.core.management import CommandError, call_command

from operations.adapters.base import LookupResult, LookupStatus
from operations.models import Intent
from reconciliation.models import ProviderEvent
from reconciliation.probe_report import Sent, key_verdict
from tests.support.fake_provider import FakeProvider
from tests.support.smtp_server import running_mail_server
from tests.support.stripe_server import LocalStripe, stripe_declaration


def probe(action: str, arguments: dict[str, Any], **options: Any) -> tuple[str, dict[str, Any]]:
    """Run the command; returns its output and the declaration it printed (the JSON at the end)."""
    out = StringIO()
    call_command("provider_probe", action, arguments=json.dumps(arguments), stdout=out, **options)
    text = out.getvalue()
    return text, json.loads(text[text.index("\n{") :])


@pytest.mark.django_db
def test_c26_probe_finds_that_localstripe_does_not_deduplicate_idempotency_key(
    localstripe: LocalStripe, settings: Any
) -> None:
    # given: the shipped declaration (it says Stripe deduplicates), marked as a test endpoint,
    # pointed at localstripe
    settings.EFFECT_LEDGER_GENERIC_HTTP = stripe_declaration(
        localstripe.url, **{"stripe.charge": {"test_mode": True}}
    )
    customer = localstripe.customer_with_card()
    # when
    text, declare = probe(
        "stripe.charge", {"amount": 1200, "currency": "EUR", "customer": customer}, event_wait=0.5
    )
    # then: two charges under one key, both listed by the lookup right after
    assert "key: does not deduplicate Idempotency-Key: two requests with one key made two effects" in text
    charges = localstripe.charges(customer)
    assert len(charges) == 2
    assert len({c["metadata"]["idempotency_key"] for c in charges}) == 1
    listed = text.split("lookup right after the effect: found (2 for the key: ", 1)[1].split(")", 1)[0]
    assert sorted(listed.split(", ")) == sorted(c["id"] for c in charges)
    # the declaration names Stripe's events; localstripe sends none for charges
    assert "event: none arrived within 0.5 s (at stripe)" in text
    assert declare["keys"] == {"header": "Idempotency-Key", "deduplicates": False}
    assert declare["lookup"]["by"] == "reference" and declare["lookup"]["items"] == "/data"
    assert not Intent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_c26_probe_finds_that_the_sandbox_payments_deduplicate_and_sees_their_signed_event(
    sandbox: Any, live_server: Any
) -> None:
    # given: the sandbox provider sends its signed events to the live ledger
    sandbox.event_settings(url=f"{live_server.url}/providers/")
    # when
    text, declare = probe(
        "payments.charge", {"amount": 1200, "currency": "EUR", "customer": "cus_42"}, event_wait=15
    )
    # then: one effect for the key, answered twice; found at once; its event arrived verified
    (effect,) = sandbox.ledger("payments")
    assert "key: deduplicates its idempotency key: the repeated request was answered with the first" in text
    assert f"request 2, same key: {effect['id']} (answered as a replay)" in text
    assert f"lookup right after the effect: found (1 for the key: {effect['id']})" in text
    assert "event: arrived and verified after" in text and "charge.succeeded" in text
    assert "proves the effect (at sandbox-payments)" in text
    assert ProviderEvent.objects.filter(idempotency_key=effect["idempotency_key"]).exists()
    assert declare == {
        "keys": {"header": "Idempotency-Key", "deduplicates": True},
        "lookup": {"authoritative": True, "consistency_window_seconds": 0.0},
    }
    assert not Intent.objects.exists()


@pytest.mark.django_db
def test_the_probe_says_when_no_event_arrives(sandbox: Any) -> None:
    # given: the sandbox sends no events (its default in tests)
    # when
    text, _ = probe(
        "payments.charge", {"amount": 1200, "currency": "EUR", "customer": "cus_42"}, event_wait=0.5
    )
    # then
    assert "event: none arrived within 0.5 s (at sandbox-payments)" in text


@pytest.mark.django_db
def test_c26_a_non_test_endpoint_is_refused_and_nothing_is_sent(
    fake_provider: FakeProvider, settings: Any
) -> None:
    # given: a declared action at a server that counts requests, not marked "test_mode"
    url = f"{fake_provider.url}/v1/transfers"
    settings.EFFECT_LEDGER_GENERIC_HTTP = {
        "acme.transfer": {"url": url, "lookup": {"url": url + "?key={idempotency_key}"}},
        "acme.refund": {"url": url, "test_mode": False},
    }
    for action in ("acme.transfer", "acme.refund"):
        # when / then
        with pytest.raises(CommandError, match="not a test endpoint"):
            probe(action, {"amount": 1200, "currency": "EUR"})
    assert fake_provider.requests == []
    assert not Intent.objects.exists()


@pytest.mark.django_db
def test_the_probe_refuses_arguments_its_schema_refuses_and_unknown_actions(sandbox: Any) -> None:
    with pytest.raises(CommandError, match="schema"):
        probe("payments.charge", {"amount": 12.5, "currency": "EUR", "customer": "cus_42"})
    with pytest.raises(CommandError, match="unknown action"):
        probe("nobody.knows", {})
    with pytest.raises(CommandError, match="JSON object"):
        call_command("provider_probe", "payments.charge", arguments="[1]")
    assert sandbox.request_count() == 0


FOUND_TWO = LookupResult(status=LookupStatus.FOUND, provider_references=("ch_1", "ch_2"))
FOUND_ONE = LookupResult(status=LookupStatus.FOUND, provider_references=("ch_1",))
NOT_YET = LookupResult(status=LookupStatus.NOT_FOUND_YET)
NO_LOOKUP = LookupResult(status=LookupStatus.UNSUPPORTED)


@pytest.mark.parametrize(
    ("first", "second", "found", "expected"),
    [
        (Sent("ch_1"), Sent("ch_2"), NOT_YET, False),  # two effects answered
        (Sent("ch_1"), Sent("ch_1", replayed=True), FOUND_ONE, True),
        (Sent("ch_1"), Sent("ch_1"), FOUND_TWO, False),  # the lookup counts two
        (Sent("k"), Sent("k"), FOUND_ONE, True),  # id-less answers, one effect listed
        (Sent("k"), Sent("k"), NOT_YET, None),  # id-less answers, nothing to count
        (Sent("ch_1"), Sent(error="AmbiguousOutcome: 502"), FOUND_ONE, None),  # a request failed
        (Sent("ch_1"), Sent(error="AmbiguousOutcome: 502"), FOUND_TWO, False),
        # an id made from our key (an email's Message-ID) is not the provider's own
        (Sent("<k@effect-ledger.local>"), Sent("<k@effect-ledger.local>"), NO_LOOKUP, None),
        (Sent("<k@effect-ledger.local>"), Sent("<k@effect-ledger.local>"), FOUND_ONE, True),
    ],
)
def test_the_key_verdict(first: Sent, second: Sent, found: LookupResult, expected: bool | None) -> None:
    assert key_verdict(first, second, found, "k")[0] is expected


def test_an_adapter_in_code_without_keys_is_declared_as_having_none() -> None:
    # the sandbox's email carries our key in its Message-ID, never in an Idempotency-Key header
    from operations.adapters.registry import get_adapter
    from reconciliation.provider_probe import _declared_keys

    email, payments = get_adapter("email.send"), get_adapter("payments.charge")
    assert _declared_keys(email, "email.send", None) == "none"
    assert _declared_keys(email, "email.send", False) == "none"
    assert _declared_keys(payments, "payments.charge", None) == {
        "header": "Idempotency-Key",
        "deduplicates": True,
    }


# --- an SMTP relay: our key is in the Message-ID, not the relay's answer ----------------------


MAIL = {"to": "ana@example.test", "subject": "Probe", "body": "Hello."}


@pytest.mark.django_db
@pytest.mark.parametrize(("data_reply", "verdict"), [("250 OK", "cannot tell"), ("", "does not deduplicate")])
def test_c26_an_smtp_relay_is_never_said_to_deduplicate_by_the_message_id_we_made(
    settings: Any, data_reply: str, verdict: str
) -> None:
    # given: a relay marked as a test endpoint; "250 OK" names no queue id, so each answer
    # carries only our Message-ID (made from our key)
    with running_mail_server() as server:
        server.handler.data_reply = data_reply
        settings.EFFECT_LEDGER_SMTP = {"mail.notify": server.entry(test_mode=True)}
        # when
        text, declare = probe("mail.notify", MAIL)
    # then: two messages at the relay, and the probe does not claim one
    assert len(server.received) == 2
    key_line = next(line for line in text.splitlines() if line.startswith("  key: "))
    assert key_line.startswith(f"  key: {verdict}"), text
    assert not key_line.startswith("  key: deduplicates")
    if verdict == "cannot tell":
        assert "made from our key" in key_line and "no lookup" in key_line
    # the advice: no keys, no lookup, and no generic HTTP snippet for an SMTP action
    assert declare == {"keys": "none", "lookup": None}
    assert "EFFECT_LEDGER_GENERIC_HTTP" not in text
    assert "SMTP" in text


# --- a probe that made no effect -------------------------------------------------------------


@pytest.mark.django_db
def test_the_probe_fails_and_declares_nothing_when_neither_request_made_an_effect(
    localstripe: LocalStripe, settings: Any
) -> None:
    # given: a customer localstripe does not know (both requests are answered 404)
    settings.EFFECT_LEDGER_GENERIC_HTTP = stripe_declaration(
        localstripe.url, **{"stripe.charge": {"test_mode": True}}
    )
    out = StringIO()
    # when
    with pytest.raises(CommandError, match="neither request made an effect"):
        call_command(
            "provider_probe",
            "stripe.charge",
            arguments=json.dumps({"amount": 1200, "currency": "EUR", "customer": "cus_nobody"}),
            stdout=out,
        )
    # then: what failed is shown; no lookup verdict and no capabilities to declare
    text = out.getvalue()
    assert "request 1: failed: TerminalError" in text and "request 2, same key: failed" in text
    assert "Capabilities" not in text and "lookup right after" not in text
    assert localstripe.charges() == []


# --- a declared action without keys, its reference in its arguments -------------------------


@dataclass
class FakeCrm:
    """A tiny ticket API on loopback (docs/how-to/connect-a-provider.md, "An internal HTTP API without idempotency keys"): ``POST /api/tickets`` makes a
    ticket (``id_in_answer``: its id in the answer), ``GET /api/tickets?external_ref=`` lists
    them; every request is recorded."""

    url: str = ""
    id_in_answer: bool = True
    seen: list[dict[str, Any]] = field(default_factory=list)
    tickets: list[dict[str, Any]] = field(default_factory=list)

    def declaration(self, **changes: Any) -> dict[str, Any]:
        return {
            "crm.create_ticket": {
                "url": f"{self.url}/api/tickets",
                "keys": "none",
                "test_mode": True,
                "body": {"title": "{title}", "customer": "{customer}", "external_ref": "{reference}"},
                "lookup": {
                    "url": f"{self.url}/api/tickets?external_ref={{reference}}",
                    "by": "reference",
                    "items": "/results",
                    "fields": {"id": "/id", "reference": "/external_ref", "status": "/state"},
                    "proving_statuses": ["open", "closed"],
                    "consistency_window_seconds": 120,
                },
                "schema": {
                    "type": "object",
                    "required": ["title", "customer", "reference"],
                    "properties": {
                        "title": {"type": "string"},
                        "customer": {"type": "string"},
                        "reference": {"type": "string"},
                    },
                },
                **changes,
            }
        }

    def posted(self) -> list[dict[str, Any]]:
        return [json.loads(seen["body"]) for seen in self.seen if seen["method"] == "POST"]


@pytest.fixture
def crm() -> Iterator[FakeCrm]:
    state = FakeCrm()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return

        def _reply(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # noqa: N802
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            state.seen.append({"method": "POST", "headers": dict(self.headers.items()), "body": raw})
            body = json.loads(raw)
            ticket = {
                "id": f"t-{len(state.tickets) + 1}",
                "external_ref": body["external_ref"],
                "state": "open",
            }
            state.tickets.append(ticket)
            self._reply(201, ticket if state.id_in_answer else {"ok": True})

        def do_GET(self) -> None:  # noqa: N802
            query = dict(parse_qsl(urlsplit(self.path).query))
            state.seen.append({"method": "GET", "query": query})
            ref = query.get("external_ref")
            self._reply(200, {"results": [t for t in state.tickets if t["external_ref"] == ref]})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


TICKET = {"title": "Printer on fire", "customer": "cus_9"}


@pytest.mark.django_db
def test_the_reference_option_goes_into_arguments_whose_schema_has_one(crm: FakeCrm, settings: Any) -> None:
    # given: the CRM of docs/how-to/connect-a-provider.md ("An internal HTTP API without idempotency keys"), whose schema requires arguments.reference
    settings.EFFECT_LEDGER_GENERIC_HTTP = crm.declaration()
    # when
    text, declare = probe("crm.create_ticket", TICKET, reference="probe-crm-1")
    # then: the reference was sent in the body and looked up by
    assert [body["external_ref"] for body in crm.posted()] == ["probe-crm-1"] * 2
    assert "reference probe-crm-1" in text
    assert "key: no key was sent (keys none); two requests made two effects (t-1, t-2)" in text
    assert "lookup right after the effect: found (2 for the key: t-1, t-2)" in text
    assert declare["keys"] == "none"


@pytest.mark.django_db
def test_a_reference_in_the_arguments_is_the_calls_reference(crm: FakeCrm, settings: Any) -> None:
    settings.EFFECT_LEDGER_GENERIC_HTTP = crm.declaration()
    text, _ = probe("crm.create_ticket", {**TICKET, "reference": "crm-7"})
    assert [body["external_ref"] for body in crm.posted()] == ["crm-7"] * 2
    assert [seen["query"] for seen in crm.seen if seen["method"] == "GET"] == [{"external_ref": "crm-7"}]
    assert "reference crm-7" in text


@pytest.mark.django_db
def test_two_different_references_are_refused_and_nothing_is_sent(crm: FakeCrm, settings: Any) -> None:
    settings.EFFECT_LEDGER_GENERIC_HTTP = crm.declaration()
    with pytest.raises(CommandError, match="differ"):
        probe("crm.create_ticket", {**TICKET, "reference": "crm-7"}, reference="crm-8")
    assert crm.seen == []


@pytest.mark.django_db
def test_without_keys_and_without_an_id_the_probe_says_no_key_was_sent(crm: FakeCrm, settings: Any) -> None:
    # given: an API without keys whose answers carry no id, and no lookup
    crm.id_in_answer = False
    settings.EFFECT_LEDGER_GENERIC_HTTP = crm.declaration(lookup=None)
    # when
    text, declare = probe("crm.create_ticket", {**TICKET, "reference": "probe-crm-2"})
    # then
    assert "key: no key was sent (keys none); the answers carry no id" in text
    assert "inconclusive" not in text
    assert all("Idempotency-Key" not in seen["headers"] for seen in crm.seen)
    assert declare == {"keys": "none", "lookup": None}
