"""Spend and effects ceilings: what each day's intents reserved (``SpendWindow``) and each
intent's share of it (``Reservation``), written by ``operations.services.ceilings``.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from operations.models.intents import Intent


class SpendWindow(models.Model):
    """What the intents of one (tenant, action, currency) reserved in one calendar day (UTC).

    Ceilings are reservations against these rows (``operations.services.ceilings``): a claim adds
    its amount and one effect with one conditional ``UPDATE`` that refuses to pass the cap, so
    concurrent claims are counted one after the other under the row lock. ``currency`` is blank
    on the row that counts effects of every currency (``effects_per_day``).
    """

    tenant = models.CharField(max_length=100)
    action = models.CharField(max_length=100)
    currency = models.CharField(max_length=3, blank=True)
    day = models.DateField(help_text="the calendar day in UTC")
    spent_minor = models.BigIntegerField(default=0, help_text="minor units of currency reserved")
    effects = models.IntegerField(default=0, help_text="effects reserved (on the blank-currency row)")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "action", "currency", "day"], name="spend_window_key"),
            models.CheckConstraint(
                condition=Q(spent_minor__gte=0) & Q(effects__gte=0), name="spend_window_non_negative"
            ),
        ]


class Reservation(models.Model):
    """One intent's share of one ``SpendWindow``, held while its effect may exist and released
    (``released_at``) when it surely does not."""

    intent = models.ForeignKey(Intent, on_delete=models.PROTECT, related_name="reservations")
    tenant = models.CharField(max_length=100)
    action = models.CharField(max_length=100)
    currency = models.CharField(max_length=3, blank=True)
    day = models.DateField()
    spent_minor = models.BigIntegerField(default=0)
    effects = models.IntegerField(default=0)
    over_ceiling = models.BooleanField(default=False, help_text="taken past the cap with an approval")
    created_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # An intent holds at most one share of a window at a time.
            models.UniqueConstraint(
                fields=["intent", "currency", "day"],
                condition=Q(released_at__isnull=True),
                name="reservation_one_open_per_window",
            ),
        ]
        indexes = [
            models.Index(fields=["intent"], condition=Q(released_at__isnull=True), name="reservation_open")
        ]
