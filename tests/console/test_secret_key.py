"""Issue 12, item 2: never sign sessions with a known or empty ``SECRET_KEY``."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from console.secret_key import KEY_FILE_NAME, resolve_secret_key

STRONG = "k3y-" + "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN"
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "configured",
    [
        "",
        "   ",
        "dev-only-insecure-key-change-me-in-production",
        "django-insecure-" + "x1y2z3" * 10,
        "short-key",
        "a" * 80,
    ],
    ids=["empty", "blank", "old-default", "django-insecure", "short", "one-character"],
)
def test_i12_2_a_weak_configured_key_is_refused_with_debug_off(configured: str, tmp_path: Path) -> None:
    with pytest.raises(ImproperlyConfigured, match="DJANGO_SECRET_KEY is refused"):
        resolve_secret_key(configured=configured, data_dir=tmp_path, debug=False)
    assert not (tmp_path / KEY_FILE_NAME).exists()


def test_i12_2_a_strong_configured_key_is_used(tmp_path: Path) -> None:
    assert resolve_secret_key(configured=STRONG, data_dir=tmp_path, debug=False) == STRONG


def test_i12_2_debug_accepts_a_development_key(tmp_path: Path) -> None:
    assert resolve_secret_key(configured="dev", data_dir=tmp_path, debug=True) == "dev"


def test_i12_2_without_a_configured_key_one_is_generated_once_and_kept(tmp_path: Path) -> None:
    # when
    first = resolve_secret_key(configured=None, data_dir=tmp_path / "data", debug=False)
    again = resolve_secret_key(configured=None, data_dir=tmp_path / "data", debug=False)
    # then: random, strong, private and stable across restarts
    path = tmp_path / "data" / KEY_FILE_NAME
    assert first == again == path.read_text().strip()
    assert len(first) >= 50
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert resolve_secret_key(configured=None, data_dir=tmp_path / "other", debug=False) != first
    assert [p.name for p in (tmp_path / "data").iterdir()] == [KEY_FILE_NAME]  # no temporary left


def test_i12_2_a_weak_key_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / KEY_FILE_NAME).write_text("dev-only-insecure-key-change-me-in-production\n")
    with pytest.raises(ImproperlyConfigured, match="is refused"):
        resolve_secret_key(configured=None, data_dir=tmp_path, debug=False)


def test_i12_2_an_unwritable_data_directory_is_refused_not_silently_defaulted(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ImproperlyConfigured, match="set DJANGO_SECRET_KEY"):
        resolve_secret_key(configured=None, data_dir=blocker / "data", debug=False)


@pytest.mark.parametrize(
    "value", ["", "dev-only-insecure-key-change-me-in-production"], ids=["empty", "old-default"]
)
def test_i12_2_manage_py_refuses_to_start_with_a_weak_key(value: str, tmp_path: Path) -> None:
    # given: a real process with the variable set to a weak value and debug off
    env = {
        **os.environ,
        "DJANGO_SECRET_KEY": value,
        "DJANGO_DEBUG": "0",
        "EFFECT_LEDGER_DATA_DIR": str(tmp_path),
    }
    # when
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    # then: it stops and says why
    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY is refused" in result.stderr


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("EFFECT_LEDGER_SIGNIN_LOCK_SECONDS", "-5"),
        ("EFFECT_LEDGER_SIGNIN_LOCK_SECONDS", "0"),
        ("EFFECT_LEDGER_SIGNIN_FAILURES", "0"),
        ("EFFECT_LEDGER_PROXY_COUNT", "-1"),
    ],
)
def test_i12_1_sign_in_settings_out_of_range_refuse_to_start(
    variable: str, value: str, tmp_path: Path
) -> None:
    # a lock of -5 s turned locking off, 0 failures refused every sign-in: refused at start-up instead
    env = {**os.environ, variable: value, "EFFECT_LEDGER_DATA_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert f"{variable} must be at least" in result.stderr
