"""The sandbox and generic HTTP adapters against the real sandbox provider process: the retry
classification table (what ``execute`` raises for each fault) and what ``lookup`` proves."""

from __future__ import annotations

import socket
import time
import uuid
from typing import Any

import pytest

from operations.adapters.base import ExecutionCall, LookupKind, LookupStatus
from operations.adapters.errors import AdapterError, AmbiguousOutcome, RetryableError, TerminalError
from operations.adapters.generic_http import GenericHttpAdapter
from operations.adapters.registry import get_adapter, known_actions
from operations.adapters.sandbox import (
    SandboxEmailAdapter,
    SandboxPaymentsAdapter,
    SandboxReservationsAdapter,
    message_id_for,
)
from tests.support.processes import SandboxProvider

ARGUMENTS = {
    "payments.charge": {"amount": 12000, "currency": "EUR", "customer": "cus_42", "reference": "order-7"},
    "email.send": {
        "to": "ana@example.com",
        "subject": "Your order",
        "body": "Shipped.",
        "reference": "order-7",
    },
    "reservations.create": {
        "resource": "room-1",
        "start": "2026-01-01T10:00:00Z",
        "seats": 2,
        "reference": "order-7",
    },
}
ADAPTERS = {
    "payments.charge": SandboxPaymentsAdapter,
    "email.send": SandboxEmailAdapter,
    "reservations.create": SandboxReservationsAdapter,
}
PRODUCTS = {"payments.charge": "payments", "email.send": "email", "reservations.create": "reservations"}


def make_call(
    action: str,
    arguments: dict[str, Any] | None = None,
    *,
    key: str | None = None,
    fence: int = 1,
    deadline: float = 5.0,
    reference: str = "",
) -> ExecutionCall:
    return ExecutionCall(
        intent_id=str(uuid.uuid4()),
        action=action,
        action_version=1,
        arguments=arguments if arguments is not None else ARGUMENTS[action],
        idempotency_key=key or f"acme:{action}:1:{uuid.uuid4()}",
        fence=fence,
        attempt_no=1,
        deadline_seconds=deadline,
        reference=reference,
    )


def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# --- the retry classification table -----------------------------------------------------------

FAULT_TABLE = [
    # (fault mode, delay_seconds, adapter deadline, raised, effects applied)
    ("crash_before_effect", None, 5.0, AmbiguousOutcome, 0),
    ("crash_after_effect", None, 5.0, AmbiguousOutcome, 1),
    ("delay_after_effect", 1.0, 0.3, AmbiguousOutcome, 1),
    ("error_500_before_effect", None, 5.0, AmbiguousOutcome, 0),
    ("error_500_after_effect", None, 5.0, AmbiguousOutcome, 1),
    ("in_progress", None, 5.0, AmbiguousOutcome, 0),
    ("hold_before_effect", 0.8, 0.3, AmbiguousOutcome, 0),
    ("hold_after_effect", 0.8, 0.3, AmbiguousOutcome, 1),
]


@pytest.mark.parametrize("action", list(ADAPTERS))
@pytest.mark.parametrize(("mode", "delay", "deadline", "raised", "applied"), FAULT_TABLE)
def test_execute_classifies_every_fault_mode(
    sandbox: SandboxProvider,
    action: str,
    mode: str,
    delay: float | None,
    deadline: float,
    raised: type[AdapterError],
    applied: int,
) -> None:
    # given
    sandbox.inject(mode, product=PRODUCTS[action], delay_seconds=delay)
    adapter = ADAPTERS[action]()

    # when
    with pytest.raises(AdapterError) as caught:
        adapter.execute(make_call(action, deadline=deadline))
    time.sleep((delay or 0) + 0.3)

    # then
    assert type(caught.value) is raised
    if mode == "in_progress":
        assert caught.value.detail["code"] == "request_in_progress"
    assert len(sandbox.ledger(PRODUCTS[action])) == applied


