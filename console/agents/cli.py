"""The options of the MCP server (``manage.py mcp_server`` and ``python -m
console.agents.mcp_server``), apart from the server so a command can show them without the
``mcp`` SDK installed."""

from __future__ import annotations

import os
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_HTTP_PORT = 8766


def add_arguments(parser: Any) -> None:
    """Add the options to an argparse parser (Django's ``CommandParser`` is one)."""
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument(
        "--url",
        # The ledger's base URL the MCP server calls the API at (--url).
        default=os.environ.get("EFFECT_LEDGER_URL", DEFAULT_URL),
        help=f"the ledger's base URL (EFFECT_LEDGER_URL; default {DEFAULT_URL})",
    )
    parser.add_argument(
        "--token",
        # The agent token the MCP server sends with stdio (--token); over http each request's own.
        default=os.environ.get("EFFECT_LEDGER_TOKEN"),
        help="stdio: the agent's token (EFFECT_LEDGER_TOKEN). http: not used; each request's "
        "Authorization header is forwarded to the API",
    )
    parser.add_argument("--host", default="127.0.0.1", help="http: the address to listen on")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_HTTP_PORT, help=f"http: the port (default {DEFAULT_HTTP_PORT})"
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds for each API request")
