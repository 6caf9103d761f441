"""Issue 33 items 1-3: a provider's contract declared in configuration — keys or none, JSON or
form bodies, credentials named not written, a lookup read through JSON pointers, a compensation
built from the original — checked at start-up with the action and field named, and run against
a real HTTP server on loopback that records what it was sent."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from django.core.exceptions import ImproperlyConfigured
from hypothesis import given
from hypothesis import strategies as st

from operations.adapters.base import ExecutionCall, LookupStatus
from operations.adapters.contract import parse_contract
from operations.adapters.declared_actions import generic_http_adapter, generic_http_config
from operations.adapters.errors import RetryableError, TerminalError
from operations.adapters.json_pointer import resolve_pointer
from operations.adapters.templates import form_pairs, render, render_url

KEY = "k-5b1c"


@dataclass
class Recorder:
    """A loopback HTTP server answering from ``routes`` (path -> (status, JSON body or bytes))
    and recording each request: method, path, query, headers, raw body."""

    url: str = ""
    routes: dict[str, tuple[int, Any]] = field(default_factory=dict)
    seen: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    state = Recorder()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            parts = urlsplit(self.path)
            state.seen.append(
                {
                    "method": self.command,
                    "path": parts.path,
                    "query": dict(parse_qsl(parts.query)),
                    "headers": dict(self.headers.items()),
                    "body": raw,
                }  # fmt: skip
            )
            status, body = state.routes.get(parts.path, (404, {"error": {"code": "not_found"}}))
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


def call(
    arguments: dict[str, Any], *, reference: str = "order-77", action: str = "acme.charge"
) -> ExecutionCall:
    return ExecutionCall(
        intent_id="6f0c8f9e-0000-4000-8000-000000000001",
        action=action,
        action_version=1,
        arguments=arguments,
        idempotency_key=KEY,
        fence=3,
        attempt_no=1,
        deadline_seconds=5.0,
        reference=reference,
    )


CHARGE = {"amount": 1200, "currency": "EUR", "customer": "cus_9"}


def stripe_like(url: str, **extra: Any) -> dict[str, Any]:
    """A Stripe-shaped declaration (form body, bearer secret, key sent but not trusted)."""
    return {
        "url": f"{url}/v1/charges",
        "encoding": "form",
        "auth": {"scheme": "bearer", "secret": "env:ACME_TEST_KEY"},
        "keys": {"header": "Idempotency-Key", "deduplicates": False},
        "body": {
            "amount": "{amount}",
            "currency": "{currency|lower}",
            "customer": "{customer}",
            "description": "{description}",
            "metadata": {"reference": "{reference}", "idempotency_key": "{idempotency_key}"},
        },
        "lookup": {
            "url": f"{url}/v1/charges?customer={{customer}}&limit=100",
            "by": "reference",
            "items": "/data",
            "fields": {
                "id": "/id",
                "status": "/status",
                "reference": "/metadata/reference",
                "idempotency_key": "/metadata/idempotency_key",
            },
            "proving_statuses": ["succeeded"],
            "consistency_window_seconds": 30,
        },
        "compensation": {
            "action": "acme.refund",
            "arguments": {"charge": "{provider_reference}", "amount": "{amount}", "currency": "{currency}"},
        },
        **extra,
    }


def adapter_for(settings: Any, entry: dict[str, Any], action: str = "acme.charge") -> Any:
    settings.EFFECT_LEDGER_GENERIC_HTTP = {action: entry}
    adapter = generic_http_adapter(action)
    assert adapter is not None
    return adapter


# --- the contract becomes capabilities -----------------------------------------------------


def test_i33_1_an_api_without_keys_is_never_safe_to_resend_and_its_absence_proves_nothing(
    settings: Any,
) -> None:
    adapter = adapter_for(settings, stripe_like("http://127.0.0.1:9"))
    capabilities = adapter.capabilities_for("acme.charge")
    assert not capabilities.same_key_retry_safe
    assert capabilities.duplicates_possible
    assert not capabilities.absence_is_proof
    assert capabilities.lookup == "eventual"
    assert capabilities.consistency_window_seconds == 30
    assert capabilities.list_by_reference
    assert capabilities.compensation_action == "acme.refund"


def test_an_entry_written_before_the_contract_means_what_it_meant(settings: Any) -> None:
    adapter = adapter_for(
        settings, {"url": "http://x.test/t", "lookup_url": "http://x.test/t/{idempotency_key}"}
    )
    capabilities = adapter.capabilities_for("acme.charge")
    assert capabilities.same_key_retry_safe and capabilities.absence_is_proof
    assert capabilities.consistency_window_seconds == 0


# --- start-up refusals, the action and the field named ----------------------------------------


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        (
            {"url": "http://x.test", "headers": {"Authorization": "Bearer sk_live_123"}},
            "['headers']['Authorization'] must name a secret",
        ),
        (
            {"url": "http://x.test", "auth": {"scheme": "bearer", "secret": "sk_live_123"}},
            "['auth']['secret'] must name a secret",
        ),
        ({"url": "http://x.test", "auth": {"scheme": "digest", "secret": "env:X"}}, "['auth'] must be"),
        (
            {"url": "http://x.test", "auth": {"scheme": "basic", "secret": "file:relative/path"}},
            "must name a secret",
        ),
        ({"url": "http://x.test", "encoding": "xml"}, "['encoding'] must be 'json' or 'form'"),
        ({"url": "http://x.test", "keys": "sometimes"}, "['keys'] must be 'none'"),
        (
            {"url": "http://x.test", "keys": {"header": "", "deduplicates": True}},
            "['keys'] needs a header name",
        ),
        (
            {"url": "http://x.test", "keys": "none", "fence_header": "X-Fence"},
            "['fence_header'] needs a provider that deduplicates",
        ),
        (
            {"url": "http://x.test", "lookup": {"url": "http://x.test/l", "by": "reference"}},
            "lists by reference but neither",
        ),
        ({"url": "http://x.test", "lookup": {"url": "http://x.test/l", "by": "whim"}}, "['by'] must be"),
        (
            {"url": "http://x.test", "lookup": {"url": "http://x.test/l", "fields": {"id": "id"}}},
            "['fields'] must map",
        ),
        (
            {"url": "http://x.test", "lookup": {"url": "http://x.test/l", "fields": {"colour": "/c"}}},
            "['fields'] must map",
        ),
        (
            {"url": "http://x.test", "lookup": {"url": "http://x.test/l", "fields": {"status": "/s"}}},
            "needs 'id'",
        ),
        (
            {"url": "http://x.test", "lookup": {"url": "http://x.test/l", "proving_statuses": ["ok"]}},
            "needs 'status'",
        ),
        (
            {"url": "http://x.test", "lookup": {"url": "http://x.test/l", "consistency_window_seconds": -1}},
            "seconds from 0",
        ),
        (
            {"url": "http://x.test", "lookup": {"url": "http://x.test/l"}, "lookup_url": "http://x.test/k"},
            "both 'lookup' and 'lookup_url'",
        ),
        ({"url": "http://x.test", "compensation": {"action": "acme.charge"}}, "cannot undo itself"),
        ({"url": "http://x.test", "body": ["amount"]}, "['body'] must be an object template"),
        ({"url": "http://x.test", "test_mode": "yes"}, "['test_mode'] must be true or false"),
        ({"url": "http://x.test", "colour": "blue"}, "unknown fields ['colour']"),
        ({"url": ""}, "needs a 'url'"),
        # what goes on the wire (found by a newcomer's try)
        ({"url": "ftp://x.test/t"}, "['url'] must be an absolute http:// or https:// URL"),
        ({"url": "/echo"}, "['url'] must be an absolute"),
        ({"url": "http://{host}:8620/echo"}, "['url'] may hold placeholders in its path and query only"),
        ({"url": "http://{user}@x.test/echo"}, "never in its host, port or user"),
        ({"url": "http://x.test/{tickets"}, "['url'] has braces that are not a placeholder"),
        ({"url": "http://x.test/t", "body": {"title": "{title|title}"}}, "['body'] has braces"),
        (
            {
                "url": "http://x.test/t",
                "schema": {"type": "object", "properties": {"a": {}}, "additionalProperties": False},
                "body": {"a": "{nope}"},
            },
            "['body'] names ['nope']",
        ),  # fmt: skip
        ({"url": "http://x.test/t", "headers": {"X-Tenant": "acme\r\nX-Injected: 1"}}, "cannot carry"),
        ({"url": "http://x.test/t", "headers": {"Bad Name": "v"}}, "is not a header name"),
        (
            {"url": "http://x.test/t", "headers": {"Host": "evil.test"}},
            "names Host, which the transport writes",
        ),
        ({"url": "http://x.test/t", "headers": {"X-Auth-Token": "tok_live_123"}}, "must name a secret"),
        ({"url": "http://x.test/t", "headers": {"Private-Token": "sk_live_123"}}, "must name a secret"),
        (
            {"url": "http://x.test/t", "keys": {"header": "Idem\nKey"}},
            "['keys']['header'] is not a header name",
        ),
        (
            {"url": "http://x.test/t", "timeout_seconds": "abc"},
            "['timeout_seconds'] must be a number of seconds",
        ),
        ({"url": "http://x.test/t", "timeout_seconds": 0}, "['timeout_seconds'] must be"),
        ({"url": "http://x.test/t", "timeout_seconds": True}, "['timeout_seconds'] must be"),
        ({"url": "http://x.test/t", "timeout_seconds": 1e6}, "['timeout_seconds'] must be"),
        ({"url": "http://x.test/t", "versions": []}, "['versions'] must be a list of integers"),
        ({"url": "http://x.test/t", "versions": [0, "x"]}, "['versions'] must be"),
        ({"url": "http://x.test/t", "id_field": "/data/id"}, "['id_field'] must be the name of a member"),
        ({"url": "http://x.test/t", "schema": {"type": "nonsense"}}, "['schema'] is not a JSON Schema"),
        ({"url": "http://x.test/t", "schema": "x"}, "['schema'] must be a JSON Schema object"),
        (
            {"url": "http://x.test/t", "lookup": {"url": "http://{host}/l"}},
            "['lookup']['url'] may hold placeholders",
        ),
        (
            {
                "url": "http://x.test/t",
                "schema": {"type": "object", "properties": {"a": {}}, "additionalProperties": False},
                "compensation": {"action": "x.undo", "arguments": {"id": "{provider_reference}", "b": "{b}"}},
            },
            "['compensation']['arguments'] names ['b']",
        ),  # fmt: skip
    ],
)
def test_i33_a_malformed_contract_is_refused_at_start_up_naming_action_and_field(
    settings: Any, entry: dict[str, Any], words: str
) -> None:
    settings.EFFECT_LEDGER_GENERIC_HTTP = {"acme.charge": entry}
    with pytest.raises(ImproperlyConfigured) as raised:
        generic_http_config()
    assert "EFFECT_LEDGER_GENERIC_HTTP['acme.charge']" in str(raised.value)
    assert words in str(raised.value)
    assert "sk_live_123" not in str(raised.value) and "tok_live_123" not in str(raised.value)  # never echoed


# --- templates, form encoding, pointers --------------------------------------------------


def test_templates_keep_types_drop_missing_optionals_and_filter() -> None:
    values = {"amount": 1200, "currency": "EUR", "reference": "ord/1 &x", "customer": "cus_9"}
    body = render({"amount": "{amount}", "currency": "{currency|lower}", "note": "{description}",
                   "text": "Order {reference}", "list": ["{amount}", "{missing}"]}, values)  # fmt: skip
    assert body == {"amount": 1200, "currency": "eur", "text": "Order ord/1 &x", "list": [1200]}
    assert (
        render_url("https://p.test/v1/c?ref={reference}", values) == "https://p.test/v1/c?ref=ord%2F1%20%26x"
    )
    with pytest.raises(Exception, match="names \\{description\\}"):
        render_url("https://p.test/{description}", values)


def test_form_encoding_nests_the_way_stripe_reads_it() -> None:
    pairs = form_pairs(
        {"amount": 1200, "metadata": {"reference": "o-1", "n": None}, "tags": ["a", "b"], "capture": False}
    )
    assert pairs == [
        ("amount", "1200"),
        ("metadata[reference]", "o-1"),
        ("tags[0]", "a"),
        ("tags[1]", "b"),
        ("capture", "false"),
    ]


def test_json_pointer_follows_rfc_6901_examples() -> None:
    # RFC 6901 §5's document and pointers
    doc = {
        "foo": ["bar", "baz"],
        "": 0,
        "a/b": 1,
        "c%d": 2,
        "e^f": 3,
        "g|h": 4,
        "i\\j": 5,
        'k"l': 6,
        " ": 7,
        "m~n": 8,
    }
    assert resolve_pointer(doc, "") == doc
    assert resolve_pointer(doc, "/foo") == ["bar", "baz"]
    assert resolve_pointer(doc, "/foo/0") == "bar"
    assert resolve_pointer(doc, "/") == 0
    assert resolve_pointer(doc, "/a~1b") == 1
    assert resolve_pointer(doc, "/m~0n") == 8
    assert resolve_pointer(doc, "/ ") == 7
    assert resolve_pointer(doc, "/foo/01") is None and resolve_pointer(doc, "/foo/2") is None
    assert resolve_pointer(doc, "/foo/0/deeper") is None
    with pytest.raises(ValueError):
        resolve_pointer(doc, "foo")


@given(st.dictionaries(st.text(max_size=8), st.integers(), min_size=1, max_size=5))
def test_json_pointer_escaping_round_trips(document: dict[str, int]) -> None:
    for key, value in document.items():
        assert resolve_pointer(document, "/" + key.replace("~", "~0").replace("/", "~1")) == value


# --- execute: what reaches the provider ---------------------------------------------------


def test_i33_2_a_form_body_with_a_named_credential_and_no_trusted_key(
    settings: Any, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given
    monkeypatch.setenv("ACME_TEST_KEY", "sk_test_from_env")
    recorder.routes["/v1/charges"] = (200, {"id": "ch_1", "status": "succeeded"})
    adapter = adapter_for(settings, stripe_like(recorder.url))

    # when
    result = adapter.execute(call(CHARGE))

    # then
    (seen,) = recorder.seen
    assert seen["headers"]["Content-Type"] == "application/x-www-form-urlencoded"
    assert seen["headers"]["Authorization"] == "Bearer sk_test_from_env"
    assert seen["headers"]["Idempotency-Key"] == KEY
    assert sorted(parse_qsl(seen["body"].decode())) == sorted([
        ("amount", "1200"), ("currency", "eur"), ("customer", "cus_9"),
        ("metadata[reference]", "order-77"), ("metadata[idempotency_key]", KEY),
    ])  # fmt: skip
    assert result.provider_reference == "ch_1"


def test_no_key_header_is_sent_to_an_api_without_keys(settings: Any, recorder: Recorder) -> None:
    recorder.routes["/t"] = (201, {"id": 7})
    adapter = adapter_for(settings, {"url": f"{recorder.url}/t", "keys": "none"})
    assert adapter.execute(call(CHARGE)).provider_reference == "7"
    assert "Idempotency-Key" not in recorder.seen[0]["headers"]
    assert json.loads(recorder.seen[0]["body"]) == CHARGE


def test_basic_and_header_credentials_from_a_file(settings: Any, recorder: Recorder, tmp_path: Any) -> None:
    secret = tmp_path / "key"
    secret.write_text("user-1:pa55\n")
    recorder.routes["/t"] = (200, {"id": "x"})
    adapter = adapter_for(
        settings, {"url": f"{recorder.url}/t", "auth": {"scheme": "basic", "secret": f"file:{secret}"}}
    )
    adapter.execute(call(CHARGE))
    assert recorder.seen[-1]["headers"]["Authorization"] == "Basic dXNlci0xOnBhNTU="
    adapter = adapter_for(
        settings,
        {
            "url": f"{recorder.url}/t",
            "auth": {"scheme": "header", "header": "X-Api-Key", "secret": f"file:{secret}"},
        },
    )
    adapter.execute(call(CHARGE))
    assert recorder.seen[-1]["headers"]["X-Api-Key"] == "user-1:pa55"


def test_an_unreadable_secret_sends_nothing_and_names_only_the_reference(
    settings: Any, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ACME_TEST_KEY", raising=False)
    adapter = adapter_for(settings, stripe_like(recorder.url))
    with pytest.raises(RetryableError, match="env:ACME_TEST_KEY") as raised:
        adapter.execute(call(CHARGE))
    assert raised.value.detail["code"] == "secret_unavailable"
    assert recorder.seen == []
    assert adapter.lookup(call(CHARGE)).status == LookupStatus.INCONCLUSIVE
    assert recorder.seen == []


def test_a_url_naming_a_value_the_intent_lacks_is_terminal_and_sends_nothing(
    settings: Any, recorder: Recorder
) -> None:
    adapter = adapter_for(settings, {"url": f"{recorder.url}/accounts/{{account}}/t"})
    with pytest.raises(TerminalError) as raised:
        adapter.execute(call(CHARGE))
    assert raised.value.detail["code"] == "template_value_missing"
    assert recorder.seen == []


def test_compensation_arguments_come_from_the_template(settings: Any) -> None:
    adapter = adapter_for(settings, stripe_like("http://127.0.0.1:9"))
    assert adapter.compensation_arguments("acme.charge", {**CHARGE, "reference": "o"}, "ch_1") == {
        "charge": "ch_1", "amount": 1200, "currency": "EUR",
    }  # fmt: skip
    plain = adapter_for(settings, {"url": "http://127.0.0.1:9/t"})
    with pytest.raises(NotImplementedError):
        plain.compensation_arguments("acme.charge", CHARGE, "x")


# --- lookup: reading a real answer ----------------------------------------------------------


def listing(*items: dict[str, Any]) -> tuple[int, Any]:
    return 200, {"object": "list", "data": list(items), "has_more": False}


def charge(
    id_: str, *, status: str = "succeeded", reference: str = "order-77", key: str = KEY
) -> dict[str, Any]:
    return {
        "id": id_,
        "object": "charge",
        "status": status,
        "metadata": {"reference": reference, "idempotency_key": key},
    }


@pytest.mark.parametrize(
    ("answer", "status", "references"),
    [
        (listing(charge("ch_1")), LookupStatus.FOUND, ("ch_1",)),
        # another intent's charge for another order, and one of ours that failed: not proof
        (
            listing(charge("ch_0", reference="order-1", key="k-other"), charge("ch_f", status="failed")),
            LookupStatus.NOT_FOUND_YET,
            (),
        ),
        # two effects of this intent's key: duplicates at a provider that does not deduplicate
        (listing(charge("ch_1"), charge("ch_2")), LookupStatus.FOUND, ("ch_1", "ch_2")),
        # another intent's charge under the same reference is not this intent's (the key says)
        (listing(charge("ch_9", key="k-other")), LookupStatus.NOT_FOUND_YET, ()),
        (listing(), LookupStatus.NOT_FOUND_YET, ()),
        ((404, {"error": {"code": "resource_missing"}}), LookupStatus.NOT_FOUND_YET, ()),
        ((410, {}), LookupStatus.WITHDRAWN, ()),
        ((500, {"error": {"code": "api_error"}}), LookupStatus.INCONCLUSIVE, ()),
        ((200, b"<html>maintenance</html>"), LookupStatus.INCONCLUSIVE, ()),
        ((200, {"object": "list", "data": {"not": "a list"}}), LookupStatus.INCONCLUSIVE, ()),
    ],
)
def test_i33_3_the_lookup_reads_a_listing_through_its_pointers(
    settings: Any,
    recorder: Recorder,
    monkeypatch: pytest.MonkeyPatch,
    answer: Any,
    status: str,
    references: tuple[str, ...],
) -> None:
    # given
    monkeypatch.setenv("ACME_TEST_KEY", "sk_test_from_env")
    recorder.routes["/v1/charges"] = answer
    adapter = adapter_for(settings, stripe_like(recorder.url))

    # when
    result = adapter.lookup(call(CHARGE))

    # then
    assert (result.status, result.provider_references) == (status, references)
    (seen,) = recorder.seen
    assert seen["method"] == "GET" and seen["query"] == {"customer": "cus_9", "limit": "100"}
    assert seen["headers"]["Authorization"] == "Bearer sk_test_from_env"


def test_a_listing_by_reference_without_a_reference_is_inconclusive(
    settings: Any, recorder: Recorder
) -> None:
    adapter = adapter_for(settings, {"url": f"{recorder.url}/t", "keys": "none",
                                     "lookup": {"url": f"{recorder.url}/t?ref={{reference}}", "by": "reference"}})  # fmt: skip
    assert adapter.lookup(call(CHARGE, reference="")).detail["code"] == "no_reference"
    assert recorder.seen == []


def test_an_authoritative_lookup_by_key_proves_absence_only_where_keys_are_honoured(
    settings: Any, recorder: Recorder
) -> None:
    recorder.routes["/t/k-5b1c"] = (404, {})
    entry = {"url": f"{recorder.url}/t",
             "lookup": {"url": f"{recorder.url}/t/{{idempotency_key}}", "by": "key", "authoritative": True}}  # fmt: skip
    adapter = adapter_for(settings, entry)
    assert adapter.lookup(call(CHARGE)).status == LookupStatus.ABSENT
    assert adapter.capabilities_for("acme.charge").absence_is_proof
    adapter = adapter_for(settings, {**entry, "keys": "none"})
    assert not adapter.capabilities_for("acme.charge").absence_is_proof  # a late request may still land


def test_a_declared_contract_is_validated_once_per_configuration(settings: Any) -> None:
    contract = parse_contract("acme.charge", stripe_like("http://127.0.0.1:9"))
    assert contract.keys.deduplicates is False and contract.encoding == "form"
    assert contract.lookup is not None and contract.lookup.by == "reference"


@pytest.mark.parametrize(
    ("variable", "content", "words"),
    [
        (
            "EFFECT_LEDGER_GENERIC_HTTP_FILE",
            {"acme.charge": {"url": "https://p.test", "headers": {"Authorization": "Bearer sk_live_1"}}},
            "EFFECT_LEDGER_GENERIC_HTTP['acme.charge']['headers']['Authorization'] must name a secret",
        ),
        (
            "EFFECT_LEDGER_SMTP_FILE",
            {"mail.send": {"host": "smtp.test", "port": 587, "from": "a@b.test", "password": "hunter2"}},
            "EFFECT_LEDGER_SMTP['mail.send']",
        ),
    ],
)
def test_i33_a_malformed_declaration_file_stops_the_process_at_start_up(
    tmp_path: Any, variable: str, content: dict[str, Any], words: str
) -> None:
    # given: a declaration file with a mistake, as a deployment would name it
    import os
    import subprocess
    import sys
    from pathlib import Path

    declared = tmp_path / "providers.json"
    declared.write_text(json.dumps(content))
    env = {**os.environ, variable: str(declared)}
    # when: any process starts (here `manage.py check`)
    run = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # then: it refuses to start, naming the action and the field, never echoing the secret
    assert run.returncode != 0
    assert words in run.stderr
    assert "sk_live_1" not in run.stderr and "hunter2" not in run.stderr


@pytest.mark.parametrize("secret", ["s\u00e9cret-\u00fcn\u00efcode", "abc\r\nX-Injected: 1"])
def test_a_secret_that_cannot_travel_in_a_header_is_terminal_names_only_its_reference_and_sends_nothing(
    settings: Any, recorder: Recorder, monkeypatch: pytest.MonkeyPatch, secret: str
) -> None:
    # given
    monkeypatch.setenv("ACME_TEST_KEY", secret)
    adapter = adapter_for(settings, stripe_like(recorder.url))
    # when
    with pytest.raises(TerminalError) as raised:
        adapter.execute(call(CHARGE))
    # then: FAILED-worthy, not UNKNOWN; the value is nowhere in what is recorded
    assert raised.value.detail == {"code": "secret_unusable"}
    assert "env:ACME_TEST_KEY" in str(raised.value) and secret not in str(raised.value)
    assert "\u00fcn\u00efcode" not in str(raised.value) and "Injected" not in str(raised.value)
    assert recorder.seen == []
    looked = adapter.lookup(call(CHARGE))
    assert looked.status == LookupStatus.INCONCLUSIVE and "Injected" not in str(looked.detail)


# --- a compensation that cannot be built or opened is refused, never a 500 ----------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("compensation", "words"),
    [
        (
            {"action": "acme.undo", "arguments": {"transfer": "{provider_reference}"}},
            "is not served by this deployment",
        ),
        ({"action": "acme.refund", "arguments": {"charge": "pre-{note}"}}, "names {note}"),
        ({"action": "acme.refund", "arguments": {"charge": "{provider_reference}"}}, "amount"),
    ],
)
def test_i33_a_compensation_that_cannot_be_opened_is_refused_and_changes_nothing(
    settings: Any, compensation: dict[str, Any], words: str
) -> None:
    # given: an UNKNOWN transfer whose declared compensation is unknown, lacks a value, or
    # builds arguments its action's schema refuses
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    from operations.exceptions import ResolutionRefused
    from operations.models import Intent
    from reconciliation.resolution import resolve_compensate
    from tests.console.conftest import make_unknown
    from tests.factories import UserFactory

    refund_schema = {"type": "object", "required": ["charge", "amount"],
                     "properties": {"charge": {"type": "string"}, "amount": {"type": "integer"}}}  # fmt: skip
    settings.EFFECT_LEDGER_GENERIC_HTTP = {
        "acme.charge": {"url": "http://127.0.0.1:9/c", "keys": "none", "compensation": compensation},
        "acme.refund": {"url": "http://127.0.0.1:9/r", "schema": refund_schema},
    }
    settings.EFFECT_LEDGER_POLICIES = {
        "acme.charge": {"approval": "never"},
        "acme.refund": {"approval": "never"},
    }
    intent = make_unknown(action="acme.charge", arguments=CHARGE)
    olga = UserFactory(username="olga", groups=["operator"])
    # when
    with pytest.raises(ResolutionRefused, match=words):
        resolve_compensate(intent_id=intent.id, user=olga, reason="undo", provider_reference="ch_1")
    # then: nothing changed, no compensation opened
    intent.refresh_from_db()
    assert intent.status == "UNKNOWN"
    assert not Intent.objects.filter(action__in=["acme.refund", "acme.undo"]).exists()
    if compensation["action"] == "acme.undo":
        with pytest.raises(SystemCheckError, match="operations.E005"):
            call_command("check")