@pytest.mark.parametrize("action", list(ADAPTERS))
def test_execute_raises_retryable_when_the_provider_is_unreachable(
    sandbox: SandboxProvider, settings: Any, action: str
) -> None:
    # given
    settings.SANDBOX_PROVIDER_URL = closed_port_url()

    # when
    with pytest.raises(RetryableError) as caught:
        ADAPTERS[action]().execute(make_call(action))

    # then
    assert caught.value.detail["code"] == "not_sent"
    assert sandbox.ledger() == []


def test_payments_success_sends_key_and_fence_and_a_replay_is_flagged(sandbox: SandboxProvider) -> None:
    # given
    adapter, call = SandboxPaymentsAdapter(), make_call("payments.charge", fence=3)

    # when
    first = adapter.execute(call)
    second = adapter.execute(call)

    # then
    (effect,) = sandbox.ledger("payments")
    assert effect["id"] == first.provider_reference == second.provider_reference
    assert (effect["idempotency_key"], effect["fence"]) == (call.idempotency_key, 3)
    assert effect["metadata"] == {}  # nothing that changes when an intent is re-created (issue 22)
    assert (first.replayed, second.replayed) == (False, True)
    assert first.response_digest == second.response_digest and len(first.response_digest) == 64
    assert first.detail["amount"] == 12000


@pytest.mark.parametrize(
    ("arguments", "fence", "code"),
    [
        ({**ARGUMENTS["payments.charge"], "customer": "cus_declined"}, 1, "card_declined"),
        ({**ARGUMENTS["payments.charge"], "amount": 1}, 5, "idempotency_key_reused"),
    ],
)
def test_payments_definite_refusals_are_terminal(
    sandbox: SandboxProvider, arguments: dict[str, Any], fence: int, code: str
) -> None:
    # given: the key was used once with fence 5
    adapter, key = SandboxPaymentsAdapter(), f"k-{uuid.uuid4()}"
    if code != "card_declined":
        adapter.execute(make_call("payments.charge", key=key, fence=5))

    # when
    with pytest.raises(TerminalError) as caught:
        adapter.execute(make_call("payments.charge", arguments, key=key, fence=fence))

    # then
    assert caught.value.detail["code"] == code
    assert len(sandbox.ledger("payments")) == (0 if code == "card_declined" else 1)


def test_i22_2_payments_stale_fence_is_ambiguous_a_newer_attempt_exists(sandbox: SandboxProvider) -> None:
    # given: the key was charged once with fence 5
    adapter, key = SandboxPaymentsAdapter(), f"k-{uuid.uuid4()}"
    adapter.execute(make_call("payments.charge", key=key, fence=5))

    # when: an attempt with the lower fence 4 arrives
    with pytest.raises(AmbiguousOutcome) as caught:
        adapter.execute(make_call("payments.charge", key=key, fence=4))

    # then: not a refusal (the newer attempt's charge exists), and nothing more was applied
    assert not isinstance(caught.value, TerminalError)
    assert caught.value.detail["code"] == "stale_fence"
    assert len(sandbox.ledger("payments")) == 1


def test_refund_of_unknown_charge_is_terminal(sandbox: SandboxProvider) -> None:
    # when
    with pytest.raises(TerminalError) as caught:
        SandboxPaymentsAdapter().execute(
            make_call("payments.refund", {"charge": "ch_missing", "amount": 100, "currency": "EUR"})
        )

    # then
    assert caught.value.detail == {"code": "resource_missing", "status": 404}


def test_payments_compensation_refund_undoes_the_charge(sandbox: SandboxProvider) -> None:
    # given
    adapter = SandboxPaymentsAdapter()
    charge = adapter.execute(make_call("payments.charge"))
    refund_args = adapter.compensation_arguments(
        "payments.charge", ARGUMENTS["payments.charge"], charge.provider_reference
    )

    # when
    refund = adapter.execute(make_call("payments.refund", refund_args))

    # then
    assert refund.provider_reference.startswith("re_")
    assert [(e["kind"], e["amount"]) for e in sandbox.ledger("payments")] == [
        ("charge", 12000),
        ("refund", 12000),
    ]


