"""The SMTP email adapter against a real SMTP server (aiosmtpd on loopback, tests/support/
smtp_server.py): one message per call, our key in its Message-ID, each side of the commit point
classified (operations/adapters/smtp/), its configuration refused with the field named; and
case C25 through the ledger: a relay that takes the message and drops the connection before its
final reply leaves the intent UNKNOWN for a person, never sent again on its own."""

from __future__ import annotations

import json
import ssl
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db.models.functions import Now

from operations.access.tenants import EVERY_TENANT
from operations.adapters.base import ExecutionCall, LookupKind, LookupStatus
from operations.adapters.errors import (
    DEADLINE_EXCEEDED_CODE,
    AdapterError,
    AmbiguousOutcome,
    ArgumentsInvalid,
    RetryableError,
    TerminalError,
)
from operations.adapters.events import key_from_message_id, message_id_for
from operations.adapters.registry import adapter_label, capabilities_for, get_adapter, known_actions
from operations.adapters.smtp import SmtpEmailAdapter, queue_id, smtp_adapter, smtp_config
from operations.adapters.smtp import adapter as smtp_adapter_module
from operations.engine.protocol import execute_intent
from operations.exceptions import ResolutionRefused, ValidationFailed
from operations.models import Intent
from reconciliation.models import Evidence
from reconciliation.resolution import resolve_absent
from reconciliation.selectors import unknown_queue
from reconciliation.services import reconcile_pass
from tests.factories import UserFactory, settled, submit
from tests.support.smtp_server import MailServer, free_port, running_mail_server, self_signed_context

ACTION = "mail.notify"
EMAIL = {"to": "ana@example.test", "subject": "Your receipt", "body": "Thanks.\n.\nA line with a dot."}


@pytest.fixture
def mail_server() -> Iterator[MailServer]:
    with running_mail_server() as server:
        yield server


def adapter(settings: Any, entry: dict[str, Any]) -> SmtpEmailAdapter:
    settings.EFFECT_LEDGER_SMTP = {ACTION: entry}
    found = smtp_adapter(ACTION)
    assert found is not None
    return found


def call(arguments: dict[str, Any] | None = None, deadline: float = 5.0) -> ExecutionCall:
    return ExecutionCall(
        intent_id=str(uuid.uuid4()),
        action=ACTION,
        action_version=1,
        arguments=arguments or dict(EMAIL),
        idempotency_key="el_" + uuid.uuid4().hex,
        fence=1,
        attempt_no=1,
        deadline_seconds=deadline,
    )


# --- the adapter against aiosmtpd -------------------------------------------------------------


def test_a_message_is_delivered_once_with_our_key_in_its_message_id(
    settings: Any, mail_server: MailServer
) -> None:
    # given
    smtp = adapter(settings, mail_server.entry())
    the_call = call()
    # when
    result = smtp.execute(the_call)
    # then: one message, from/to/subject as asked, our key in its Message-ID
    assert len(mail_server.received) == 1
    received = mail_server.received[0]
    assert (received.mail_from, received.rcpt_tos) == ("ledger@example.test", ["ana@example.test"])
    message = received.message
    assert message["From"] == "Ledger <ledger@example.test>"
    assert (message["To"], message["Subject"]) == ("ana@example.test", "Your receipt")
    assert message["Message-ID"] == message_id_for(the_call.idempotency_key)
    assert key_from_message_id(message["Message-ID"]) == the_call.idempotency_key
    # the lone "." survived dot-stuffing
    assert message.get_content().replace("\r\n", "\n") == EMAIL["body"] + "\n"
    # and the receipt is the queue id the server named, with its reply's digest
    assert result.provider_reference == "Q1"
    assert len(result.response_digest) == 64
    assert result.detail["message_id"] == message_id_for(the_call.idempotency_key)


def test_without_a_queue_id_the_receipt_is_our_message_id(settings: Any, mail_server: MailServer) -> None:
    mail_server.handler.data_reply = "250 OK"
    the_call = call()
    result = adapter(settings, mail_server.entry()).execute(the_call)
    assert result.provider_reference == message_id_for(the_call.idempotency_key)


