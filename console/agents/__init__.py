"""Connecting AI agents to the ledger over its public HTTP API.

``client``: a small typed HTTP client (httpx; nothing of Django or the ledger, so it runs on the
agent's machine). ``mcp_server``: an MCP server on the official ``mcp`` SDK built on that client
(``pip install 'effect-ledger[agents]'``).
"""
