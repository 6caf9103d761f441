"""``manage.py mcp_server``: the MCP server for AI agents (``console.agents.mcp_server``).

Stdio by default (a desktop agent starts it; ``EFFECT_LEDGER_TOKEN`` and ``EFFECT_LEDGER_URL``),
or ``--transport http`` (streamable HTTP on ``--host``/``--port``, path ``/mcp``, forwarding
each request's ``Authorization`` header). It talks to the ledger over the public API only; on a
machine without the ledger run ``python -m console.agents.mcp_server`` with the same options.
Needs the ``agents`` extra (``pip install -e '.[agents]'``).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = "Run the MCP server for AI agents (stdio, or streamable HTTP with --transport http)."

    def add_arguments(self, parser: CommandParser) -> None:
        from console.agents.cli import add_arguments

        add_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            from console.agents.mcp_server import run
        except ImportError as exc:
            raise CommandError(
                f"the MCP server needs the 'agents' extra: pip install -e '.[agents]' ({exc})"
            ) from exc
        run(options)
