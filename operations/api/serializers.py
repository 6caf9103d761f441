"""Explicit input and output serializers of the intents API; the intent itself, as every endpoint
returns it, is ``operations.api.intent_representation``."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from operations.models import Intent
from operations.policies.rules import APPROVAL_RULES, RISK_TIERS


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
        help_text="absolute http(s) URL with a host; no credentials, no fragment (docs/reference/webhooks.md)",
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