def test_non_ascii_text_is_sent_7bit(settings: Any, mail_server: MailServer) -> None:
    arguments = {**EMAIL, "subject": "Reçu n° 42", "body": "Merci, à bientôt — " + "x" * 200}
    adapter(settings, mail_server.entry()).execute(call(arguments))
    content = mail_server.received[0].content
    assert content.isascii()
    assert mail_server.received[0].message["Subject"] == "Reçu n° 42"
    assert mail_server.received[0].message.get_content().replace("\r\n", "\n") == arguments["body"] + "\n"


def test_refused_connection_is_retryable(settings: Any) -> None:
    smtp = adapter(settings, {"host": "127.0.0.1", "port": free_port(), "from": "ledger@example.test"})
    with pytest.raises(RetryableError) as raised:
        smtp.execute(call())
    assert raised.value.detail["code"] == "not_sent"


@pytest.mark.parametrize(
    ("fault", "reply", "expected", "code"),
    [
        ("rcpt_reply", "550 5.1.1 No such user", TerminalError, "smtp_refused"),
        ("rcpt_reply", "451 4.3.0 Try again later", RetryableError, "smtp_deferred"),
        ("mail_reply", "553 5.7.1 Sender refused", TerminalError, "smtp_refused"),
        ("mail_reply", "421 4.7.0 Too many connections", RetryableError, "smtp_deferred"),
        ("data_command_reply", "554 5.5.1 No valid recipients", TerminalError, "smtp_refused"),
        ("data_command_reply", "451 4.3.0 Not now", RetryableError, "smtp_deferred"),
        ("data_reply", "554 5.7.1 Message refused", TerminalError, "smtp_refused"),
        ("data_reply", "452 4.3.1 Insufficient storage", RetryableError, "smtp_deferred"),
    ],
)
def test_refusals_are_classified_by_their_reply_class(
    settings: Any, mail_server: MailServer, fault: str, reply: str, expected: type[AdapterError], code: str
) -> None:
    # given
    setattr(mail_server.handler, fault, reply)
    # when / then (RFC 5321 §4.2.1: 4yz transient, 5yz permanent)
    with pytest.raises(expected) as raised:
        adapter(settings, mail_server.entry()).execute(call())
    assert raised.value.detail["code"] == code
    assert raised.value.detail["reply_code"] == int(reply[:3])
    # and a message reached the server only where the refusal is its final reply
    assert len(mail_server.received) == (1 if fault == "data_reply" else 0)


def test_connection_dropped_after_the_message_is_ambiguous(settings: Any, mail_server: MailServer) -> None:
    # given: the server takes the whole message and closes the connection before its reply
    mail_server.handler.after_data = "drop"
    # when / then
    with pytest.raises(AmbiguousOutcome) as raised:
        adapter(settings, mail_server.entry()).execute(call())
    assert raised.value.detail["code"] == "connection_dropped"
    assert len(mail_server.received) == 1


def test_a_stall_past_the_deadline_after_the_message_is_ambiguous(
    settings: Any, mail_server: MailServer
) -> None:
    # given: the server takes the message and stays silent past the deadline
    mail_server.handler.after_data, mail_server.handler.stall_seconds = "stall", 3.0
    smtp = adapter(settings, mail_server.entry(timeout_seconds=0.8))
    # when
    with pytest.raises(AmbiguousOutcome) as raised:
        smtp.execute(call(deadline=10.0))  # timeout_seconds caps the call's deadline
    # then
    assert raised.value.detail["code"] == DEADLINE_EXCEEDED_CODE
    assert raised.value.timed_out
    assert len(mail_server.received) == 1


