"""Reads of the named leases (``operations.services.leases`` writes them)."""

from __future__ import annotations

from django.db import connection

from operations.models import Lease


def lease_held(*, name: str) -> bool:
    """Whether somebody holds an unexpired claim on the lease ``name`` now (database clock)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM {Lease._meta.db_table} WHERE name = %s AND expires_at >= statement_timestamp()",
            [name],
        )
        return cursor.fetchone() is not None
