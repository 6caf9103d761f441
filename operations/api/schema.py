"""The OpenAPI document of the intents API (drf-spectacular, served at ``/api/schema/``): what
the views' ``extend_schema`` decorators cannot say by themselves.

* ``AgentTokenScheme``: ``Authorization: Bearer <token>`` (``AgentTokenAuthentication``) as an
  HTTP bearer security scheme (OpenAPI 3.1 section 4.8.27), applied to every operation.
* ``StrictBodyExtension``: ``additionalProperties: false`` on the bodies whose serializer
  refuses unknown fields (``StrictSerializer``).
* ``problem_responses``: the RFC 9457 problems an operation can answer.
* ``add_action_schemas``: a postprocessing hook turning the submit and preview bodies into a
  ``oneOf`` with one branch per served action, discriminated by ``action``, whose ``arguments``
  is the adapter's own JSON schema (``registry.served_argument_schemas``), read when the document
  is generated: the document and the submission's validation read the same schemas.

The document is OpenAPI 3.1 (``SPECTACULAR_SETTINGS["OAS_VERSION"]``): its schemas are JSON
Schema 2020-12, the dialect of the argument schemas, which are copied unchanged.
"""

from __future__ import annotations

import json
import re
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension, OpenApiSerializerExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import build_bearer_security_scheme_object
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse

from operations.adapters.registry import served_argument_schemas
from operations.api.serializers import ProblemDetailsSerializer
from operations.api.support import PROBLEM_CONTENT_TYPE
from operations.workers.delivery import DATABASE_RETRY_AFTER_SECONDS

Schema = dict[str, Any]


class AgentTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]  # drf-spectacular registers subclasses
    """``AgentTokenAuthentication`` as the security scheme ``AgentToken`` (HTTP bearer)."""

    target_class = "operations.api.authentication.AgentTokenAuthentication"
    name = "AgentToken"

    def get_security_definition(self, auto_schema: AutoSchema) -> Schema:
        """``{"type": "http", "scheme": "bearer", ...}`` (RFC 6750 section 2.1)."""
        scheme: Schema = build_bearer_security_scheme_object(
            header_name="HTTP_AUTHORIZATION", token_prefix="Bearer"
        )
        scheme["description"] = (
            "An agent's token, printed once by `python manage.py create_agent NAME --tenant T`."
        )
        return scheme


class StrictBodyExtension(OpenApiSerializerExtension):  # type: ignore[no-untyped-call]  # drf-spectacular registers subclasses
    """The schema of a ``StrictSerializer`` says what it enforces: no other members."""

    target_class = "operations.api.serializers.StrictSerializer"
    match_subclasses = True

    def map_serializer(self, auto_schema: AutoSchema, direction: Any) -> Schema:
        """drf-spectacular's own mapping, plus ``additionalProperties: false``."""
        schema: Schema = auto_schema._map_serializer(  # type: ignore[no-untyped-call]
            self.target, direction, bypass_extensions=True
        )
        return {**schema, "additionalProperties": False}


_PROBLEM_DESCRIPTIONS = {
    400: "Malformed request: unreadable JSON, a missing or malformed Idempotency-Key, a damaged cursor, "
    "a wait outside 0 < wait <= 30 seconds or an unknown status to wait on",
    401: "No token, or an unknown or revoked one",
    403: "Refused for this principal: an action outside the agent's scopes (allowed_actions lists "
    "them), or a cancel of a compensation intent",
    404: "No such intent in your tenant",
    406: "The Accept header admits no JSON",
    409: "The intent is RUNNING or beyond; current_status names its state",
    413: "The body is larger than 64 KiB",
    415: "The body is not application/json",
    429: "Over the rate limit of this agent or of its tenant; send it again after Retry-After",
    422: "Invalid request (errors lists every failing field), an unknown action (known_actions), "
    "an Idempotency-Key reused for another request (intent_id), or a callback URL refused "
    "(callback-url-refused: its reason in detail)",
    503: "The database is unreachable; nothing was stored; send the same request again after Retry-After",
}

#: Response headers of the problem statuses that carry one.
RETRY_AFTER = OpenApiParameter(
    "Retry-After",
    OpenApiTypes.INT,
    OpenApiParameter.HEADER,
    response=[429, 503],
    description="seconds to wait before sending the request again (503: "
    f"{DATABASE_RETRY_AFTER_SECONDS}; 429: until the rate limit's window admits it)",
)
WWW_AUTHENTICATE = OpenApiParameter(
    "WWW-Authenticate",
    str,
    OpenApiParameter.HEADER,
    response=[401],
    description='the scheme to authenticate with: Bearer realm="effect-ledger" (RFC 9110 section 11.6.1)',
)


