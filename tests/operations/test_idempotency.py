"""Canonical JSON, request hashes and provider keys (pure logic; no database)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from operations.idempotency import (
    FINGERPRINT_VERSION,
    CanonicalizationError,
    canonical_json,
    derive_provider_key,
    is_valid_client_key,
    request_hash,
)

SAFE_INT = st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
scalars = st.none() | st.booleans() | SAFE_INT | st.text(max_size=20)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
documents = st.dictionaries(st.text(max_size=8), json_values, max_size=6)
#: The reference and fingerprint version of a new intent with no reference.
FINGERPRINT: dict[str, Any] = {"reference": "", "fingerprint_version": FINGERPRINT_VERSION}


def shuffled(value: Any, seed: int) -> Any:
    """The same JSON value with every object's keys inserted in another order."""
    if isinstance(value, dict):
        keys = list(value)
        keys = keys[seed % len(keys) :] + keys[: seed % len(keys)] if keys else keys
        return {k: shuffled(value[k], seed + 1) for k in reversed(keys)}
    if isinstance(value, list):
        return [shuffled(v, seed + 1) for v in value]
    return value


@given(documents, st.integers(min_value=0, max_value=7))
def test_canonical_form_ignores_key_order(doc: dict[str, Any], seed: int) -> None:
    assert canonical_json(doc) == canonical_json(shuffled(doc, seed))


@given(documents)
def test_canonical_form_ignores_insignificant_whitespace(doc: dict[str, Any]) -> None:
    spaced = json.loads(json.dumps(doc, indent=4, separators=(" ,  ", " :   ")))
    assert canonical_json(spaced) == canonical_json(doc)


@given(documents, st.text(min_size=1, max_size=8), json_values)
def test_any_value_change_changes_the_hash(doc: dict[str, Any], key: str, value: Any) -> None:
    # given a document and the same document with one member set to another value
    changed = {**doc, key: value}
    # when
    h1 = request_hash(tenant="t", action="a", action_version=1, arguments=doc, **FINGERPRINT)
    h2 = request_hash(tenant="t", action="a", action_version=1, arguments=changed, **FINGERPRINT)
    # then: the hashes differ exactly when the canonical documents differ
    assert (h1 == h2) == (canonical_json(doc) == canonical_json(changed))
    if key not in doc or json.dumps(doc[key], sort_keys=True) != json.dumps(value, sort_keys=True):
        assert h1 != h2


@given(SAFE_INT, SAFE_INT)
def test_amount_change_changes_the_hash(a: int, b: int) -> None:
    def h(amount):
        return request_hash(
            tenant="t",
            action="payments.charge",
            action_version=1,
            arguments={"amount": amount},
            **FINGERPRINT,
        )  # noqa: E731

    assert (h(a) == h(b)) == (a == b)


def test_hash_covers_tenant_action_and_version() -> None:
    base = {"tenant": "t", "action": "a", "action_version": 1, "arguments": {"x": 1}, **FINGERPRINT}
    hashes = {
        request_hash(**base),
        request_hash(**{**base, "tenant": "u"}),
        request_hash(**{**base, "action": "b"}),
        request_hash(**{**base, "action_version": 2}),
    }
    assert len(hashes) == 4


@pytest.mark.parametrize("value", [{"a": 2**53}, {"a": float("nan")}, {"a": float("inf")}, {"a": {1, 2}}])
def test_values_without_a_canonical_form_are_refused(value: Any) -> None:
    with pytest.raises(CanonicalizationError):
        canonical_json(value)


def test_c06_provider_key_is_stable_and_ignores_volatile_data() -> None:
    # given one intent identity
    identity: dict[str, Any] = {
        "tenant": "acme",
        "principal": "agent:agent-1",
        "client_key": "tool-call-7",
        "action": "payments.charge",
        "action_version": 1,
    }
    # when derived on every "retry"
    keys = {derive_provider_key(**identity) for _ in range(10)}
    # then: one key, and only identity changes it
    assert len(keys) == 1
    for field, other in [
        ("tenant", "globex"),
        ("principal", "agent:agent-2"),
        ("client_key", "tool-call-8"),
        ("action", "payments.refund"),
        ("action_version", 2),
    ]:
        assert derive_provider_key(**{**identity, field: other}) not in keys
    (key,) = keys
    assert key.startswith("el_") and len(key) == 51


@pytest.mark.parametrize(
    ("key", "valid"),
    [
        ("a", True),
        ("~" * 255, True),
        (" spaced key ", True),
        ("", False),
        (None, False),
        ("x" * 256, False),
        ("ключ", False),
        ("a\x7f", False),
        ("a\nb", False),
    ],
)
def test_client_key_shape(key: str | None, valid: bool) -> None:
    assert is_valid_client_key(key) is valid
