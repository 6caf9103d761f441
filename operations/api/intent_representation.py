"""The intent as every endpoint of the API returns it (``IntentSerializer``), and read by itself
with the newest decision a person made on it (``IntentDetailSerializer``): its outcome, its
links into the API and the console, why it is held or a likely duplicate.
"""

from __future__ import annotations

import copy
from typing import Any

from django.urls import NoReverseMatch, reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from operations.access.scopes import agent_sees_principal
from operations.models import AuditEvent, Intent, Outcome
from operations.selectors import intent_latest_decision, intent_latest_outcome, intent_likely_duplicate
from operations.selectors.intent_pages import PageFacts


class FieldsBuiltOnce:
    """Serializer mixin for read-only representations: the fields are built once per class and
    each instance gets shallow copies to bind (issue 37). DRF's ``ModelSerializer.get_fields``
    rebuilds every field from the model on every instantiation (deep copies of the declared
    ones, a field per model field): a tenth of a submit's time. A copy is unbound (the
    prototypes never are), so ``bind`` sets its name, parent and source as on a fresh field.
    For output only: a writable serializer's fields keep validators that must not be shared."""

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        """Copies of the class's fields (built by DRF's ``get_fields`` the first time)."""
        cls = type(self)
        prototypes = cls.__dict__.get("_field_prototypes")
        if prototypes is None:
            prototypes = super().get_fields()  # type: ignore[misc]
            cls._field_prototypes = prototypes  # type: ignore[attr-defined]
        return {name: copy.copy(field) for name, field in prototypes.items()}


class OutcomeSerializer(FieldsBuiltOnce, serializers.ModelSerializer[Outcome]):
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


class ResolutionSerializer(FieldsBuiltOnce, serializers.ModelSerializer[AuditEvent]):
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


class IntentSerializer(FieldsBuiltOnce, serializers.ModelSerializer[Intent]):
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
            earlier = self.held_behind_principal(instance)
            if principal is not None and earlier is not None and earlier != principal:
                data["held_behind"] = None
                if data.get("likely_duplicate"):
                    data["likely_duplicate"] = {
                        **data["likely_duplicate"],
                        "earlier_intent": None,
                        "reason": OTHERS_DUPLICATE,
                    }
        return data

    def page_facts(self) -> PageFacts | None:
        """The facts read for the whole page (``context["page_facts"]``, a list answer), or None."""
        facts: PageFacts | None = self.context.get("page_facts")
        return facts

    def held_behind_principal(self, instance: Intent) -> str | None:
        """The principal of the intent ``instance`` is held behind (None: none)."""
        if (facts := self.page_facts()) is not None:
            return (
                facts.held_behind_principals.get(instance.held_behind_id) if instance.held_behind_id else None
            )
        return instance.held_behind.principal if instance.held_behind is not None else None

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
        outcome = self.latest_outcome(intent)
        return OutcomeSerializer(outcome).data if outcome else None

    def latest_outcome(self, intent: Intent) -> Outcome | None:
        """The outcome the answer shows (``intent_latest_outcome``; the page's, in a list)."""
        if (facts := self.page_facts()) is not None:
            return facts.outcomes.get(intent.id)
        return intent_latest_outcome(intent)

    def likely_duplicate_event(self, intent: Intent) -> AuditEvent | None:
        """The event ``likely_duplicate`` shows (``intent_likely_duplicate``; the page's, in a list)."""
        if (facts := self.page_facts()) is not None:
            return facts.likely_duplicates.get(intent.id)
        return intent_likely_duplicate(intent)

    @extend_schema_field(LikelyDuplicateSerializer(allow_null=True))
    def get_likely_duplicate(self, intent: Intent) -> dict[str, Any] | None:
        """The reason of its ``likely_duplicate`` audit event (``likely_duplicate_event``)."""
        event = self.likely_duplicate_event(intent)
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
        event = self.latest_decision(intent)
        return ResolutionSerializer(event).data if event else None

    def latest_decision(self, intent: Intent) -> AuditEvent | None:
        """The decision ``resolution`` shows (``intent_latest_decision``)."""
        return intent_latest_decision(intent)
