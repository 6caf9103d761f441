"""``console.settings`` imports the settings of ``console/settings_*.py`` by name: Django reads
only the module ``DJANGO_SETTINGS_MODULE`` names, so a setting added to one of them and not
imported would silently not apply."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import console.settings

FOLDER = Path(console.settings.__file__).parent
MODULES = sorted(path.stem for path in FOLDER.glob("settings_*.py"))


def assigned_settings(source: str) -> set[str]:
    """The upper-case names a module assigns (at any depth of its top-level statements), not
    the ones it imports."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        names |= {t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper()}
    return names


def test_the_settings_modules_are_found() -> None:
    assert {"settings_celery", "settings_core", "settings_ledger"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_every_setting_of_a_settings_module_is_a_setting_of_console_settings(name: str) -> None:
    # given
    module = importlib.import_module(f"console.{name}")
    # when
    settings = assigned_settings((FOLDER / f"{name}.py").read_text())
    missing = {key for key in settings if getattr(console.settings, key, None) is not getattr(module, key)}
    # then
    assert settings and not missing, (
        f"console.{name} defines settings console.settings does not import: {missing}"
    )
