"""Project package: settings, URLs, the Celery app and the operator console.

The Celery app (``console.celery``) is imported when Django's apps are ready
(``ConsoleConfig.ready``) and by ``celery -A console``, not when this package is imported: a
module of the package that needs neither Django nor the ledger (``console.agents.client``, the
MCP server on an agent's machine) imports without loading the settings, which start the
embedded PostgreSQL when ``DATABASE_URL`` is unset.
"""

from __future__ import annotations

from typing import Any

__all__ = ["celery_app"]


def __getattr__(name: str) -> Any:
    """``console.celery_app``, the Celery app, imported on first use (PEP 562)."""
    if name == "celery_app":
        from console.celery import app

        return app
    raise AttributeError(f"module 'console' has no attribute {name!r}")
