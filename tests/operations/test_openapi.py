"""The OpenAPI document served at ``/api/schema/`` matches the live API (issue 12, item 6): real
requests and responses are validated against it with openapi-core (status, media type, body and
headers), and it carries the bearer scheme and one argument schema per served action."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest
from openapi_core import Config, OpenAPI
from openapi_core.contrib.django import DjangoOpenAPIRequest, DjangoOpenAPIResponse
from openapi_core.templating.responses.exceptions import ResponseFinderError
from openapi_core.validation.request.exceptions import RequestValidationError
from openapi_core.validation.response.exceptions import InvalidHeader
from rest_framework.test import APIClient

from operations.adapters.registry import get_adapter, known_actions
from operations.models import Intent
from tests.factories import charge_arguments, submit

pytestmark = pytest.mark.django_db

URL = "/api/v1/intents"
OPERATIONS = [
    ("/api/v1/actions", "get"),
    ("/api/v1/intents", "get"),
    ("/api/v1/intents", "post"),
    ("/api/v1/intents/{intent_id}", "get"),
    ("/api/v1/intents/{intent_id}/cancel", "post"),
    ("/api/v1/intents/preview", "post"),
]


def served_document() -> dict[str, Any]:
    """The document as ``/api/schema/`` serves it, unauthenticated (as Swagger UI fetches it)."""
    response = APIClient().get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    document: dict[str, Any] = json.loads(response.content)
    return document


def openapi() -> OpenAPI:
    config = Config(extra_media_type_deserializers={"application/problem+json": json.loads})
    return OpenAPI.from_dict(served_document(), config=config)


class SentRequest(DjangoOpenAPIRequest):
    """The Django request as openapi-core reads it, with the body the test sent (the API's
    parser has consumed the request's stream)."""

    def __init__(self, response: Any) -> None:
        super().__init__(response.wsgi_request)
        self.sent = getattr(response, "sent_body", b"")

    @property
    def body(self) -> bytes:
        return self.sent


def assert_matches_document(response: Any) -> None:
    """The response validates against the served document (status, media type, body, headers)
    for the operation the request reached."""
    openapi().validate_response(SentRequest(response), DjangoOpenAPIResponse(response))


def post(api: APIClient, body: Any, key: str | None = "key-1", url: str = URL) -> Any:
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    data = json.dumps(body).encode()
    response = api.post(url, data=data, content_type="application/json", **headers)
    response.sent_body = data
    return response


def charge(**extra: Any) -> dict[str, Any]:
    return {"action": "payments.charge", "arguments": charge_arguments(), **extra}


def test_i12_6_list_and_detail_answers_match_the_document(api: APIClient) -> None:
    # given
    intent = submit(tenant="acme")
    submit(tenant="acme")
    # when: a first page of one, its next page, and the detail
    first = api.get(URL, {"page_size": 1})
    following = api.get(first.json()["next"])
    detail = api.get(f"{URL}/{intent.id}")
    # then: the list is the paginated object, not an array
    assert set(first.json()) == {"next", "previous", "results"}
    for response in (first, following, detail):
        assert response.status_code == 200
        assert_matches_document(response)
    # and the check is not vacuous: the detail's 404, as if the list had answered it, is refused
    missing = api.get(f"{URL}/{uuid.uuid4()}")
    with pytest.raises(ResponseFinderError):
        openapi().validate_response(SentRequest(first), DjangoOpenAPIResponse(missing))


def test_i12_6_submit_and_replay_match_the_document_with_their_headers(api: APIClient) -> None:
    # given
    document = served_document()
    # when
    created = post(api, charge(reference="order-1"))
    replayed = post(api, charge(reference="order-1"))
    preview = post(api, charge(), key=None, url=f"{URL}/preview")
    # then
    assert (created.status_code, replayed.status_code, replayed["Idempotent-Replayed"]) == (201, 201, "true")
    for response in (created, replayed, preview):
        assert_matches_document(response)
    headers = document["paths"][URL]["post"]["responses"]["201"]["headers"]
    assert {"Location", "Idempotent-Replayed"} <= set(headers)
    (key,) = [p for p in document["paths"][URL]["post"]["parameters"] if p["name"] == "Idempotency-Key"]
    assert (key["in"], key["required"], key["schema"]["maxLength"]) == ("header", True, 255)


def _provoke(status: int, api: APIClient, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A real request answered with ``status``."""
    if status == 400:
        return post(api, charge(), key="")
    if status == 401:
        return APIClient().get(URL, HTTP_AUTHORIZATION="Bearer not-a-token")
    if status == 403:
        original, refund = submit(), submit()
        Intent.objects.filter(id=refund.id).update(compensates=original)
        return post(api, {}, key=None, url=f"{URL}/{refund.id}/cancel")
    if status == 404:
        return api.get(f"{URL}/{uuid.uuid4()}")
    if status == 409:
        intent = submit()
        Intent.objects.filter(id=intent.id).update(status=Intent.Status.SUCCEEDED)
        return post(api, {"reason": "too late"}, key=None, url=f"{URL}/{intent.id}/cancel")
    if status == 413:
        return post(api, charge(metadata={"pad": "x" * 70_000}))
    if status == 415:
        return api.post(
            URL, data="action=payments.charge", content_type="text/plain", HTTP_IDEMPOTENCY_KEY="k"
        )
    if status == 422:
        return post(api, {"action": "payments.charge", "arguments": {"amount": 1.5}})
    assert status == 503
    refused = psycopg.OperationalError("connection refused")
    monkeypatch.setattr(
        "operations.api.views.selectors.intent_get", lambda **_: (_ for _ in ()).throw(refused)
    )
    return api.get(f"{URL}/{uuid.uuid4()}")


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 413, 415, 422, 503])
def test_i12_6_each_problem_matches_the_document(
    status: int, api: APIClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # when
    response = _provoke(status, api, monkeypatch)
    # then: the problem, its media type and its headers (WWW-Authenticate, Retry-After) are documented
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert_matches_document(response)
    documented = served_document()["components"]["schemas"]["ProblemDetails"]["properties"]
    assert set(response.json()) <= set(documented)


def test_i12_6_bearer_scheme_is_declared_and_applied_to_every_operation() -> None:
    # when
    document = served_document()
    # then
    assert document["components"]["securitySchemes"]["AgentToken"]["type"] == "http"
    assert document["components"]["securitySchemes"]["AgentToken"]["scheme"] == "bearer"
    for path, method in OPERATIONS:
        assert document["paths"][path][method]["security"] == [{"AgentToken": []}], (path, method)
        assert "401" in document["paths"][path][method]["responses"], (path, method)


def _arguments_of(document: dict[str, Any], body: str, action: str) -> tuple[dict[str, Any], list[int]]:
    schemas = document["components"]["schemas"]
    branch = schemas[schemas[body]["discriminator"]["mapping"][action].rsplit("/", 1)[1]]
    assert branch["properties"]["action"]["const"] == action
    name = branch["properties"]["arguments"]["$ref"].rsplit("/", 1)[1]
    return schemas[name], branch["properties"]["action_version"]["enum"]


def test_i12_6_every_served_action_has_its_argument_schema_branch() -> None:
    # when
    document = served_document()
    # then: submit and preview bodies, one branch per action, with the adapter's schema
    for body in ("IntentCreate", "IntentPreview"):
        assert document["components"]["schemas"][body]["discriminator"]["propertyName"] == "action"
        for action in known_actions():
            adapter = get_adapter(action)
            (version,) = adapter.versions_for(action)
            arguments, versions = _arguments_of(document, body, action)
            assert arguments == adapter.argument_schema_for(action, version)
            assert versions == [version]


def test_i12_6_generic_http_actions_appear_with_their_schema_or_any_object(settings: Any) -> None:
    # given
    schema = {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}
    settings.EFFECT_LEDGER_GENERIC_HTTP = {
        "acme.order": {"url": "https://acme.test/orders", "schema": schema, "versions": [1, 2]},
        "acme.ping": {"url": "https://acme.test/ping"},
    }
    # when
    document = served_document()
    # then
    assert _arguments_of(document, "IntentCreate", "acme.order") == (schema, [1, 2])
    assert _arguments_of(document, "IntentCreate", "acme.ping") == ({"type": "object"}, [1])


def test_i12_6_the_document_refuses_arguments_the_api_refuses(api: APIClient) -> None:
    # given: a request whose arguments fail the charge schema, and one that passes
    spec = openapi()
    bad = post(api, {"action": "payments.charge", "arguments": {"amount": "4990"}}, key="k-bad")
    good = post(api, charge(), key="k-good")
    # when / then: the document says what the API says
    assert (bad.status_code, good.status_code) == (422, 201)
    with pytest.raises(RequestValidationError):
        spec.validate_request(SentRequest(bad))
    spec.validate_request(SentRequest(good))


def test_i12_6_an_action_whose_arguments_changed_gets_one_branch_per_schema() -> None:
    # given: version 1 and 3 share a schema, version 2 has another
    from operations.api.schema import action_bodies

    old, new = {"type": "object"}, {"type": "object", "required": ["sku"]}
    base_schema = {
        "type": "object",
        "properties": {
            "action": {"type": "string"},
            "action_version": {"type": "integer", "default": 1},
            "arguments": {"type": "object"},
        },
        "required": ["action", "arguments"],
    }
    # when
    body, components = action_bodies("IntentCreate", base_schema, {"acme.order": {1: old, 2: new, 3: old}})
    # then: v1 and v3 in one branch (action_version optional, default 1), v2 in the other (required)
    branches = components["IntentCreateAcmeOrder"]["oneOf"]
    assert [b["properties"]["action_version"]["enum"] for b in branches] == [[1, 3], [2]]
    assert "action_version" not in branches[0]["required"] and "action_version" in branches[1]["required"]
    assert "default" not in branches[1]["properties"]["action_version"]
    assert (components["AcmeOrderArguments"], components["AcmeOrderV2Arguments"]) == (old, new)
    assert body["discriminator"]["mapping"] == {"acme.order": "#/components/schemas/IntentCreateAcmeOrder"}


def test_i18_7_a_429_and_an_action_not_allowed_403_match_the_document(settings: Any) -> None:
    # given: one request a minute per agent, and an agent that may only send email
    from operations.models import RateWindow
    from tests.factories import make_agent

    settings.EFFECT_LEDGER_CACHE_URL = ""
    _, token = make_agent("mailer", actions=["email.*"])
    mailer = APIClient()
    mailer.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    # when
    refused = [post(mailer, charge()), post(mailer, charge(), key=None, url=f"{URL}/preview")]
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "RATE_AGENT": "1/min"}
    RateWindow.objects.all().delete()
    assert mailer.get(URL).status_code == 200
    throttled = [mailer.get(URL), mailer.get(f"{URL}/{uuid.uuid4()}"), post(mailer, charge())]
    # then: documented, with Retry-After on every 429
    for response in refused:
        assert (response.status_code, response.json()["code"]) == (403, "action-not-allowed")
        assert_matches_document(response)
    for response in throttled:
        assert response.status_code == 429 and int(response["Retry-After"]) >= 1
        assert_matches_document(response)
    document = served_document()
    for path, method in OPERATIONS:
        responses = document["paths"][path][method]["responses"]
        assert "Retry-After" in responses["429"]["headers"]
    for path in ("/api/v1/intents", "/api/v1/intents/preview"):
        assert "403" in document["paths"][path]["post"]["responses"]


def test_i16_1_preview_money_and_an_unknown_currency_match_the_document(api: APIClient) -> None:
    # when: a yen charge (money with exponent 0), an email (no money) and an unknown currency
    url = f"{URL}/preview"
    jpy = post(api, charge(arguments=charge_arguments(125_000, currency="JPY")), key=None, url=url)
    email = post(
        api,
        {"action": "email.send", "arguments": {"to": "ana@example.test", "subject": "Hi", "body": "x"}},
        key=None,
        url=url,
    )
    unknown = post(api, charge(arguments=charge_arguments(4990, currency="XYZ")), key=None, url=url)
    # then: each answer is the one the document describes
    assert jpy.status_code == 200 and jpy.json()["money"]["exponent"] == 0
    assert email.status_code == 200 and email.json()["money"] is None
    assert unknown.status_code == 422
    for response in (jpy, email, unknown):
        assert_matches_document(response)
    # and the document names the money object's members
    money = served_document()["components"]["schemas"]["Money"]
    assert set(money["required"]) == {"amount_minor", "currency", "exponent", "decimal"}


def test_i15_a_wait_its_header_and_its_refusal_match_the_document(
    api: APIClient, status_listener: Any
) -> None:
    # given: a terminal intent (a wait on it answers at once) and one still READY
    done = submit(tenant="acme")
    Intent.objects.filter(id=done.id).update(status=Intent.Status.SUCCEEDED)
    ready = submit(tenant="acme")
    # when
    waited = api.get(f"{URL}/{done.id}", {"wait": "5"})
    other_status = api.get(f"{URL}/{ready.id}", {"wait": "5", "status": "RUNNING"})
    refused = api.get(f"{URL}/{done.id}", {"wait": "31"})
    # then: the answers, the header and the 400 problem are the document's
    assert (waited.status_code, waited["Effect-Ledger-Wait"]) == (200, "timeout")
    assert (other_status.status_code, other_status["Effect-Ledger-Wait"]) == (200, "changed")
    assert refused.status_code == 400
    for response in (waited, other_status, refused):
        assert_matches_document(response)
    operation = served_document()["paths"][f"{URL}/{{intent_id}}"]["get"]
    parameters = {p["name"]: p for p in operation["parameters"]}
    assert parameters["wait"]["schema"] == {"type": "number", "exclusiveMinimum": 0, "maximum": 30.0}
    assert parameters["status"]["schema"]["enum"] == list(Intent.Status.values)
    assert operation["responses"]["200"]["headers"]["Effect-Ledger-Wait"]["schema"]["enum"] == [
        "changed",
        "timeout",
        "busy",
    ]
    # and the check is not vacuous: a header value the document does not name is refused
    waited["Effect-Ledger-Wait"] = "maybe"
    with pytest.raises(InvalidHeader):
        assert_matches_document(waited)
