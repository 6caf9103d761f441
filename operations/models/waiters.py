"""Requests waiting for an intent's status to change (``IntentWaiter``)."""

from __future__ import annotations

from django.db import models


class IntentWaiter(models.Model):
    """A request waiting for ``intent_id``'s status to change (``operations.api.waiting``): while a
    row names an intent, the status trigger of migration 0028 sends ``pg_notify`` for it; an
    intent nobody waits for costs its writers one index probe and no NOTIFY (whose commit takes
    a server-wide lock). Rows live for one wait; ``expires_at`` lets a crashed web process's
    rows be swept. An UNLOGGED table: nothing in it needs to survive a crash.
    """

    id = models.BigAutoField(primary_key=True)
    intent_id = models.UUIDField(db_index=True)
    expires_at = models.DateTimeField(db_index=True)
