"""Statement queries of the sandbox provider (used by ``statements.py``): each product's effects
as its daily statement lists them, and the adjustments (table ``sandbox.statement_adjustments``)
that make a statement leave an item out or show another amount.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from console.lab.sandbox_provider.store import Pool, item_table

STATEMENT_SQL = {
    "payments": """
SELECT 'charge' AS object, id, idempotency_key, NULL AS message_id, reference, amount, currency,
       created_at FROM sandbox.charges
UNION ALL
SELECT 'refund', id, idempotency_key, NULL, reference, amount, currency, created_at
  FROM sandbox.refunds
""",
    "email": """
SELECT 'email' AS object, id, NULL AS idempotency_key, message_id, reference, NULL::bigint AS amount,
       NULL AS currency, created_at FROM sandbox.emails
""",
    "reservations": """
SELECT 'reservation' AS object, id, NULL AS idempotency_key, NULL AS message_id, reference,
       NULL::bigint AS amount, NULL AS currency, created_at FROM sandbox.reservations
""",
}


def statement_lines(pool: Pool, *, product: str, start: datetime, end: datetime) -> list[dict[str, Any]]:
    """The effects of ``product`` created in ``[start, end)``, as a statement shows them: without
    the omitted ones, with an adjusted amount where one was set; oldest first. Withdrawn items
    and cancelled reservations are included (the effect was made).

    Returns:
        rows ``{object, id, idempotency_key, message_id, reference, amount, currency, created_at}``.
    """
    with pool.connection() as conn:
        rows: list[dict[str, Any]] = conn.execute(
            f"SELECT e.object, e.id, e.idempotency_key, e.message_id, e.reference,"  # noqa: S608
            f" coalesce(a.amount, e.amount) AS amount, e.currency, e.created_at"
            f" FROM ({STATEMENT_SQL[product]}) e"
            f" LEFT JOIN sandbox.statement_adjustments a ON a.product = %s AND a.id = e.id"
            f" WHERE e.created_at >= %s AND e.created_at < %s AND NOT coalesce(a.omitted, false)"
            f" ORDER BY e.created_at, e.id",
            [product, start, end],
        ).fetchall()
    return rows


def adjust_statement(
    pool: Pool, *, product: str, item_id: str, omit: bool = False, amount: int | None = None
) -> bool:
    """Make statements leave item ``item_id`` out (``omit``) or show ``amount`` for it.

    Returns:
        ``True`` when the item exists, ``False`` when ``product`` has no such item.
    """
    table = item_table(product, item_id)
    if table is None:
        return False
    with pool.connection() as conn, conn.transaction():
        if not conn.execute(f"SELECT 1 FROM sandbox.{table} WHERE id = %s", [item_id]).fetchone():  # noqa: S608
            return False
        conn.execute(
            "INSERT INTO sandbox.statement_adjustments (product, id, omitted, amount) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (product, id) DO UPDATE SET"
            " omitted = sandbox.statement_adjustments.omitted OR EXCLUDED.omitted,"
            " amount = coalesce(EXCLUDED.amount, sandbox.statement_adjustments.amount)",
            [product, item_id, omit, amount],
        )
    return True
