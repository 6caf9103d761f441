"""The settings the other settings modules derive from: where the project and its local data
live, and whether Django runs in debug mode. Part of ``console.settings`` (which imports every
name), the module ``DJANGO_SETTINGS_MODULE`` names.
"""

from __future__ import annotations

from pathlib import Path

from console.env import env_bool, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("EFFECT_LEDGER_DATA_DIR", str(BASE_DIR / ".data")))

DEBUG = env_bool("DJANGO_DEBUG", False)