# --- lookup: payments (authoritative) ----------------------------------------------------------


def test_payments_lookup_finds_a_charge_whose_response_was_lost(sandbox: SandboxProvider) -> None:
    # given
    adapter, call = SandboxPaymentsAdapter(), make_call("payments.charge")
    sandbox.inject("crash_after_effect", product="payments")
    with pytest.raises(AmbiguousOutcome):
        adapter.execute(call)

    # when
    result = adapter.lookup(call)

    # then
    assert result.status is LookupStatus.FOUND
    assert result.provider_references == (sandbox.ledger("payments")[0]["id"],)


def test_payments_lookup_proves_absence_after_crash_before_effect(sandbox: SandboxProvider) -> None:
    # given
    adapter, call = SandboxPaymentsAdapter(), make_call("payments.charge")
    sandbox.inject("crash_before_effect", product="payments")
    with pytest.raises(AmbiguousOutcome):
        adapter.execute(call)

    # when
    result = adapter.lookup(call)

    # then
    assert result.status is LookupStatus.ABSENT
    assert sandbox.ledger() == []


def test_payments_lookup_is_inconclusive_while_the_key_is_processing(sandbox: SandboxProvider) -> None:
    # given: the provider holds the key and applies late
    adapter, call = SandboxPaymentsAdapter(), make_call("payments.charge", deadline=0.3)
    sandbox.inject("delay_after_effect", product="payments", delay_seconds=1.0)
    with pytest.raises(AmbiguousOutcome):
        adapter.execute(call)

    # when
    during = adapter.lookup(call)
    time.sleep(1.0)
    after = adapter.lookup(call)

    # then
    assert during.status is LookupStatus.INCONCLUSIVE and during.detail["code"] == "request_in_progress"
    assert after.status is LookupStatus.FOUND


def test_payments_lookup_reports_withdrawn_and_declined(sandbox: SandboxProvider) -> None:
    # given
    adapter = SandboxPaymentsAdapter()
    charged = make_call("payments.charge")
    sandbox.withdraw("payments", adapter.execute(charged).provider_reference)
    declined = make_call("payments.charge", {**ARGUMENTS["payments.charge"], "customer": "cus_declined"})
    with pytest.raises(TerminalError):
        adapter.execute(declined)

    # when
    withdrawn_result, declined_result = adapter.lookup(charged), adapter.lookup(declined)

    # then
    assert withdrawn_result.status is LookupStatus.WITHDRAWN
    assert declined_result.status is LookupStatus.ABSENT and declined_result.detail["stored_status"] == 402


@pytest.mark.parametrize("action", list(ADAPTERS))
def test_lookup_is_inconclusive_when_the_provider_is_unreachable(
    sandbox: SandboxProvider, settings: Any, action: str
) -> None:
    # given
    settings.SANDBOX_PROVIDER_URL = closed_port_url()

    # when
    result = ADAPTERS[action]().lookup(make_call(action))

    # then
    assert result.status is LookupStatus.INCONCLUSIVE


# --- lookup: email (eventual) -------------------------------------------------------------------


def test_email_uses_the_key_as_message_id_and_duplicates_are_visible(sandbox: SandboxProvider) -> None:
    # given: a lost response, then a blind retry sends the email twice
    adapter, call = SandboxEmailAdapter(), make_call("email.send")
    sandbox.inject("crash_after_effect", product="email")
    with pytest.raises(AmbiguousOutcome):
        adapter.execute(call)
    adapter.execute(call)

    # when
    result = adapter.lookup(call)

    # then
    effects = sandbox.ledger("email")
    assert {e["message_id"] for e in effects} == {message_id_for(call.idempotency_key)}
    assert result.status is LookupStatus.FOUND
    assert set(result.provider_references) == {e["id"] for e in effects} and len(effects) == 2


