"""Machine principals: an ``Agent`` and its bearer tokens (``AgentToken``)."""

from __future__ import annotations

from django.db import models


class Agent(models.Model):
    """A machine principal (an AI agent or program) authenticating with bearer tokens
    (``AgentToken``: only their sha256 is stored; two are valid at once during a rotation).

    Its reach (issue 18, item 6): it may submit only the actions its ``actions`` patterns match,
    and it reads, lists and cancels its own intents (``Scope.OWN``) or its whole tenant's
    (``Scope.TENANT``). It can never approve or resolve anything.
    """

    class Scope(models.TextChoices):
        OWN = "own", "Its own intents"
        TENANT = "tenant", "Every intent of its tenant"

    name = models.CharField(max_length=100)
    tenant = models.CharField(max_length=100)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    actions = models.JSONField(
        default=list,
        blank=True,
        help_text='action patterns it may submit and preview: "payments.*", "email.send", "*" '
        "(operations.access.scopes.action_allowed); empty: none",
    )
    scope = models.CharField(
        max_length=10,
        choices=Scope.choices,
        default=Scope.OWN,
        help_text="which intents it reads, lists and cancels: its own, or its whole tenant's",
    )
    callback_url = models.CharField(
        max_length=2000,
        blank=True,
        default="",
        db_default="",
        help_text="where signed webhooks of its intents' terminal states are POSTed "
        "(operations.notifications.callback_urls); blank: none",
    )
    callback_secret = models.CharField(
        max_length=100,
        blank=True,
        default="",
        db_default="",
        help_text="the Standard Webhooks signing secret (whsec_<base64>), made when a URL is first set; "
        "stored as is, since HMAC signing needs it",
    )

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="agent_name_unique")]

    def __str__(self) -> str:
        return f"{self.principal}@{self.tenant}"

    @property
    def principal(self) -> str:
        """The principal string stored on intents, ``agent:<name>``."""
        return f"agent:{self.name}"

    @property
    def is_authenticated(self) -> bool:
        """DRF treats an authenticated agent like a user for permission checks."""
        return True


class AgentToken(models.Model):
    """One bearer token of an agent (only its sha256). Several may be valid at once: a rotation
    (``manage.py rotate_agent_token``) mints a new one and leaves the old valid until its
    ``expires_at``, so there is no moment without a valid token."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="tokens")
    digest = models.CharField(max_length=64, unique=True, help_text="sha256 hex of the token")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="refused from then on; empty: never")
    revoked_at = models.DateTimeField(null=True, blank=True, help_text="refused from then on")

    def __str__(self) -> str:
        return f"token {self.digest[:8]}… of {self.agent_id}"
