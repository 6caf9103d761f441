"""Render crash-lab results in the reference table's shape (effects / missing per cell)."""

from __future__ import annotations

from console.lab.crashlab.verdict import DRILL, FAILOVER, RESTORE, Row

LABELS = {
    "retry": "retry, no deduplication (control)",
    "record-after": "record completion after the call (control)",
    "record-before": "record completion before the call (control)",
    "ledger": "Effect Ledger (stable key, lease, fence, reconciler)",
}


DUPLICATES_HEADER = "duplicates: created / found / compensated / flagged / missed"
RESTORE_HEADER = "restore: lost by the restore / duplicates / lost / FAILED with effect / with an operator"
FAILOVER_HEADER = (
    "failover: lost by the promotion / duplicates / lost / FAILED with effect / with an operator"
)
#: The drills whose row fills a column of its own rather than the boundaries' columns.
DRILLS = {DRILL, RESTORE, FAILOVER}


def _label(row: Row) -> str:
    label = LABELS.get(row.strategy, row.strategy)
    if row.strategy == DRILL:
        per = {name: (row.detail.get(name) or {}).get("intents", "?") for name in ("email", "reservations")}
        return (
            f"Effect Ledger, duplicate drill ({per['email']} email + {per['reservations']} reservations): "
            "no keys, first send lost, operator absent"
        )
    if row.strategy in {RESTORE, FAILOVER}:
        kinds = " + ".join(
            f"{(row.detail.get(name) or {}).get('references', '?')} {name}"
            for name in row.provider.split("+")
        )
        if row.strategy == FAILOVER:
            behind = (row.detail.get("lag") or {}).get("wal_bytes_behind", "?")
            return (
                f"Effect Ledger, failover drill ({kinds}): streaming replica cut off {behind} WAL bytes "
                "behind, primary stopped hard, replica promoted, lost intents re-submitted"
            )
        return (
            f"Effect Ledger, restore drill ({kinds}): ledger database restored from a mid-run dump, "
            "lost intents re-submitted"
        )
    if row.provider == "email":
        return "Effect Ledger, email: no keys, lookup by Message-ID"
    if row.provider == "reservations":
        return "Effect Ledger, reservations: no keys, list by reference"
    return label


def markdown_table(rows: list[Row], ops: int) -> str:
    """A Markdown table: one line per strategy, one column per boundary with
    ``effects / missing``, then (when the duplicate drill ran) its duplicates column, (when the
    restore drill ran) its restore column, (when the failover drill ran) its failover column, then requests and kills per line, then the verdict."""
    boundaries = list(dict.fromkeys(row.boundary for row in rows))
    lines: dict[str, dict[str, Row]] = {}
    for row in rows:
        lines.setdefault(_label(row), {})[row.boundary] = row
    matrix = any(row.strategy not in DRILLS for row in rows)
    first = f"strategy ({ops} ops per cell)" if matrix else "strategy"
    header = [first, *[f"{b}: effects / missing" for b in boundaries]]
    drill = any(row.strategy == DRILL for row in rows)
    header += [DUPLICATES_HEADER] if drill else []
    restore = any(row.strategy == RESTORE for row in rows)
    header += [RESTORE_HEADER] if restore else []
    failover = any(row.strategy == FAILOVER for row in rows)
    header += [FAILOVER_HEADER] if failover else []
    header += ["requests", "kills", "verdict"]
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, cells in lines.items():
        values = [f"{c.effects} / {c.missing}" if (c := cells.get(b)) else "" for b in boundaries]
        if drill:
            values.append(
                " / ".join(str(n) for n in (d.duplicates, d.found, d.compensated, d.flagged, d.missed))
                if (d := cells.get("operator-absent")) and d.strategy == DRILL
                else ""
            )
        if restore:
            values.append(
                " / ".join(
                    str(n) for n in (r.interrupted, r.duplicates, r.missing, r.failed_with_effect, r.operator)
                )
                if (r := cells.get("restore")) and r.strategy == RESTORE
                else ""
            )
        if failover:
            values.append(
                " / ".join(
                    str(n) for n in (f.interrupted, f.duplicates, f.missing, f.failed_with_effect, f.operator)
                )
                if (f := cells.get("failover")) and f.strategy == FAILOVER
                else ""
            )
        requests = " + ".join(str(c.requests) for c in cells.values())
        kills = " + ".join(str(c.kills) for c in cells.values())
        problems = [p for c in cells.values() for p in c.problems]
        verdict = "PASS" if not problems else "FAIL: " + "; ".join(problems)
        out.append("| " + " | ".join([label, *values, requests, kills, verdict]) + " |")
    return "\n".join(out) + "\n"