def test_email_lookup_says_not_found_yet_while_the_read_path_lags(sandbox: SandboxProvider) -> None:
    # given
    sandbox.configure(email_lookup_lag_seconds=1.0)
    adapter, call = SandboxEmailAdapter(), make_call("email.send")
    sent = adapter.execute(call)

    # when
    early = adapter.lookup(call)
    time.sleep(1.2)
    late = adapter.lookup(call)

    # then
    assert early.status is LookupStatus.NOT_FOUND_YET
    assert late.status is LookupStatus.FOUND and late.provider_references == (sent.provider_reference,)


def test_email_lookup_reports_withdrawn(sandbox: SandboxProvider) -> None:
    # given
    adapter, call = SandboxEmailAdapter(), make_call("email.send")
    sandbox.withdraw("email", adapter.execute(call).provider_reference)

    # when
    result = adapter.lookup(call)

    # then
    assert result.status is LookupStatus.WITHDRAWN


# --- lookup: reservations (list by reference) ---------------------------------------------------


def test_reservations_lookup_lists_every_duplicate_by_reference(sandbox: SandboxProvider) -> None:
    # given: a lost response and a blind retry book twice
    adapter, call = SandboxReservationsAdapter(), make_call("reservations.create")
    sandbox.inject("error_500_after_effect", product="reservations")
    with pytest.raises(AmbiguousOutcome):
        adapter.execute(call)
    second = adapter.execute(call)

    # when
    result = adapter.lookup(call)
    listed = adapter.list_by_reference("order-7")

    # then
    ids = [e["id"] for e in sandbox.ledger("reservations")]
    assert result.status is LookupStatus.FOUND
    assert list(result.provider_references) == ids == listed and len(ids) == 2
    assert second.provider_reference == ids[1]


def test_reservations_lookup_uses_call_reference_before_arguments(sandbox: SandboxProvider) -> None:
    # given
    adapter = SandboxReservationsAdapter()
    arguments = {**ARGUMENTS["reservations.create"], "reference": "from-arguments"}
    adapter.execute(make_call("reservations.create", arguments))

    # when
    by_call = adapter.lookup(make_call("reservations.create", arguments, reference="from-call"))
    by_arguments = adapter.lookup(make_call("reservations.create", arguments))

    # then
    assert by_call.status is LookupStatus.NOT_FOUND_YET
    assert by_arguments.status is LookupStatus.FOUND


def test_reservations_empty_list_is_not_found_yet_never_absent(sandbox: SandboxProvider) -> None:
    # given: the only reservation was withdrawn, so the list is empty although it happened
    adapter, call = SandboxReservationsAdapter(), make_call("reservations.create")
    sandbox.withdraw("reservations", adapter.execute(call).provider_reference)

    # when
    result = adapter.lookup(call)

    # then
    assert result.status is LookupStatus.NOT_FOUND_YET
    assert result.detail["code"] == "empty_list"
    assert adapter.list_by_reference("order-7") == []
    assert len(sandbox.ledger("reservations")) == 1


def test_reservations_cancel_executes_and_is_found(sandbox: SandboxProvider) -> None:
    # given
    adapter = SandboxReservationsAdapter()
    booked = adapter.execute(make_call("reservations.create")).provider_reference
    cancel_args = adapter.compensation_arguments(
        "reservations.create", ARGUMENTS["reservations.create"], booked
    )
    cancel = make_call("reservations.cancel", cancel_args)

    # when
    before = adapter.lookup(cancel)
    result = adapter.execute(cancel)
    again = adapter.execute(cancel)
    after = adapter.lookup(cancel)

    # then
    assert before.status is LookupStatus.ABSENT
    assert result.provider_reference == again.provider_reference == booked
    assert after.status is LookupStatus.FOUND
    assert [e["status"] for e in sandbox.ledger("reservations")] == ["cancelled"]


