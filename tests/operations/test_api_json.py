"""The API's orjson parser and renderer answer exactly what the standard library's did."""

from __future__ import annotations

import datetime
import json
import uuid
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from rest_framework.renderers import JSONRenderer
from rest_framework.test import APIClient

from operations.api.json_io import FastJSONRenderer
from operations.models import Intent
from operations.strict_json import loads_strict

URL = "/api/v1/intents"


def charge_body(amount: bytes = b"10", extra: bytes = b"") -> bytes:
    return b'{"action":"payments.charge","arguments":{"amount":%s,"currency":"EUR","customer":"c"}%s}' % (
        amount,
        extra,
    )


def post_raw(api: APIClient, raw: bytes) -> Any:
    return api.post(URL, data=raw, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k-1")


def problem_of(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["status"] == status and body["type"].startswith("tag:effect-ledger")
    return body


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("raw", "detail"),
    [
        (
            b"{not json",
            "malformed JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        ),
        (b'{"a":1} x', "malformed JSON: Extra data: line 1 column 9 (char 8)"),
        (charge_body(b"NaN"), "malformed JSON: NaN is not valid JSON"),
        (charge_body(b"Infinity"), "malformed JSON: Infinity is not valid JSON"),
        (charge_body(b"-Infinity"), "malformed JSON: -Infinity is not valid JSON"),
        (b"\xff\xfe\x00garbage", "the body is not valid UTF-8 (byte 0)"),
        (b'{"reference":"caf\xe9"}', "the body is not valid UTF-8 (byte 17)"),
        (
            b"\xef\xbb\xbf{}",
            "malformed JSON: Unexpected UTF-8 BOM (decode using utf-8-sig): line 1 column 1 (char 0)",
        ),
        (b'{"action":"pay\x01"}', "malformed JSON: Invalid control character at: line 1 column 15 (char 14)"),
        (b"[" * 2000 + b"]" * 2000, "the JSON is nested too deeply"),
    ],
    ids=[
        "malformed",
        "trailing",
        "nan",
        "infinity",
        "minus-infinity",
        "not-utf8",
        "latin1",
        "bom",
        "control",
        "deep",
    ],
)
def test_refused_bodies_are_400_problems_with_the_standard_librarys_message(
    api: APIClient, raw: bytes, detail: str
) -> None:
    # when
    body = problem_of(post_raw(api, raw), 400)
    # then
    assert body["code"] == "parse-error" and body["detail"] == detail
    assert not Intent.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("number", [2**53 + 1, 2**63, 2**64, 2**70, -(2**70)])
def test_integers_beyond_2_53_and_64_bits_get_the_clear_422_not_a_rounded_float(
    api: APIClient, number: int
) -> None:
    # when: orjson alone would turn 2**64 and beyond into a float, losing the digits
    body = problem_of(post_raw(api, charge_body(str(number).encode())), 422)
    # then: the exact number is named, as before
    assert body["code"] == "validation-failed"
    assert f"the number {number} is beyond ±(2^53−1)" in body["detail"]
    assert not Intent.objects.exists()


@pytest.mark.django_db
def test_a_number_too_large_for_a_double_is_refused_as_before(api: APIClient) -> None:
    # when: json.loads reads 1e400 as infinity (orjson refuses it); validation refuses it
    body = problem_of(post_raw(api, charge_body(b"1e400")), 422)
    # then
    assert body["errors"] == [{"field": "arguments.amount", "message": "Value must be valid JSON."}]


@pytest.mark.django_db
def test_a_lone_surrogate_escape_reaches_validation_as_before(api: APIClient) -> None:
    # when: json.loads accepts "\ud800" (orjson refuses it); the bounds check refuses it
    body = problem_of(post_raw(api, b'{"action":"payments.charge","arguments":{"customer":"\\ud800"}}'), 422)
    # then
    assert body["code"] == "validation-failed"


@pytest.mark.django_db
def test_a_big_integer_in_metadata_is_kept_exact(api: APIClient) -> None:
    # when
    response = post_raw(api, charge_body(extra=b',"metadata":{"n":%d}' % 2**70))
    # then
    assert response.status_code == 201
    assert b'"n":1180591620717411303424' in response.content
    assert Intent.objects.get().metadata == {"n": 2**70}


json_numbers = (
    st.integers()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
)
json_values = st.recursive(
    st.none() | st.booleans() | json_numbers | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=16,
)


@hypothesis_settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=json_values, ascii_only=st.booleans())
def test_parsing_equals_json_loads(value: Any, ascii_only: bool) -> None:
    # given
    raw = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    try:
        expected: Any = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        expected = type(exc)
    # when
    try:
        parsed: Any = loads_strict(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        parsed = type(exc)
    # then: same values and the same types (an integer stays an int, exact)
    assert repr(parsed) == repr(expected)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), Decimal("NaN")])
def test_rendering_refuses_non_finite_numbers_like_drf(bad: Any) -> None:
    with pytest.raises(ValueError):
        JSONRenderer().render({"a": [1, None, bad]})
    with pytest.raises(ValueError):
        FastJSONRenderer().render({"a": [1, None, bad]})


render_values = st.recursive(
    st.none()
    | st.booleans()
    | json_numbers
    | st.text()
    | st.uuids()
    | st.decimals(allow_nan=False, allow_infinity=False, places=3)
    | st.datetimes(timezones=st.none() | st.timezones())
    | st.dates()
    | st.times(),
    lambda children: (
        st.lists(children, max_size=4)
        | st.tuples(children)
        | st.dictionaries(st.text(max_size=6) | st.integers(), children, max_size=4)
    ),
    max_leaves=16,
)


@hypothesis_settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=render_values)
def test_rendering_gives_drfs_bytes(value: Any) -> None:
    # given
    try:
        expected: Any = JSONRenderer().render(value)
    except (TypeError, ValueError) as exc:
        expected = type(exc)
    # when
    try:
        rendered: Any = FastJSONRenderer().render(value)
    except (TypeError, ValueError) as exc:
        rendered = type(exc)
    # then
    assert rendered == expected


def test_rendering_of_the_usual_types_is_unchanged() -> None:
    # given
    value = {
        "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "at": datetime.datetime(2026, 11, 30, 12, 0, 0, 450, tzinfo=datetime.UTC),
        "amount": Decimal("49.90"),
        "rate": 1e-7,
        "big": 2**70,
        "text": "line\u2028separator é",
        "nothing": None,
    }
    # when / then
    assert FastJSONRenderer().render(value) == JSONRenderer().render(value)
    assert FastJSONRenderer().render(None) == b""
    assert FastJSONRenderer().render([1], "application/json; indent=2") == b"[\n  1\n]"