def test_auth_with_named_secrets(settings: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    secret = tmp_path / "smtp-password"
    secret.write_text("s3cret\n")
    monkeypatch.setenv("SMTP_TEST_USER", "ledger")
    with running_mail_server(users={"ledger": "s3cret"}) as server:
        entry = server.entry(username="env:SMTP_TEST_USER", password=f"file:{secret}")
        adapter(settings, entry).execute(call())
        assert len(server.received) == 1
        # a refused login (535) is terminal, nothing sent
        secret.write_text("wrong")
        with pytest.raises(TerminalError) as raised:
            adapter(settings, entry).execute(call())
        assert (raised.value.detail["step"], raised.value.detail["reply_code"]) == ("AUTH", 535)
        assert len(server.received) == 1


def test_an_unavailable_secret_is_retryable_and_nothing_is_sent(
    settings: Any, mail_server: MailServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SMTP_TEST_MISSING", raising=False)
    smtp = adapter(
        settings, mail_server.entry(username="env:SMTP_TEST_MISSING", password="env:SMTP_TEST_MISSING")
    )
    with pytest.raises(RetryableError) as raised:
        smtp.execute(call())
    assert raised.value.detail["code"] == "secret_unavailable"
    assert "SMTP_TEST_MISSING" in str(raised.value)
    assert (mail_server.handler.connections, mail_server.received) == (0, [])


def test_starttls_not_offered_sends_nothing_in_the_clear(settings: Any, mail_server: MailServer) -> None:
    with pytest.raises(RetryableError) as raised:
        adapter(settings, mail_server.entry(starttls=True)).execute(call())
    assert raised.value.detail["code"] == "not_offered"
    assert mail_server.received == []


@pytest.mark.parametrize("mode", ["starttls", "ssl"])
def test_tls_with_a_trusted_certificate_delivers_and_authenticates(
    settings: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    # given: a relay offering STARTTLS (or implicit TLS) and AUTH, with a certificate our TLS
    # context trusts (the adapter's default context, given this test's CA)
    context = self_signed_context(tmp_path)
    original = ssl.create_default_context

    def trusting(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        if args or kwargs:
            return original(*args, **kwargs)
        return original(cafile=str(tmp_path / "smtp-cert.pem"))

    monkeypatch.setattr(ssl, "create_default_context", trusting)
    monkeypatch.setenv("SMTP_TEST_USER", "ledger")
    monkeypatch.setenv("SMTP_TEST_PASSWORD", "s3cret")
    tls = {"starttls" if mode == "starttls" else "tls": context}
    with running_mail_server(users={"ledger": "s3cret"}, **tls) as server:
        entry = server.entry(username="env:SMTP_TEST_USER", password="env:SMTP_TEST_PASSWORD", **{mode: True})
        # when
        result = adapter(settings, entry).execute(call())
    # then: delivered once, over TLS, after AUTH
    assert result.provider_reference == "Q1" and len(server.received) == 1


@pytest.mark.parametrize("mode", ["starttls", "ssl"])
def test_a_certificate_nobody_trusts_sends_nothing(settings: Any, tmp_path: Any, mode: str) -> None:
    # given: a relay offering TLS (STARTTLS, or implicit TLS) with a self-signed certificate
    context = self_signed_context(tmp_path)
    with running_mail_server(**{"starttls" if mode == "starttls" else "tls": context}) as server:
        # when / then: the certificate is verified, refused, and nothing is sent
        with pytest.raises(RetryableError) as raised:
            adapter(settings, server.entry(**{mode: True})).execute(call())
        assert raised.value.detail["code"] == "not_sent"
        assert "CERTIFICATE_VERIFY_FAILED" in str(raised.value)
        assert server.received == []


@pytest.mark.parametrize(
    "arguments",
    [
        {**EMAIL, "to": "ana@example.test\r\nBcc: eve@example.test"},
        {**EMAIL, "to": "ana@example.test\n"},
        {**EMAIL, "subject": "Hello\r\nBcc: eve@example.test"},
        {**EMAIL, "subject": "Hello\n"},
        {**EMAIL, "to": "ana@example.test, eve@example.test"},
    ],
)
def test_header_injection_is_refused(
    settings: Any, mail_server: MailServer, arguments: dict[str, Any]
) -> None:
    smtp = adapter(settings, mail_server.entry())
    # at submission (the schema) ...
    with pytest.raises(ArgumentsInvalid):
        smtp.validate(ACTION, arguments)
    # ... and again before sending, were a row to hold it
    with pytest.raises(TerminalError) as raised:
        smtp.execute(call(arguments))
    assert raised.value.detail["code"] in {"unsafe_header", "invalid_address"}
    assert mail_server.received == []


#: CVE-2024-6923: an RFC 2047 encoded word that decodes to CR LF, which Python before 3.11.10 /
#: 3.12.5 folds into real new lines: a Reply-To, a Content-Type and an HTML body injected.
CVE_SUBJECT = (
    "=?utf-8?q?Invoice=0D=0AReply-To:_attacker=40evil.example=0D=0AContent-Type:_text/html"
    '=0D=0A=0D=0A<a_href=3D"http://evil.example">Pay_here</a>?='
)
UNSAFE_HEADERS = [
    {**EMAIL, "subject": CVE_SUBJECT},
    {**EMAIL, "subject": "Invoice =?utf-8?b?DQpCY2M6IGV2ZUBleGFtcGxlLnRlc3Q=?="},
    {**EMAIL, "to": "=?utf-8?q?a=0D=0ABcc:_eve=40x.test?=@example.test"},
    *(
        {**EMAIL, "subject": f"Hello{char}Bcc: eve@example.test"}
        for char in "\x00\x0b\x0c\x1c\x85\u2028\u2029"
    ),
]


@pytest.mark.parametrize("arguments", UNSAFE_HEADERS)
def test_line_breaks_controls_and_encoded_words_are_refused_in_headers(
    settings: Any, mail_server: MailServer, arguments: dict[str, Any]
) -> None:
    smtp = adapter(settings, mail_server.entry())
    # at submission (the schema) ...
    with pytest.raises(ArgumentsInvalid):
        smtp.validate(ACTION, arguments)
    # ... and again before connecting, were a row to hold it: a refusal, never an unexpected
    # exception (the engine would record that as an ambiguous outcome)
    with pytest.raises(TerminalError) as raised:
        smtp.execute(call(arguments))
    assert raised.value.detail["code"] == "unsafe_header"
    assert mail_server.received == [] and mail_server.handler.connections == 0


@pytest.mark.django_db
def test_the_cve_2024_6923_subject_is_refused_at_submission(ledger_mail: MailServer, api: Any) -> None:
    # given / when: through the service
    with pytest.raises(ValidationFailed) as raised:
        submit(action=ACTION, arguments={**EMAIL, "subject": CVE_SUBJECT})
    # then
    assert "subject" in str(raised.value.__dict__)
    # and through the API: 422
    response = api.post(
        "/api/v1/intents",
        data=json.dumps({"action": ACTION, "arguments": {**EMAIL, "subject": CVE_SUBJECT}}),
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="cve-1",
    )
    assert response.status_code == 422, response.content
    assert not Intent.objects.exists() and ledger_mail.received == []


def test_a_message_that_does_not_read_back_as_built_is_not_sent(
    settings: Any, mail_server: MailServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: the header check before building is gone (the defence behind it must hold alone)
    smtp = adapter(settings, mail_server.entry())
    monkeypatch.setattr(smtp_adapter_module, "unsafe_header", lambda value: False)
    # when
    with pytest.raises(TerminalError) as raised:
        smtp.execute(call({**EMAIL, "subject": CVE_SUBJECT}))
    # then: the message, serialised as it would be sent and parsed back, has headers we did not
    # set and another body: refused, nothing sent
    assert raised.value.detail["code"] == "unsafe_message"
    assert "Reply-To" in str(raised.value)
    assert mail_server.received == [] and mail_server.handler.connections == 0


def test_an_unexpected_error_while_building_the_message_is_a_refusal(
    settings: Any, mail_server: MailServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    smtp = adapter(settings, mail_server.entry())

    def broken(key: str) -> str:
        raise ValueError("boom")

    monkeypatch.setattr(smtp_adapter_module, "message_id_for", broken)
    with pytest.raises(TerminalError) as raised:
        smtp.execute(call())
    assert raised.value.detail["code"] == "unbuildable_message"
    assert mail_server.received == [] and mail_server.handler.connections == 0


@pytest.mark.parametrize(
    "subject", [" Leading space", "Two  spaces\tand a tab ", "Reçu =? n° 42".replace("=?", "= ?"), "é" * 500]
)
def test_ordinary_subjects_still_read_back_and_are_sent(
    settings: Any, mail_server: MailServer, subject: str
) -> None:
    smtp = adapter(settings, mail_server.entry())
    smtp.validate(ACTION, {**EMAIL, "subject": subject})
    smtp.execute(call({**EMAIL, "subject": subject}))
    [received] = mail_server.received
    assert received.message["Subject"] == subject.lstrip()


def test_capabilities_lookup_and_preview(settings: Any, mail_server: MailServer) -> None:
    smtp = adapter(settings, mail_server.entry(test_mode=True))
    capabilities = capabilities_for(ACTION)
    assert (capabilities.idempotency_keys, capabilities.lookup, capabilities.compensation_action) == (
        False,
        LookupKind.NONE,
        None,
    )
    assert not capabilities.same_key_retry_safe and not capabilities.absence_is_proof
    assert smtp.lookup(call()).status == LookupStatus.UNSUPPORTED
    assert smtp.preview(ACTION, EMAIL).summary == "Send email to ana@example.test: Your receipt"
    assert smtp.target_for(ACTION, EMAIL) == "ana@example.test"
    assert smtp.test_endpoint
    assert get_adapter(ACTION) is smtp
    assert ACTION in known_actions() and adapter_label(ACTION) == "SMTP"


def test_an_explicit_adapter_wins_over_the_smtp_configuration(settings: Any) -> None:
    settings.EFFECT_LEDGER_SMTP = {"email.send": {"host": "127.0.0.1", "port": 25, "from": "a@b.test"}}
    assert adapter_label("email.send") == "SMTP"
    settings.EFFECT_LEDGER_ADAPTERS = {"email.send": "operations.adapters.sandbox.SandboxEmailAdapter"}
    assert adapter_label("email.send") == "SandboxEmailAdapter"
    assert type(get_adapter("email.send")).__name__ == "SandboxEmailAdapter"


def test_queue_ids_of_known_servers() -> None:
    assert queue_id("2.0.0 Ok: queued as 4F2B81234") == "4F2B81234"
    assert queue_id("OK id=1rABcD-000123-4E") == "1rABcD-000123-4E"
    assert queue_id("2.0.0 x7QJ1ABC012345 Message accepted for delivery") == "x7QJ1ABC012345"
    assert queue_id("OK") == ""


# --- configuration ------------------------------------------------------------------------------

GOOD = {"host": "smtp.example.test", "port": 587, "from": "ledger@example.test"}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"port": 587, "from": "a@b.test"}, "EFFECT_LEDGER_SMTP['mail.notify'] needs a 'host'"),
        ({**GOOD, "host": ""}, "['host'] must be a host name"),
        ({**GOOD, "port": 0}, "['port'] must be an integer from 1 to 65535"),
        ({**GOOD, "port": 70000}, "['port'] must be an integer from 1 to 65535"),
        ({**GOOD, "port": "587"}, "['port'] must be an integer from 1 to 65535"),
        ({**GOOD, "from": "not an address"}, "['from'] must be one address"),
        ({**GOOD, "from": "a@b.test\r\nBcc: eve@x.test"}, "['from'] must be one address"),
        ({**GOOD, "username": "env:U", "password": "hunter2"}, "['password'] must name a secret"),
        ({**GOOD, "username": "ledger", "password": "env:P"}, "['username'] must name a secret"),
        ({**GOOD, "password": "env:P"}, "needs both 'username' and 'password'"),
        ({**GOOD, "starttls": "yes"}, "['starttls'] must be true or false"),
        ({**GOOD, "starttls": True, "ssl": True}, "choose one"),
        ({**GOOD, "timeout_seconds": 0}, "['timeout_seconds'] must be a positive number"),
        ({**GOOD, "retries": 3}, "unknown fields ['retries']"),
        ("smtp://x", "must be a dict"),
    ],
)
def test_configuration_refusals_name_the_action_and_the_field(
    settings: Any, entry: Any, message: str
) -> None:
    settings.EFFECT_LEDGER_SMTP = {ACTION: entry}
    with pytest.raises(ImproperlyConfigured) as raised:
        smtp_config()
    assert message in str(raised.value)
    assert "mail.notify" in str(raised.value)
    assert "hunter2" not in str(raised.value)


def test_an_action_has_one_provider(settings: Any) -> None:
    settings.EFFECT_LEDGER_SMTP = {ACTION: GOOD}
    settings.EFFECT_LEDGER_GENERIC_HTTP = {ACTION: {"url": "http://127.0.0.1:9/x"}}
    with pytest.raises(ImproperlyConfigured, match="also in EFFECT_LEDGER_GENERIC_HTTP"):
        smtp_config()
    assert adapter_label(ACTION) == "generic HTTP"  # the first configuration read answers


# --- C25 through the ledger -----------------------------------------------------------------------


@pytest.fixture
def ledger_mail(settings: Any, mail_server: MailServer) -> MailServer:
    """``mail.notify`` served by the SMTP adapter against the test server, no approval."""
    settings.EFFECT_LEDGER_SMTP = {ACTION: mail_server.entry(timeout_seconds=1.0, test_mode=True)}
    settings.EFFECT_LEDGER_POLICIES = {ACTION: {"approval": "never"}}
    return mail_server


@pytest.mark.django_db
def test_c25_one_message_per_intent_and_redelivery_sends_nothing(ledger_mail: MailServer) -> None:
    # given: two intents (two business references)
    first = submit(action=ACTION, arguments={**EMAIL, "reference": "order-1"}, reference="order-1")
    second = submit(action=ACTION, arguments={**EMAIL, "reference": "order-2"}, reference="order-2")
    # when: each is executed, then delivered again
    labels = [execute_intent(first.id), execute_intent(second.id)]
    again = [execute_intent(first.id), execute_intent(second.id)]
    # then: two messages, one per intent, each carrying its intent's key
    assert labels == ["succeeded", "succeeded"] and again == ["duplicate", "duplicate"]
    keys = [key_from_message_id(r.message["Message-ID"]) for r in ledger_mail.received]
    first.refresh_from_db()
    second.refresh_from_db()
    assert keys == [first.idempotency_key, second.idempotency_key]
    assert first.outcomes.get().provider_reference == "Q1"  # the relay's queue id


@pytest.mark.django_db
@pytest.mark.parametrize("fault", ["drop", "stall"])
def test_c25_dropped_before_the_final_reply_is_unknown_for_an_operator(
    ledger_mail: MailServer, fault: str
) -> None:
    # given: the relay takes the message, then drops the connection (or stalls past the
    # deadline) before its final 250
    ledger_mail.handler.after_data, ledger_mail.handler.stall_seconds = fault, 3.0
    intent = submit(action=ACTION, arguments={**EMAIL, "reference": "order-7"}, reference="order-7")
    # when
    label = execute_intent(intent.id)
    # then: UNKNOWN (no keys, no lookup: absence is never proof), in the operators' queue with
    # the reason, and our key in the Message-ID of the one message the relay holds
    intent.refresh_from_db()
    assert (label, intent.status) == ("unknown", Intent.Status.UNKNOWN)
    reason = "connection dropped" if fault == "drop" else "deadline"
    assert reason in intent.last_error and "may have been accepted" in intent.last_error
    assert intent in unknown_queue(scope=EVERY_TENANT)
    [received] = ledger_mail.received
    assert received.message["Message-ID"] == message_id_for(intent.idempotency_key)

    # when: the relay behaves again, the intent is delivered again, and the reconciler passes
    ledger_mail.handler.after_data = "reply"
    assert execute_intent(intent.id) == "duplicate"
    for _ in range(3):
        Intent.objects.filter(id=intent.id).update(next_lookup_at=Now())  # due for a lookup now
        reconcile_pass()
    # then: nothing was sent again; the lookups said "unsupported" and it is still UNKNOWN
    intent.refresh_from_db()
    assert intent.status == Intent.Status.UNKNOWN
    assert len(ledger_mail.received) == 1
    lookups = Evidence.objects.filter(intent=intent, kind=Evidence.Kind.LOOKUP)
    assert lookups.exists() and {e.result for e in lookups} == {LookupStatus.UNSUPPORTED.value}

    # when: an operator says "absent" without accepting the duplicate risk
    operator: Any = UserFactory(username="olga", groups=["operator"])
    with pytest.raises(ResolutionRefused, match="does not deduplicate on our key"):
        resolve_absent(intent_id=intent.id, user=operator, reason="not in the mailbox")
    intent.refresh_from_db()
    assert intent.status == Intent.Status.UNKNOWN
    # then with it: READY, sent again with the same key (the person's decision, recorded)
    resolved = resolve_absent(
        intent_id=intent.id, user=operator, reason="not in the mailbox", accept_duplicate_risk=True
    )
    assert resolved.status == Intent.Status.READY
    assert execute_intent(settled(resolved).id) == "succeeded"
    assert [r.message["Message-ID"] for r in ledger_mail.received] == [
        message_id_for(intent.idempotency_key)
    ] * 2
