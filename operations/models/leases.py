"""Named leases: "one holder at a time, and never for ever" without session state in the
database connection (``operations.services.leases``)."""

from __future__ import annotations

from django.db import models


class Lease(models.Model):
    """One named lease: held by ``holder`` until ``expires_at`` (database clock).

    A row exists while somebody holds (or held, then died holding) the lease; the holder
    deletes it when done, and a row whose ``expires_at`` has passed is taken over by the next
    claimant. It replaces PostgreSQL *session* advisory locks, which a connection pooler in
    transaction mode leaves on a pooled server connection (DESIGN.md, "Topology").
    """

    name = models.CharField(
        primary_key=True, max_length=600, help_text="what is held, e.g. webhook-delivery-pass"
    )
    holder = models.CharField(max_length=64, help_text="a random token of the claim that holds it")
    expires_at = models.DateTimeField(help_text="after this (database clock) the next claimant takes it over")

    class Meta:
        db_table = "operations_lease"

    def __str__(self) -> str:
        return f"{self.name} until {self.expires_at:%Y-%m-%d %H:%M:%S}"
