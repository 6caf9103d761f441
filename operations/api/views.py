"""The intents API (``/api/v1/``). Thin views: parse, call one service or selector, render."""

from __future__ import annotations

import uuid
from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.exceptions import NotFound, ParseError
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from operations import selectors, services
from operations.access.scopes import action_allowed, agent_sees_principal
from operations.api import waiting
from operations.api.archived import ARCHIVED_HEADER_PARAMETER, archived_answer
from operations.api.intent_representation import OUTCOME_STATUSES, IntentDetailSerializer, IntentSerializer
from operations.api.schema import RETRY_AFTER, WWW_AUTHENTICATE, problem_responses
from operations.api.serializers import (
    ActionListSerializer,
    CallbackSerializer,
    CallbackSetSerializer,
    IntentCancelSerializer,
    IntentCreateSerializer,
    IntentListQuerySerializer,
    IntentPreviewSerializer,
    PreviewResponseSerializer,
)
from operations.archive.selectors import archived_get
from operations.exceptions import ActionNotAllowed
from operations.models import Agent, Intent
from operations.money import money_json
from operations.notifications.webhook_sender import secret_hint
from operations.selectors.intent_pages import intent_page_facts
from operations.selectors.pagination import InvalidCursor, cursor_time
from operations.selectors.webhooks import agent_callback

IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    # 1-255 printable ASCII (idempotency.CLIENT_KEY_PATTERN); HTTP drops a field value's leading
    # and trailing spaces (RFC 9110 section 5.5), so a key that arrives starts and ends with one
    # of the others.
    {
        "type": "string",
        "minLength": 1,
        "maxLength": 255,
        "pattern": "^[\\x21-\\x7e]([\\x20-\\x7e]*[\\x21-\\x7e])?$",
    },
    OpenApiParameter.HEADER,
    required=True,
    description="1-255 printable ASCII characters; scoped to your tenant and principal",
)
SUBMIT_HEADERS = [
    OpenApiParameter(
        "Location", str, OpenApiParameter.HEADER, response=[201], description="the intent's URL"
    ),
    OpenApiParameter(
        "Idempotent-Replayed",
        {"type": "string", "enum": ["true"]},
        OpenApiParameter.HEADER,
        response=[201],
        description="present on a replay: the same key and request answered with the intent it created",
    ),
]
#: ``GET /api/v1/intents/{id}?wait=SECONDS[&status=STATUS]`` (``operations.api.waiting``).
WAIT_HEADER = "Effect-Ledger-Wait"
WAIT_PARAMETERS = [
    OpenApiParameter(
        "wait",
        {"type": "number", "exclusiveMinimum": 0, "maximum": waiting.MAX_WAIT_SECONDS},
        OpenApiParameter.QUERY,
        description=(
            "seconds (0 < wait <= 30, fractions allowed): answer as soon as the intent's status is no "
            "longer `status`, or when they run out. A settled intent (SUCCEEDED, or terminal) answers "
            "at once. Without it "
            "the intent is answered at once."
        ),
    ),
    OpenApiParameter(
        "status",
        {"type": "string", "enum": list(Intent.Status.values)},
        OpenApiParameter.QUERY,
        description="with wait: wait while the intent is in this status (default: its status when the "
        "request arrives); ignored without wait",
    ),
    OpenApiParameter(
        WAIT_HEADER,
        {"type": "string", "enum": ["changed", "timeout", "busy"]},
        OpenApiParameter.HEADER,
        response=[200],
        description="present with wait: `changed` when the status answered differs from the one waited "
        "on, `timeout` when it does not (the wait ran out, or the intent is settled in it), `busy` when "
        "the server had no wait slot free and answered at once (wait a moment, then ask again)",
    ),
]
#: The problem headers every operation can answer with.
PROBLEM_HEADERS = [WWW_AUTHENTICATE, RETRY_AFTER]


def _agent(request: Request) -> Agent:
    agent = request.user
    assert isinstance(agent, Agent)
    return agent