def test_reservations_list_by_reference_raises_retryable_when_unreachable(
    sandbox: SandboxProvider, settings: Any
) -> None:
    # given
    settings.SANDBOX_PROVIDER_URL = closed_port_url()

    # when / then
    with pytest.raises(RetryableError):
        SandboxReservationsAdapter().list_by_reference("order-7")


# --- the generic HTTP adapter -----------------------------------------------------------------


@pytest.fixture
def acme_transfer(sandbox: SandboxProvider, settings: Any) -> GenericHttpAdapter:
    """``acme.transfer`` configured against the sandbox's key-honouring charges endpoint."""
    settings.EFFECT_LEDGER_GENERIC_HTTP = {
        "acme.transfer": {
            "url": f"{sandbox.url}/v1/charges",
            "lookup_url": f"{sandbox.url}/v1/charges?idempotency_key={{idempotency_key}}",
            "schema": {
                "type": "object",
                "properties": {"amount": {"type": "integer"}, "currency": {"type": "string"}},
                "required": ["amount", "currency"],
            },
            "timeout_seconds": 5,
            "headers": {"X-Tenant": "acme"},
            "fence_header": "X-Fencing-Token",
        }
    }
    adapter = get_adapter("acme.transfer")
    assert isinstance(adapter, GenericHttpAdapter)
    return adapter


def test_generic_adapter_is_registered_with_its_capabilities(acme_transfer: GenericHttpAdapter) -> None:
    # then
    assert "acme.transfer" in known_actions()
    assert acme_transfer.actions == ("acme.transfer",)
    assert acme_transfer.capabilities.idempotency_keys is True
    assert acme_transfer.capabilities.lookup is LookupKind.AUTHORITATIVE
    assert acme_transfer.capabilities.fences is True
    assert get_adapter("payments.charge").__class__ is SandboxPaymentsAdapter


def test_generic_adapter_executes_once_per_key_and_looks_up(
    sandbox: SandboxProvider, acme_transfer: GenericHttpAdapter
) -> None:
    # given
    call = make_call("acme.transfer", {**ARGUMENTS["payments.charge"], "reference": "t-1"})
    never_sent = make_call("acme.transfer", ARGUMENTS["payments.charge"])

    # when
    first, second = acme_transfer.execute(call), acme_transfer.execute(call)
    found, absent = acme_transfer.lookup(call), acme_transfer.lookup(never_sent)

    # then
    assert first.provider_reference == second.provider_reference and second.replayed is True
    assert found.status is LookupStatus.FOUND and found.provider_references == (first.provider_reference,)
    assert absent.status is LookupStatus.ABSENT
    assert len(sandbox.ledger("payments")) == 1


@pytest.mark.parametrize(
    ("fault", "raised"),
    [
        ("crash_after_effect", AmbiguousOutcome),
        ("error_500_before_effect", AmbiguousOutcome),
        ("in_progress", AmbiguousOutcome),
    ],
)
def test_generic_adapter_uses_the_same_classification_table(
    sandbox: SandboxProvider, acme_transfer: GenericHttpAdapter, fault: str, raised: type[AdapterError]
) -> None:
    # given
    sandbox.inject(fault, product="payments")

    # when / then
    with pytest.raises(raised):
        acme_transfer.execute(make_call("acme.transfer", ARGUMENTS["payments.charge"]))


def test_generic_adapter_validates_with_the_configured_schema(acme_transfer: GenericHttpAdapter) -> None:
    # when
    from operations.adapters.errors import ArgumentsInvalid

    with pytest.raises(ArgumentsInvalid) as caught:
        acme_transfer.validate("acme.transfer", {"amount": 10.5})

    # then
    assert {e["field"] for e in caught.value.errors} == {"amount", "arguments"}
