"""The Django admin site's views of role grants (``RoleGrant``: where each console role holds)
and of agents (their reach, whether active, their tokens' expiry and revocation)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from operations.access.scopes import action_patterns_parse
from operations.models import Agent, AgentToken, RoleGrant, WebhookDelivery
from operations.notifications.callback_urls import callback_url_problem
from operations.notifications.webhook_sender import secret_hint
from operations.services.webhooks import agent_callback_clear, agent_callback_set


@admin.register(RoleGrant)
class RoleGrantAdmin(admin.ModelAdmin):  # type: ignore[type-arg]  # not subscriptable at run time
    """Add, list and remove an account's grants: role (a group's name) and tenant (``*``: every tenant)."""

    list_display = ("user", "role", "tenant", "created_at")
    list_filter = ("role", "tenant")
    search_fields = ("user__username", "role", "tenant")
    readonly_fields = ("created_at",)


class AgentForm(forms.ModelForm):  # type: ignore[type-arg]
    """An agent's reach as an operator edits it: the action patterns as one comma-separated
    line, checked by the same parser as ``create_agent`` (``operations.access.scopes``)."""

    actions_text = forms.CharField(
        label="Actions",
        required=False,
        help_text="comma-separated patterns: '*', 'payments.*', 'email.send'; empty: none",
    )

    class Meta:
        model = Agent
        fields = ("scope", "is_active", "callback_url")

    def clean_callback_url(self) -> str:
        url = str(self.cleaned_data.get("callback_url") or "")
        problem = callback_url_problem(url) if url else ""
        if problem:
            raise forms.ValidationError(problem)
        return url

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["actions_text"].initial = ", ".join(self.instance.actions or [])

    def clean_actions_text(self) -> list[str]:
        try:
            return action_patterns_parse(self.cleaned_data.get("actions_text") or "")
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from exc

    def save(self, commit: bool = True) -> Agent:
        self.instance.actions = self.cleaned_data["actions_text"]
        agent: Agent = super().save(commit=commit)
        return agent


class AgentTokenInline(admin.TabularInline):  # type: ignore[type-arg]
    """An agent's tokens: only their digests are stored; an expiry or a revocation may be set
    here (each web process refuses it within ``TOKEN_CACHE_SECONDS``). New tokens come from
    ``create_agent`` and ``rotate_agent_token``, which show them once."""

    model = AgentToken
    extra = 0
    can_delete = False
    fields = ("digest_prefix", "created_at", "expires_at", "revoked_at")
    readonly_fields = ("digest_prefix", "created_at")

    @admin.display(description="digest")
    def digest_prefix(self, token: AgentToken) -> str:
        return f"{token.digest[:12]}…"

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):  # type: ignore[type-arg]  # not subscriptable at run time
    """Agents: their reach (actions, scope), whether they are active, and their tokens. Name and
    tenant are fixed (intents and keys are recorded under them); agents are made with
    ``create_agent``."""

    form = AgentForm
    list_display = ("name", "tenant", "scope", "actions", "is_active", "callback_url", "created_at")
    list_filter = ("tenant", "scope", "is_active")
    search_fields = ("name", "tenant")
    readonly_fields = ("name", "tenant", "created_at", "signing_secret")
    fields = (
        "name",
        "tenant",
        "actions_text",
        "scope",
        "is_active",
        "callback_url",
        "signing_secret",
        "created_at",
    )
    inlines = (AgentTokenInline,)
    actions = ("rotate_callback_secret",)

    @admin.display(description="webhook signing secret")
    def signing_secret(self, agent: Agent) -> str:
        return secret_hint(agent.callback_secret) or "—"

    def save_model(self, request: HttpRequest, obj: Agent, form: Any, change: bool) -> None:
        """The callback URL goes through the services: a first URL makes the signing secret,
        shown once in a message; a blank URL removes it and the secret. The other fields are
        saved by name: ``obj`` was read when the request began, and a full save would write back
        the callback URL and secret of then over a registration or rotation made meanwhile."""
        url = obj.callback_url
        obj.save(update_fields=["scope", "is_active", "actions"])
        if not url:
            agent_callback_clear(agent=obj)
            return
        result = agent_callback_set(agent=obj, url=url)
        if result.new_secret:
            messages.warning(
                request, f"Signing secret of {obj} (shown once; give it to the agent): {result.new_secret}"
            )

    @admin.action(description="Rotate the webhook signing secret (shown once)")
    def rotate_callback_secret(self, request: HttpRequest, queryset: QuerySet[Agent]) -> None:
        for agent in queryset:
            if not agent.callback_url:
                messages.error(request, f"{agent} has no callback URL: set one first")
                continue
            secret = agent_callback_set(agent=agent, url=agent.callback_url, rotate_secret=True).new_secret
            messages.warning(request, f"New signing secret of {agent} (shown once): {secret}")

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False  # intents name it; deactivate instead


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):  # type: ignore[type-arg]  # not subscriptable at run time
    """Webhook deliveries, read-only (the console's Webhooks page re-sends them)."""

    list_display = ("message_id", "event_type", "state", "attempts", "tenant", "agent", "created_at")
    list_filter = ("state", "event_type", "tenant")
    search_fields = ("message_id",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