def _context(request: Request) -> dict[str, Any]:
    """The serializers' context: the agent (what it may see) and the request (absolute links)."""
    return {"agent": _agent(request), "request": request}


def _intent_or_404(request: Request, intent_id: uuid.UUID, *, decision: str = "") -> Intent:
    """The intent the agent may reach (its tenant's; only its own when its scope is ``own``).

    Another agent's intent is answered exactly like another tenant's, 404: an agent limited to
    its own intents learns nothing of the others, not even that they exist. A ``decision`` (a
    cancel) on one is recorded as refused on that intent's audit chain.
    """
    agent = _agent(request)
    principal = agent_sees_principal(agent)
    intent = selectors.intent_get(tenant=agent.tenant, intent_id=intent_id, principal=principal)
    if intent is None:
        another_agents = principal is not None and selectors.intent_get(
            tenant=agent.tenant, intent_id=intent_id
        )
        if decision and another_agents:
            services.intent_record_refusal(
                intent_id=intent_id,
                actor=agent.principal,
                decision=decision,
                reason="outside the agent's scope: it may cancel only its own intents",
            )
        raise NotFound(f"no intent {intent_id} in your tenant")
    return intent


def _require_action(request: Request, *, decision: str) -> None:
    """Refuse (403, audited) an action the agent's scopes do not include, before anything else
    looks at the body. A body without a textual ``action`` is left to the serializer (422)."""
    agent = _agent(request)
    action = request.data.get("action") if isinstance(request.data, dict) else None
    if isinstance(action, str) and not action_allowed(agent.actions, action):
        reason = f"agent {agent.principal} may not {decision} {action!r}; it may: {', '.join(agent.actions) or 'nothing'}"
        services.agent_record_refusal(agent=agent, decision=decision, reason=reason, action=action)
        raise ActionNotAllowed(reason, allowed_actions=list(agent.actions))


class IntentPagination(CursorPagination):
    """Keyset pagination, newest first; stable under concurrent inserts."""

    ordering = ("-created_at", "-id")
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200

    def decode_cursor(self, request: Request) -> Cursor | None:
        """DRF's cursor, refused with a 400 problem when it is not one this list wrote (DRF
        answers 404 for a bad encoding, and a position that is not a time reached the database
        as a 500; issue 12, item 4)."""
        try:
            cursor = super().decode_cursor(request)
        except NotFound as exc:
            raise ParseError("malformed cursor: use the next or previous link of a page") from exc
        position = cursor.position if cursor is not None else None
        if position is not None:
            try:
                cursor_time(position)
            except InvalidCursor as exc:
                raise ParseError("malformed cursor: use the next or previous link of a page") from exc
        return cursor

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        """The page as ``get_paginated_response`` writes it: ``{"next", "previous", "results"}``,
        the links absolute URLs or null (OpenAPI 3.1: ``type: [string, "null"]``)."""
        link = {"type": ["string", "null"], "format": "uri"}
        return {
            "type": "object",
            "properties": {
                "next": {**link, "description": "the next (older) page; null on the last"},
                "previous": {**link, "description": "the previous (newer) page; null on the first"},
                "results": schema,
            },
            "required": ["next", "previous", "results"],
        }


