"""quickstart supervises the MCP server when the ``agents`` extra is installed, and skips it
with a note when it is not (``pip install -e . && python manage.py quickstart`` keeps working)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from console.lab.management.commands import quickstart

OPTIONS = {"port": 8100, "sandbox_port": 8865, "workers": 1, "mcp_port": 8866}


def test_i15_quickstart_runs_the_mcp_server_on_its_port_against_its_api(tmp_path: Path) -> None:
    # when
    programs = quickstart.Command()._programs(OPTIONS, tmp_path)
    # then
    assert (
        "-m console.agents.mcp_server --transport http --port 8866 --url http://127.0.0.1:8100"
        in programs["mcp"]
    )
    assert "--token" not in programs["mcp"]  # it holds no token: each request brings its own


def test_i15_quickstart_without_the_agents_extra_skips_the_mcp_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: mcp not installed
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "mcp" else real(name, *args)

    monkeypatch.setattr(quickstart.importlib.util, "find_spec", find_spec)
    # when
    programs = quickstart.Command()._programs(OPTIONS, tmp_path)
    # then: the others still run
    assert "mcp" not in programs
    assert {"web", "worker", "beat", "sandbox"} <= set(programs)
