"""Explicit input and output serializers of the intents API."""

from __future__ import annotations

from typing import Any

from django.urls import NoReverseMatch, reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from operations.access.scopes import agent_sees_principal
from operations.models import AuditEvent, Intent, Outcome
from operations.policies.rules import APPROVAL_RULES, RISK_TIERS
from operations.selectors import intent_latest_decision, intent_latest_outcome, intent_likely_duplicate


class StrictSerializer(serializers.Serializer[Any]):
    """Refuses unknown fields, so a typo is reported instead of silently ignored."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["unexpected field"] for name in unknown})
        return super().to_internal_value(data)


class JsonIntegerField(serializers.IntegerField):
    """An integer that is a JSON integer: ``"1"``, ``1.0`` and ``true`` are refused, as money
    floats are, instead of being coerced (a version is part of the request's identity)."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        value: int = super().to_internal_value(data)
        return value


class IntentCreateSerializer(StrictSerializer):
    """Body of ``POST /api/v1/intents``. ``metadata`` is stored but not hashed."""

    action = serializers.CharField(max_length=100)
    action_version = JsonIntegerField(min_value=1, max_value=1000, default=1)
    arguments = serializers.DictField(child=serializers.JSONField(), allow_empty=True)
    reference = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    metadata = serializers.DictField(child=serializers.JSONField(), required=False, default=dict)


class IntentPreviewSerializer(StrictSerializer):
    """Body of ``POST /api/v1/intents/preview``."""

    action = serializers.CharField(max_length=100)
    action_version = JsonIntegerField(min_value=1, max_value=1000, default=1)
    arguments = serializers.DictField(child=serializers.JSONField(), allow_empty=True)
    reference = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class IntentCancelSerializer(StrictSerializer):
    """Optional body of ``POST /api/v1/intents/{id}/cancel``."""

    reason = serializers.CharField(max_length=1000, required=False, allow_blank=True, default="")


class IntentListQuerySerializer(StrictSerializer):
    """Query parameters of ``GET /api/v1/intents``."""

    status = serializers.ChoiceField(choices=Intent.Status.choices, required=False)
    action = serializers.CharField(max_length=100, required=False)
    reference = serializers.CharField(max_length=200, required=False)
    created_after = serializers.DateTimeField(required=False)
    created_before = serializers.DateTimeField(required=False)
    cursor = serializers.CharField(required=False)
    page_size = serializers.IntegerField(min_value=1, max_value=200, required=False)


class OutcomeSerializer(serializers.ModelSerializer[Outcome]):
    """The newest evidence of the effect."""

    class Meta:
        model = Outcome
        fields = ["source", "provider_reference", "response_digest", "created_at"]
        read_only_fields = fields


OUTCOME_STATUSES = frozenset({"SUCCEEDED", "COMPENSATING", "COMPENSATED"})

#: The console page a person opens for an intent, by status (URL names of ``console.urls``):
#: the approval page while it waits for one, the operators' pages while it waits for them.
CONSOLE_PAGES = {
    "AWAITING_APPROVAL": "approval-detail",
    "UNKNOWN": "unknown-detail",
    "HELD": "held-detail",
}
CONSOLE_DEFAULT_PAGE = "intent-detail"


class IntentLinksSerializer(serializers.Serializer[Any]):
    """``links`` of an intent: absolute URLs (RFC 3986), present when the request is known."""

    self = serializers.URLField(help_text="this intent in the API")
    console = serializers.URLField(
        allow_null=True,
        help_text="the console page a person opens for it: the approval page (/approvals/<id>/) "
        "while AWAITING_APPROVAL, the operators' page while UNKNOWN or HELD, its detail page "
        "otherwise; null when this deployment serves no console",
    )


class ResolutionSerializer(serializers.ModelSerializer[AuditEvent]):
    """The newest decision a person made that moved the intent (its audit event)."""

    at = serializers.DateTimeField(source="created_at", read_only=True)

    class Meta:
        model = AuditEvent
        fields = ["event", "actor", "from_status", "to_status", "reason", "at"]
        read_only_fields = fields


class LikelyDuplicateSerializer(serializers.Serializer[Any]):
    """``likely_duplicate`` of an intent held (or rejected) because an earlier intent for the same
    business action already made its effect."""

    earlier_intent = serializers.UUIDField(
        allow_null=True,
        help_text="the earlier intent whose effect stands (null when this agent may not read it)",
    )
    reason = serializers.CharField(help_text="what the earlier intent already did, and when")
    at = serializers.DateTimeField(help_text="when it was found to be a likely duplicate")


#: ``likely_duplicate.reason`` for an agent that may not read the earlier intent (scope ``own``).
OTHERS_DUPLICATE = (
    "likely duplicate: an intent of another principal for the same business action already made its effect"
)


class IntentSerializer(serializers.ModelSerializer[Intent]):
    """The representation of an intent returned by every endpoint."""

    intent_id = serializers.UUIDField(source="id", read_only=True)
    outcome = serializers.SerializerMethodField()
    held_behind = serializers.UUIDField(
        source="held_behind_id",
        read_only=True,
        allow_null=True,
        help_text=(
            "status HELD: the earlier intent for the same business action this one waits for. "
            "Do not submit again: this intent proceeds if that one ends without effect, and goes to "
            "a person if it succeeded."
        ),
    )
    hold_reason = serializers.CharField(
        read_only=True,
        help_text=(
            "status HELD for a person rather than behind an earlier intent: why this deployment cannot "
            "run it (its action or version is not served here); empty otherwise. Nothing was sent."
        ),
    )
    likely_duplicate = serializers.SerializerMethodField(
        help_text=(
            "set when this intent was held for a person (status HELD) or refused by policy (status "
            "REJECTED) as a likely duplicate: an earlier intent for the same business action (its "
            "reference) already made its effect, while it was open or within the policy's "
            "reuse_window_seconds. Do not submit it again; to do the action a second time on purpose, "
            "use a new reference. Null otherwise."
        )
    )
    links = serializers.SerializerMethodField()

    def to_representation(self, instance: Intent) -> dict[str, Any]:
        """The intent as JSON. With an ``agent`` in the context, ``held_behind`` (and the
        earlier intent ``likely_duplicate`` names) is shown only when that agent may read it: an
        agent of scope ``own`` is not told the id of a colleague's intent (issue 18; the hold
        itself stays, since one business action per tenant is the safety rule)."""
        data: dict[str, Any] = super().to_representation(instance)
        agent = self.context.get("agent")
        if agent is not None and data.get("held_behind") is not None:
            principal = agent_sees_principal(agent)
            if (
                principal is not None
                and instance.held_behind is not None
                and instance.held_behind.principal != principal
            ):
                data["held_behind"] = None
                if data.get("likely_duplicate"):
                    data["likely_duplicate"] = {
                        **data["likely_duplicate"],
                        "earlier_intent": None,
                        "reason": OTHERS_DUPLICATE,
                    }
        return data

    class Meta:
        model = Intent
        fields = [
            "intent_id",
            "tenant",
            "principal",
            "action",
            "action_version",
            "arguments",
            "request_hash",
            "reference",
            "metadata",
            "status",
            "held_behind",
            "hold_reason",
            "likely_duplicate",
            "attempt_count",
            "approval_expires_at",
            "last_error",
            "outcome",
            "links",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    def get_outcome(self, intent: Intent) -> dict[str, Any] | None:
        if intent.status not in OUTCOME_STATUSES:  # outcomes are written only with these
            return None
        outcome = intent_latest_outcome(intent)
        return OutcomeSerializer(outcome).data if outcome else None

    @extend_schema_field(LikelyDuplicateSerializer(allow_null=True))
    def get_likely_duplicate(self, intent: Intent) -> dict[str, Any] | None:
        """The reason of its ``likely_duplicate`` audit event (``intent_likely_duplicate``)."""
        event = intent_likely_duplicate(intent)
        if event is None:
            return None
        earlier = event.data.get("earlier") if isinstance(event.data, dict) else None
        return LikelyDuplicateSerializer(
            {
                "earlier_intent": earlier or intent.held_behind_id,
                "reason": event.reason,
                "at": event.created_at,
            }
        ).data

    @extend_schema_field(IntentLinksSerializer)
    def get_links(self, intent: Intent) -> dict[str, str | None]:
        """Absolute URLs of the intent in the API and in the console (``CONSOLE_PAGES``), built
        from the request (its scheme and ``Host``, checked against ``ALLOWED_HOSTS``)."""
        request = self.context.get("request")
        api_path = f"/api/v1/intents/{intent.id}"
        try:
            console_path: str | None = reverse(
                CONSOLE_PAGES.get(intent.status, CONSOLE_DEFAULT_PAGE), args=[intent.id]
            )
        except NoReverseMatch:
            console_path = None
        if request is None:
            return {"self": api_path, "console": console_path}
        return {
            "self": request.build_absolute_uri(api_path),
            "console": request.build_absolute_uri(console_path) if console_path else None,
        }


class IntentDetailSerializer(IntentSerializer):
    """One intent read by itself (``GET /api/v1/intents/{id}``): the representation of every
    endpoint plus ``resolution``, the newest decision a person made that moved it."""

    resolution = serializers.SerializerMethodField()

    class Meta(IntentSerializer.Meta):
        fields = [*IntentSerializer.Meta.fields, "resolution"]
        read_only_fields = fields

    @extend_schema_field(ResolutionSerializer(allow_null=True))
    def get_resolution(self, intent: Intent) -> dict[str, Any] | None:
        """The newest approval, rejection, operator resolution, release or cancel by a person
        (``intent_latest_decision``); null when no person decided anything on it."""
        event = intent_latest_decision(intent)
        return ResolutionSerializer(event).data if event else None


class ActionVersionSerializer(serializers.Serializer[Any]):
    """One served version of an action."""

    action_version = serializers.IntegerField(min_value=1)
    arguments_schema = serializers.DictField(
        help_text="JSON Schema (draft 2020-12) of the arguments: what a submission is validated against"
    )


class ActionSerializer(serializers.Serializer[Any]):
    """One action the agent may submit (``operations.selectors.actions.ActionDescription``)."""

    action = serializers.CharField()
    versions = ActionVersionSerializer(many=True)
    risk_tier = serializers.ChoiceField(choices=list(RISK_TIERS))
    needs_approval = serializers.ChoiceField(
        choices=["always", "never", "depends_on_arguments"],
        help_text="whether an intent waits for a person's approval; depends_on_arguments: an amount "
        "above approval_threshold_minor, or in a currency it does not name (the preview says exactly)",
    )
    approval = serializers.ChoiceField(choices=list(APPROVAL_RULES))
    approval_threshold_minor = serializers.DictField(
        child=serializers.IntegerField(),
        allow_null=True,
        help_text="above_amount: the threshold per ISO 4217 currency, in minor units",
    )
    approvals_required = serializers.IntegerField(min_value=1)


class ActionListSerializer(serializers.Serializer[Any]):
    """``GET /api/v1/actions``: ``{"results": [action, ...]}``, sorted by name."""

    results = ActionSerializer(many=True)


class MoneySerializer(serializers.Serializer[Any]):
    """The money an action moves, exact: ``{"amount_minor": 125000, "currency": "JPY",
    "exponent": 0, "decimal": "125000"}`` (``operations.money.money_json``)."""

    amount_minor = serializers.IntegerField(help_text="integer minor units, as submitted")
    currency = serializers.CharField(help_text="ISO 4217 code, upper case")
    exponent = serializers.IntegerField(
        min_value=0, help_text="ISO 4217 minor-unit digits of the currency (JPY 0, EUR 2, KWD 3)"
    )
    decimal = serializers.RegexField(
        r"^-?[0-9]+(\.[0-9]+)?$",
        help_text="the amount in major units as an exact decimal string: amount_minor / 10^exponent "
        'with exactly exponent digits after the point ("125000", "49.90", "1.234")',
    )


class PreviewResponseSerializer(serializers.Serializer[Any]):
    """What ``POST /api/v1/intents/preview`` answers; nothing is persisted."""

    action = serializers.CharField()
    request_hash = serializers.CharField()
    needs_approval = serializers.BooleanField()
    summary = serializers.CharField()
    target = serializers.CharField()
    amount_minor = serializers.IntegerField(allow_null=True)
    currency = serializers.CharField(allow_null=True)
    money = MoneySerializer(
        allow_null=True,
        help_text="the money the action moves, converted by its currency; null when it moves none",
    )
    scope = serializers.CharField()
    checks = serializers.ListField(child=serializers.DictField())
    policy = serializers.DictField()


class FieldErrorSerializer(serializers.Serializer[Any]):
    """One failing field of a 422 problem: ``{"field": "arguments.amount", "message": "..."}``."""

    field = serializers.CharField(help_text="dotted path of the field (``body`` for the whole body)")
    message = serializers.CharField()


class ProblemDetailsSerializer(serializers.Serializer[Any]):
    """The body of every error, ``application/problem+json`` (RFC 9457 section 3), as
    ``operations.api.support.problem`` builds it: the standard members, ``code`` (the last
    segment of ``type``), and the extension members some problems carry (section 3.2)."""

    type = serializers.CharField(
        help_text="tag URI naming the problem, e.g. tag:effect-ledger,2026:problems/not-found"
    )
    title = serializers.CharField()
    status = serializers.IntegerField(min_value=400, max_value=599)
    detail = serializers.CharField()
    code = serializers.CharField(help_text="stable slug, the last segment of type")
    known_actions = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="422 for an unknown action: the actions served",
    )
    allowed_actions = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="403 action-not-allowed: the action patterns this agent may submit",
    )
    intent_id = serializers.UUIDField(
        required=False, help_text="422 idempotency-key-reused: the intent the key belongs to"
    )
    current_status = serializers.ChoiceField(
        choices=Intent.Status.choices, required=False, help_text="409: the intent's status now"
    )

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        """The members above plus ``errors`` (declared here: an attribute of that name would
        hide ``Serializer.errors``)."""
        fields = super().get_fields()
        fields["errors"] = FieldErrorSerializer(
            many=True, required=False, help_text="422: every failing field"
        )
        return fields


class JsonStringField(serializers.CharField):
    """A string that is a JSON string: numbers and booleans are refused, not coerced."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        value: str = super().to_internal_value(data)
        return value


class JsonBooleanField(serializers.BooleanField):
    """A boolean that is a JSON boolean: ``"true"`` and ``1`` are refused, not coerced."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class CallbackSetSerializer(StrictSerializer):
    """Body of ``PUT /api/v1/callback``."""

    url = JsonStringField(
        max_length=2000,
        trim_whitespace=False,
        help_text="absolute http(s) URL with a host; no credentials, no fragment (README, 'Webhooks to agents')",
    )
    rotate_secret = JsonBooleanField(
        required=False, default=False, help_text="make a new signing secret (the old one stops signing now)"
    )


class CallbackSerializer(serializers.Serializer[Any]):
    """An agent's callback registration as the API shows it."""

    url = serializers.CharField(help_text="where terminal states are POSTed; empty: none")
    secret_hint = serializers.CharField(help_text="whsec_… and the secret's last 4 characters; empty: none")
    secret = serializers.CharField(
        allow_null=True,
        help_text="the new signing secret (whsec_<base64>), only in the answer that made it; null otherwise",
    )
