"""console.env: settings read from the environment."""

from __future__ import annotations

from typing import Any

import pytest


def test_a_declaration_file_that_cannot_be_read_names_its_variable(tmp_path: Any) -> None:
    # issue 33: a malformed or missing providers file stops the process, naming the variable
    from console.env import env_json_file

    broken = tmp_path / "providers.json"
    broken.write_text('{"a": ')
    with pytest.raises(
        ValueError, match=r"EFFECT_LEDGER_GENERIC_HTTP_FILE=.*is not JSON: .* at line 1 column 7"
    ):
        env_json_file(
            "EFFECT_LEDGER_GENERIC_HTTP_FILE", environ={"EFFECT_LEDGER_GENERIC_HTTP_FILE": str(broken)}
        )
    with pytest.raises(ValueError, match="EFFECT_LEDGER_SMTP_FILE=/nowhere.json cannot be read"):
        env_json_file("EFFECT_LEDGER_SMTP_FILE", environ={"EFFECT_LEDGER_SMTP_FILE": "/nowhere.json"})
    broken.write_text("[]")
    with pytest.raises(ValueError, match="must hold a JSON object"):
        env_json_file("X", environ={"X": str(broken)})
    broken.write_text('{"a": {"url": "https://p.test"}}')
    assert env_json_file("X", environ={"X": str(broken)}) == {"a": {"url": "https://p.test"}}
    assert env_json_file("X", environ={}) == {}
