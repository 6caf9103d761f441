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


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("0", "must be at least 0.1, got 0"),
        ("-1", "must be at least 0.1, got -1"),
        ("nan", "must be a finite number, got 'nan'"),
        ("inf", "must be a finite number, got 'inf'"),
        ("abc", "must be a number, got 'abc'"),
    ],
)
def test_i35_a_period_that_would_flood_or_hide_is_refused_naming_its_variable(raw: str, message: str) -> None:
    # a beat with EFFECT_LEDGER_STATEMENT_PERIOD_SECONDS=0 sent thousands of runs a second; nan
    # made the health page a 500; a heartbeat of 0, nan or inf hid a second beat from it
    from console.env import env_float

    with pytest.raises(ValueError, match="EFFECT_LEDGER_X_SECONDS " + message):
        env_float("EFFECT_LEDGER_X_SECONDS", 5.0, environ={"EFFECT_LEDGER_X_SECONDS": raw}, minimum=0.1)
    assert (
        env_float("EFFECT_LEDGER_X_SECONDS", 5.0, environ={"EFFECT_LEDGER_X_SECONDS": "0.5"}, minimum=0.1)
        == 0.5
    )


@pytest.mark.parametrize(
    "environ",
    [
        {"EFFECT_LEDGER_STATEMENT_PERIOD_SECONDS": "0"},
        {"EFFECT_LEDGER_STATEMENT_PERIOD_SECONDS": "nan"},
        {"EFFECT_LEDGER_RELAY_PERIOD_SECONDS": "-1"},
        {"EFFECT_LEDGER_BEAT_HEARTBEAT_SECONDS": "inf"},
        {"EFFECT_LEDGER_BEAT_HEARTBEAT_SECONDS": "0"},
        {"EFFECT_LEDGER_HEALTH_BEAT_WINDOW_SECONDS": "15"},  # under twice the heartbeat (10 s)
    ],
)
def test_i35_bad_periods_stop_the_process_at_start_up(environ: dict[str, str]) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    (name,) = environ
    child = subprocess.run(  # noqa: S603 - this interpreter, fixed code
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings", **environ},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.returncode != 0 and f"environment variable {name} must" in child.stderr, child.stderr[-500:]
