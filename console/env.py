"""Typed helpers that read settings from the environment (12-factor style)."""

from __future__ import annotations

import os


def env_str(name: str, default: str = "") -> str:
    """Return ``os.environ[name]`` or ``default`` when unset or empty."""
    return os.environ.get(name) or default


def env_int(name: str, default: int) -> int:
    """Return the variable as an integer; raise ``ValueError`` naming it when malformed."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from exc


def env_float(name: str, default: float) -> float:
    """Return the variable as a float; raise ``ValueError`` naming it when malformed."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ValueError(f"environment variable {name} must be a number, got {raw!r}") from exc


def env_bool(name: str, default: bool) -> bool:
    """Return the variable as a boolean (1/true/yes/on, case-insensitive)."""
    raw = os.environ.get(name)
    if not raw:
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: list[str]) -> list[str]:
    """Return a comma-separated variable as a list of stripped, non-empty items."""
    raw = os.environ.get(name)
    if not raw:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]