class IntentCollectionView(APIView):
    """``POST`` submits an intent (an action the agent's scopes include); ``GET`` lists the
    intents it may see (``IntentPagination``)."""

    pagination_class = IntentPagination

    @extend_schema(
        summary="Submit an intent (201; the same key and request again: the same intent, replayed)",
        request=IntentCreateSerializer,
        responses={201: IntentSerializer, **problem_responses(400, 403, 413, 415, 422)},
        parameters=[IDEMPOTENCY_KEY, *SUBMIT_HEADERS, ARCHIVED_HEADER_PARAMETER, *PROBLEM_HEADERS],
    )
    def post(self, request: Request) -> Response:
        agent = _agent(request)
        _require_action(request, decision="submit")
        body = IntentCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data: dict[str, Any] = body.validated_data
        result = services.intent_submit(
            tenant=agent.tenant,
            principal=agent.principal,
            client_key=request.headers.get("Idempotency-Key"),
            action=data["action"],
            action_version=data["action_version"],
            arguments=data["arguments"],
            reference=data["reference"],
            metadata=data["metadata"],
        )
        headers = {"Location": f"/api/v1/intents/{result.intent.id}"}
        if not result.created:
            headers["Idempotent-Replayed"] = "true"
        if result.archived is not None:
            answer, archived_headers = archived_answer(result.archived, _context(request))
            return Response(answer, status=status.HTTP_201_CREATED, headers={**headers, **archived_headers})
        return Response(
            IntentSerializer(result.intent, context=_context(request)).data,
            status=status.HTTP_201_CREATED,
            headers=headers,
        )

    @extend_schema(
        # Named here: drf-spectacular's list heuristic looks at the lowest response key, which the
        # problem responses' (status, media type) keys win.
        operation_id="v1_intents_list",
        summary="List the tenant's intents, newest first, a cursor page at a time",
        parameters=[IntentListQuerySerializer, *PROBLEM_HEADERS],
        responses={200: IntentSerializer(many=True), **problem_responses(400, 422)},
    )
    def get(self, request: Request) -> Response:
        query = IntentListQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        filters = {k: v for k, v in query.validated_data.items() if k not in {"cursor", "page_size"}}
        agent = _agent(request)
        queryset = selectors.intent_list(
            tenant=agent.tenant, principal=agent_sees_principal(agent), **filters
        )
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(queryset, request, view=self) or []
        facts = intent_page_facts(page, outcome_statuses=OUTCOME_STATUSES)
        return paginator.get_paginated_response(
            IntentSerializer(page, many=True, context={**_context(request), "page_facts": facts}).data
        )


class IntentDetailView(APIView):
    """``GET`` one intent the agent may see (its tenant's, or only its own: ``Agent.scope``);
    with ``?wait=SECONDS``, once its status changes or the seconds run out (``operations.api.waiting``)."""

    @extend_schema(
        summary="Read an intent; with wait, as soon as its status changes (at most wait seconds)",
        responses={200: IntentDetailSerializer, **problem_responses(400, 404)},
        parameters=[*WAIT_PARAMETERS, ARCHIVED_HEADER_PARAMETER, *PROBLEM_HEADERS],
    )
    def get(self, request: Request, intent_id: uuid.UUID) -> Response:
        wait = waiting.wait_request(request.query_params)
        try:
            intent = _intent_or_404(request, intent_id)
        except NotFound:
            agent = _agent(request)
            archived = archived_get(
                tenant=agent.tenant, intent_id=intent_id, principal=agent_sees_principal(agent)
            )
            if archived is None:
                raise
            answer, archived_headers = archived_answer(archived, _context(request))
            return Response(answer, headers=archived_headers)
        headers: dict[str, str] = {}
        if wait is not None:
            # Another agent's intent was answered 404 above, before any waiting.
            awaited = wait.status or intent.status
            waited = waiting.wait_for_status_change(intent_id=intent.id, status=awaited, seconds=wait.seconds)
            if waited is not None:
                intent = _intent_or_404(request, intent_id)
            busy = waited is None and intent.status == awaited
            headers[WAIT_HEADER] = "busy" if busy else "changed" if intent.status != awaited else "timeout"
        return Response(IntentDetailSerializer(intent, context=_context(request)).data, headers=headers)


