"""Settings for the benchmark's gunicorn: the real settings plus ``/bench/trivial``."""

from __future__ import annotations

from console.settings import *  # noqa: F403

ROOT_URLCONF = "console.lab.bench.urls"
