"""Shaping for console pages (no reads here): what changed between two payloads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DiffRow:
    """One changed leaf between two payloads; ``before``/``after`` are None when absent."""

    path: str
    before: Any
    after: Any


def payload_diff(before: Any, after: Any, path: str = "") -> list[DiffRow]:
    """Every leaf that differs between two JSON values, as dotted paths (``items[0].sku``)."""
    if isinstance(before, dict) and isinstance(after, dict):
        rows: list[DiffRow] = []
        for key in sorted(set(before) | set(after)):
            sub = f"{path}.{key}" if path else str(key)
            rows.extend(payload_diff(before.get(key), after.get(key), sub))
        return rows
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        rows = []
        for index, (old, new) in enumerate(zip(before, after, strict=True)):
            rows.extend(payload_diff(old, new, f"{path}[{index}]"))
        return rows
    if before != after:
        return [DiffRow(path or "(whole payload)", before, after)]
    return []
