"""The settings the other settings modules derive from: where the project and its local data
live, and whether Django runs in debug mode. Part of ``console.settings`` (which imports every
name), the module ``DJANGO_SETTINGS_MODULE`` names.
"""

from __future__ import annotations

from pathlib import Path

from console.env import env_bool, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
# The local data folder each machine keeps: the embedded PostgreSQL (pg/), the filesystem broker,
# metrics, the generated secret key, and by default the audit signing key and checkpoint file.
DATA_DIR = Path(env_str("EFFECT_LEDGER_DATA_DIR", str(BASE_DIR / ".data")))

# Django's debug mode: off in production. On, a weak DJANGO_SECRET_KEY is accepted and the sandbox
# provider is on by default.
DEBUG = env_bool("DJANGO_DEBUG", False)