def problem_responses(*statuses: int) -> dict[tuple[int, str], OpenApiResponse]:
    """The ``extend_schema(responses=...)`` entries of the problems an operation can answer:
    ``{(status, "application/problem+json"): OpenApiResponse(ProblemDetails)}`` for each status
    (plus 401, 406, 429 and 503, which every operation can answer: authentication, content
    negotiation, the rate limits and the database come before any view), and the web server's
    414 (text/html) for a request line too long to read."""
    codes = sorted({*statuses, 401, 406, 429, 503})
    return {
        **{
            (code, PROBLEM_CONTENT_TYPE): OpenApiResponse(
                ProblemDetailsSerializer, _PROBLEM_DESCRIPTIONS[code]
            )
            for code in codes
        },
        (414, "text/html"): URI_TOO_LONG,
    }


#: What the web server answers, before the application, to a request line longer than it reads
#: (gunicorn's ``limit_request_line``, 4094 bytes): any operation can get it with long enough
#: query parameters, and its body is the server's HTML page, not problem details.
URI_TOO_LONG = OpenApiResponse(
    OpenApiTypes.STR,
    "The request line is longer than the web server reads (4094 bytes): an HTML page from the "
    "server; nothing reached the application",
)


def _camel(action: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[^A-Za-z0-9]+", action) if part)


def _version_groups(versions: dict[int, Schema]) -> list[tuple[list[int], Schema]]:
    """The versions of one action grouped by identical argument schema, in version order."""
    groups: dict[str, tuple[list[int], Schema]] = {}
    for version, schema in sorted(versions.items()):
        groups.setdefault(json.dumps(schema, sort_keys=True), ([], schema))[0].append(version)
    return list(groups.values())


def _branch(base: Schema, action: str, versions: list[int], arguments_ref: str) -> Schema:
    """One action (at the versions sharing one argument schema) as a complete body object."""
    version_schema = {**base["properties"]["action_version"], "enum": versions}
    required = set(base.get("required", ()))
    if 1 not in versions:  # action_version defaults to 1: any other must be sent
        version_schema.pop("default", None)
        required.add("action_version")
    return {
        "type": "object",
        "properties": {
            **base["properties"],
            "action": {"type": "string", "const": action},
            "action_version": version_schema,
            "arguments": {"$ref": arguments_ref},
        },
        "required": sorted(required),
        "additionalProperties": False,
    }


def action_bodies(
    base_name: str, base: Schema, served: dict[str, dict[int, Schema]]
) -> tuple[Schema, dict[str, Schema]]:
    """The body ``base_name`` (a free-form ``arguments``) as one branch per served action.

    Arguments:
        base_name: the component drf-spectacular made of the body's serializer (``IntentCreate``).
        base: that component; its other members are kept in every branch.
        served: ``{action: {version: argument schema}}`` (``served_argument_schemas``).

    Returns:
        ``(body, components)``: ``body`` is ``{"oneOf": [...], "discriminator": {"propertyName":
        "action", "mapping": {action: ref}}}``; ``components`` the branches
        (``IntentCreatePaymentsCharge``) and the argument schemas (``PaymentsChargeArguments``,
        ``...V2Arguments`` where a later version changed them) to add beside it.
    """
    components: dict[str, Schema] = {}
    mapping: dict[str, str] = {}
    for action, versions in served.items():
        name = _camel(action) or "Action"
        while f"{base_name}{name}" in components:  # two names differing only in punctuation
            name += "_"
        branches = []
        for group_versions, schema in _version_groups(versions):
            suffix = "" if 1 in group_versions else f"V{group_versions[0]}"
            arguments_name = f"{name}{suffix}Arguments"
            components[arguments_name] = schema
            branches.append(_branch(base, action, group_versions, f"#/components/schemas/{arguments_name}"))
        body_name = f"{base_name}{name}"
        components[body_name] = branches[0] if len(branches) == 1 else {"oneOf": branches}
        components[body_name]["description"] = f"{action}, version {', '.join(map(str, sorted(versions)))}"
        mapping[action] = f"#/components/schemas/{body_name}"
    body: Schema = {
        "description": base.get("description", ""),
        "oneOf": [{"$ref": ref} for ref in mapping.values()],
        "discriminator": {"propertyName": "action", "mapping": mapping},
    }
    return body, components


#: The bodies whose ``arguments`` depend on ``action``: submit and preview.
ACTION_BODIES = ("IntentCreate", "IntentPreview")


def add_action_schemas(result: Schema, generator: Any, request: Any, public: bool) -> Schema:
    """drf-spectacular postprocessing hook (``SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]``):
    replace ``IntentCreate`` and ``IntentPreview`` by their per-action ``oneOf``
    (``action_bodies``), built from the adapter registry each time the document is generated.
    With no action served (an empty registry) the bodies stay free-form."""
    schemas: dict[str, Schema] = result.get("components", {}).get("schemas", {})
    served = served_argument_schemas()
    if not served:
        return result
    for base_name in ACTION_BODIES:
        if base_name in schemas:
            body, components = action_bodies(base_name, schemas[base_name], served)
            schemas.update(components)
            schemas[base_name] = body
    return result
