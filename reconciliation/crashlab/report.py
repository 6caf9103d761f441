"""Render crash-lab results in the reference table's shape (effects / missing per cell)."""

from __future__ import annotations

from reconciliation.crashlab.verdict import Row

LABELS = {
    "retry": "retry, no deduplication (control)",
    "record-after": "record completion after the call (control)",
    "record-before": "record completion before the call (control)",
    "ledger": "Effect Ledger (stable key, lease, fence, reconciler)",
}


def _label(row: Row) -> str:
    label = LABELS.get(row.strategy, row.strategy)
    if row.provider == "email":
        return "Effect Ledger, email: no keys, lookup by Message-ID"
    if row.provider == "reservations":
        return "Effect Ledger, reservations: no keys, list by reference"
    return label


def markdown_table(rows: list[Row], ops: int) -> str:
    """A Markdown table: one line per strategy, one column per boundary with
    ``effects / missing``, then requests and kills per line, then the verdict."""
    boundaries = list(dict.fromkeys(row.boundary for row in rows))
    lines: dict[str, dict[str, Row]] = {}
    for row in rows:
        lines.setdefault(_label(row), {})[row.boundary] = row
    header = ["strategy (" + str(ops) + " ops per cell)", *[f"{b}: effects / missing" for b in boundaries]]
    header += ["requests", "kills", "verdict"]
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, cells in lines.items():
        values = [f"{c.effects} / {c.missing}" if (c := cells.get(b)) else "" for b in boundaries]
        requests = " + ".join(str(c.requests) for c in cells.values())
        kills = " + ".join(str(c.kills) for c in cells.values())
        problems = [p for c in cells.values() for p in c.problems]
        verdict = "PASS" if not problems else "FAIL: " + "; ".join(problems)
        out.append("| " + " | ".join([label, *values, requests, kills, verdict]) + " |")
    return "\n".join(out) + "\n"
