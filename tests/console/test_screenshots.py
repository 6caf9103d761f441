"""Issue 16 item 8: running the tests never rewrites the tracked screenshots."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.console.browser_support import screenshot_folder

ROOT = Path(__file__).resolve().parents[2]


def test_i16_8_screenshots_go_to_a_temporary_folder_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EFFECT_LEDGER_SCREENSHOTS", raising=False)
    folder = screenshot_folder()
    assert ROOT not in folder.parents, folder


def test_i16_8_the_documented_command_writes_docs_screenshots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("EFFECT_LEDGER_SCREENSHOTS", "docs/screenshots")
    assert screenshot_folder() == ROOT / "docs" / "screenshots"
    readme = (ROOT / "README.md").read_text()
    assert "EFFECT_LEDGER_SCREENSHOTS=docs/screenshots pytest -m browser tests/console" in readme