class IntentCancelView(APIView):
    """``POST`` cancels an intent that has not started running; 409 otherwise."""

    @extend_schema(
        request=IntentCancelSerializer,
        responses={200: IntentSerializer, **problem_responses(400, 403, 404, 409, 413, 415, 422)},
        parameters=PROBLEM_HEADERS,
    )
    def post(self, request: Request, intent_id: uuid.UUID) -> Response:
        intent = _intent_or_404(request, intent_id, decision="cancel")
        # [] or null is not the object the schema names: 422 like submit and preview (an empty
        # body is an empty object: a cancel without a reason).
        body = IntentCancelSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        intent = services.intent_cancel(
            intent_id=intent.id, actor=_agent(request).principal, reason=body.validated_data["reason"]
        )
        return Response(IntentSerializer(intent, context=_context(request)).data)


class IntentPreviewView(APIView):
    """``POST`` a dry run: what exactly would happen; persists nothing."""

    @extend_schema(
        request=IntentPreviewSerializer,
        responses={200: PreviewResponseSerializer, **problem_responses(400, 403, 413, 415, 422)},
        parameters=PROBLEM_HEADERS,
    )
    def post(self, request: Request) -> Response:
        _require_action(request, decision="preview")
        body = IntentPreviewSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        result = services.intent_preview(
            tenant=_agent(request).tenant,
            action=data["action"],
            action_version=data["action_version"],
            arguments=data["arguments"],
            reference=data["reference"],
        )
        payload = {
            "action": result.action,
            "request_hash": result.request_hash,
            "needs_approval": result.needs_approval,
            "policy": result.policy.to_snapshot(),
            **result.preview.__dict__,
            "money": money_json(result.preview.amount_minor, result.preview.currency),
        }
        return Response(PreviewResponseSerializer(payload).data)


class ActionListView(APIView):
    """``GET`` the actions this agent may submit (``selectors.agent_actions``): each with its
    versions and their argument JSON schemas, its risk tier and whether it needs approval."""

    @extend_schema(
        summary="List the actions this agent may submit, with their argument schemas and approval rules",
        responses={200: ActionListSerializer, **problem_responses()},
        parameters=PROBLEM_HEADERS,
    )
    def get(self, request: Request) -> Response:
        actions = selectors.agent_actions(_agent(request))
        return Response(ActionListSerializer({"results": actions}).data)


def _callback(url: str, stored_secret: str, new_secret: str | None = None) -> dict[str, Any]:
    return {"url": url, "secret_hint": secret_hint(stored_secret), "secret": new_secret}


class CallbackView(APIView):
    """The agent's own callback URL for signed webhooks of its intents' terminal states
    (``operations.services.webhooks``): ``GET`` it, ``PUT`` it (the signing secret is answered
    once, when made), ``DELETE`` it."""

    @extend_schema(
        summary="Your callback URL and a hint of its signing secret (url empty: none)",
        responses={200: CallbackSerializer, **problem_responses()},
        parameters=PROBLEM_HEADERS,
    )
    def get(self, request: Request) -> Response:
        # Read now, not from request.user (cached since authentication, up to TOKEN_CACHE_SECONDS).
        url, secret = agent_callback(agent_id=_agent(request).id)
        return Response(CallbackSerializer(_callback(url, secret)).data)

    @extend_schema(
        summary="Register your callback URL (the signing secret is in this answer when new or rotated)",
        request=CallbackSetSerializer,
        responses={200: CallbackSerializer, **problem_responses(400, 413, 415, 422)},
        parameters=PROBLEM_HEADERS,
    )
    def put(self, request: Request) -> Response:
        body = CallbackSetSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        result = services.agent_callback_set(
            agent=_agent(request),
            url=body.validated_data["url"],
            rotate_secret=body.validated_data["rotate_secret"],
        )
        stored = result.agent
        answer = _callback(stored.callback_url, stored.callback_secret, result.new_secret or None)
        return Response(CallbackSerializer(answer).data)

    @extend_schema(
        summary="Remove your callback URL and its secret (no more webhooks)",
        responses={204: None, **problem_responses()},
        parameters=PROBLEM_HEADERS,
    )
    def delete(self, request: Request) -> Response:
        services.agent_callback_clear(agent=_agent(request))
        return Response(status=status.HTTP_204_NO_CONTENT)
